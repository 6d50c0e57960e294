"""Everything a report reads, from result files only (a sweep folder or a ``bench --out`` folder).
Per-rank rows go to ``rank_rows``; world sizes, settings and stores are relabelled, never pooled."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import pandas as pd

from bench import results as R
from bench.errors import InputError
from bench.outputs import read_json
from bench.report import settings
from bench.sweep import layout


@dataclass(frozen=True)
class CompareResult:
    """One finished compare cell: its dataset, the summary table and its folder (figures)."""

    cell: str
    dataset: str
    folder: Path
    summary: Any  # pandas.DataFrame, bench.compare.table.SUMMARY_COLUMNS
    image_size: tuple[int, int] | None


@dataclass(frozen=True)
class ReportInputs:
    """rows: tidy results (bench rows + one ``cell_s`` status row per sweep cell) less the per-rank rows
    of data-parallel runs; rank_rows: those."""

    root: Path
    name: str
    description: str
    rows: Any  # pandas.DataFrame
    env: dict[str, Any] | None
    cells: list[dict[str, Any]] = field(default_factory=list)  # sweep.json cells (resolved)
    markers: dict[str, dict[str, Any]] = field(default_factory=dict)
    compares: list[CompareResult] = field(default_factory=list)
    predictions: Any = None  # pandas.DataFrame: run_id, dataset, pipeline, repeat, image, label, prediction
    code: dict[str, Any] | None = None  # the sweep's current code identity (sweep.json), if recorded
    code_of: dict[str, dict[str, Any] | None] = field(default_factory=dict)  # cell or run id -> code identity
    rank_rows: Any = None  # pandas.DataFrame, the columns of ``rows``; None: not read

    @cached_property
    def recorded_bytes(self) -> dict[tuple[str, str], tuple[float | None, str]]:
        """``recorded_bytes_per_image(self.rows)``, computed once."""
        return recorded_bytes_per_image(self.rows)


def load(results_dir: str | Path) -> ReportInputs:
    root = Path(results_dir)
    if not root.is_dir():
        raise InputError("is a file, not a results folder" if root.exists() else "no such results folder", root)
    if layout.is_sweep_dir(root):
        return _load_sweep(root)
    every = settings.by_settings(settings.by_store(by_world_size(R.read_results(root))))
    rows, rank_rows = split_ranks(every)
    env = _read_json(next(iter(sorted(root.glob("runs/*/env.json"))), None))
    code_of = {p.parent.name: (_read_json(p) or {}).get("code") for p in sorted(root.glob("runs/*/env.json"))}
    return ReportInputs(root=root, name=root.name, description="", rows=rows, env=env,
                        predictions=_predictions([root], rows), code_of=code_of, rank_rows=rank_rows)


STORE = "cfg.store"


def _predictions(folders: list[Path], rows: Any) -> Any:
    """Every ``runs/<run_id>/predictions.csv`` under ``folders``, labelled with its run's dataset and pipeline."""
    cols = ["run_id", "dataset", "pipeline", "repeat", "image", "label", "prediction"]
    frames = []
    for f in folders:
        for p in sorted(f.glob(f"**/{R.RUNS_DIR}/*/{R.PREDICTIONS_FILE}")):  # a cell may nest its results
            try:
                d = pd.read_csv(p)
            except (OSError, ValueError):
                continue
            frames.append(d.assign(run_id=p.parent.name))
    if not frames:
        return pd.DataFrame(columns=cols)
    d = pd.concat(frames, ignore_index=True)
    runs = rows[["run_id", "dataset", "pipeline"]].drop_duplicates("run_id").astype(str)
    return d.merge(runs, on="run_id", how="inner")[cols]


def _read_json(path: Path | None) -> dict[str, Any] | None:
    return None if path is None else read_json(Path(path))


def _load_sweep(root: Path) -> ReportInputs:
    sweep = _read_json(root / layout.SWEEP_FILE)
    if sweep is None:
        raise InputError(f"unreadable {layout.SWEEP_FILE}", root / layout.SWEEP_FILE)
    every = layout.read_sweep_results(root)
    finished = layout.finished_cells(root)
    markers = {m["id"]: m for _, m in finished}
    cells = sweep.get("cells", [])
    cell_dir = {m["id"]: d for d, m in finished if m.get("status") == "ok"}
    ok = [c for c in cells if c["id"] in cell_dir]  # finished ok, in sweep.json's order
    prep_dataset = {c["id"]: c.get("name") or c["id"] for c in ok if c["kind"] == "prepare"}
    manifests = {name: m for cid, name in prep_dataset.items()
                 if (m := _read_json(cell_dir[cid] / name / "manifest.json")) is not None}
    compares = []
    for c in ok:
        m = manifests.get(prep_dataset.get(c.get("data", ""), ""))
        folder = cell_dir[c["id"]] / "compare"
        if c["kind"] == "compare" and (folder / "summary.csv").is_file():
            size = tuple(m["image_size"]) if m and "image_size" in m else None
            compares.append(CompareResult(cell=c["id"], dataset=prep_dataset.get(c.get("data", ""), ""),
                                          folder=folder, summary=pd.read_csv(folder / "summary.csv"), image_size=size))
    every = settings.by_settings(settings.by_store(by_world_size(status_cell_fields(every, cells))))
    rows, rank_rows = split_ranks(every)
    return ReportInputs(
        root=root, name=sweep.get("name", root.name), description=sweep.get("description", ""),
        rows=rows, env=_read_json(root / layout.ENV_FILE), cells=cells, markers=markers,
        compares=compares,
        predictions=_predictions(list(cell_dir.values()), rows), code=sweep.get("code"),
        code_of={m["id"]: m.get("code") for _, m in finished}, rank_rows=rank_rows,
    )


def split_ranks(rows: Any) -> tuple[Any, Any]:
    """(the rows every table reads: aggregate rows and failed ranks' ``run`` rows, every row with ``rank`` set)."""
    if "rank" not in rows.columns:
        return rows, rows.iloc[:0]
    per_rank = rows["rank"].notna()
    status = rows["metric"].eq("run") & per_rank
    return rows[~per_rank | status], rows[per_rank]


WORLD_SIZE = "cfg.pipe.world_size"


NPROC, NNODES = "cfg.nproc", "cfg.nnodes"  # the --nproc launcher's error row of a run no rank wrote


def world_sizes(rows: Any) -> Any:
    """Each row's world size: ``cfg.pipe.world_size``, else ``cfg.nproc`` x ``cfg.nnodes`` (the launcher's
    error row), <NA> where neither is recorded."""
    ws = pd.to_numeric(rows[WORLD_SIZE], errors="coerce") if WORLD_SIZE in rows.columns else \
        pd.Series(float("nan"), index=rows.index)
    if NPROC in rows.columns:
        nodes = pd.to_numeric(rows[NNODES], errors="coerce").fillna(1) if NNODES in rows.columns else 1
        ws = ws.fillna(pd.to_numeric(rows[NPROC], errors="coerce") * nodes)
    return ws


def is_status_row(rows: Any) -> Any:
    """A sweep cell's status row (``metric`` ``cell_s``), not a run's."""
    return rows["metric"].eq(layout.STATUS_METRIC).fillna(False).astype(bool)


def by_world_size(rows: Any) -> Any:
    """Rows of a dataset whose runs differ in world size relabelled ``NAME (N processes)`` for N > 1. Status
    rows take their cell's world size's label, else follow their cell's runs (``settings.relabel``)."""
    if rows.empty or not ({WORLD_SIZE, NPROC} & set(rows.columns)):
        return rows
    recorded = world_sizes(rows)
    status = is_status_row(rows)
    ws = recorded.fillna(1).astype(int)
    for ds in rows["dataset"].dropna().unique():
        here = rows["dataset"] == ds
        runs = here & ~status & rows["run_id"].notna()
        sizes = set(ws[runs])
        if len(sizes) < 2:
            continue
        name = {n: ds if n == 1 else f"{ds} ({n} processes)" for n in sizes}
        label_of = {str(r): name[n] for r, n in zip(rows.loc[runs, "run_id"], ws[runs], strict=True)}
        own = here & status & recorded.isin(list(sizes))  # a status row with its cell's world size
        rows = rows.copy()
        rows.loc[own, "dataset"] = [name[int(n)] for n in recorded[own]]
        rows = settings.relabel(rows, here & ~own, "dataset", label_of)
        recorded, status = world_sizes(rows), is_status_row(rows)  # relabel may add copies
        ws = recorded.fillna(1).astype(int)
    return rows


def status_cell_fields(rows: Any, cells: list[dict[str, Any]]) -> Any:
    """Each bench cell's status row given its cell's world size and store path from sweep.json, so it
    joins its cell's table even when the cell has no runs."""
    bench = {c["id"]: c for c in cells if c.get("kind") == "bench" and "id" in c}
    if rows.empty or settings.SWEEP_CELL not in rows.columns or not bench:
        return rows
    cell = rows[settings.SWEEP_CELL]
    status = is_status_row(rows) & cell.isin(list(bench))
    if not status.any():
        return rows
    world = cell.map({i: int(c.get("nproc") or 1) * int(c.get("nnodes") or 1) for i, c in bench.items()})
    fill = {WORLD_SIZE: world}
    if STORE in rows.columns:  # store cell id -> the one path its readers' runs recorded
        store_id = cell.map({i: c.get("store") for i, c in bench.items()})
        ran = ~is_status_row(rows) & store_id.notna() & rows[STORE].notna()
        paths = rows[ran].groupby(store_id[ran])[STORE].agg(  # the one recorded store (None: none, or several)
            lambda s: str(v[0]) if len(v := s.dropna().astype(str).unique()) == 1 else None)
        fill[STORE] = store_id.map(paths.dropna())
    rows = rows.copy()
    for col, values in fill.items():
        if col not in rows.columns:
            rows[col] = pd.Series(pd.NA, index=rows.index, dtype="object")
        take = status & rows[col].isna() & values.notna()
        if take.any():
            rows.loc[take, col] = values[take]
    return rows


def recorded_bytes_per_image(rows: Any) -> dict[tuple[str, str], tuple[float | None, str]]:
    """(dataset, pipeline) -> (median ``dataset_bytes_per_image`` of its rows, None where only skipped;
    the first skip reason), for the pairs whose rows carry it."""
    if rows.empty or "metric" not in rows.columns:
        return {}
    m = rows[rows["metric"] == "dataset_bytes_per_image"]
    out: dict[tuple[str, str], tuple[float | None, str]] = {}
    for (ds, p), g in m.groupby(["dataset", "pipeline"], sort=True):
        ok = g.loc[g["status"] == "ok", "value"].dropna()
        why = g.loc[g["status"] != "ok", "reason"].dropna()
        out[(str(ds), str(p))] = (float(ok.median()) if len(ok) else None, str(why.iloc[0]) if len(why) else "")
    return out
