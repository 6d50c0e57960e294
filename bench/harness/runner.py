"""The runner: one config, one mode, R repeats on one timing protocol (docs/measurement.md), rows into
the results store.

Per repeat, with a fresh pipeline (and model): ``build_s``; resident and ``dataset_bytes_per_image``
rows (untimed); ``ttfb_s`` (``iter()`` to the first batch on the device) and ``time_to_first_batch_s`` =
``build_s + ttfb_s``; ``warmup`` epochs; then measured epochs inside the monitors, ``epochs`` of them and
more until they add up to ``min_seconds`` (autorange: their updates are discarded before evaluation);
per epoch ``epoch_s``, ``images_per_s``, the wait/compute split (with ``step_sync``) and ``train_loss``;
per repeat the monitor metrics and ``images_per_cpu_s``; in train mode ``test_acc`` on the original
pixels and per-image predictions. ``loader``: pipeline, no step; ``replay``: cached batches, train step;
``train``: pipeline, train step.

Data parallel (``cfg.dist``, under torchrun): every rank runs the protocol on its shard, epochs start
together, rank 0 merges and writes one run (``bench.harness.ranks``). ``INRBENCH_TEST_FAIL_RANK=R[:kill]``
is a test hook (``_injected_failure``).

Outcomes: ``Unavailable`` -> a skip row, exit 0; out of memory -> an error row, exit 3; an epoch bound
overrun or any other exception -> an error row, exit 1; ``InputError`` -> an error row, exit 2. Rows are
written together at the end, so a failed run never leaves partial rows.
"""

from __future__ import annotations

import dataclasses
import gc
import math
import os
import signal
import sys
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pipelines
from bench import dist, envinfo, results
from bench.datasets.prepared import open_prepared
from bench.devices import resolve_device
from bench.errors import InputError, is_out_of_memory
from bench.harness import left, monitors
from bench.harness.epochs import EpochBound
from bench.harness.monitors import Monitor
from bench.harness.ranks import DistConfig, PeerStopped, RankResult, Sync, merge
from bench.harness.replay import CountingSource, ReplayBatches, cache_batches
from bench.harness.timing import DeviceClock, EpochTiming, clock_for, timed_epoch
from bench.outputs import claim
from bench.train.backbones import create_backbone
from bench.train.evaluate import evaluate
from bench.train.expand import ExpandConfig
from bench.train.loop import TrainConfig
from bench.train.trainers import check_method, create_trainer
from pipelines.base import PipelineConfig, Unavailable

DATASET_BYTES = "dataset_bytes_per_image"

EXIT_OK, EXIT_ERROR, EXIT_INPUT, EXIT_OOM = 0, 1, 2, 3
AUTORANGE_MAX_EPOCHS = 10_000  # per repeat: a bound on the autorange whatever min_seconds says
RUN_ID_ENV = "INRBENCH_RUN_ID"  # set by ``inrbench bench --nproc`` for the ranks it launches
_exit = os._exit  # how a rank leaves at once (``_leave_if_peers_may_wait``; tests replace it)


@dataclass(frozen=True)
class BenchConfig:
    """One ``inrbench bench`` run, fully resolved (no "auto" left), saved with every row."""

    pipeline: str
    data: str
    mode: str = "loader"
    store: str | None = None
    epochs: int = 1
    warmup: int = 1
    repeats: int = 3
    min_seconds: float = 0.0  # measured seconds per repeat at least (autorange: more epochs)
    pipe: PipelineConfig = field(default_factory=PipelineConfig)
    backbone: str = "small-cnn"
    train: TrainConfig = field(default_factory=TrainConfig)
    eval_split: str = "test"
    replay_batches: int = 16
    step_sync: bool = True
    monitor_period_s: float = 0.1
    pss_period_s: float = 1.0
    torch_threads: int | None = None  # torch intra-op threads for the run; None = torch's default
    method: str = "dense"  # training method (bench.train.trainers registry)
    expand: ExpandConfig | None = None  # the method's schedule (method expand)
    eval_every_epoch: bool = False  # train: test accuracy after every scheduled epoch (untimed)
    dist: DistConfig | None = None  # data parallel: world size, backend, topology (None: one process)

    def __post_init__(self) -> None:
        if self.mode not in results.MODES:
            raise ValueError(f"mode must be one of {'|'.join(results.MODES)}, got {self.mode!r}")
        for name in ("epochs", "repeats", "replay_batches"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.torch_threads is not None and self.torch_threads < 1:
            raise ValueError(f"torch_threads must be >= 1, got {self.torch_threads}")
        if self.warmup < 0:
            raise ValueError(f"warmup must be >= 0, got {self.warmup}")
        check_method(self.method, self.expand, self.warmup + self.epochs)
        if self.method != "dense" and self.mode == "loader":
            raise ValueError(f"--method {self.method} trains a model: it needs --mode replay or train, not loader")
        if not self.min_seconds >= 0:
            raise ValueError(f"min_seconds must be >= 0, got {self.min_seconds}")
        if not (0 < self.monitor_period_s < float("inf") and 0 < self.pss_period_s < float("inf")):
            raise ValueError(f"monitor periods must be > 0 and finite, got {self.monitor_period_s}, {self.pss_period_s}")
        world = self.dist.world_size if self.dist is not None else 1
        if self.pipe.world_size != world:
            raise ValueError(f"pipe.world_size {self.pipe.world_size} but the run has {world} process(es)")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @property
    def dataset(self) -> str:
        return Path(self.data).resolve().name


@dataclass
class RunOutcome:
    run_id: str
    run_dir: Path
    status: str  # ok | skip | error
    exit_code: int
    rows: results.RunRows
    input_error: InputError | None = None
    broken: str | None = None  # data parallel: why the process group failed (None: it still works)


def run_bench(cfg: BenchConfig, out: str | Path, clock: DeviceClock | None = None) -> RunOutcome:
    """Run ``cfg`` and write its ``env.json``, ``config.json`` and rows (``rows.csv`` last: the run is done)
    under ``out``, claimed first (``bench.outputs``). Data parallel: every rank calls it, rank 0 writes."""
    monitors.forget_idle()  # this run's repeats share one idle baseline
    if cfg.torch_threads is None:  # record the count torch ran with
        import torch

        cfg = dataclasses.replace(cfg, torch_threads=torch.get_num_threads())
    sync = _sync_for(cfg)
    out, run_id = _start(cfg, out, sync)
    rows = results.RunRows(run_id, cfg.pipeline, cfg.dataset, cfg.mode, cfg.to_dict(),
                           rank=cfg.pipe.rank if sync.distributed else None)
    if not sync.distributed:
        return _run(cfg, out, rows, sync, clock)
    # torchrun stopping this rank (another one exited first) leaves a record in the run folder
    with left.on_sigterm(out, rows, sync.rank, lambda: sync.broken, lambda c: _exit(c)):
        return _run(cfg, out, rows, sync, clock)


def _run(cfg: BenchConfig, out: Path, rows: results.RunRows, sync: Sync, clock: DeviceClock | None) -> RunOutcome:
    """``run_bench`` once ``out`` is claimed and the run id drawn: the repeats, then the rows."""
    code, input_error = EXIT_OK, None
    bound: EpochBound | None = None
    threads = _set_threads(cfg.torch_threads)
    try:
        data = open_prepared(cfg.data)
        # checksum the splits now (cached per process), not inside repeat 0's timed build
        for name in dict.fromkeys((cfg.pipe.split, *((cfg.eval_split,) if cfg.mode == "train" else ()))):
            data.split(name)
        bound = EpochBound.of(cfg.pipeline, len(data.split(cfg.pipe.split)), cfg.pipe)
        import torch  # a CUDA device on a machine without CUDA: a skip row (a bad spec: bad input)

        if resolve_device(cfg.pipe.device, missing_cuda_ok=True).startswith("cuda") and not torch.cuda.is_available():
            raise Unavailable(f"device {cfg.pipe.device} requested but torch.cuda.is_available() is False here")
        clock = clock or clock_for(cfg.pipe.device)
        for r in range(cfg.repeats):
            _repeat(cfg, data, rows, r, clock, sync)
        overrun = None if sync.distributed else bound.check([rows._rows])  # data parallel: at the merge
        if overrun is not None:
            rows.error(overrun)
            code = EXIT_ERROR
    except PeerStopped as e:  # another rank failed: its row says why; this rank's rows are dropped
        rows.error(f"stopped: {e}")
    except Unavailable as e:
        rows.skip(f"unavailable: {e}")
    except InputError as e:
        rows.error(f"bad input: {e}")
        code, input_error = EXIT_INPUT, e
        if _peers_may_wait(cfg, sync):  # leaving now: nobody else will print the reason
            print(f"inrbench: error: {e}", file=sys.stderr)
        _leave_if_peers_may_wait(cfg, sync, code, out, rows)
    except Exception as e:  # a crash or an OOM in this run: an error row, never partial rows
        code = EXIT_OOM if is_out_of_memory(e) else EXIT_ERROR
        rows.error(f"{'out of memory: ' if code == EXIT_OOM else ''}{results.exception_reason(e)}")
        if code == EXIT_OOM:  # sizes beyond the machine: one line, no traceback (the row says it too)
            print(f"inrbench: error: out of memory: {results.exception_reason(e)}", file=sys.stderr)
        else:
            traceback.print_exc(file=sys.stderr)
        _leave_if_peers_may_wait(cfg, sync, code, out, rows)
    finally:
        _set_threads(threads)
        try:  # a sticky CUDA error raised again here becomes one warning line
            _free_device_memory(cfg.pipe.device)
        except Exception as e:
            print(f"inrbench: warning: freeing device memory after the run failed: {results.exception_reason(e)}",
                  file=sys.stderr)
    if not sync.distributed:
        results.write_env(Path(out) / results.RUNS_DIR / rows.run_id)
        run_dir = results.write_run(out, rows)
        return RunOutcome(rows.run_id, run_dir, rows.status, code, rows, input_error)
    return _finish_distributed(cfg, out, rows, code, input_error, sync, bound)


def _sync_for(cfg: BenchConfig) -> Sync:
    """This process's sync points; a data-parallel config needs the process group to exist."""
    if cfg.dist is None:
        return Sync()
    if not dist.active():
        raise InputError(f"this config is a data-parallel run of {cfg.dist.world_size} processes: run it "
                         "under torchrun (inrbench bench --nproc N)")
    import torch.distributed as tdist

    if tdist.get_world_size() != cfg.dist.world_size or tdist.get_rank() != cfg.pipe.rank:
        raise InputError(f"config rank {cfg.pipe.rank} of {cfg.dist.world_size}, but this process is rank "
                         f"{tdist.get_rank()} of {tdist.get_world_size()}")
    return Sync(cfg.pipe.rank, cfg.dist.world_size)


def _start(cfg: BenchConfig, out: str | Path, sync: Sync) -> tuple[Path, str]:
    """Rank 0 checks/claims ``out`` and draws the run id; every rank gets both (or the InputError)."""
    if not sync.distributed:
        return _claim_results(cfg, out), results.new_run_id(cfg.pipeline, cfg.mode)
    got: tuple[str | None, str | None] = (None, None)
    if sync.rank == 0:
        try:  # the id ``inrbench bench --nproc`` drew (it writes an error row if no rank writes the run)
            got = (str(_claim_results(cfg, out)), os.environ.get(RUN_ID_ENV) or results.new_run_id(cfg.pipeline, cfg.mode))
        except InputError as e:
            got = (None, str(e))
    claimed, run_id = dist.broadcast_object(got)
    if claimed is None:
        raise InputError(run_id or "results folder refused on rank 0")
    return Path(claimed), str(run_id)


def _peers_may_wait(cfg: BenchConfig, sync: Sync) -> bool:
    """NCCL with a DDP model alive and the group not already broken (``_leave_if_peers_may_wait``)."""
    return bool(sync.distributed and sync.ddp and sync.broken is None and cfg.dist is not None
                and cfg.dist.backend == "nccl")


def _leave_if_peers_may_wait(cfg: BenchConfig, sync: Sync, code: int, out: Path, rows: results.RunRows) -> None:
    """On NCCL, a rank that failed while a DDP model exists leaves at once (``os._exit``), after recording
    its exit code (``dist.STATUS_DIR_ENV``) and reason (``left.record``): its peers may be inside DDP's
    all-reduce, which NCCL would pair with the final gather and hang until ``--dist-timeout``."""
    if not _peers_may_wait(cfg, sync):
        return
    status_dir = os.environ.get(dist.STATUS_DIR_ENV)
    if status_dir:
        try:
            (Path(status_dir) / f"rank{sync.rank}").write_text(str(code))
        except OSError:
            pass
    try:
        run_dir = left.record(out, rows, sync.rank, code, left.reason_of(rows))
        where = f"why is recorded in {run_dir}"
    except Exception as e:  # leaving anyway: say why nothing was recorded
        where = f"recording why failed: {results.exception_reason(e)}"
    print(f"inrbench: rank {sync.rank}: failed while DDP's collectives may be in flight on NCCL: leaving "
          f"now so that torchrun stops the other ranks ({where})", file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    _exit(code)


def _finish_distributed(cfg: BenchConfig, out: Path, rows: results.RunRows, code: int,
                        input_error: InputError | None, sync: Sync, bound: EpochBound | None) -> RunOutcome:
    """Every rank's result to rank 0, which merges (checking ``bound``) and writes; its outcome to all."""
    assert cfg.dist is not None
    mine = RankResult.of(sync.rank, rows, code, input_error is not None)
    every = sync.finish(mine)
    announced: tuple[str, str, int, str | None] = ("", "error", EXIT_ERROR, None)
    merged = rows
    try:
        if sync.rank == 0:
            merged = results.RunRows(rows.run_id, cfg.pipeline, cfg.dataset, cfg.mode, cfg.to_dict())
            code, bad_input = merge(merged, every, sync.broken, bound)
            run_dir = Path(out) / results.RUNS_DIR / merged.run_id
            with left.rank0_writes(run_dir):  # replaces rows written from left records (bench.harness.left)
                d = cfg.dist  # env.json's ``distributed`` section: the topology, each rank's host
                results.write_env(run_dir, envinfo.collect(distributed={
                    "world_size": d.world_size, "backend": d.backend, "nnodes": d.nnodes,
                    "local_world_size": d.local_world_size, "timeout_s": d.timeout_s,
                    "ranks": [{"rank": r, "hostname": h, "local_rank": lr}
                              for r, (h, lr) in enumerate(zip(d.hosts, d.local_ranks, strict=True))]}))
                results.write_run(out, merged)
            announced = (str(run_dir), merged.status, code, bad_input)
    finally:
        announced = sync.announce(announced)
    if sync.rank != 0 and sync.broken is not None:  # rank 0 may never have heard from this rank: say why
        why = left.reason_of(rows) or f"its result may not have reached rank 0: the process group failed ({sync.broken})"
        try:
            left.record(out, rows, sync.rank, code, why)
        except Exception as e:
            print(f"inrbench: rank {sync.rank}: could not record why it left: {results.exception_reason(e)}",
                  file=sys.stderr)
    run_dir, status, code, bad_input = announced
    if sync.rank != 0:
        merged = results.RunRows(rows.run_id, cfg.pipeline, cfg.dataset, cfg.mode, cfg.to_dict(),
                                 rank=sync.rank)
        merged.status = status
    return RunOutcome(rows.run_id, Path(run_dir), status, code, merged,
                      InputError(bad_input) if bad_input else None, sync.broken)


def _claim_results(cfg: BenchConfig, out: str | Path) -> Path:
    """Check ``out`` and create/mark it as a results folder (appended to; concurrent runs are fine)."""
    with claim(out, "results", inputs={"prepared dataset (--data)": cfg.data, "store (--store)": cfg.store},
               mode="append", lock=False) as p:
        results.check_results(p)
        return p


def _set_threads(n: int | None) -> int:
    """Set torch's intra-op threads (if ``n``); returns the previous count."""
    import torch

    prev = torch.get_num_threads()
    if n is not None:
        torch.set_num_threads(n)
    return prev


def _free_device_memory(device: str) -> None:
    """After a CUDA run (an OOM above all): drop cached blocks so the next run starts clean."""
    import torch

    if torch.device(device).type == "cuda" and torch.cuda.is_available():
        gc.collect()
        if torch.cuda.is_initialized():  # else nothing is cached, and resetting raises
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(torch.device(device))


def _repeat(cfg: BenchConfig, data: Any, rows: results.RunRows, r: int, clock: DeviceClock,
            sync: Sync | None = None) -> None:
    """One repeat: build, first batch, warm-up, measured epochs under the monitors, eval."""
    sync = sync or Sync()
    _free_device_memory(cfg.pipe.device)  # nothing of the previous repeat/run stays cached
    sync.point()  # every rank builds its pipeline together
    mon = Monitor(cfg.pipe.device, cfg.monitor_period_s, pss_period_s=cfg.pss_period_s).start()
    try:
        _repeat_body(cfg, data, rows, r, clock, mon, sync)
    finally:
        mon.close()


def _repeat_body(cfg: BenchConfig, data: Any, rows: results.RunRows, r: int, clock: DeviceClock,
                 mon: Monitor, sync: Sync) -> None:
    t0 = clock.now()
    pipe = pipelines.create(cfg.pipeline, data, cfg.pipe, store=Path(cfg.store) if cfg.store else None)
    try:
        rows.add("build_s", (clock.now() - t0) / 1e9, "s", repeat=r)
        held = pipe.resident_bytes()
        rows.add("resident_device_bytes", held.get("device", 0), "bytes", repeat=r)
        rows.add("resident_host_bytes", held.get("host", 0), "bytes", repeat=r)
        _add_dataset_bytes(rows, pipe, r)
        counted = CountingSource(pipe)
        steps_per_epoch = len(pipe)
        source: Any = counted
        if cfg.mode == "replay":
            source = ReplayBatches(_replay_cache(cfg, counted, clock, rows, r), steps_per_epoch)
            pipe.close()  # nothing can be decoded from here on
            _free_device_memory(cfg.pipe.device)
        trainer = None
        if cfg.mode != "loader":
            sync.point()  # DDP's constructor is a collective
            sync.ddp = True  # until the repeat's evaluation is done
            trainer = _trainer(cfg, data, steps_per_epoch)
        # loader mode: no step, the batch is already on the device (the clock's sync waits for it)
        step = trainer.step if trainer is not None else (lambda batch: None)
        for e in range(cfg.warmup):
            sync.point()  # the ranks' epochs start together
            t = _epoch(cfg, source, step, clock, rows, r, e)
            rows.add("warmup_epoch_s", t.seconds, "s", repeat=r, epoch=e)
            rows.add("warmup_images_per_s", t.images_per_s, "img/s", repeat=r, epoch=e)
            _add_loss(rows, trainer, r, e, cfg, data, sync)
        _measure(cfg, source, counted, step, trainer, clock, rows, r, mon=mon, data=data, sync=sync)
        got = {row["metric"]: row["value"] for row in rows._rows  # time_to_first_batch_s = build_s + ttfb_s
               if row["repeat"] == r and row["metric"] in ("build_s", "ttfb_s") and row["status"] == "ok"}
        if len(got) == 2:
            rows.add("time_to_first_batch_s", got["build_s"] + got["ttfb_s"], "s", repeat=r)
        if cfg.mode == "train":
            sync.point()  # evaluation all-reduces
            _add_eval(cfg, data, trainer, clock, rows, r)
        sync.ddp = False
    finally:
        pipe.close()


def _add_dataset_bytes(rows: results.RunRows, pipe: Any, r: int) -> None:
    """``Pipeline.dataset_bytes_per_image`` (the report's bytes/image), or a skip row saying why not."""
    value = pipe.dataset_bytes_per_image()
    if value is None:
        rows.unavailable(DATASET_BYTES, "bytes", "the pipeline does not state its bytes per image "
                         "(Pipeline.dataset_bytes_per_image)", repeat=r)
    elif not (math.isfinite(value) and value > 0):
        rows.unavailable(DATASET_BYTES, "bytes", f"the pipeline states {value} bytes per image, "
                         "not a positive number", repeat=r)
    else:
        rows.add(DATASET_BYTES, float(value), "bytes", repeat=r)


def _epoch(cfg: BenchConfig, source: Any, step: Any, clock: DeviceClock, rows: results.RunRows,
           r: int, e: int) -> EpochTiming:
    """One timed epoch; the repeat's first epoch also gives ``ttfb_s`` (replay took it earlier)."""
    t = timed_epoch(source, step, clock, cfg.step_sync)
    if t.steps == 0:
        raise RuntimeError(f"epoch {e} of repeat {r} yielded no batch")
    if e == 0 and cfg.mode != "replay":
        rows.add("ttfb_s", (t.ttfb_ns or 0) / 1e9, "s", repeat=r)
    return t


def _injected_failure(cfg: BenchConfig, r: int, n: int) -> None:
    """Test hook: ``INRBENCH_TEST_FAIL_RANK=R`` makes rank R raise (``R:kill``: SIGKILL itself) before
    repeat 0's first measured epoch."""
    want = os.environ.get("INRBENCH_TEST_FAIL_RANK")
    if want is None or r != 0 or n != 0:
        return
    rank, _, how = want.strip().partition(":")
    if rank == str(cfg.pipe.rank):
        if how == "kill":  # as an OOM killer would
            os.kill(os.getpid(), signal.SIGKILL)
        raise RuntimeError(f"injected failure on rank {cfg.pipe.rank} (INRBENCH_TEST_FAIL_RANK)")


def _measure(cfg: BenchConfig, source: Any, counted: CountingSource, step: Any, trainer: Any,
             clock: DeviceClock, rows: results.RunRows, r: int, mon: Monitor | None = None,
             data: Any = None, sync: Sync | None = None) -> None:
    """The measured epochs (``epochs``, then autorange to ``min_seconds``) inside the monitors, then their
    rows. The model's state after the scheduled epochs is kept on the CPU (a device copy would count in
    the memory peak) and restored. Each epoch's sync point shares the slowest rank's seconds."""
    sync = sync or Sync()
    if mon is not None:  # started before the build (``_repeat``): only mark the region
        mon.mark()
    else:
        mon = Monitor(cfg.pipe.device, cfg.monitor_period_s, pss_period_s=cfg.pss_period_s).start()
    images, measured_s, n, scheduled = 0, 0.0, 0, None
    try:
        while True:
            _injected_failure(cfg, r, n)
            slowest_s = max(sync.point(measured_s))
            if not (n < cfg.epochs or (slowest_s < cfg.min_seconds and n < AUTORANGE_MAX_EPOCHS)):
                break
            if n == cfg.epochs and cfg.mode == "train":  # past the schedule: timing only
                scheduled = {k: v.detach().to("cpu", copy=True) for k, v in trainer.model.state_dict().items()}
            e = cfg.warmup + n
            drawn = counted.drawn
            t = _epoch(cfg, source, step, clock, rows, r, e)
            images += t.images
            measured_s += t.seconds
            n += 1
            _add_epoch(rows, t, r, e, counted.drawn - drawn, cfg.step_sync)
            _add_loss(rows, trainer, r, e, cfg, data, sync)
    finally:
        mres = mon.stop()
    if scheduled is not None:
        trainer.model.load_state_dict(scheduled)
    rows.add("measured_epochs", n, "1", repeat=r)
    rows.add("measured_s", measured_s, "s", repeat=r)
    for metric, value, unit in mres.metrics():
        rows.add(metric, value, unit, repeat=r)
    if mres.cpu_seconds > 0:  # CPU cost per image: robust to other jobs stealing the cores
        rows.add("images_per_cpu_s", images / mres.cpu_seconds, "img/cpu-s", repeat=r)
    else:
        rows.unavailable("images_per_cpu_s", "img/cpu-s", "no CPU time measured (region shorter "
                         "than the kernel's CPU accounting tick)", repeat=r)
    for metric, unit, reason in mres.unavailable:
        rows.unavailable(metric, unit, reason, repeat=r)
    rows.add_monitor_samples(r, mres.samples)


def _replay_cache(cfg: BenchConfig, counted: CountingSource, clock: DeviceClock,
                  rows: results.RunRows, r: int) -> list[Any]:
    """replay: one whole pipeline epoch (never an abandoned iterator) keeping clones of its first
    ``replay_batches`` batches; its first batch gives ``ttfb_s``."""
    cached: list[Any] = []

    def keep(batch: Any) -> None:
        if len(cached) < cfg.replay_batches:
            cached.extend(cache_batches([batch], 1))

    t = timed_epoch(counted, keep, clock, step_sync=False)
    if not cached:
        raise RuntimeError("the pipeline yielded no batch to cache for replay")
    rows.add("ttfb_s", (t.ttfb_ns or 0) / 1e9, "s", repeat=r)
    rows.add("replay_cache_s", t.seconds, "s", repeat=r)
    rows.add("replay_cached_batches", len(cached), "1", repeat=r)
    return cached


def _trainer(cfg: BenchConfig, data: Any, steps_per_epoch: int) -> Any:
    import torch

    torch.manual_seed(cfg.pipe.seed)  # the same seed on every rank (DDP also broadcasts rank 0's weights)
    model = create_backbone(cfg.backbone, data.num_classes)
    dev = torch.device(cfg.pipe.device)
    if dev.type == "cuda":
        torch.backends.cudnn.benchmark = True
    return create_trainer(cfg.method, model, cfg.train, dev,
                          total_steps=steps_per_epoch * (cfg.warmup + cfg.epochs), method_config=cfg.expand,
                          ddp=cfg.dist is not None)


def _add_epoch(rows: results.RunRows, t: EpochTiming, r: int, e: int, drawn: int, step_sync: bool) -> None:
    rows.add("epoch_s", t.seconds, "s", repeat=r, epoch=e)
    rows.add("images_per_s", t.images_per_s, "img/s", repeat=r, epoch=e)
    rows.add("images", t.images, "1", repeat=r, epoch=e)
    rows.add("steps", t.steps, "1", repeat=r, epoch=e)
    rows.add("pipeline_batches", drawn, "1", repeat=r, epoch=e)
    if t.ttfb_ns is not None:
        rows.add("first_batch_s", t.ttfb_ns / 1e9, "s", repeat=r, epoch=e)
    if step_sync:
        rows.add("data_wait_s", sum(t.wait_ns) / 1e9, "s", repeat=r, epoch=e)
        rows.add("compute_s", sum(t.compute_ns) / 1e9, "s", repeat=r, epoch=e)
        rows.add_steps(r, e, [w / 1e9 for w in t.wait_ns], [c / 1e9 for c in t.compute_ns], t.step_images)


def _add_loss(rows: results.RunRows, trainer: Any, r: int, e: int, cfg: BenchConfig, data: Any,
              sync: Sync | None = None) -> None:
    """After epoch ``e`` (untimed): the trainer's ``epoch_metrics``, the mean loss, and with
    ``eval_every_epoch`` a scheduled epoch's ``epoch_test_acc``."""
    if trainer is None:
        return
    for metric, value, unit in trainer.epoch_metrics():
        rows.add(metric, value, unit, repeat=r, epoch=e)
    rows.add("train_loss", trainer.end_epoch(), "1", repeat=r, epoch=e)
    if cfg.eval_every_epoch and e < cfg.warmup + cfg.epochs and cfg.eval_split in data.splits:
        split = data.split(cfg.eval_split)
        (sync or Sync()).point()  # evaluation all-reduces
        ev = evaluate(trainer.model, split.images, split.labels, cfg.pipe.augment, trainer.device,
                      amp=cfg.train.amp)
        rows.add("epoch_test_acc", ev.accuracy, "1", repeat=r, epoch=e)


def _add_eval(cfg: BenchConfig, data: Any, trainer: Any, clock: DeviceClock, rows: results.RunRows,
              r: int) -> None:
    last = cfg.warmup + cfg.epochs - 1
    if cfg.eval_split not in data.splits:
        rows.unavailable("test_acc", "1", f"dataset has no split {cfg.eval_split!r} (has {', '.join(data.splits)})", repeat=r)
        return
    split = data.split(cfg.eval_split)
    t0 = clock.now()
    ev = evaluate(trainer.model, split.images, split.labels, cfg.pipe.augment, trainer.device,
                  amp=cfg.train.amp)
    rows.add("eval_s", (clock.now() - t0) / 1e9, "s", repeat=r, epoch=last)
    rows.add("test_acc", ev.accuracy, "1", repeat=r, epoch=last)
    rows.add("test_loss", ev.loss, "1", repeat=r, epoch=last)
    rows.add("test_images", ev.images, "1", repeat=r, epoch=last)
    if ev.predictions is not None:
        rows.add_predictions(r, split.labels, ev.predictions)
