"""Hostile result folders (issue 34): hand-edited, corrupted or copied run rows through the real CLI.

A rows.csv value that cannot be a measurement (text in a numeric column, a zero, negative, infinite or
absurd epoch time) and a run counted twice (a copied run folder) are refused by ``report`` with one
line naming the file and the line, exit 2, nothing written; ``bench`` appending to such a folder refuses
the same way before it measures, and adds no run.
"""

from __future__ import annotations

import shutil

import pandas as pd
import pytest

from bench import results as R
from bench.outputs import write_marker
from tests.cli_helpers import assert_one_line_error, run_cli, snapshot


def _run(run_id: str) -> R.RunRows:
    run = R.RunRows(run_id, "raw", "ds", "loader", {"pipeline": "raw", "seed": 0})
    for rep in range(3):
        for ep in range(2):
            run.add("epoch_s", 0.5 + 0.01 * rep + 0.001 * ep, "s", repeat=rep, epoch=ep)
            run.add("images_per_s", 1000.0 + 10 * rep + ep, "img/s", repeat=rep, epoch=ep)
    return run


def _edit(col: str, value: str, metric: str = "epoch_s"):
    """Set ``col`` of run a's first ``metric`` row to the text ``value``; -> (rows.csv, its line number)."""
    def build(res):
        f = res / "runs" / "a" / "rows.csv"
        df = pd.read_csv(f, dtype=str, keep_default_na=False)
        i = int(df.index[df["metric"] == metric][0])
        df.loc[i, col] = value
        df.to_csv(f, index=False)
        return f, f"line {i + 2}: "
    return build


def _copied(res):
    shutil.copytree(res / "runs" / "b", res / "runs" / "b copy")
    return res / "runs" / "b copy" / "rows.csv", "holds run b, as "


CASES = [  # id, damage(res) -> (file, line prefix), the rest of the message
    ("epoch-zero", _edit("value", "0"), "epoch_s 0 s is not a measurement (a finite number > 0, at most 1e+12)"),
    ("epoch-negative", _edit("value", "-0.245"), "epoch_s -0.245 s is not a measurement (a finite number > 0"),
    ("epoch-inf", _edit("value", "inf"), "epoch_s inf s is not a measurement"),
    ("epoch-1e308", _edit("value", "1e308"), "epoch_s 1e+308 s is not a measurement"),
    ("throughput-negative", _edit("value", "-5", "images_per_s"), "images_per_s -5 img/s is not a measurement"),
    ("value-text", _edit("value", "abc"), "value 'abc' is not a number; delete this run's folder or restore"),
    ("repeat-text", _edit("repeat", "x"), "repeat 'x' is not an integer"),
    ("repeat-fraction", _edit("repeat", "1.5"), "repeat 1.5 is not an integer"),
    ("copied-run-folder", _copied, "does (a copied run folder?): a run is counted once; delete one of them"),
]


@pytest.fixture
def res(tmp_path):
    for rid in ("a", "b"):
        R.write_run(tmp_path / "res", _run(rid))
    write_marker(tmp_path / "res", "results", entries=False)  # as `inrbench bench` marks its --out
    return tmp_path / "res"


@pytest.mark.parametrize("damage,message", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_report_refuses_rows_that_are_not_measurements(damage, message, res, tmp_path, capsys):
    f, line = damage(res)
    before = snapshot(tmp_path)
    rc, _, err = run_cli(capsys, "report", res, "--out", tmp_path / "rep")
    text = assert_one_line_error(rc, err, message)
    assert f"{f}: " in text and (line in text or not line.startswith("line")), text
    assert not (tmp_path / "rep").exists() and snapshot(tmp_path) == before


def test_untouched_rows_report(res, tmp_path, capsys):
    """The same folder undamaged reports (exit 0): the checks refuse only the damage."""
    rc, _, err = run_cli(capsys, "report", res, "--out", tmp_path / "rep")
    assert rc == 0, err


@pytest.mark.parametrize("damage,message", [c[1:] for c in CASES if c[0] in ("value-text", "copied-run-folder")],
                         ids=["value-text", "copied-run-folder"])
def test_bench_refuses_such_a_folder_before_it_measures(damage, message, res, tmp_path, capsys):
    """It measured, wrote its run, then raised (``ValueError``) rebuilding the views."""
    from bench.datasets.prepare import prepare_dataset

    data = prepare_dataset("synthetic", tmp_path / "ds", size=8, per_class=2, num_classes=2)
    f, _ = damage(res)
    before = snapshot(res / "runs")  # (the folder gets its results marker: ``bench.outputs``)
    rc, out, err = run_cli(capsys, "bench", "--pipeline", "raw", "--data", data, "--mode", "loader", "--epochs", 1,
                           "--warmup", 0, "--repeats", 1, "--batch-size", 2, "--workers", 0, "--device", "cpu",
                           "--out", res)
    assert_one_line_error(rc, err, f"{f}: ", message)
    assert snapshot(res / "runs") == before and "rows:" not in out
