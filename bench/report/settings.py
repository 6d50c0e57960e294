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
- ``spelled_apart``: runs kept apart by a path that may name one folder or store spelled two ways.
  Older ``bench`` runs recorded ``--data``/``--store`` as typed, relative to a folder they did not
  record; newer ones record them absolute. A run records no content hash of what it read, and the
  report never resolves a recorded relative path from where it runs (``bench.report.load``), so
  ``data/syn`` and ``/w/data/syn`` cannot be tied: they stay apart, never pooled on a guess, and the
  report names each such pair (one relative path whose components, less leading ``.``/``..``, end the
  other's) so that two rows that differ only in spelling are not read as two inputs.

Keys that describe the run rather than its epochs (which pipeline, how many epochs and repeats,
seeds, monitor periods, the training-method axis, world size and the data-parallel shape, the
sweep cell: ``IGNORED``, ``IGNORED_PREFIXES``) never split; the prepared folder's path does (two
folders of one name are two datasets). A sweep cell's status rows carry no settings: they follow
their cell's runs (``_relabel``); a bench cell's status row is first given its cell's world size and store
from sweep.json (``bench.report.load.status_cell_fields``), so one of a cell without runs finds its table.
A missing value (empty in the CSV: a setting older results did not record) splits nothing. ``bench`` records every setting's value as used: ``--threads`` left out is
saved as the count torch ran with (``bench.harness.runner.run_bench``), not as ``None``. ``bench.report.load`` applies both after ``by_world_size``.
"""

from __future__ import annotations

from pathlib import PurePath
from typing import Any

CFG = "cfg."
STORE = "cfg.store"
DATA = "cfg.data"
IGNORED = frozenset({
    "cfg.pipeline", "cfg.store", "cfg.mode", "cfg.epochs", "cfg.repeats", "cfg.warmup",
    "cfg.min_seconds", "cfg.monitor_period_s", "cfg.pss_period_s", "cfg.pipe.seed",
    "cfg.method", "cfg.expand", "cfg.eval_every_epoch", "cfg.pipe.allow_unverified_store",
    "cfg.pipe.world_size", "cfg.pipe.rank",
    "cfg.nproc", "cfg.nnodes", "cfg.argv",  # ``bench --nproc``'s launcher's error row: the run's shape and line
})
# the sweep cell that ran it; the expand schedule; a data-parallel run's shape (hosts, timeout)
IGNORED_PREFIXES = ("cfg.sweep.", "cfg.expand.", "cfg.dist.")
# older results' names of a setting -> today's (the rows of one run hold one of them)
ALIASES = {"cfg.batch_size": "cfg.pipe.batch_size", "cfg.device": "cfg.pipe.device"}
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
            if c.startswith(CFG) and c not in IGNORED and c not in ALIASES and not c.startswith(IGNORED_PREFIXES)]


def _with_aliases(rows: Any) -> Any:
    """``rows`` with an older name's values moved under today's (``ALIASES``) where today's is missing."""
    old = [a for a in ALIASES if a in rows.columns]
    if not old:
        return rows
    rows = rows.copy()
    for a in old:
        new = ALIASES[a]
        rows[new] = rows[a] if new not in rows.columns else rows[new].where(rows[new].notna(), rows[a])
    return rows


def _fmt(v: Any) -> str:
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    return str(v)


def _per_run(rows: Any, keys: list[str]) -> Any:
    """One row per run: dataset, mode and its ``keys`` (the first non-missing value of each)."""
    return rows.groupby("run_id", sort=False)[["dataset", "mode", *keys]].first()


def splitting(rows: Any) -> dict[str, list[str]]:
    """dataset -> the settings whose values differ between two runs of one mode (column order)."""
    rows = _with_aliases(rows)
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
    """The settings whose values differ between the runs of ``a`` and those of ``b`` (two row
    selections, e.g. a pipeline's replay and train runs: a cross-mode comparison needs them alike)."""
    rows_a, rows_b = _with_aliases(a), _with_aliases(b)
    keys = [k for k in setting_keys(rows_a) if k in rows_b.columns]
    out = []
    for k in keys:
        va, vb = set(rows_a[k].dropna().astype(str)), set(rows_b[k].dropna().astype(str))
        if va and vb and va != vb:
            out.append(k)
    return out


def _relabel(rows: Any, here: Any, column: str, label_of: dict[str, str]) -> Any:
    """Set ``column`` of the rows selected by ``here`` to their run's label (``label_of``: run id ->
    label). Rows of a run without a label (a sweep cell's status rows, ``sweep:<cell>``, carry no
    settings) take the label of the runs of their sweep cell; failing that they are copied under
    every label, so a skip or error reason shows in each table instead of a table of its own."""
    import pandas as pd

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


def by_settings(rows: Any, manifests: dict[str, dict[str, Any]]) -> tuple[Any, dict[str, dict[str, Any]]]:
    """Rows relabelled ``NAME [key=value, ...]`` where a dataset's runs differ in a setting within
    a mode (``splitting``); ``manifests`` gains the same entries. A sweep cell's status rows follow
    their cell's runs (``_relabel``)."""
    split = splitting(rows)
    if not split:
        return rows, manifests
    manifests = dict(manifests)
    rows = _with_aliases(rows)  # older names' values under today's, kept in the rows
    for ds, keys in split.items():
        here = rows["dataset"] == ds
        label_of = _setting_labels(rows[here], ds, keys)
        for label in set(label_of.values()):
            if ds in manifests:
                manifests[label] = manifests[ds]
        rows = _relabel(rows, here, "dataset", label_of)
    return rows, manifests


def _setting_labels(rows: Any, ds: str, keys: list[str]) -> dict[str, str]:
    """run id -> ``DS [key=value, ...]`` with its values of ``keys`` (runs with none of them: no label)."""
    import pandas as pd

    out = {}
    for run_id, r in _per_run(rows[rows["run_id"].notna()], keys).iterrows():
        parts = [f"{short(k)}={_fmt(r[k])}" for k in keys if not pd.isna(r[k])]
        if parts:
            out[str(run_id)] = f"{ds} [{', '.join(parts)}]"
    return out


def _store_labels(stores: list[str]) -> dict[str, str]:
    """Each store path -> its shortest distinguishing label: the file stem, or with as many parent
    folders as it takes (``encode-8bit/s``) when two stores share a stem."""
    parts = {s: PurePath(s).with_suffix("").parts for s in stores}
    for depth in range(1, max((len(v) for v in parts.values()), default=1) + 1):
        label = {s: "/".join(v[-depth:]) for s, v in parts.items()}
        if len(set(label.values())) == len(stores):
            return label
    return {s: s for s in stores}


def by_store(rows: Any) -> Any:
    """Runs of one dataset x pipeline that read different stores (``cfg.store``: ``inr``), in any
    modes, relabelled pipeline ``NAME [STEM]`` per store (``_store_labels``), so no table pools two
    stores. A sweep cell's status rows follow their cell's runs (``_relabel``)."""
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
        rows = _relabel(rows, here, "pipeline", label_of)
    return rows


def _tail(path: str) -> tuple[str, ...]:
    """A relative path's components less leading ``.``/``..`` (what it names below where it was typed)."""
    parts = PurePath(path).parts
    i = 0
    while i < len(parts) and parts[i] in (".", ".."):
        i += 1
    return parts[i:]


def may_be_one(a: str, b: str) -> bool:
    """Two recorded paths, at least one relative, where the shorter one's components (a relative path's
    less leading ``.``/``..``: ``_tail``) end the other's: perhaps one folder or file, typed from two
    places. Two absolute paths are two."""
    if PurePath(a).is_absolute() and PurePath(b).is_absolute():
        return False
    short, long = sorted((PurePath(v).parts if PurePath(v).is_absolute() else _tail(v) for v in (a, b)), key=len)
    return bool(short) and tuple(long[len(long) - len(short):]) == tuple(short)


def _pairs(values: list[str]) -> list[tuple[str, str]]:
    """The pairs of ``values`` (sorted: relative first) that ``may_be_one``."""
    vs = sorted(set(values), key=lambda v: (PurePath(v).is_absolute(), v))
    return [(a, b) for i, a in enumerate(vs) for b in vs[i + 1:] if may_be_one(a, b)]


def spelled_apart(rows: Any) -> list[str]:
    """One line per pair of recorded ``--data`` (per dataset) or ``--store`` (per dataset x pipeline)
    spellings that keep runs apart in the tables (``by_settings``, ``by_store``) and ``may_be_one``:
    ``DS: runs that recorded `--data A` and runs that recorded `--data B` (labels ...)``."""
    if rows.empty or "run_id" not in rows.columns:
        return []
    runs = rows[rows["run_id"].notna()]
    out = []
    split = splitting(rows)
    if DATA in runs.columns:
        for ds, g in runs.groupby("dataset", sort=True):
            keys = split.get(str(ds), [])
            if DATA not in keys:
                continue
            label_of = _setting_labels(_with_aliases(g), str(ds), keys)
            for a, b in _pairs(list(g[DATA].dropna().astype(str))):
                labels = [", ".join(f"`{x}`" for x in sorted({label_of[r] for r in g.loc[g[DATA] == v, "run_id"]
                                                                if r in label_of})) for v in (a, b)]
                out.append(f"{ds}: runs that recorded `--data {a}` and runs that recorded `--data {b}` "
                           f"(labels {labels[0]}, {labels[1]})")
    if STORE in runs.columns:
        for (ds, p), g in runs[runs[STORE].notna()].groupby(["dataset", "pipeline"], sort=True):
            stores = sorted(set(g[STORE].astype(str)))
            names = _store_labels(stores)
            for a, b in _pairs(stores):
                out.append(f"{ds}, {p}: runs that recorded `--store {a}` and runs that recorded `--store {b}` "
                           f"(pipelines `{p} [{names[a]}]`, `{p} [{names[b]}]`)")
    return out
