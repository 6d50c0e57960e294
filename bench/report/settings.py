"""Runs made with different settings are never pooled: ``by_settings`` relabels datasets ``NAME [key=value]``
where a ``cfg.*`` setting differs (``IGNORED`` keys never split), ``by_store`` pipelines ``inr [STEM]``."""

from __future__ import annotations

from pathlib import PurePath
from typing import Any

import pandas as pd

CFG = "cfg."
STORE = "cfg.store"
IGNORED = frozenset({
    "cfg.pipeline", "cfg.store", "cfg.mode", "cfg.epochs", "cfg.repeats", "cfg.warmup",
    "cfg.min_seconds", "cfg.monitor_period_s", "cfg.pss_period_s", "cfg.pipe.seed",
    "cfg.method", "cfg.expand", "cfg.eval_every_epoch", "cfg.pipe.allow_unverified_store",
    "cfg.pipe.world_size", "cfg.pipe.rank",
    "cfg.nproc", "cfg.nnodes", "cfg.argv",
})
# the sweep cell that ran it; the expand schedule; a data-parallel run's shape (hosts, timeout)
IGNORED_PREFIXES = ("cfg.sweep.", "cfg.expand.", "cfg.dist.")
SWEEP_CELL = "cfg.sweep.cell"
_SHORT_PREFIXES = ("cfg.pipe.augment.", "cfg.pipe.", "cfg.train.", "cfg.")


def short(key: str) -> str:
    """``cfg.pipe.augment.crop`` -> ``crop``; ``cfg.train.lr`` -> ``lr``."""
    for p in _SHORT_PREFIXES:
        if key.startswith(p):
            return key[len(p):]
    return key


def setting_keys(rows: Any) -> list[str]:
    """The ``cfg.*`` columns that are settings (not ``IGNORED``), in column order."""
    return [c for c in rows.columns
            if c.startswith(CFG) and c not in IGNORED and not c.startswith(IGNORED_PREFIXES)]


def _fmt(v: Any) -> str:
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    return str(v)


def _per_run(rows: Any, keys: list[str]) -> Any:
    """One row per run: dataset, mode and its ``keys`` (the first non-missing value of each)."""
    return rows.groupby("run_id", sort=False)[["dataset", "mode", *keys]].first()


def splitting(rows: Any) -> dict[str, list[str]]:
    """dataset -> the settings whose values differ between two runs of one mode (column order)."""
    keys = setting_keys(rows)
    if rows.empty or not keys or "run_id" not in rows.columns:
        return {}
    runs = _per_run(rows[rows["run_id"].notna()], keys)
    out: dict[str, list[str]] = {}
    for ds, g in runs.groupby("dataset", sort=False):
        split = [k for k in keys if (g.groupby("mode")[k].nunique(dropna=True) > 1).any()]
        if split:
            out[str(ds)] = split
    return out


def differing(a: Any, b: Any) -> list[str]:
    """The settings whose values differ between two row selections (a cross-mode comparison needs them alike)."""
    out = []
    for k in [k for k in setting_keys(a) if k in b.columns]:
        va, vb = set(a[k].dropna().astype(str)), set(b[k].dropna().astype(str))
        if va and vb and va != vb:
            out.append(k)
    return out


def relabel(rows: Any, here: Any, column: str, label_of: dict[str, str]) -> Any:
    """Set ``column`` of the rows ``here`` to their run's label (``label_of``: run id -> label). Rows
    without one (status rows) take their sweep cell's runs' labels, else are copied under every label."""
    labels = sorted(set(label_of.values()))
    by_cell: dict[str, set[str]] = {}
    if SWEEP_CELL in rows.columns:
        for run_id, cell in rows.loc[here & rows["run_id"].isin(label_of), ["run_id", SWEEP_CELL]].itertuples(index=False):
            if isinstance(cell, str):
                by_cell.setdefault(cell, set()).add(label_of[run_id])
    mapped = rows["run_id"].map(label_of)
    out = rows.copy()
    take = here & mapped.notna()
    out.loc[take, column] = mapped[take]
    rest = here & mapped.isna()
    extra = []
    for idx in rows.index[rest]:
        cell = rows.at[idx, SWEEP_CELL] if SWEEP_CELL in rows.columns else None
        targets = sorted(by_cell.get(cell, ())) if isinstance(cell, str) else []
        for i, label in enumerate(targets or labels):
            if i == 0:
                out.at[idx, column] = label
            else:
                row = rows.loc[[idx]].copy()
                row[column] = label
                extra.append(row)
    return pd.concat([out, *extra], ignore_index=True) if extra else out


def by_settings(rows: Any) -> Any:
    """Rows relabelled ``NAME [key=value, ...]`` per ``splitting``."""
    split = splitting(rows)
    if not split:
        return rows
    for ds, keys in split.items():
        here = rows["dataset"] == ds
        label_of = {}  # run id -> ``DS [key=value, ...]`` (runs with none of the keys: no label)
        for run_id, r in _per_run(rows[here & rows["run_id"].notna()], keys).iterrows():
            parts = [f"{short(k)}={_fmt(r[k])}" for k in keys if not pd.isna(r[k])]
            if parts:
                label_of[str(run_id)] = f"{ds} [{', '.join(parts)}]"
        rows = relabel(rows, here, "dataset", label_of)
    return rows


def _store_labels(stores: list[str]) -> dict[str, str]:
    """Each store path -> its shortest distinguishing label: the stem, with parents where stems clash."""
    parts = {s: PurePath(s).with_suffix("").parts for s in stores}
    for depth in range(1, max((len(v) for v in parts.values()), default=1) + 1):
        label = {s: "/".join(v[-depth:]) for s, v in parts.items()}
        if len(set(label.values())) == len(stores):
            return label
    return {s: s for s in stores}


def by_store(rows: Any) -> Any:
    """Runs of one dataset x pipeline reading different stores relabelled pipeline ``NAME [STEM]``."""
    if STORE not in rows.columns or rows.empty:
        return rows
    has = rows[STORE].notna() & rows["run_id"].notna()
    if not has.any():
        return rows
    n = rows[has].groupby(["dataset", "pipeline"])[STORE].nunique()
    mixed = n[n > 1]
    for ds, p in mixed.index:
        here = (rows["dataset"] == ds) & (rows["pipeline"] == p)
        stores = rows.loc[here & rows[STORE].notna() & rows["run_id"].notna(), ["run_id", STORE]]
        names = _store_labels(sorted(stores[STORE].astype(str).unique()))
        label_of = {str(r): f"{p} [{names[str(s)]}]" for r, s in stores.drop_duplicates("run_id").itertuples(index=False)}
        rows = relabel(rows, here, "pipeline", label_of)
    return rows
