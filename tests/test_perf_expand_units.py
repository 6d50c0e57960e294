"""``perf expand`` says what its units are (runs in one Python process, not OS processes:
docs/measurement.md) and gives its accuracy difference as what it is: one trained model per method,
no interval over training, not a result (with McNemar on those two models)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd

from bench.cli import main
from bench.report import methods as M

TINY = ["perf", "expand", "--source", "synthetic", "--per-class", "4", "--size", "8", "--backbone", "small-cnn",
        "--schedule", "0.5:-:1,1:-:1", "--threads", "1", "--batch-size", "16"]


def _comparison() -> pd.DataFrame:
    base = {"dataset": "d", "pipeline": "raw", "total_s": 1.0, "cpu_s": 1.0, "flops_rel": 1.0, "acc": 0.9,
            "acc_lo": 0.8, "acc_hi": 0.95, "mcnemar": None, "processes": 1, "repeats_each": 1, "repeats": 1}
    return pd.DataFrame([
        {**base, "method": "dense", "speedup": np.nan, "lo": np.nan, "hi": np.nan, "cpu_ratio": np.nan,
         "cpu_lo": np.nan, "cpu_hi": np.nan},
        {**base, "method": "expand", "speedup": 1.4, "lo": np.nan, "hi": np.nan, "cpu_ratio": 1.5,
         "cpu_lo": np.nan, "cpu_hi": np.nan},
    ])


def test_the_report_table_keeps_processes_and_perf_expand_says_in_process_runs():
    report = M.fmt_comparison(_comparison())
    assert "processes x repeats" in report.columns
    assert report.iloc[1]["speedup vs dense [95% CI]"] == "1.4x (no interval: 1 process)"
    perf = M.fmt_comparison(_comparison(), ("in-process run", "in-process runs"))
    assert "in-process runs x repeats" in perf.columns and "processes x repeats" not in perf.columns
    assert perf.iloc[1]["speedup vs dense [95% CI]"] == "1.4x (no interval: 1 in-process run)"


def test_perf_expand_prints_its_accuracy_difference_as_no_result(capsys):
    assert main([*TINY, "--repeats", "1"]) == 0
    out = capsys.readouterr().out
    assert "in-process runs x repeats" in out and "processes x repeats" not in out
    line = next(ln for ln in out.splitlines() if ln.startswith("expand vs dense:"))
    assert "points (one trained model per method" in line and "no interval over training randomness, not a result" in line
    assert "McNemar: " in line
    assert "(one run a side: no interval, not a result)" in line  # one run per method: the time ratio too
    assert "the point estimates" in line and "not a result" in line.split("goal")[1]


def test_perf_expand_json_carries_the_accuracy_note(capsys):
    assert main([*TINY, "--repeats", "1", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert "not a result" in doc["accuracy_drop_note"] and "not a result" in doc["goal_note"]
    assert "accuracy_mcnemar_p" in doc
    assert "in-process runs x repeats" in doc["comparison"][0]


def test_expand_ratio_text_says_no_difference_when_the_interval_holds_one():
    """It printed "1.02x [95% CI 1.00-1.08] shorter": an interval holding 1.0 is no difference, rounded outward."""
    from bench.perf.expand import _ratio
    from bench.stats import NO_DIFFERENCE

    assert _ratio(1.02, 0.996, 1.08, "shorter") == f"{NO_DIFFERENCE} [95% CI 0.99-1.08]"
    assert _ratio(1.42, 1.204, 1.676, "shorter") == "1.42x shorter [95% CI 1.20-1.68]"
    assert _ratio(1.003, 1.001, 1.006, "fewer") == "1.003x fewer [95% CI 1.001-1.006]"
    assert _ratio(1.4, float("nan"), float("nan"), "fewer") == "1.40x fewer (one run a side: no interval, not a result)"



def test_comparison_text_says_no_spread_apart_from_one_unit():
    """No interval for want of spread (equal units on both sides) is said so, not called one process."""
    from bench.stats import NO_SPREAD

    c = _comparison()
    c["why"], c["cpu_why"] = NO_SPREAD, "one sample"
    row = M.fmt_comparison(c).iloc[1]
    assert row["speedup vs dense [95% CI]"] == "1.4x (no spread: no interval, not a result)"
    assert row["CPU-s ratio [95% CI]"] == "1.5x (no interval: 1 process)"


def test_expand_ratio_without_spread_says_so_not_one_run_a_side():
    from bench.perf.expand import _ratio
    from bench.stats import NO_SPREAD

    nan = float("nan")
    assert _ratio(1.4, nan, nan, "shorter", NO_SPREAD) == "1.40x shorter (no spread: no interval, not a result)"
    assert _ratio(1.4, nan, nan, "shorter") == "1.40x shorter (one run a side: no interval, not a result)"
