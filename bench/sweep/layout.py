"""A sweep's results folder (docs/sweeps.md): ``sweep.json``, ``env.json``, ``results.csv`` (the merged view, written
at the end of a run), ``cells/<id>/`` with ``cell.json`` written atomically after the cell's outputs (a folder without it
is never read), ``attempt.json`` (what an unfinished cell may resume from) and ``shared/<name>/`` (caches)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bench.atomic import atomic_write_bytes
from bench.errors import InputError

SWEEP_FILE = "sweep.json"
ENV_FILE = "env.json"
CELLS_DIR = "cells"
RESULTS_SUBDIR, OUT_SUBDIR = "results", "out"  # where bench and inrbench cells write (cell_rows)
SHARED_DIR = "shared"  # caches shared between cells (e.g. encode --fit-cache); never results
MARKER = "cell.json"
ATTEMPT = "attempt.json"  # {"resume_key", "started_utc"} of the cell's latest start
MERGED_CSV = "results.csv"
STATUS_METRIC = "cell_s"


def is_sweep_dir(out: str | Path) -> bool:
    return (Path(out) / SWEEP_FILE).is_file()


def enclosing_sweep(out: str | Path) -> Path | None:
    """The sweep results folder ``out`` lies inside (symlinks resolved), or ``None``."""
    from bench.outputs import is_own

    return next((p for p in Path(out).expanduser().resolve().parents if is_own(p, "sweep")), None)


def read_marker(cell_dir: Path) -> dict[str, Any] | None:
    """The completion marker, or ``None`` when the cell never finished (or the marker is unreadable)."""
    try:
        return json.loads((cell_dir / MARKER).read_text())
    except (OSError, ValueError):
        return None


def finished_cells(out: str | Path) -> list[tuple[Path, dict[str, Any]]]:
    """``(cell_dir, marker)`` for every finished cell of the current ``sweep.json``, in its order."""
    out = Path(out)
    order: list[str] = []
    try:
        order = [c["id"] for c in json.loads((out / SWEEP_FILE).read_text())["cells"]]
    except (OSError, ValueError, KeyError):
        pass
    dirs = {p.name: p for p in (out / CELLS_DIR).glob("*") if p.is_dir()}
    # cells of an older version of the sweep (no longer in sweep.json) are left on disk, unread
    ids = [i for i in order if i in dirs] if order else sorted(dirs)
    res = []
    for i in ids:
        m = read_marker(dirs[i])
        if m is not None:
            res.append((dirs[i], m))
    return res


def status_row(marker: dict[str, Any]) -> dict[str, Any]:
    """One tidy row (results schema) for a finished cell."""
    from bench.results import RESULTS_SCHEMA_VERSION

    ok = marker["status"] == "ok"
    return {"schema_version": RESULTS_SCHEMA_VERSION, "run_id": f"sweep:{marker['id']}",
            "pipeline": marker.get("pipeline", ""), "dataset": marker.get("dataset", ""), "mode": marker.get("mode", ""),
            "repeat": None, "epoch": None, "rank": None,  # about the whole cell, never one rank of it
            "metric": STATUS_METRIC, "value": float(marker["wall_s"]) if ok else float("nan"), "unit": "s",
            "status": marker["status"], "reason": "" if ok else marker.get("reason", "") or marker["status"],
            "cfg.sweep.cell": marker["id"], "cfg.sweep.kind": marker.get("kind", "")}


def cell_rows(cell_dir: Path):
    """The result rows a cell wrote itself (``inrbench bench`` layout) in ``CELL/results``, ``CELL/out`` or ``CELL``."""
    import pandas as pd

    from bench import results as R

    frames = []
    for d in (cell_dir / RESULTS_SUBDIR, cell_dir / OUT_SUBDIR, cell_dir):
        if (d / R.RUNS_DIR).is_dir() and any((d / R.RUNS_DIR).glob(f"*/{R.ROWS_FILE}")):
            frames.append(R.read_results(d))
    if not frames:
        return None
    return frames[0] if len(frames) == 1 else pd.concat(frames, ignore_index=True)


def read_sweep_results(out: str | Path):
    """Every finished cell's own rows plus one status row per finished cell, as one DataFrame."""
    import pandas as pd

    from bench import results as R

    out = Path(out)
    if not is_sweep_dir(out):
        raise InputError(f"not a sweep results folder (no {SWEEP_FILE})", out)
    frames, status = [], []
    for cell_dir, marker in finished_cells(out):
        df = cell_rows(cell_dir)
        if df is not None:
            frames.append(df.assign(**{"cfg.sweep.cell": marker["id"], "cfg.sweep.kind": marker.get("kind", "")}))
        status.append(status_row(marker))
    if status:
        frames.append(pd.DataFrame(status))
    if not frames:
        return pd.DataFrame({c: pd.Series(dtype=t) for c, t in R.CORE_COLUMNS.items()})
    df = pd.concat(frames, ignore_index=True)
    cfg_cols = sorted(c for c in df.columns if c.startswith(R.CFG_PREFIX))
    df = df[list(R.CORE_COLUMNS) + cfg_cols].copy()
    for col, dtype in R.CORE_COLUMNS.items():
        df[col] = pd.to_numeric(df[col]).astype(dtype) if dtype in ("Int64", "float64") else df[col].astype("string")
    df["reason"] = df["reason"].fillna("")
    return df


def write_merged(out: str | Path) -> None:
    df = read_sweep_results(out)
    atomic_write_bytes(Path(out) / MERGED_CSV, df.to_csv(index=False).encode("utf-8"))
