"""``perf encode``'s batched / loop speedup: with one process a side it is printed as no result (as the
report prints one process); with ``--repeats N`` the loop runs in N processes too, interleaved, and the
ratio carries the report's interval (processes as units: Welch's t on the logs)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from bench import stats as S
from bench.cli import main

ARGS = ["perf", "encode", "--synthetic", "--iterations", "5", "--batch", "6", "--loop-images", "2",
        "--layers", "2", "--hidden", "8", "--size", "8"]


@pytest.fixture
def fake(monkeypatch):
    return _fake_spawn(monkeypatch, {"loop": [10.0, 12.0, 11.0], "eager": [100.0, 110.0, 90.0]})


def _fake_spawn(monkeypatch, rates: dict[str, list[float]]) -> list[str]:
    """``perf encode``'s workers replaced by fixed rates, one per process, per kind (loop, eager,
    compiled); the kinds in the order they were started."""
    from bench.perf import encode as pe

    calls, left = [], {k: iter(v) for k, v in rates.items()}

    def spawn(args, method, images, step="eager", **over):
        calls.append(method if method == "loop" else step)
        r = next(left[calls[-1]])
        out = {"images": 6, "iterations": 5, "image_iterations_per_s": r, "seconds": 30.0 / r,
               "peak_memory_bytes": 0, "memory_kind": "x", "mean_psnr": 20.0, "threads": 1,
               "mean_psnr_first": {"1": 20.0, "2": 20.0}}
        if method == "batched":
            out.update(chunk=6, workers=1, achieved_gflops=r / 100, pct_of_peak=1.0, peak_tflops=1.0,
                       peak_dtype="float32", warmup_seconds=0.0)
        return out

    monkeypatch.setattr(pe, "_spawn", spawn)
    return calls


def test_one_process_a_side_is_no_result(fake, capsys):
    assert main(ARGS) == 0
    out = capsys.readouterr().out
    line = next(ln for ln in out.splitlines() if ln.startswith("speedup"))
    assert "10.0x (one process a side: no interval, not a result;" in line  # was a bare "10.0x"
    assert fake == ["loop", "eager"]


def test_repeats_run_the_loop_as_often_and_give_the_interval(fake, capsys):
    assert main([*ARGS, "--repeats", "3", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert fake == ["loop", "eager", "eager", "loop", "loop", "eager"]  # interleaved, ABBA
    assert r["loop"]["rates"] == [10.0, 12.0, 11.0]
    iv = S.unit_ratio_ci([[100.0], [110.0], [90.0]], [[10.0], [12.0], [11.0]])
    sp = r["speedup_ci"]
    assert sp["n"] == 3 and (sp["value"], sp["lo"], sp["hi"]) == pytest.approx((iv.value, iv.lo, iv.hi))
    assert r["speedup"] == pytest.approx(np.exp(np.mean(np.log([100, 110, 90])) - np.mean(np.log([10, 12, 11]))))
    assert sp["lo"] < sp["value"] < sp["hi"]


def test_repeats_print_the_interval(fake, capsys):
    assert main([*ARGS, "--repeats", "3"]) == 0
    line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("speedup"))
    iv = S.unit_ratio_ci([[100.0], [110.0], [90.0]], [[10.0], [12.0], [11.0]])
    assert S.fmt_ratio(iv) in line and "3 processes a side" in line and "not a result" not in line


@pytest.fixture
def fake_steps(monkeypatch):
    """``--step both``: the loop, eager and compiled workers with fixed rates (3 processes each)."""
    _fake_spawn(monkeypatch, {"loop": [10.0, 12.0, 11.0], "eager": [100.0, 110.0, 90.0],
                              "compiled": [250.0, 300.0, 200.0]})


def test_compiled_over_eager_takes_the_same_interval_as_batched_over_loop(fake_steps, capsys):
    """One method for both ratios: processes as units, ratio of geometric means, Welch's t on the logs
    (it was the ratio of medians, 2.5x, with a bootstrap interval)."""
    assert main([*ARGS, "--step", "both", "--repeats", "3", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    iv = S.unit_ratio_ci([[250.0], [300.0], [200.0]], [[100.0], [110.0], [90.0]])
    ce = r["compiled_over_eager_ci"]
    assert ce["n"] == 3 and (ce["value"], ce["lo"], ce["hi"]) == pytest.approx((iv.value, iv.lo, iv.hi))
    geo = np.exp(np.mean(np.log([250, 300, 200])) - np.mean(np.log([100, 110, 90])))
    assert r["compiled_over_eager"] == pytest.approx(geo) and abs(geo - 2.5) > 1e-3  # not the median ratio
    assert ce["method"] == r["speedup_ci"]["method"] == "ratio of geometric means, Welch's 95% t interval"


def test_both_ratios_are_printed_the_same_way(fake_steps, capsys):
    assert main([*ARGS, "--step", "both", "--repeats", "3"]) == 0
    lines = capsys.readouterr().out.splitlines()
    ce = next(ln for ln in lines if ln.startswith("compiled / eager"))
    sp = next(ln for ln in lines if ln.startswith("speedup"))
    iv = S.unit_ratio_ci([[250.0], [300.0], [200.0]], [[100.0], [110.0], [90.0]])
    assert S.fmt_ratio(iv) in ce
    for line in (ce, sp):
        assert "(3 processes a side; ratio of geometric means, Welch's 95% t interval)" in line, line


def test_one_process_a_side_is_no_result_for_compiled_over_eager_too(fake_steps, capsys):
    assert main([*ARGS, "--step", "both"]) == 0
    ce = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("compiled / eager"))
    assert "2.50x (one process a side: no interval, not a result;" in ce


def test_equal_rates_in_several_processes_say_no_spread_not_one_process():
    """Three processes a side with equal rates: no interval for want of spread, never 'one process a side'."""
    from bench.perf.encode import _fmt_ratio, _process_ratio

    r = _process_ratio([100.0] * 3, [50.0] * 3)
    assert r["lo"] is None and r["n"] == 3 and r["why"] == "no spread"
    assert _fmt_ratio(r) == "2.0x (no spread: no interval, not a result)"
    one = _process_ratio([100.0], [50.0])
    assert "one process a side" in _fmt_ratio(one)
