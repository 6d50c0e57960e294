"""`inrbench bench`: time one pipeline in one mode (loader | replay | train); write ``runs/<run_id>/``.
Exit: 0 ok or skipped, 1 crashed, 2 bad input, 3 out of memory; a failed run leaves no result rows.
``--nproc N`` reruns under torchrun; rank 0 writes and prints, ranks leave together (``_leave``)."""

from __future__ import annotations

import argparse
import importlib
import os
import socket
import sys
from pathlib import Path

from bench import dist, results
from bench.argtypes import nonnegative_int, positive_int, seed
from bench.cli import list_names
from bench.devices import resolve_device
from bench.errors import InputError, one_line
from bench.outputs import is_own

HELP = "time a pipeline (loader | replay | train), monitor CPU/RSS/GPU memory, write result rows"

# metric -> (label, scale, unit shown) for the summary table
SUMMARY = {
    "images_per_s": ("img/s", 1.0, ""),
    "epoch_s": ("epoch", 1.0, "s"),
    "ttfb_s": ("ttfb", 1.0, "s"),
    "data_wait_s": ("wait", 1.0, "s"),
    "compute_s": ("compute", 1.0, "s"),
    "cpu_cores_busy": ("cores", 1.0, ""),
    "images_per_cpu_s": ("img/cpu-s", 1.0, ""),
    "build_s": ("build", 1.0, "s"),
    "measured_epochs": ("epochs/rep", 1.0, ""),
    "host_pss_peak_bytes": ("PSS", 2.0**-20, "MiB"),
    "host_rss_peak_bytes": ("RSS sum", 2.0**-20, "MiB"),
    "gpu_mem_used_peak_bytes": ("GPU mem", 2.0**-20, "MiB"),
    "torch_peak_allocated_bytes": ("torch alloc", 2.0**-20, "MiB"),
    "test_acc": ("test acc", 100.0, "%"),
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    list_names(p.add_argument("--pipeline", required=True, metavar="NAME", help="a registered pipeline: {names}"),
               lambda: importlib.import_module("pipelines").names())
    p.add_argument("--data", required=True, help="prepared dataset folder (`inrbench prepare`)")
    p.add_argument("--store", help="encoded store file (the inr pipeline's .inr file)")
    p.add_argument("--allow-unverified-store", action="store_true",
                   help="use a store that records no source pixels hash (not from `inrbench encode`); "
                        "default: refuse it, since it cannot be tied to --data")
    p.add_argument("--mode", choices=("loader", "replay", "train"), default="loader",
                   help="loader: pipeline alone; replay: model on cached batches; train: end to end")
    p.add_argument("--epochs", type=positive_int, default=1, help="measured epochs per repeat (default 1)")
    p.add_argument("--warmup", type=nonnegative_int, default=1, help="warm-up epochs per repeat, reported apart (default 1)")
    p.add_argument("--repeats", type=positive_int, default=3, help="repeats, each with a fresh pipeline/model (default 3)")
    p.add_argument("--min-seconds", type=float, default=1.0, metavar="S",
                   help="autorange: after --epochs, more measured epochs per repeat until they add up to "
                        "S seconds (default 1; 0 = exactly --epochs); the count is recorded (measured_epochs)")
    p.add_argument("--batch-size", type=positive_int, default=256, help="images per batch, per rank with --nproc")
    p.add_argument("--workers", type=nonnegative_int, default=2, help="loader workers/threads (default 2)")
    p.add_argument("--resident", choices=("all", "shard"), default="all",
                   help="with --nproc: each rank holds the whole split (all, default) or only its fixed shard "
                        "(samples never move between ranks; pipelines/shard.py)")
    p.add_argument("--device", default="auto", help="cpu | cuda | cuda:N | auto (cuda when available)")
    list_names(p.add_argument("--backbone", default="auto", metavar="NAME",
                              help="a registered backbone ({names}), or auto: resnet18-cifar up to 64 px, else resnet18"),
               lambda: importlib.import_module("bench.train.backbones").backbone_names())
    p.add_argument("--seed", type=seed, default=0, help="seed of shuffling, augmentation and model init")
    p.add_argument("--split", default="train", help="split the pipeline feeds (default train)")
    p.add_argument("--eval-split", default="test", help="split for test accuracy in train mode (default test)")
    g = p.add_argument_group("augmentation (pipelines.base.Augment)")
    g.add_argument("--crop", choices=("random-resized", "random-pad", "center"), default="random-resized",
                   help="random-resized (--scale, --ratio), random-pad (--pad) or center crop")
    g.add_argument("--size", type=positive_int, help="output side (default: the dataset's image height)")
    g.add_argument("--scale", type=float, nargs=2, metavar=("LO", "HI"), default=(0.08, 1.0),
                   help="random-resized: range of the crop's area fraction")
    g.add_argument("--ratio", type=float, nargs=2, metavar=("LO", "HI"), default=(3 / 4, 4 / 3),
                   help="random-resized: range of the crop's aspect ratio (default 3/4 4/3)")
    g.add_argument("--pad", type=int, default=4, help="random-pad padding (default 4)")
    g.add_argument("--no-flip", action="store_true", help="disable the random horizontal flip")
    t = p.add_argument_group("training")
    t.add_argument("--lr", type=float, default=0.1, help="SGD peak learning rate, cosine-annealed")
    t.add_argument("--momentum", type=float, default=0.9, help="SGD momentum")
    t.add_argument("--weight-decay", type=float, default=5e-4, help="SGD weight decay")
    t.add_argument("--amp", choices=("auto", "bf16", "off"), default="auto", help="auto: bf16 on CUDA")
    list_names(t.add_argument("--method", default="dense", metavar="NAME",
                              help="training method (bench.train.trainers): {names}; expand is network expansion, "
                                   "a sub-network grown into the dense model (needs --schedule)"),
               lambda: importlib.import_module("bench.train.trainers").trainer_names())
    t.add_argument("--schedule", metavar="W:D:E,...",
                   help="expand: stages WIDTH:DEPTH:EPOCHS (width fraction of the dense channels, residual "
                        "blocks per ResNet stage, ViT blocks or small-cnn conv layers, or '-' for the dense depth, "
                        "epochs), ending at the dense model; epochs add up to --warmup + --epochs, e.g. 0.5:1:2,0.75:2:1,1:2:1")
    t.add_argument("--restart-lr", action="store_true",
                   help="expand: restart the cosine learning-rate schedule at each growth (default: keep it)")
    t.add_argument("--eval-every-epoch", action="store_true",
                   help="train: test accuracy after every scheduled epoch, untimed (time-to-accuracy curves)")
    h = p.add_argument_group("harness")
    h.add_argument("--replay-batches", type=int, default=16, help="batches cached for replay (default 16)")
    h.add_argument("--no-step-sync", action="store_true",
                   help="read the clock only at epoch boundaries (no per-step wait/compute split)")
    h.add_argument("--monitor-period", type=float, default=0.1, help="monitor sampling period, s (default 0.1)")
    h.add_argument("--pss-period", type=float, default=1.0,
                   help="host PSS sampling period, s (default 1; each read costs ~20 ms per process)")
    h.add_argument("--threads", type=positive_int,
                   help="torch intra-op threads (default: torch's, usually the core count)")
    p.add_argument("--compile", action="store_true", help="let adapters torch.compile their device work")
    p.add_argument("--out", required=True, help="results folder (rows are added to it)")

    dist.add_launch_arguments(p)


def build_config(args: argparse.Namespace, world=None, dist_config=None):
    """argv -> a resolved, validated ``BenchConfig`` (``InputError`` on bad values); ``world`` gives a rank's
    place and device (``cuda`` -> ``cuda:LOCAL_RANK``), ``dist_config`` the run's ``DistConfig``."""
    import pipelines
    from bench.datasets.prepared import open_prepared
    from bench.harness.runner import BenchConfig
    from bench.train.backbones import backbone_names, default_backbone
    from bench.train.loop import TrainConfig
    from pipelines.base import Augment, PipelineConfig

    if args.pipeline not in pipelines.names():
        raise InputError(f"unknown pipeline {args.pipeline!r}; known: {', '.join(pipelines.names())}")
    if args.store is None and pipelines.needs_store(args.pipeline):
        raise InputError(f"--pipeline {args.pipeline} reads an encoded store: pass --store FILE (`inrbench encode`)")
    data = open_prepared(args.data)
    _check_names(args, data)
    # cuda on a machine without CUDA is a skip row (run_bench); a malformed or absent device is exit 2
    device = resolve_device(args.device, missing_cuda_ok=True)
    rank, world_size = 0, 1
    if world is not None and world.distributed:
        device, rank, world_size = dist.rank_device(device, world), world.rank, world.world_size
    size = args.size if args.size is not None else data.image_size[0]
    backbone = default_backbone(size) if args.backbone == "auto" else args.backbone
    if backbone not in backbone_names():
        raise InputError(f"unknown backbone {backbone!r}; known: {', '.join(backbone_names())}")
    try:
        aug = Augment(crop=args.crop, size=size, scale=tuple(args.scale), ratio=tuple(args.ratio),
                      pad=args.pad, flip=not args.no_flip)
        pipe = PipelineConfig(batch_size=args.batch_size, augment=aug, split=args.split, device=device,
                              workers=args.workers, seed=args.seed, compile=args.compile,
                              allow_unverified_store=args.allow_unverified_store, rank=rank,
                              world_size=world_size, resident=getattr(args, "resident", "all"))
        train = TrainConfig(lr=args.lr, momentum=args.momentum, weight_decay=args.weight_decay, amp=args.amp)
        expand = _expand_config(args, backbone, data.num_classes)
        return BenchConfig(
            # absolute paths (symlinks kept): a report built elsewhere finds the sizes, never a same-named folder
            pipeline=args.pipeline, data=os.path.abspath(data.root), mode=args.mode,
            store=os.path.abspath(args.store) if args.store else None,
            epochs=args.epochs, warmup=args.warmup, repeats=args.repeats,
            min_seconds=args.min_seconds, pipe=pipe, backbone=backbone,
            train=train, eval_split=args.eval_split, replay_batches=args.replay_batches,
            step_sync=not args.no_step_sync, monitor_period_s=args.monitor_period,
            pss_period_s=args.pss_period, torch_threads=args.threads,
            method=args.method, expand=expand, eval_every_epoch=args.eval_every_epoch, dist=dist_config,
        )
    except ValueError as e:
        raise InputError(f"bad configuration: {e}") from None


def _check_names(args: argparse.Namespace, data) -> None:
    """Refuse a typo (a split ``--data`` lacks, a ``--store`` that is no store file; ``--eval-split`` in
    train mode only) before ``run_bench`` creates a run folder whose error row every report would show."""
    for option, name in (("--split", args.split), *((("--eval-split", args.eval_split),) if args.mode == "train" else ())):
        if name not in data.splits:
            raise InputError(f"{option} {name!r}: {data.root} has no such split (it has {', '.join(data.splits)})")
    if args.store is None:
        return
    path = Path(args.store)
    from inr import atrest, store

    store.check_store_path(path)

    try:
        with open(path, "rb") as f:
            packed = atrest.is_packed(f.read(64))
    except OSError as e:
        raise InputError(f"cannot read: {e.strerror or e}", path) from None
    if not packed:  # the header alone: a file that is no store (a typo naming another file) is refused now
        store.read_header(path)


def _expand_config(args: argparse.Namespace, backbone: str, num_classes: int):
    """``--method expand --schedule ...`` -> a validated ``ExpandConfig`` (``ValueError`` if bad); None for dense."""
    if args.method != "expand":
        if args.schedule is not None or args.restart_lr:
            raise ValueError(f"--schedule/--restart-lr apply to --method expand, not {args.method}")
        return None
    if not args.schedule:
        raise ValueError("--method expand needs --schedule WIDTH:DEPTH:EPOCHS,...")
    from bench.train.backbones import create_backbone
    from bench.train.expand import ExpandConfig, check_schedule

    cfg = ExpandConfig.parse(args.schedule, restart_lr=args.restart_lr)
    check_schedule(cfg, create_backbone(backbone, num_classes))
    return cfg


def summary_table(rows) -> str:
    """The console summary of one run: per metric the median (IQR from 2 samples) of its ok (aggregate)
    rows, test accuracy as the report gives it, each rank's img/s; a run that measured nothing says so."""
    from bench.report.tables import accuracy, fmt_accuracy, fmt_num

    every = results.to_frame(rows.rows())
    df = results.aggregate_rows(every)
    status = every[every.metric == "run"]
    if len(status):
        return "\n".join(_status_line(r) for _, r in status.iterrows())
    s = results.summarize(df, by=("metric",)).set_index("metric")
    head = (f"{rows.pipeline} {rows.mode} on {rows.dataset} (medians over the run's samples: epochs, or repeats; "
            "the IQR where there are 2 or more; n samples)")
    world = rows.config.get("dist") or {}
    if world:
        head += f", {world['world_size']} ranks ({world['backend']}; img/s global, times the slowest rank's)"
    lines = [head]
    for metric, (label, scale, unit) in SUMMARY.items():
        if metric not in s.index:
            continue
        m, n = s.loc[metric], int(s.loc[metric, "n"])
        if metric == "test_acc":
            lines.append(_accuracy_line(label, df, m, n, accuracy, fmt_accuracy))
            continue
        value = f"{fmt_num(m['median'] * scale)}{f' {unit}' if unit else ''}"
        spread = f" (IQR {fmt_num(m['iqr'] * scale)})" if n > 1 else ""
        lines.append(f"  {label:<12} {value + spread:<28} n={n}")
    per_rank = every[(every.metric == "images_per_s") & every["rank"].notna() & (every.status == "ok")]
    if len(per_rank):
        med = per_rank.groupby("rank")["value"].median()
        lines.append("  img/s by rank " + ", ".join(f"{int(k)}: {fmt_num(v)}" for k, v in med.items()))
    lines += _absent_lines(df[df.status == "skip"])
    return "\n".join(lines)


def _absent_lines(skipped) -> list[str]:
    """``absent here:`` and per skip reason the metrics it holds for (a reason varying by repeat: the first)."""
    if not len(skipped):
        return []
    by_reason: dict[str, list[str]] = {}
    for metric, reasons in skipped.groupby("metric", sort=True)["reason"]:
        distinct = list(dict.fromkeys(str(r) for r in reasons if isinstance(r, str) and r)) or ["no reason recorded"]
        why = distinct[0]
        if len(distinct) > 1:
            k = len(distinct) - 1
            why += f" ({k} other reason{'s' if k > 1 else ''} on other repeats)"
        by_reason.setdefault(why, []).append(str(metric))
    return ["  absent here:", *(f"    {', '.join(ms)}: {why}" for why, ms in sorted(by_reason.items(),
                                                                               key=lambda kv: kv[1]))]


def _accuracy_line(label: str, df, m, n: int, accuracy, fmt_accuracy) -> str:
    """``test acc  90.0 % [81.5-94.8] (95% Wilson: 72/80 test images of one model, ...)``, or the median."""
    acc = accuracy(df)
    if len(acc) == 1 and acc.iloc[0]["n"] > 0:  # the test image count recorded (NaN: not)
        a = acc.iloc[0]
        value = fmt_accuracy(a)
        shown = value.replace(" [", " % [", 1) if "[" in value else f"{value} %"
        reps = int(a["repeats"])
        return (f"  {label:<12} {shown} (95% Wilson: {int(a['k'])}/{int(a['n'])} test images of one model"
                f"{f', mean of {reps} repeats' if reps > 1 else ''})")
    return f"  {label:<12} {100 * m['median']:.1f} % (no test image count recorded: no interval)  n={n}"


def _status_line(r) -> str:
    """A run that measured nothing: ``SKIP: <reason>. Nothing was measured; ...`` or ``ERROR: <reason>``."""
    import pandas as pd

    where = f"{r['pipeline']} {r['mode']}" + (f" (rank {int(r['rank'])})" if pd.notna(r["rank"]) else "")
    if r["status"] == "skip":
        return (f"{where}: SKIP: {r['reason']}. Nothing was measured; a skip row records why (exit 0: a sweep "
                "goes on and reports the cell as skipped)")
    return f"{where}: {str(r['status']).upper()}: {r['reason']}"


def run(args: argparse.Namespace) -> int:
    if dist.launch_requested(args):
        return _launch(args)
    if dist.from_env().distributed:
        return _run_rank(args)
    from bench.harness.runner import run_bench

    cfg = build_config(args)
    outcome = run_bench(cfg, args.out)
    print(summary_table(outcome.rows))
    print(f"rows: {outcome.run_dir / 'rows.csv'}")
    if outcome.input_error is not None:
        raise outcome.input_error
    return outcome.exit_code


def _launch(args: argparse.Namespace) -> int:
    """``--nproc``: the ranks under torchrun with a run id drawn here (``RUN_ID_ENV``), so a run no rank
    wrote (a rank killed) still leaves one error row."""
    from bench.datasets.prepared import open_prepared
    from bench.harness.runner import RUN_ID_ENV

    _check_names(args, open_prepared(args.data))  # a typo: one line, before torchrun, no error row
    resolve_device(args.device, missing_cuda_ok=True)  # a device this machine lacks: the same, once
    run_id = results.new_run_id(args.pipeline, args.mode)
    os.environ[RUN_ID_ENV] = run_id
    try:
        code, said = dist.launch_ranks(args, "bench")
    finally:
        os.environ.pop(RUN_ID_ENV, None)
    run_dir = Path(args.out) / results.RUNS_DIR / run_id
    if code != 0 and 0 not in said and (run_dir / results.ROWS_FILE).exists():
        _say_recorded(run_dir)  # rank 0 was stopped before it printed; the ranks recorded why
    if code != 0 and not (run_dir / "rows.csv").exists() and is_own(args.out, "results"):  # rank 0 claimed it
        rows = results.RunRows(run_id, args.pipeline, Path(args.data).resolve().name, args.mode,
                               # absolute paths, as build_config records them (symlinks kept)
                               {"pipeline": args.pipeline, "data": os.path.abspath(args.data),
                                "store": os.path.abspath(args.store) if args.store else None, "mode": args.mode,
                                "nproc": args.nproc, "nnodes": args.nnodes, "argv": " ".join(args._argv)})
        rows.error(f"torchrun exited with status {code} before rank 0 wrote this run (a rank was killed "
                   "or crashed hard; its stderr is above)")
        results.write_env(run_dir)
        results.write_run(args.out, rows)
        print(f"rows: {run_dir / 'rows.csv'} (error: no rank finished the run)")
    return code


def _say_recorded(run_dir) -> None:
    """What rank 0 would have printed of a failed run torchrun stopped: the status lines the ranks recorded."""
    import pandas as pd

    try:
        rows = pd.read_csv(run_dir / results.ROWS_FILE, usecols=lambda c: c in ("pipeline", "mode", "rank", "metric",
                                                                                 "status", "reason"))
    except (OSError, ValueError):
        return
    for _, r in rows[rows.metric == "run"].iterrows():
        print(_status_line(r))
    print(f"rows: {run_dir / results.ROWS_FILE}")
    sys.stdout.flush()


def _run_rank(args: argparse.Namespace) -> int:
    """One rank of a data-parallel run (under torchrun), ended by ``bench.dist.run_rank``."""
    return dist.run_rank(lambda: _rank_body(args))


def _rank_body(args: argparse.Namespace) -> int:
    """Join the group, agree on the config, run; only rank 0 prints, and the ranks leave together."""
    import torch

    from bench.harness.ranks import DistConfig
    from bench.harness.runner import EXIT_INPUT, run_bench

    try:
        device, early = resolve_device(args.device, missing_cuda_ok=True), None
    except InputError as e:  # every rank refuses alike: join anyway (gloo), so that rank 0 alone says it
        device, early = "cpu", str(e)
    # no CUDA here: join with gloo; the run records the skip (as one process does)
    world = dist.init(device if torch.cuda.is_available() else "cpu", args.dist_timeout)
    try:
        places = dist.all_gather_object((socket.gethostname(), world.local_rank))
        dist_config = DistConfig(world_size=world.world_size, backend=str(world.backend), nnodes=world.nnodes,
                                 local_world_size=world.local_world_size,
                                 hosts=tuple(h for h, _ in places), local_ranks=tuple(lr for _, lr in places),
                                 timeout_s=float(args.dist_timeout))
        cfg, error = None, early
        if error is None:
            try:
                cfg = build_config(args, world, dist_config)
            except InputError as e:
                error = str(e)
        errors = [(r, e) for r, e in enumerate(dist.all_gather_object(error)) if e]
        if errors:
            r, e = errors[0]
            return _leave(world, EXIT_INPUT, e if all(x == e for _, x in errors) else f"rank {r}: {e}")
        try:
            outcome = run_bench(cfg, args.out)
        except InputError as e:  # the results folder refused (every rank learns it from rank 0)
            return _leave(world, EXIT_INPUT, str(e))
        if world.is_main:
            print(summary_table(outcome.rows))
            print(f"rows: {outcome.run_dir / 'rows.csv'}")
        if outcome.input_error is not None:
            return _leave(world, EXIT_INPUT, str(outcome.input_error), together=outcome.broken is None)
        return _leave(world, outcome.exit_code, together=outcome.broken is None)
    finally:
        dist.shutdown()


def _leave(world, code: int, error: str | None = None, together: bool = True) -> int:
    """End a rank with ``code``: rank 0 prints ``error``, every rank flushes and records its status, then
    (``together``) waits at a barrier so no rank exits before rank 0 has said why."""
    if error is not None and world.is_main:
        print(f"inrbench: error: {one_line(error)}", file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    dist.record_status(code)
    if together:
        try:
            dist.barrier()
        except Exception:  # a peer gone meanwhile: this rank has said what it had to say
            pass
    return code
