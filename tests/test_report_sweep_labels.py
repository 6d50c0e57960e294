"""A sweep's report labels each table by one setting (``NAME (2 processes)``, ``NAME [batch_size=16]``,
``inr [STEM]``): a sweep cell's status rows join the table of their cell, never one of their own, and
sizes looked up for a table (an ``inr`` store's bytes/image) are found under the table's label.

The audit's case: ``inrbench sweep --nproc 2`` (every bench cell 2 processes). The cells' status rows
(``metric cell_s``) record no world size, so the report read them as single-process rows: a second
``ph16`` table of ``not run`` cells beside the real ``ph16 (2 processes)`` one, and the 2-process
table's ``inr`` bytes/image "—" (the store was looked up under ``ph16``)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

from bench import results as R
from bench.report.build import build_report
from bench.report.load import by_world_size, load
from tests.report_tables import _quick_reports, parse_tables  # noqa: F401

FIX = Path(__file__).resolve().parent / "fixtures" / "results" / "sweep"
N_TRAIN = 10  # the fixture's prepared train split
PRUNED, FP32 = 7000 / N_TRAIN, 33000 / N_TRAIN  # its two stores' bytes per image


# cells the tables here never read: the compare cells and the encodes of the design-space sweep
UNREAD = ("compare", "compare-ds", "enc-ds-L3", "enc-ds-L5", "enc-ds-h8", "enc-ds-h24")


def _copy_fixture(res: Path) -> None:
    """The fixture sweep without its ``UNREAD`` cells (nor in sweep.json): a smaller report, the same tables."""
    shutil.copytree(FIX, res, ignore=lambda d, names: [n for n in names if Path(d).name == "cells" and n in UNREAD])
    sweep = json.loads((res / "sweep.json").read_text())
    sweep["cells"] = [c for c in sweep["cells"] if c["id"] not in UNREAD]
    (res / "sweep.json").write_text(json.dumps(sweep))


def _edit_rows(cell_dir: Path, **cfg) -> None:
    for f in cell_dir.glob("runs/*/rows.csv"):
        d = pd.read_csv(f)
        for k, v in cfg.items():
            d[k] = v
        d.to_csv(f, index=False)


def _sweep(tmp_path: Path, two: tuple[str, ...] = ("bench-",)) -> Path:
    """The fixture sweep with the bench cells whose id starts with one of ``two`` run as 2 processes
    (``nproc: 2`` in sweep.json, ``cfg.pipe.world_size`` 2 in their runs), the others as 1."""
    res = tmp_path / "results"
    _copy_fixture(res)
    sweep = json.loads((res / "sweep.json").read_text())
    for c in sweep["cells"]:
        if c["kind"] == "bench":
            c["nproc"] = 2 if c["id"].startswith(two) else 1
            _edit_rows(res / "cells" / c["id"], **{"cfg.pipe.world_size": c["nproc"]})
    (res / "sweep.json").write_text(json.dumps(sweep))
    return res


def _report(res: Path, tmp_path: Path) -> tuple[str, dict]:
    build_report(res, tmp_path / "rep")
    text = (tmp_path / "rep" / "README.md").read_text()
    return text, parse_tables(text)


def _headline(tables: dict, ds: str) -> pd.DataFrame:
    return tables[f"{ds} — headline"][0].set_index("pipeline")


def test_a_sweep_of_2_process_cells_has_no_table_of_status_rows(tmp_path):
    """Every bench cell at 2 processes: one world size, so one ``photos32`` table (the dataset keeps its
    name), with the measurements; no second table whose cells all read ``not run``."""
    text, tables = _report(_sweep(tmp_path), tmp_path)
    assert [k for k in tables if "headline" in k] == ["photos32 — headline"]
    assert not any("processes)" in k for k in tables)
    h = _headline(tables, "photos32")
    assert "not run" not in h.to_string()
    assert h.loc["raw", "loader img/s"] != "—" and h.loc["inr", "bytes/image"] == f"{PRUNED:.0f}"
    ips = tables["photos32 — images/s, median (IQR)"][0].set_index("pipeline")
    assert ips.loc["inr", "replay"] == "error: exit -9: Killed (out of memory)"  # a cell without runs
    rows = load(tmp_path / "results").rows
    status = rows[rows["metric"] == "cell_s"]
    assert set(status["dataset"]) == {"photos32"}
    assert status.loc[status["cfg.sweep.kind"] == "bench", "cfg.pipe.world_size"].eq(2).all()


def test_cells_at_two_world_sizes_keep_their_status_rows_and_store_in_their_own_table(tmp_path):
    """raw and inr at 2 processes, torch-jpeg and dali at 1: two tables, each pipeline in its own
    only (no ``not run`` rows of the other's pipelines), the failed inr replay cell (no runs) in the
    2-process table, and the 2-process table's inr bytes/image its store's."""
    text, tables = _report(_sweep(tmp_path, two=("bench-inr", "bench-raw")), tmp_path)
    one, two = _headline(tables, "photos32"), _headline(tables, "photos32 (2 processes)")
    assert list(one.index) == ["torch-jpeg", "dali"] and list(two.index) == ["raw", "inr"]
    assert two.loc["inr", "bytes/image"] == f"{PRUNED:.0f}"
    ips = tables["photos32 (2 processes) — images/s, median (IQR)"][0].set_index("pipeline")
    assert ips.loc["inr", "replay"] == "error: exit -9: Killed (out of memory)"
    assert "inr" not in tables["photos32 — images/s, median (IQR)"][0]["pipeline"].tolist()
    acc = tables["Accuracy (test split, original pixels, evaluation transform)"][0]
    inr = acc[(acc["dataset"] == "photos32 (2 processes)") & (acc["pipeline"] == "inr")]
    assert inr["bytes/image"].tolist() == [f"{PRUNED:.0f}"]


def _copy_cell(res: Path, src: str, dst: str, sweep_fields: dict, **cfg) -> None:
    """A new bench cell ``dst``: ``src``'s folder, runs renamed, ``cfg`` set in its rows, ``sweep_fields`` in sweep.json."""
    shutil.copytree(res / "cells" / src, res / "cells" / dst)
    for run in sorted((res / "cells" / dst / "runs").iterdir()):
        new = run.with_name(run.name.replace(src.removeprefix("bench-"), dst.removeprefix("bench-")))
        run.rename(new)
        f = new / "rows.csv"
        f.write_text(f.read_text().replace(run.name, new.name))
    _edit_rows(res / "cells" / dst, **cfg)
    m = json.loads((res / "cells" / dst / "cell.json").read_text())
    (res / "cells" / dst / "cell.json").write_text(json.dumps({**m, "id": dst}))
    sweep = json.loads((res / "sweep.json").read_text())
    base = next(c for c in sweep["cells"] if c["id"] == src)
    sweep["cells"].append({**base, **sweep_fields, "id": dst})
    (res / "sweep.json").write_text(json.dumps(sweep))


def test_store_sizes_are_found_under_setting_and_store_labels(tmp_path):
    """An inr loader cell at another batch size (``photos32 [batch_size=16]``) and an inr train cell of
    another store (``inr [fp32]`` beside ``inr [pruned-8bit]``): each row's bytes/image is what its own runs
    recorded (the store they read)."""
    res = tmp_path / "results"
    _copy_fixture(res)
    for c in ("bench-inr-loader", "bench-inr-train"):
        _edit_rows(res / "cells" / c, **{"cfg.store": "/s/pruned-8bit.inr"})
    _copy_cell(res, "bench-inr-train", "bench-inr-train-fp32", {"store": "enc-fp32"}, **{"cfg.store": "/s/fp32.inr"})
    for f in (res / "cells" / "bench-inr-train-fp32").glob("runs/*/rows.csv"):
        d = pd.read_csv(f)
        d.loc[d["metric"] == "dataset_bytes_per_image", "value"] = FP32
        d.to_csv(f, index=False)
    _copy_cell(res, "bench-inr-loader", "bench-inr-loader-b16", {"batch_size": 16},
               **{"cfg.store": "/s/pruned-8bit.inr", "cfg.batch_size": 16})
    text, tables = _report(res, tmp_path)
    h8, h16 = _headline(tables, "photos32 [batch_size=8]"), _headline(tables, "photos32 [batch_size=16]")
    assert h8.loc["inr [pruned-8bit]", "bytes/image"] == f"{PRUNED:.0f}"
    assert h8.loc["inr [fp32]", "bytes/image"] == f"{FP32:,.0f}"
    # the failed inr replay cell (no runs; store enc-pruned-8bit) follows its store, not every inr store
    assert [p for p in h16.index if p.startswith("inr")] == ["inr [pruned-8bit]"]
    assert h16.loc["inr [pruned-8bit]", "bytes/image"] == f"{PRUNED:.0f}"


def _run(out: Path, run_id: str, pipeline: str, world: int | None, cell: str) -> None:
    cfg = {"pipe": {"device": "cpu", "batch_size": 8}, "sweep": {"cell": cell}}
    if world is not None:
        cfg["pipe"]["world_size"] = world
    run = R.RunRows(run_id, pipeline, "syn", "loader", cfg)
    for e in range(3):
        run.add("epoch_s", 0.1 + 0.01 * e, "s", repeat=0, epoch=e + 1)
    R.write_run(out, run)


def _status(cell: str, pipeline: str, status: str, world: int | None = None) -> dict:
    """A sweep cell's status row as ``bench.sweep.layout.status_row`` writes it (and, ``world``, as the
    report gives it its cell's world size from sweep.json: ``load.status_cell_fields``)."""
    return {"run_id": f"sweep:{cell}", "pipeline": pipeline, "dataset": "syn", "mode": "loader", "metric": "cell_s",
            "value": 1.0 if status == "ok" else float("nan"), "unit": "s", "status": status,
            "reason": "" if status == "ok" else "no GPU", "cfg.sweep.cell": cell,
            "cfg.pipe.world_size": world}


@pytest.mark.parametrize("world, labels", [
    (None, ["syn", "syn (2 processes)"]),  # no world size, no runs: its reason under every label
    (2, ["syn (2 processes)"]),  # its cell's world size: that table only
    (4, ["syn", "syn (2 processes)"]),  # a world size no run has: no table of its own
])
def test_by_world_size_splits_on_runs_only_and_status_rows_follow_their_cell(tmp_path, world, labels):
    out = tmp_path / "r"
    _run(out, "a", "raw", None, "raw-1")  # an older run: no world size recorded, one process
    _run(out, "b", "raw", 2, "raw-2")
    rows = R.read_results(out)
    extra = [_status("raw-1", "raw", "ok"), _status("raw-2", "raw", "ok"), _status("dali-x", "dali", "skip", world)]
    rows = pd.concat([rows, pd.DataFrame(extra)], ignore_index=True)
    split = by_world_size(rows)
    label = dict(zip(split["run_id"], split["dataset"], strict=False))
    assert label["a"] == "syn" and label["b"] == "syn (2 processes)"
    assert label["sweep:raw-1"] == "syn" and label["sweep:raw-2"] == "syn (2 processes)"
    assert sorted(split.loc[split["run_id"] == "sweep:dali-x", "dataset"]) == labels
    # status rows alone never split a dataset
    alone = by_world_size(rows[rows["run_id"] != "b"])
    assert set(alone["dataset"]) == {"syn"}


def test_the_nproc_launchers_error_row_counts_at_its_world_size(tmp_path):
    """``bench --nproc 2`` whose ranks never wrote the run leaves one error row recording ``cfg.nproc``/
    ``cfg.nnodes`` (no ``cfg.pipe.world_size``): it belongs with the 2-process runs, and those keys split nothing."""
    out = tmp_path / "r"
    _run(out, "one", "raw", 1, "c1")
    _run(out, "two", "raw", 2, "c2")
    for run_id, argv in (("crashed", "bench --nproc 2"), ("crashed-again", "bench --nproc 2 --workers 1")):
        err = R.RunRows(run_id, "raw", "syn", "loader", {"pipeline": "raw", "data": "/d/syn", "mode": "loader",
                                                         "nproc": 2, "nnodes": 1, "argv": argv})
        err.error("torchrun exited with status 1 before rank 0 wrote this run")
        R.write_run(out, err)
    rows = load(out).rows
    assert set(rows.loc[rows["run_id"].str.startswith("crashed"), "dataset"]) == {"syn (2 processes)"}
    assert set(rows["dataset"]) == {"syn", "syn (2 processes)"}
