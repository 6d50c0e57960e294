"""What a report says about the runs' own settings and sizes, read from what the runs recorded:
the torch thread counts in the Environment table (never the report's or the sweep's own process's),
and the headline's speedup against a baseline that was not run."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from bench import results as R
from bench.report.build import build_report
from tests.report_tables import _quick_reports, parse_tables, sweep_report  # noqa: F401

FIX = Path(__file__).resolve().parent / "fixtures" / "results" / "sweep"


def _run(out: Path, run_id: str, pipeline: str, threads: int | None, mode: str = "loader", **cfg) -> Path:
    config = {"pipe": {"device": "cpu", "split": "train"}, **cfg}
    if threads is not None:
        config["torch_threads"] = threads
    rows = R.RunRows(run_id, pipeline, "syn", mode, config)
    for r in range(2):
        rows.add("epoch_s", 1.0 + 0.1 * r, "s", repeat=r, epoch=1)
        rows.add("images_per_s", 100.0 - r, "img/s", repeat=r, epoch=1)
    run_dir = R.write_run(out, rows)
    env = json.loads((FIX / "env.json").read_text())
    env["torch_num_threads"] = 2  # the process that wrote env.json, not what the runs timed at
    R.write_env(run_dir, env)
    return run_dir


def _environment(report: Path) -> dict[str, str]:
    t = parse_tables((report / "README.md").read_text())["Environment"][0]
    return dict(zip(t[""], t["value"], strict=True))


def test_environment_shows_the_runs_thread_counts_not_the_report_process(tmp_path):
    out = tmp_path / "results"
    for i, p in enumerate(("raw", "torch-jpeg", "dali")):
        _run(out, f"r{i}", p, 1)
    build_report(out, tmp_path / "rep")
    env = _environment(tmp_path / "rep")
    assert "torch threads" not in env  # the old row: env.json's torch_num_threads (2)
    assert env["torch threads (as the runs recorded them)"] == "1 in all 3 runs"


def test_environment_names_each_thread_count_and_the_runs_without_one(tmp_path):
    out = tmp_path / "results"
    _run(out, "a", "raw", 1)
    _run(out, "b", "raw", 2)
    _run(out, "c", "torch-jpeg", 2)
    _run(out, "d", "torch-jpeg", None)  # older results: no record, which splits nothing
    build_report(out, tmp_path / "rep")
    value = _environment(tmp_path / "rep")["torch threads (as the runs recorded them)"]
    assert value.startswith("1 in 1 run, 2 in 2 runs (")
    assert value.endswith("; 1 run did not record it")
    text = (tmp_path / "rep" / "README.md").read_text()
    assert "syn [torch_threads=1]" in text and "syn [torch_threads=2]" in text  # never pooled


def test_no_thread_row_when_no_run_recorded_one(tmp_path):
    out = tmp_path / "results"
    _run(out, "a", "raw", None)
    build_report(out, tmp_path / "rep")
    assert not any(k.startswith("torch threads") for k in _environment(tmp_path / "rep"))


def test_the_committed_sweep_fixture_reports_its_runs_threads(tmp_path_factory):
    """A sweep folder: its env.json is the sweep process's; the row comes from the bench rows."""
    from bench.report.build import run_threads
    from bench.report.load import load

    x = load(FIX)
    env = _environment(sweep_report(tmp_path_factory))
    want = run_threads(x.rows)
    assert env.get("torch threads (as the runs recorded them)") == want
    assert "torch threads" not in env


def test_a_headline_speedup_against_a_baseline_not_run_says_so(tmp_path):
    out = tmp_path / "results"
    for pipeline in ("raw", "torch-jpeg"):
        for k in range(2):
            rows = R.RunRows(f"{pipeline}-{k}", pipeline, "syn", "train", {"pipe": {"device": "cpu"}})
            for r in range(2):
                rows.add("epoch_s", float(np.exp(0.01 * k + 0.02 * r)), "s", repeat=r, epoch=1)
                rows.add("images_per_s", 100.0, "img/s", repeat=r, epoch=1)
            R.write_run(out, rows)
    build_report(out, tmp_path / "rep")
    t = parse_tables((tmp_path / "rep" / "README.md").read_text())["syn — headline"][0].set_index("pipeline")
    assert t.loc["raw", "train speedup vs dali"] == "n/a: dali not run"  # as the speedup table says it
    assert t.loc["torch-jpeg", "train speedup vs torch-jpeg"] == "1.00x (baseline)"
