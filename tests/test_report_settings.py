"""Runs with different settings in one results folder are never pooled (``bench.report.settings``)."""

from __future__ import annotations

import numpy as np
import pytest

from bench import results as R
from bench.report import settings as ST
from bench.report.build import build_report
from bench.report.load import load
from tests.report_tables import parse_tables


def _run(out, run_id: str, pipeline: str, mode: str, times: list[float], **cfg) -> None:
    pipe = {"device": "cpu", "batch_size": cfg.pop("batch_size", 64), "augment": {"crop": cfg.pop("crop", "random-pad")}}
    config = {"pipe": pipe, "torch_threads": cfg.pop("threads", 1), "epochs": len(times), **cfg}
    run = R.RunRows(run_id, pipeline, "syn", mode, config)
    for e, t in enumerate(times):
        run.add("epoch_s", t, "s", repeat=0, epoch=e + 1)
        run.add("images_per_s", 320 / t, "img/s", repeat=0, epoch=e + 1)
    R.write_run(out, run)


def _median(cell: str) -> float:
    return float(cell.split(" (IQR ")[0].replace(",", ""))


def test_runs_of_two_settings_get_two_tables_not_one_median(tmp_path):
    """The audit's case: raw at batch 256 / random-resized / 2 threads and raw at batch 64 /
    random-pad / 1 thread in one --out, with torch-jpeg only at the second setting."""
    out = tmp_path / "results"
    _run(out, "a", "raw", "loader", [0.20, 0.21, 0.19], batch_size=256, crop="random-resized", threads=2)
    _run(out, "b", "raw", "loader", [0.006, 0.0059, 0.0061])
    _run(out, "c", "torch-jpeg", "loader", [0.03, 0.031, 0.029])
    _run(out, "d", "raw", "loader", [0.0062, 0.006, 0.0058], epochs=5)  # epochs is no setting
    assert ST.splitting(R.read_results(out)) == {"syn": ["cfg.pipe.augment.crop", "cfg.pipe.batch_size",
                                                          "cfg.torch_threads"]}
    build_report(out, tmp_path / "rep")
    tables = parse_tables((tmp_path / "rep" / "README.md").read_text())
    big = tables["syn [crop=random-resized, batch_size=256, torch_threads=2] — images/s, median (IQR)"][0]
    small = tables["syn [crop=random-pad, batch_size=64, torch_threads=1] — images/s, median (IQR)"][0]
    big, small = big.set_index("pipeline"), small.set_index("pipeline")
    assert list(big.index) == ["raw"] and _median(big.loc["raw", "loader"]) == pytest.approx(320 / 0.20, rel=1e-3)
    assert list(small.index) == ["raw", "torch-jpeg"]  # runs b and d pooled: same setting
    assert _median(small.loc["raw", "loader"]) == pytest.approx(np.median(320 / np.array([0.006, 0.0059, 0.0061, 0.0062, 0.006, 0.0058])), rel=2e-3)
    assert not any(k.startswith("syn — ") for k in tables)  # nothing pooled across the two


def test_a_setting_that_differs_only_between_modes_splits_nothing(tmp_path):
    out = tmp_path / "results"
    for p in ("raw", "dali"):
        _run(out, f"{p}-l", p, "loader", [0.01, 0.011, 0.009], step_sync=True)
        _run(out, f"{p}-t", p, "train", [1.0, 1.1, 0.9], step_sync=False)
    _run(out, "old", "torch-jpeg", "loader", [0.05, 0.051, 0.049])  # older rows: no step_sync column value
    assert ST.splitting(R.read_results(out)) == {}
    assert set(load(out).rows["dataset"]) == {"syn"}


def test_inr_runs_of_two_stores_are_two_pipelines(tmp_path):
    out = tmp_path / "results"
    _run(out, "raw", "raw", "loader", [0.01, 0.011, 0.009])
    _run(out, "i8", "inr", "loader", [0.02, 0.021, 0.019], store="/x/encode-8bit/8bit.inr")
    _run(out, "i16", "inr", "loader", [0.04, 0.041, 0.039], store="/x/encode-16bit/16bit.inr")
    _run(out, "i8t", "inr", "train", [1.0, 1.0, 1.0], store="/x/encode-8bit/8bit.inr")
    rows = load(out).rows
    assert set(rows["pipeline"]) == {"raw", "inr [8bit]", "inr [16bit]"}
    assert set(rows.loc[rows["run_id"] == "i8t", "pipeline"]) == {"inr [8bit]"}
    assert set(rows["dataset"]) == {"syn"}  # the store is no dataset-wide setting
    one = tmp_path / "one"
    _run(one, "i8", "inr", "loader", [0.02, 0.021, 0.019], store="/x/a.inr")
    _run(one, "i8t", "inr", "train", [1.0, 1.0, 1.0], store="/x/a.inr")
    assert set(load(one).rows["pipeline"]) == {"inr"}  # one store: the name stays


def _status_row(rows, cell: str, pipeline: str, status: str, reason: str = ""):
    """A sweep cell's status row (as bench.sweep.layout writes it): no settings, its cell's id."""
    import pandas as pd

    r = {c: pd.NA for c in rows.columns}
    r.update({"run_id": f"sweep:{cell}", "pipeline": pipeline, "dataset": "syn", "mode": "loader",
              "metric": "cell_s", "value": 1.0, "unit": "s", "status": status, "reason": reason,
              "cfg.sweep.cell": cell})
    return pd.concat([rows, pd.DataFrame([r])], ignore_index=True)


def test_a_sweep_cells_status_rows_follow_its_runs_or_every_split(tmp_path):
    """No ghost 'syn' dataset: a cell's status row takes its runs' label; a skipped cell, which has
    no runs, shows its reason under every label."""
    out = tmp_path / "results"
    _run(out, "a", "raw", "loader", [0.2, 0.21, 0.19], batch_size=256, **{"sweep": {"cell": "raw-256"}})
    _run(out, "b", "raw", "loader", [0.006, 0.0059, 0.0061], **{"sweep": {"cell": "raw-64"}})
    rows = R.read_results(out)
    rows = _status_row(rows, "raw-256", "raw", "ok")
    rows = _status_row(rows, "dali-64", "dali", "skip", "DALI needs a GPU")
    split = ST.by_settings(rows)
    assert "syn" not in set(split["dataset"])
    assert set(split.loc[split["run_id"] == "sweep:raw-256", "dataset"]) == {"syn [batch_size=256]"}
    skip = split[split["run_id"] == "sweep:dali-64"]
    assert sorted(skip["dataset"]) == ["syn [batch_size=256]", "syn [batch_size=64]"]


def test_stores_sharing_a_stem_are_told_apart_by_their_folder():
    assert ST._store_labels(["/x/encode-8bit/s.inr", "/x/encode-16bit/s.inr"]) == {
        "/x/encode-8bit/s.inr": "encode-8bit/s", "/x/encode-16bit/s.inr": "encode-16bit/s"}
    assert ST._store_labels(["/x/a/8bit.inr", "/x/b/16bit.inr"]) == {"/x/a/8bit.inr": "8bit", "/x/b/16bit.inr": "16bit"}


def test_two_data_paths_split_and_a_dist_timeout_does_not(tmp_path):
    """Two prepared folders of one name are two datasets; a data-parallel run's timeout is no setting."""
    out = tmp_path / "results"
    _run(out, "new", "raw", "loader", [0.006, 0.0059, 0.0061], batch_size=4, data="/d/ds")
    _run(out, "other", "raw", "loader", [0.006, 0.0059, 0.0061], batch_size=4, data="/e/ds",
         dist={"timeout_s": 60})
    assert ST.splitting(R.read_results(out)) == {"syn": ["cfg.data"]}
