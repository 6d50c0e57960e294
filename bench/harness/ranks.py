"""Data-parallel runs in the harness: the ranks meet at sync points (``Sync.point``), rank 0 merges
every rank's rows into one run (``merge``, ``AGGREGATE``). Protocol, failures and merged rows:
docs/distributed.md ("How the ranks of a run meet")."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from bench import dist, results
from bench.harness.left import reason_of

if TYPE_CHECKING:
    from bench.harness.epochs import EpochBound

# How an aggregate row (rank <NA>) is made from the ranks' rows of one (repeat, epoch, metric).
#   max: the slowest / largest rank (times: the run waits for it; device memory: what one device needs)
#   sum: totals over the job (images, CPU, host memory of every process)
#   rate: global images/s = sum over ranks of (rate x seconds) / the slowest rank's seconds
#   slowest: the value of the rank whose epoch_s is largest (the split of that epoch's time)
#   mean: over ranks (train_loss: each rank's mean over the same number of steps)
#   same: identical on every rank (all-reduced, or a property of the split): rank 0's, checked equal
AGGREGATE: dict[str, str] = {
    **dict.fromkeys(("epoch_s", "warmup_epoch_s", "ttfb_s", "build_s", "time_to_first_batch_s",
                     "first_batch_s", "replay_cache_s", "eval_s", "measured_s", "measured_epochs", "steps",
                     "resident_device_bytes", "gpu_mem_used_peak_bytes", "gpu_mem_used_start_bytes",
                     "gpu_mem_idle_bytes", "gpu_mem_over_idle_peak_bytes", "torch_peak_allocated_bytes",
                     "torch_peak_reserved_bytes", "model_params", "model_flops_per_image", "expand_stage",
                     "expand_width", "expand_depth"), "max"),
    **dict.fromkeys(("images", "pipeline_batches", "replay_cached_batches", "resident_host_bytes",
                     "cpu_seconds", "cpu_cores_busy", "cpu_cores_busy_max", "monitor_cpu_seconds",
                     "host_rss_peak_bytes", "host_pss_peak_bytes"), "sum"),
    "images_per_s": "rate", "warmup_images_per_s": "rate", "images_per_cpu_s": "per_cpu",
    "data_wait_s": "slowest", "compute_s": "slowest",
    "train_loss": "mean", "gpu_util_mean_pct": "mean",
    **dict.fromkeys(("test_acc", "test_loss", "test_images", "epoch_test_acc", "dataset_bytes_per_image"), "same"),
}
RATE_SECONDS = {"images_per_s": "epoch_s", "warmup_images_per_s": "warmup_epoch_s"}


class PeerStopped(Exception):
    """Another rank finished its run (failed or skipped) and sent its result at this sync point."""


@dataclass(frozen=True)
class DistConfig:
    """A data-parallel run's shape, saved with every row (``cfg.dist.*``) and in ``env.json``;
    ``hosts[r]`` / ``local_ranks[r]``: rank r's hostname and its rank on that host."""

    world_size: int
    backend: str
    nnodes: int
    local_world_size: int
    hosts: tuple[str, ...]
    local_ranks: tuple[int, ...]
    timeout_s: float

    def __post_init__(self) -> None:
        if self.world_size < 2:
            raise ValueError(f"a data-parallel run has world_size >= 2, got {self.world_size}")
        if len(self.hosts) != self.world_size or len(self.local_ranks) != self.world_size:
            raise ValueError(f"{len(self.hosts)} hosts / {len(self.local_ranks)} local ranks for "
                             f"{self.world_size} ranks")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class RankResult:
    """What one rank sends at the end: its status and, when ok, its rows and samples."""

    rank: int
    status: str  # ok | skip | error
    exit_code: int
    reason: str = ""
    input_error: bool = False
    rows: list[dict[str, Any]] = field(default_factory=list)  # RunRows.rows() (config flattened in)
    steps: list[dict[str, Any]] = field(default_factory=list)
    monitor: list[dict[str, Any]] = field(default_factory=list)
    predictions: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def of(cls, rank: int, run: results.RunRows, exit_code: int, input_error: bool = False) -> RankResult:
        return cls(rank, run.status, exit_code, reason_of(run), input_error, run.rows(), run.steps, run.monitor,
                   run.predictions)


@dataclass
class _Point:
    value: Any


class Sync:
    """The ranks' meeting points; in a single process every call is local."""

    def __init__(self, rank: int = 0, world_size: int = 1):
        self.rank, self.world_size = rank, world_size
        self.results: list[Any] | None = None  # what the final gather brought, once known
        self.broken: str | None = None  # why the group can no longer be used
        self.ddp = False  # a DDP model exists: between points, peers may be inside its collectives

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    def _gather(self, obj: Any) -> list[Any]:
        if self.broken is not None:
            raise RuntimeError(f"the process group failed earlier: {self.broken}")
        try:
            return dist.all_gather_object(obj)
        except Exception as e:
            self.broken = results.exception_reason(e)
            raise

    def point(self, value: Any = None) -> list[Any]:
        """Meet every rank; the list of their ``value``s in rank order. ``PeerStopped`` when a rank
        has finished instead (its result is kept for ``finish``)."""
        if not self.distributed:
            return [value]
        got = self._gather(_Point(value))
        if any(not isinstance(g, _Point) for g in got):
            self.results = got
            done = [g.rank for g in got if isinstance(g, RankResult)]
            raise PeerStopped(f"rank {', '.join(map(str, done))} stopped")
        return [g.value for g in got]

    def finish(self, mine: RankResult) -> list[RankResult | None]:
        """Every rank's final result, in rank order (None: a rank that stopped because a peer did,
        or one that could not be heard from when the group failed)."""
        if not self.distributed:
            return [mine]
        if self.results is None and self.broken is None:
            try:
                self.results = self._gather(mine)
            except Exception:
                pass
        if self.results is None:
            return [mine if r == self.rank else None for r in range(self.world_size)]
        return [g if isinstance(g, RankResult) else None for g in self.results]

    def announce(self, outcome: Any) -> Any:
        """Rank 0's ``outcome`` on every rank (after it wrote the run); local when the group failed."""
        if not self.distributed or self.broken is not None:
            return outcome

        try:
            return dist.broadcast_object(outcome)
        except Exception as e:
            self.broken = results.exception_reason(e)
            return outcome


# ----------------------------------------------------------------------------- merging

def merge(run: results.RunRows, ranks: Sequence[RankResult | None], broken: str | None = None,
          bound: EpochBound | None = None) -> tuple[int, str | None]:
    """Fill ``run`` (rank 0's config, ``rank`` None) from every rank's result; (exit code, the
    input-error message if a rank failed on bad input). ``bound``: the most images an epoch of all
    ranks may hold (``epochs.EpochBound``; None: not checked)."""
    world = len(ranks)
    failed = {r.rank: r for r in ranks if r is not None and r.status == "error"}
    if broken is not None:
        for k, r in enumerate(ranks):
            if r is None:
                failed[k] = RankResult(k, "error", 1, f"no result: the process group failed ({broken})")
    if failed:
        run.fail_ranks("error", {k: f"rank {k}: {failed[k].reason}" for k in sorted(failed)})
        first = failed[min(failed)]
        bad_input = next((f for _, f in sorted(failed.items()) if f.input_error), None)
        return first.exit_code, (f"rank {bad_input.rank}: {bad_input.reason}" if bad_input else None)
    skipped = {r.rank: r for r in ranks if r is not None and r.status == "skip"}
    if skipped:
        reasons = {r.reason for r in skipped.values()}
        if len(skipped) == world and len(reasons) == 1:
            run.fail_ranks("skip", {None: reasons.pop()})
        else:
            run.fail_ranks("skip", {k: f"rank {k}: {skipped[k].reason}" for k in sorted(skipped)})
        return 0, None
    if any(r is None for r in ranks):  # nobody failed, yet someone stopped: cannot happen unless broken
        run.fail_ranks("error", {k: f"rank {k}: no result" for k, r in enumerate(ranks) if r is None})
        return 1, None
    oks: list[RankResult] = [r for r in ranks if r is not None]
    overrun = bound.check([r.rows for r in oks]) if bound is not None else None
    if overrun is not None:  # the ranks did not shard the split: no throughput is reported
        run.fail_ranks("error", {None: overrun})
        return 1, None
    for row in aggregate([r.rows for r in oks]):
        if row["status"] == "ok":
            run.add(row["metric"], row["value"], row["unit"], repeat=row["repeat"], epoch=row["epoch"])
        else:
            run.unavailable(row["metric"], row["unit"], row["reason"], repeat=row["repeat"])
    run.rank_rows = [row for r in oks for row in r.rows]
    run.steps = [s for r in oks for s in r.steps]
    run.monitor = [s for r in oks for s in r.monitor]
    run.predictions = list(oks[0].predictions)
    return 0, None


def _key(row: dict[str, Any]) -> tuple[Any, Any]:
    def norm(v: Any) -> Any:
        return None if v is None or (isinstance(v, float) and math.isnan(v)) else int(v)

    return norm(row["repeat"]), norm(row["epoch"])


def aggregate(per_rank: Sequence[Sequence[dict[str, Any]]]) -> list[dict[str, Any]]:
    """The aggregate rows of ranks' ok runs: a metric with an ``AGGREGATE`` rule measured ok on every rank at
    that repeat/epoch; on some ranks only, or skipped on any -> a skip row saying which."""
    world = len(per_rank)
    cells: dict[tuple[Any, Any, str], dict[int, dict[str, Any]]] = defaultdict(dict)
    for k, rows in enumerate(per_rank):
        for row in rows:
            if row["metric"] != "run":
                cells[(*_key(row), row["metric"])][k] = row
    ok = {key: {k: float(r["value"]) for k, r in by.items() if r["status"] == "ok"} for key, by in cells.items()}
    out = []
    for (rep, ep, metric), by in cells.items():
        rule = AGGREGATE.get(metric)
        if rule is None:
            continue
        unit = next(iter(by.values()))["unit"]
        vals = ok[(rep, ep, metric)]
        if len(vals) < world:
            skip = next((r for r in by.values() if r["status"] == "skip"), None)
            why = (f"rank {skip['rank']}: {skip['reason']}" if skip is not None
                   else f"measured on rank(s) {sorted(vals)} of {world} only")
            out.append(_row(rep, ep, metric, float("nan"), unit, "skip", why))
            continue
        value = _combine(rule, metric, vals, lambda m, rep=rep, ep=ep: ok.get((rep, ep, m), {}),
                         lambda m, rep=rep: _repeat_sum(ok, rep, m))
        if value is None:
            out.append(_row(rep, ep, metric, float("nan"), unit, "skip",
                            f"cannot aggregate {metric} over {world} ranks (a companion metric is missing, "
                            "or an all-reduced value differs across ranks)"))
        else:
            out.append(_row(rep, ep, metric, value, unit, "ok", ""))
    return out


def _repeat_sum(ok: dict[tuple[Any, Any, str], dict[int, float]], rep: Any, metric: str) -> dict[int, float]:
    """Per rank: ``metric`` summed over every epoch of repeat ``rep``."""
    tot: dict[int, float] = defaultdict(float)
    for (r, _, m), vals in ok.items():
        if r == rep and m == metric:
            for k, v in vals.items():
                tot[k] += v
    return dict(tot)


def _combine(rule: str, metric: str, vals: dict[int, float], same_cell, same_repeat) -> float | None:
    ranks = sorted(vals)
    if rule == "max":
        return max(vals.values())
    if rule == "sum":
        return sum(vals.values())
    if rule == "mean":
        return sum(vals.values()) / len(vals)
    if rule == "same":
        v0 = vals[ranks[0]]
        if any(not math.isclose(v, v0, rel_tol=1e-9, abs_tol=1e-12) for v in vals.values()):
            return None  # all-reduced values that differ: not aggregated (a skip row says so)
        return v0
    if rule == "rate":
        secs = same_cell(RATE_SECONDS[metric])
        if set(secs) != set(vals) or max(secs.values()) <= 0:
            return None
        return sum(vals[k] * secs[k] for k in ranks) / max(secs.values())
    if rule == "slowest":
        secs = same_cell("epoch_s")
        if set(secs) != set(vals):
            return None
        return vals[max(ranks, key=lambda k: secs[k])]
    if rule == "per_cpu":  # total measured images / total CPU seconds of the repeat
        images, cpu = same_repeat("images"), same_cell("cpu_seconds")
        if set(images) != set(vals) or set(cpu) != set(vals) or sum(cpu.values()) <= 0:
            return None
        return sum(images.values()) / sum(cpu.values())
    raise ValueError(f"unknown aggregation rule {rule!r}")


def _row(rep: Any, ep: Any, metric: str, value: float, unit: str, status: str, reason: str) -> dict[str, Any]:
    return {"repeat": rep, "epoch": ep, "metric": metric, "value": value, "unit": unit, "status": status,
            "reason": reason}
