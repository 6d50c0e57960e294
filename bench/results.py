"""Results as data: one tidy row per observation, one folder per run, merged views on top.

The schema (columns, statuses, the files under ``OUT/runs/<run_id>/``) is in ``docs/results.md``.
"""

from __future__ import annotations

import json
import math
import secrets
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench import envinfo
from bench.atomic import atomic_write_bytes, atomic_write_json
from bench.errors import InputError, older_artifact

RESULTS_SCHEMA_VERSION = 3
STATUSES = ("ok", "skip", "error")
MODES = ("loader", "replay", "train")
CFG_PREFIX = "cfg."

# Core columns and their pandas dtypes, in file order; cfg.* columns follow, sorted.
CORE_COLUMNS: dict[str, str] = {
    "schema_version": "Int64",
    "run_id": "string",
    "pipeline": "string",
    "dataset": "string",
    "mode": "string",
    "rank": "Int64",
    "repeat": "Int64",
    "epoch": "Int64",
    "metric": "string",
    "value": "float64",
    "unit": "string",
    "status": "string",
    "reason": "string",
}

RUNS_DIR = "runs"
ROWS_FILE = "rows.csv"
CONFIG_FILE = "config.json"
ENV_FILE = "env.json"
STEPS_FILE = "steps.csv"
MONITOR_FILE = "monitor.csv"
PREDICTIONS_FILE = "predictions.csv"
MERGED_CSV = "results.csv"
MERGED_PARQUET = "results.parquet"


def new_run_id(pipeline: str, mode: str) -> str:
    """``<UTC yyyymmddThhmmss>-<pipeline>-<mode>-<6 hex>``: sortable by time, unique."""
    return f"{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}-{pipeline}-{mode}-{secrets.token_hex(3)}"


def flatten_config(config: Mapping[str, Any], prefix: str = CFG_PREFIX) -> dict[str, Any]:
    """Nested dict -> ``{"cfg.a.b": scalar}``; lists/tuples -> JSON text; None stays None."""
    out: dict[str, Any] = {}
    for key, val in config.items():
        name = f"{prefix}{key}"
        if isinstance(val, Mapping):
            out.update(flatten_config(val, prefix=name + "."))
        elif isinstance(val, (list, tuple)):
            out[name] = json.dumps(list(val))
        elif val is None or isinstance(val, (bool, int, float, str)):
            out[name] = val
        else:
            out[name] = str(val)
    return out


def _one_line(text: str, default: str) -> str:
    return " ".join(str(text).split()) or default


REASON_MAX_CHARS = 500


def exception_reason(e: BaseException) -> str:
    """One line for an error row, ``Type: message`` (a traceback inside reduced to its last line),
    at most ``REASON_MAX_CHARS``."""
    text = str(e)
    if "Traceback (most recent call last)" in text:
        lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
        where = lines[0].rstrip(".") if lines and lines[0].startswith("Caught ") else ""
        text = lines[-1] + (f" ({where})" if where else "")
        line = _one_line(text, type(e).__name__)
    else:
        line = _one_line(f"{type(e).__name__}: {text}", type(e).__name__)
    return line if len(line) <= REASON_MAX_CHARS else line[: REASON_MAX_CHARS - 3] + "..."


@dataclass
class RunRows:
    """One run's rows in memory until ``write_run``; ``skip``/``error`` replace them with one status row.
    ``rank``: a data-parallel rank collecting its own rows; ``rank_rows``: the ranks' rows, written after these."""

    run_id: str
    pipeline: str
    dataset: str
    mode: str
    config: Mapping[str, Any] = field(default_factory=dict)
    rank: int | None = None
    _rows: list[dict[str, Any]] = field(default_factory=list)
    rank_rows: list[dict[str, Any]] = field(default_factory=list)
    steps: list[dict[str, Any]] = field(default_factory=list)
    monitor: list[dict[str, Any]] = field(default_factory=list)
    predictions: list[dict[str, Any]] = field(default_factory=list)
    status: str = "ok"

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")

    def _base(self) -> dict[str, Any]:
        return {
            "schema_version": RESULTS_SCHEMA_VERSION,
            "run_id": self.run_id,
            "pipeline": self.pipeline,
            "dataset": self.dataset,
            "mode": self.mode,
            "rank": self.rank,
        }

    def _ranked(self) -> dict[str, Any]:
        return {} if self.rank is None else {"rank": self.rank}

    def add(self, metric: str, value: float, unit: str, repeat: int | None = None,
            epoch: int | None = None) -> None:
        if self.status != "ok":
            raise RuntimeError(f"run {self.run_id} is already marked {self.status}")
        value = float(value)
        if not math.isfinite(value):
            raise ValueError(f"metric {metric!r} is not finite ({value}); record an error instead")
        self._rows.append({**self._base(), "repeat": repeat, "epoch": epoch, "metric": metric,
                           "value": value, "unit": unit, "status": "ok", "reason": ""})

    def add_steps(self, repeat: int, epoch: int, wait_s: Sequence[float], compute_s: Sequence[float],
                  images: Sequence[int]) -> None:
        """Per-step samples of one measured epoch (kept apart from the rows: ``steps.csv``)."""
        if not len(wait_s) == len(compute_s) == len(images):
            raise ValueError("per-step sample lists differ in length")
        self.steps += [{**self._ranked(), "repeat": repeat, "epoch": epoch, "step": i, "wait_s": w, "compute_s": c, "images": n}
                       for i, (w, c, n) in enumerate(zip(wait_s, compute_s, images, strict=True))]

    def add_monitor_samples(self, repeat: int, samples: Iterable[Sequence[Any]]) -> None:
        """Monitor samples ``(t_s, cores_busy, rss_bytes, gpu_mem_used_bytes, gpu_util_pct)``."""
        cols = ("t_s", "cores_busy", "rss_bytes", "gpu_mem_used_bytes", "gpu_util_pct")
        self.monitor += [{**self._ranked(), "repeat": repeat, **dict(zip(cols, smp, strict=True))} for smp in samples]

    def add_predictions(self, repeat: int, labels: Sequence[int], predictions: Sequence[int]) -> None:
        """One repeat's test predictions, image ``i`` of the evaluation split at position ``i``."""
        if len(labels) != len(predictions):
            raise ValueError(f"{len(labels)} labels but {len(predictions)} predictions")
        self.predictions += [{"repeat": repeat, "image": i, "label": int(y), "prediction": int(p)}
                             for i, (y, p) in enumerate(zip(labels, predictions, strict=True))]

    def unavailable(self, metric: str, unit: str, reason: str, repeat: int | None = None) -> None:
        """One metric cannot be measured here: a ``skip`` row for it with the reason."""
        if self.status != "ok":
            raise RuntimeError(f"run {self.run_id} is already marked {self.status}")
        self._rows.append({**self._base(), "repeat": repeat, "epoch": None, "metric": metric,
                           "value": float("nan"), "unit": unit, "status": "skip",
                           "reason": _one_line(reason, "skip")})

    def _mark(self, status: str, reasons: Mapping[int | None, str]) -> None:
        self.status = status
        self.steps, self.monitor, self.predictions, self.rank_rows = [], [], [], []
        self._rows = [{**self._base(), "rank": rank if rank is not None else self.rank, "repeat": None,
                       "epoch": None, "metric": "run", "value": float("nan"), "unit": "", "status": status,
                       "reason": _one_line(reason, status)} for rank, reason in reasons.items()]

    def skip(self, reason: str) -> None:
        self._mark("skip", {None: reason})

    def error(self, reason: str) -> None:
        self._mark("error", {None: reason})

    def fail_ranks(self, status: str, reasons: Mapping[int | None, str]) -> None:
        """A data-parallel run that did not finish: one ``run`` row per rank in ``reasons``
        (``rank`` column set; None = a row for the whole run), replacing every other row."""
        if status not in ("skip", "error") or not reasons:
            raise ValueError(f"fail_ranks needs status skip|error and at least one reason, got {status!r}")
        self._mark(status, reasons)

    def rows(self) -> list[dict[str, Any]]:
        cfg = flatten_config(self.config)
        return [{**r, **cfg} for r in self._rows] + list(self.rank_rows)


def to_frame(rows: Sequence[Mapping[str, Any]]):
    """Rows -> DataFrame with the core dtypes and the core columns first."""
    import pandas as pd

    df = pd.DataFrame(list(rows))
    for col in CORE_COLUMNS:
        if col not in df.columns:
            df[col] = None
    cfg_cols = sorted(c for c in df.columns if c.startswith(CFG_PREFIX))
    extra = sorted(c for c in df.columns if c not in CORE_COLUMNS and c not in cfg_cols)
    if extra:
        raise ValueError(f"unknown result columns {extra}; add them to the schema or cfg.*")
    df = df[list(CORE_COLUMNS) + cfg_cols]
    return _apply_dtypes(df)


def _apply_dtypes(df):
    import pandas as pd

    for col, dtype in CORE_COLUMNS.items():
        if dtype == "Int64":
            df[col] = pd.to_numeric(df[col], errors="raise").astype("Int64")
        elif dtype == "float64":
            df[col] = pd.to_numeric(df[col], errors="raise").astype("float64")
        else:
            df[col] = df[col].astype("string")
    # An ok row has an empty reason; CSV reads "" back as NA: normalize both ways to "".
    df["reason"] = df["reason"].fillna("")
    return df


def write_run(out: str | Path, run: RunRows) -> Path:
    """Write a finished run's rows atomically and rebuild the merged views (a failure there is a warning);
    returns ``out/runs/<run_id>``."""
    rows = run.rows()
    if not rows:
        raise ValueError(f"run {run.run_id} has no rows; record ok metrics, a skip or an error")
    run_dir = Path(out) / RUNS_DIR / run.run_id
    run_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_json(run_dir / CONFIG_FILE, dict(run.config))
    df = to_frame(rows)
    import pandas as pd

    for records, name in ((run.steps, STEPS_FILE), (run.monitor, MONITOR_FILE),
                          (run.predictions, PREDICTIONS_FILE)):
        if records:
            atomic_write_bytes(run_dir / name, pd.DataFrame(records).to_csv(index=False).encode("utf-8"))
    atomic_write_bytes(run_dir / ROWS_FILE, df.to_csv(index=False).encode("utf-8"))
    try:
        rebuild_views(out)
    except (OSError, InputError) as e:  # the run is recorded; the views only merge the runs (read_results)
        why = f"{e.filename or Path(out) / MERGED_CSV}: {e.strerror or e}" if isinstance(e, OSError) else str(e)
        print(f"inrbench: warning: run {run.run_id} is recorded ({run_dir / ROWS_FILE}), but the merged views were "
              f"not rebuilt: {' '.join(why.split())}; the next run into this folder rebuilds them (rerunning this "
              "one would add a second run)", file=sys.stderr)
    return run_dir


def write_env(run_dir: str | Path, env: Mapping[str, Any] | None = None) -> Path:
    """Write ``env.json`` (``bench.envinfo.collect()`` unless given) atomically into ``run_dir``."""
    if env is None:
        env = envinfo.collect()
    path = Path(run_dir) / ENV_FILE
    atomic_write_json(path, dict(env))
    return path


def _read_rows_csv(path: Path):
    import pandas as pd

    try:
        df = pd.read_csv(path, dtype={c: "string" for c, t in CORE_COLUMNS.items() if t == "string"},
                         keep_default_na=True, low_memory=False)
    except (OSError, ValueError) as e:
        raise InputError(f"cannot read results rows: {e}", path) from None
    _check_records(path)
    versions = set(pd.to_numeric(df.get("schema_version"), errors="coerce").dropna().astype(int)) \
        if "schema_version" in df.columns else set()
    if versions and min(versions) < RESULTS_SCHEMA_VERSION:
        raise older_artifact(path, min(versions), "rerun `inrbench bench`")
    missing = [c for c in CORE_COLUMNS if c not in df.columns]
    if missing:
        raise InputError(f"not a results file (missing columns {missing})", path)
    if versions - {RESULTS_SCHEMA_VERSION}:
        raise InputError(f"results schema_version {sorted(versions)}, this inrbench reads {RESULTS_SCHEMA_VERSION}", path)
    _check_values(df, path)
    return df


# An ok row of the timing protocol's clock readings is a finite number in [0, MAX_MEASURED] (1e308 s
# overflowed the report's ratios); an epoch's time and throughput are > 0 (a zero dropped the run from the
# speedup). Not the monitors' CPU seconds: a process tree's CPU time can shrink as a worker exits.
POSITIVE_METRICS = ("epoch_s", "warmup_epoch_s", "measured_s", "images_per_s", "warmup_images_per_s")
TIMED_METRICS = (*POSITIVE_METRICS, "build_s", "ttfb_s", "time_to_first_batch_s", "first_batch_s", "data_wait_s",
                 "compute_s", "replay_cache_s", "eval_s")
MAX_MEASURED = 1e12
FIX = "delete this run's folder or restore the file"


def _check_values(df, path: Path) -> None:
    """Refuse (one ``InputError`` naming the file and line) a numeric column holding text or a fraction
    where an integer belongs, and an ok row's clock reading that cannot be a measurement."""
    import numpy as np
    import pandas as pd

    for col, dtype in CORE_COLUMNS.items():
        if dtype == "string":
            continue
        num = pd.to_numeric(df[col], errors="coerce")
        bad = df[col].notna() & (num.isna() | ((num % 1 != 0) if dtype == "Int64" else False))
        if bad.any():
            i = int(np.flatnonzero(bad.to_numpy())[0])
            x = df[col].iloc[i]
            shown = repr(x) if isinstance(x, str) else f"{x:g}"
            raise InputError(f"line {i + 2}: {col} {shown} is not {'an integer' if dtype == 'Int64' else 'a number'}; "
                             f"{FIX}", path)
    v = pd.to_numeric(df["value"]).to_numpy(dtype=np.float64)
    ok = df["status"].eq("ok").fillna(False).to_numpy(dtype=bool)
    timed = ok & df["metric"].isin(TIMED_METRICS).fillna(False).to_numpy(dtype=bool) & ~np.isnan(v)
    with np.errstate(invalid="ignore"):
        positive = df["metric"].isin(POSITIVE_METRICS).fillna(False).to_numpy(dtype=bool)
        bad = timed & ((v < 0) | (v > MAX_MEASURED) | (positive & (v == 0)))
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        need = "> 0" if positive[i] else ">= 0"
        raise InputError(f"line {i + 2}: {df['metric'].iloc[i]} {v[i]:g} {df['unit'].iloc[i]} is not a measurement "
                         f"(a finite number {need}, at most {MAX_MEASURED:g}); {FIX}", path)


def _check_records(path: Path) -> None:
    """Refuse a rows.csv cut short or edited out of shape (no final newline, a record of another width)."""
    import csv
    import io

    raw = path.read_bytes()
    if not raw.endswith(b"\n"):
        raise InputError("truncated: the last line ends without a newline (the file was cut short); "
                         "delete this run's folder or restore the file", path)
    try:
        reader = csv.reader(io.StringIO(raw.decode("utf-8", errors="replace")))
        header = next(reader, [])
        for record in reader:
            if len(record) != len(header):
                raise InputError(f"malformed: line {reader.line_num} has {len(record)} fields, the header "
                                 f"{len(header)}; delete this run's folder or restore the file", path)
    except csv.Error as e:
        raise InputError(f"cannot read results rows: {e}", path) from None


def read_results(out: str | Path):
    """Every run's rows under ``out`` (``runs/*/rows.csv``) as one DataFrame; ``InputError`` when there are none
    or a file is not a results file of this schema."""
    import pandas as pd

    out = Path(out)
    if not out.is_dir():
        raise InputError("is a file, not a results folder" if out.exists() else "no such results folder", out)
    files = sorted((out / RUNS_DIR).glob(f"*/{ROWS_FILE}"))
    if not files:
        raise InputError(f"no results (no {RUNS_DIR}/*/{ROWS_FILE}; run `inrbench bench --out {out}`)", out)
    frames, seen = [], {}
    for f in files:
        frames.append(_read_rows_csv(f))
        for rid in frames[-1]["run_id"].dropna().unique():
            if seen.setdefault(rid, f) != f:  # counted twice, it would narrow every interval
                raise InputError(f"holds run {rid}, as {seen[rid]} does (a copied run folder?): a run is "
                                 "counted once; delete one of them", f)
    df = pd.concat(frames, ignore_index=True)
    cfg_cols = sorted(c for c in df.columns if c.startswith(CFG_PREFIX))
    return _apply_dtypes(df[list(CORE_COLUMNS) + cfg_cols].copy())


def check_results(out: str | Path) -> None:
    """The runs already under ``out`` read (``read_results``'s checks): a ``bench`` appending to a folder
    whose rows the views and the report cannot read is refused before it measures, not after."""
    if any((Path(out) / RUNS_DIR).glob(f"*/{ROWS_FILE}")):
        read_results(out)


def rebuild_views(out: str | Path) -> None:
    """Rebuild ``results.csv`` (and ``results.parquet`` with pyarrow) atomically; a cfg.* column Arrow cannot
    hold goes into the parquet view as text."""
    out = Path(out)
    df = read_results(out)
    atomic_write_bytes(out / MERGED_CSV, df.to_csv(index=False).encode("utf-8"))
    try:
        import pyarrow as pa
    except ImportError:
        return
    import io

    for col in df.columns:
        if df[col].dtype == object:
            try:
                pa.array(df[col], from_pandas=True)
            except (pa.ArrowException, OverflowError, TypeError, ValueError):
                df[col] = df[col].astype("string")
    buf = io.BytesIO()
    df.to_parquet(buf, index=False)
    atomic_write_bytes(out / MERGED_PARQUET, buf.getvalue())


def aggregate_rows(df):
    """The rows that describe whole runs: every row of a single-process run, and a data-parallel
    run's aggregate rows (``rank`` <NA>); its per-rank rows are left out."""
    return df[df["rank"].isna()] if "rank" in df.columns else df


def summarize(df, by: Iterable[str] = ("run_id", "pipeline", "dataset", "mode", "rank", "metric", "unit")):
    """Median, quartiles, IQR and count of ``value`` over the ok rows, grouped by ``by``; without ``rank`` in
    ``by``, pass ``aggregate_rows(df)``."""
    by = list(by)
    ok = df[df["status"] == "ok"]
    g = ok.groupby(by, dropna=False, sort=True)["value"]
    res = g.agg(median="median", q25=lambda s: s.quantile(0.25), q75=lambda s: s.quantile(0.75),
                n="count").reset_index()
    res["iqr"] = res["q75"] - res["q25"]
    return res[[*by, "median", "q25", "q75", "iqr", "n"]]
