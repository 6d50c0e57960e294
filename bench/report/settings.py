"""Runs made with different settings are never pooled, nor compared as if they were alike.

Every table pools the runs of one dataset x pipeline x mode and compares pipelines within one
dataset x mode. That is only fair when those runs share their *settings*: the ``cfg.*`` columns
that change what an epoch costs (batch size, augmentation, workers, threads, device, backbone,
optimizer, step sync, ...). ``inrbench bench`` adds every run to its ``--out``, so one folder
can hold the same pipeline at two batch sizes.

- ``by_settings``: a setting *splits* a dataset when two runs of the same mode hold different
  values of it (missing values, from older results, do not count). Each run's dataset is then
  relabelled ``NAME [key=value, ...]`` with its values of the splitting settings, so each label
  holds runs of one setting, and every table compares pipelines at one setting. Settings that
  differ only between modes (loader runs with step sync, train runs without) split nothing.
- ``by_store``: ``inr`` runs of one dataset that read different stores (``cfg.store``, in any
  modes) become pipelines ``inr [STEM]`` (the store's file stem), one per store.

Keys that describe the run rather than its epochs (which pipeline, the data path, how many
epochs and repeats, seeds, monitor periods, the training-method axis, world size, the sweep cell: ``IGNORED``,
``IGNORED_PREFIXES``)
never split. ``bench.report.load`` applies both after ``by_world_size``.
"""

from __future__ import annotations

from pathlib import PurePath
from typing import Any

CFG = "cfg."
STORE = "cfg.store"
IGNORED = frozenset({
    "cfg.pipeline", "cfg.data", "cfg.store", "cfg.mode", "cfg.epochs", "cfg.repeats", "cfg.warmup",
    "cfg.min_seconds", "cfg.monitor_period_s", "cfg.pss_period_s", "cfg.pipe.seed",
    "cfg.method", "cfg.expand", "cfg.eval_every_epoch", "cfg.pipe.allow_unverified_store",
    "cfg.pipe.world_size", "cfg.pipe.rank",
})
IGNORED_PREFIXES = ("cfg.sweep.", "cfg.expand.")  # the sweep cell that ran it; the expand schedule
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


def by_settings(rows: Any, manifests: dict[str, dict[str, Any]]) -> tuple[Any, dict[str, dict[str, Any]]]:
    """Rows relabelled ``NAME [key=value, ...]`` where a dataset's runs differ in a setting within
    a mode (``splitting``); ``manifests`` gains the same entries. Rows without a run id keep theirs."""
    split = splitting(rows)
    if not split:
        return rows, manifests
    import pandas as pd

    rows, manifests = rows.copy(), dict(manifests)
    for ds, keys in split.items():
        runs = _per_run(rows[(rows["dataset"] == ds) & rows["run_id"].notna()], keys)
        for run_id, r in runs.iterrows():
            parts = [f"{short(k)}={_fmt(r[k])}" for k in keys if not pd.isna(r[k])]
            label = f"{ds} [{', '.join(parts)}]" if parts else ds
            rows.loc[rows["run_id"] == run_id, "dataset"] = label
            if ds in manifests:
                manifests[label] = manifests[ds]
    return rows, manifests


def by_store(rows: Any) -> Any:
    """Runs of one dataset x pipeline that read different stores (``cfg.store``: ``inr``), in any
    modes, relabelled pipeline ``NAME [STEM]`` per store, so no table pools two stores."""
    if STORE not in rows.columns or rows.empty:
        return rows
    has = rows[STORE].notna() & rows["run_id"].notna()
    if not has.any():
        return rows
    n = rows[has].groupby(["dataset", "pipeline"])[STORE].nunique()
    mixed = n[n > 1]
    if mixed.empty:
        return rows
    rows = rows.copy()
    for ds, p in mixed.index:
        here = has & (rows["dataset"] == ds) & (rows["pipeline"] == p)
        for store in rows.loc[here, STORE].unique():
            rows.loc[here & (rows[STORE] == store), "pipeline"] = f"{p} [{PurePath(str(store)).stem}]"
    return rows
