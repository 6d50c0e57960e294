"""`inrbench encode PREPARED_DIR --preset NAME --out FILE`: fit, prune, quantize, store (resumable).
``--nproc N`` splits the shards across ranks, rank 0 merges; bad options exit 2 before torchrun starts."""

from __future__ import annotations

import argparse
import contextlib
from typing import Any

from bench import dist
from bench.argtypes import (
    nonnegative_float,
    nonnegative_int,
    pixel_fraction,
    positive_float,
    positive_int,
    seed,
)
from bench.cli import list_names, progress_bar, quiet_cuda_home_note
from bench.dist import add_launch_arguments
from bench.errors import InputError, one_line, os_error_message

# A rank waits at the final barrier for its peers' last shards: up to one shard's fit (16384 images
# x 5,000 iterations of mini-imagenet can take hours); a dead peer is caught by torchrun anyway.
ENCODE_TIMEOUT_S = 24 * 3600.0

# the pruning and QAT options' defaults (inr.prune.PruneConfig, inr.encode.EncodeConfig): the options are
# None when left out, so that one given where it would be ignored is refused (``check_options``)
PRUNE_DEFAULTS = {"rounds": 2, "finetune_iterations": 200, "lr": 2e-3, "max_ratio": 0.6, "step": 0.05}
QAT_LR = 1e-4

HELP = "encode a prepared split as per-image SIRENs (fit, prune, quantize) into one INR store file"


def preset_names() -> list[str]:
    """The fit presets (``inr.fit.PRESETS``), for ``--help``."""
    from inr.fit import PRESETS

    return list(PRESETS)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("prepared", help="a prepared dataset folder (`inrbench prepare`)")
    list_names(p.add_argument("--preset", default="demo", metavar="NAME", help="fit preset: {names}"), preset_names)
    p.add_argument("--split", default="train", help="split to encode (default train)")
    p.add_argument("--out", required=True,
                   help="the store file to write (not inside the prepared folder; an existing store needs --overwrite)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing store file written by inrbench encode")
    g = p.add_argument_group("fit (override the preset)")
    g.add_argument("--iterations", type=positive_int, help="Adam iterations per image")
    g.add_argument("--layers", type=positive_int, help="SIREN sine layers (the linear output layer is extra)")
    g.add_argument("--hidden", type=positive_int, help="SIREN hidden width")
    g.add_argument("--w0", type=positive_float, help="w0 of every sine layer")
    g.add_argument("--w0-first", type=positive_float, help="w0 of the first layer (default: --w0)")
    g.add_argument("--lr", type=positive_float, help="Adam peak learning rate, cosine-annealed")
    g.add_argument("--seed", type=seed, help="seed of the random init")
    g.add_argument("--batch", type=positive_int, help="images fitted together (default: from --memory-mb)")
    g.add_argument("--memory-mb", type=positive_int, help="memory budget per chunk in MiB (default: 60%% of free GPU memory, 2048 on CPU)")
    g.add_argument("--autocast", choices=["none", "bf16"], help="bf16 matmuls for fitting (first layer fp32; fp16 is not offered: no loss scaling)")
    g.add_argument("--init", help="start every image from this learned initialization (`inrbench meta-init`; "
                   "its sha256 is recorded in the store) instead of the seeded random init")
    g.add_argument("--target-psnr", type=positive_float, metavar="DB",
                   help="early stop: an image stops fitting once its PSNR reaches DB (checked every 25 iterations, "
                        "on the prefix of the full schedule); images that never get there run all iterations")
    g.add_argument("--pixel-fraction", type=pixel_fraction, metavar="F",
                   help="each fit step sees this fraction of each image's pixels, e.g. 1/8 (a new subset every step, "
                        "seeded by image; keep-best on all pixels every 25 iterations; default 1: all)")
    g.add_argument("--fit-step", choices=["eager", "compiled"],
                   help="eager (reference, default) or compiled (torch.compile, polynomial sine; fp32)")
    g = p.add_argument_group("pruning (--prune: iterative, an exact fraction; --prune-budget-db: dynamic, per image)")
    g.add_argument("--prune", type=_fraction("[0, 1)"), default=0.0,
                   help="iterative pruning: fraction of weights pruned per layer, exact, in [0, 1) (default 0: none)")
    g.add_argument("--prune-budget-db", type=nonnegative_float,
                   help="dynamic pruning: per image, prune while the PSNR drop is <= this many dB (not with --prune)")
    g.add_argument("--prune-max", type=_fraction("(0, 1)"),
                   help=f"dynamic pruning: largest ratio tried, in (0, 1) (default {PRUNE_DEFAULTS['max_ratio']:g})")
    g.add_argument("--prune-step", type=_fraction("(0, 1)"),
                   help=f"dynamic pruning: ratio step, in (0, 1), at most --prune-max "
                        f"(default {PRUNE_DEFAULTS['step']:g})")
    g.add_argument("--prune-rounds", type=positive_int,
                   help=f"iterative pruning (--prune): rounds (default {PRUNE_DEFAULTS['rounds']})")
    g.add_argument("--prune-finetune", type=nonnegative_int,
                   help=f"fine-tune iterations per round, or per ratio tried (default "
                        f"{PRUNE_DEFAULTS['finetune_iterations']})")
    g.add_argument("--prune-lr", type=positive_float,
                   help=f"fine-tune peak learning rate, cosine-annealed per round or ratio tried (default {PRUNE_DEFAULTS['lr']:g})")
    g = p.add_argument_group("quantization")
    g.add_argument("--bits", default="32", help="N | FIRST:HIDDEN:LAST | comma list per layer; 4..16, 32 = float32 (default 32)")
    g.add_argument("--per-channel", action="store_true",
                   help="one scale per output channel (default: per layer); needs quantized --bits")
    g.add_argument("--qat", type=nonnegative_int, default=0,
                   help="quantization-aware fine-tune iterations; needs quantized --bits (default 0)")
    g.add_argument("--qat-lr", type=positive_float,
                   help=f"quantization-aware fine-tune learning rate, with --qat (default {QAT_LR:g})")
    g = p.add_argument_group("run")
    g.add_argument("--device", default="cpu", help="cpu or cuda[:N] (default cpu)")
    g.add_argument("--threads", type=positive_int, help="torch CPU threads (default: torch's default)")
    g.add_argument("--shard-size", type=positive_int, help="images per resumable shard (default 1024 on CPU, 16384 on CUDA)")
    g.add_argument("--limit", type=positive_int, help="encode only the first N images of the split")
    g.add_argument("--keep-work", action="store_true", help="keep the shard folder after success")
    g.add_argument("--fit-cache", help="folder of float32 fits reused by encodes of the same images and fit config")
    g.add_argument("--no-progress", action="store_true",
                   help="no progress bar (there is none anyway where stderr is not a terminal)")
    g.add_argument("--at-rest", choices=("lzma",),
                   help="write the store entropy-coded for disk and transfer (inr.atrest); it is decoded once "
                        "at load into the same resident layout (inspect/compare report disk and resident bytes)")

    add_launch_arguments(p, timeout_s=ENCODE_TIMEOUT_S)


def _fraction(interval: str):
    """An argparse type: a number in ``[0, 1)`` or ``(0, 1)`` (``interval``), refused naming the option."""
    import math

    def parse(text: str) -> float:
        try:
            v = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        ok = (0 <= v < 1) if interval.startswith("[") else (0 < v < 1)
        if not ok or math.isnan(v):
            raise argparse.ArgumentTypeError(f"must be in {interval}, got {text}")
        return v

    parse.__name__ = "fraction"
    return parse


def check_options(args: argparse.Namespace, bits: tuple[int, ...]) -> None:
    """Refuse options that would be ignored or contradict each other, naming the flags (``bits``: parsed --bits)."""
    from inr.quantize import FLOAT_BITS

    if args.prune and args.prune_budget_db is not None:
        raise InputError(f"--prune {args.prune:g} and --prune-budget-db {args.prune_budget_db:g} are two pruning "
                         "modes (an exact fraction per layer, or per image within a PSNR budget): give one")
    dynamic = args.prune_budget_db is not None
    for flag, value in (("--prune-max", args.prune_max), ("--prune-step", args.prune_step)):
        if value is not None and not dynamic:
            raise InputError(f"{flag} {value:g} applies to dynamic pruning only: add --prune-budget-db DB, "
                             "or leave it out")
    if args.prune_rounds is not None and not args.prune:
        raise InputError(f"--prune-rounds {args.prune_rounds} applies to iterative pruning only: add --prune "
                         "FRACTION, or leave it out" + (" (dynamic pruning steps by --prune-step)" if dynamic else ""))
    for flag, value in (("--prune-finetune", args.prune_finetune), ("--prune-lr", args.prune_lr)):
        if value is not None and not (args.prune or dynamic):
            raise InputError(f"{flag} {value:g} applies only when pruning: add --prune FRACTION or "
                             "--prune-budget-db DB, or leave it out")
    if dynamic:
        top = PRUNE_DEFAULTS["max_ratio"] if args.prune_max is None else args.prune_max
        step = PRUNE_DEFAULTS["step"] if args.prune_step is None else args.prune_step
        if step > top:
            raise InputError(f"--prune-step {step:g} is larger than --prune-max {top:g}: no ratio would be tried")
    quantized = any(b != FLOAT_BITS for b in bits)
    if args.qat and not quantized:
        raise InputError(f"--qat {args.qat} fine-tunes against quantized weights, but --bits {args.bits} keeps every "
                         "layer float32 (32 is the default): QAT needs quantized widths (--bits 4..16, e.g. --bits 8)")
    if args.qat_lr is not None and not args.qat:
        raise InputError(f"--qat-lr {args.qat_lr:g} applies only with --qat N: add it, or leave --qat-lr out")
    if args.per_channel and not quantized:
        raise InputError(f"--per-channel sets quantization scales, but --bits {args.bits} keeps every layer "
                         "float32 (32 is the default): it needs quantized widths (--bits 4..16)")


def _given(value, default):
    return default if value is None else value


def build_config(args: argparse.Namespace):
    """The validated ``EncodeConfig`` from the preset and the command-line overrides."""
    from inr.encode import EncodeConfig
    from inr.fit import preset
    from inr.prune import PruneConfig
    from inr.quantize import QuantConfig, parse_bits

    try:
        fit_cfg = preset(
            args.preset, iterations=args.iterations, layers=args.layers, hidden=args.hidden, w0=args.w0,
            w0_first=args.w0_first, lr=args.lr, seed=args.seed, batch=args.batch,
            memory_budget_mb=args.memory_mb, autocast=args.autocast, step=args.fit_step, target_psnr=args.target_psnr,
            pixel_fraction=args.pixel_fraction,
        )
        if args.init:  # refused here (one line, exit 2) when it is not an init for this architecture
            from dataclasses import replace

            from inr.meta import load_init

            fit_cfg = replace(fit_cfg, init=str(args.init), init_sha256=load_init(args.init, fit_cfg.arch).sha256)
        bits = parse_bits(args.bits, fit_cfg.arch.num_linear)
        check_options(args, bits)
        d = PRUNE_DEFAULTS
        prune = PruneConfig(  # the config's own checks stay as a backstop: the flags were checked above
            ratio=args.prune, rounds=_given(args.prune_rounds, d["rounds"]),
            finetune_iterations=_given(args.prune_finetune, d["finetune_iterations"]),
            lr=_given(args.prune_lr, d["lr"]), budget_db=args.prune_budget_db,
            max_ratio=_given(args.prune_max, d["max_ratio"]), step=_given(args.prune_step, d["step"]),
        )
        quant = QuantConfig(bits, per_channel=args.per_channel)
        return EncodeConfig(fit=fit_cfg, quant=quant, prune=prune, qat_iterations=args.qat,
                            qat_lr=_given(args.qat_lr, QAT_LR), at_rest=getattr(args, "at_rest", None),
                            shard_size=args.shard_size if args.shard_size is not None else (16384 if args.device.startswith("cuda") else 1024))
    except ValueError as e:
        raise InputError(f"bad encode options: {e}") from None


def run(args: argparse.Namespace) -> int:
    from bench.devices import resolve_device
    from bench.outputs import claim

    launching = dist.launch_requested(args)
    world = dist.World() if launching else dist.from_env()
    with dist.said_once_per_node(world):  # under the user's own torchrun: one line per node, not one per rank
        args.device = resolve_device(args.device)  # a malformed or absent device: exit 2 before any work
    if launching:
        _precheck(args)
        return dist.launch(args, "encode")
    if world.distributed:
        return _run_rank(args, world)
    # refuse a bad --out (or one another encode is writing) before any work; held until the store is written
    with claim(args.out, "store", inputs=_inputs(args), mode="replace" if args.overwrite else "new"):
        return _encode(args)


def _inputs(args: argparse.Namespace) -> dict:
    return {"prepared dataset": args.prepared, "fit cache (--fit-cache)": args.fit_cache}


def _precheck(args: argparse.Namespace) -> None:
    """What every rank would refuse, refused once here before torchrun starts (one line, exit 2)."""
    from bench.datasets.prepared import open_prepared
    from bench.outputs import check_output

    dist.rank_device(args.device, dist.World(0, args.nproc * args.nnodes, 0, args.nproc))
    build_config(args)
    check_output(args.out, "store", inputs=_inputs(args), mode="replace" if args.overwrite else "new")
    _select(args, open_prepared(args.prepared), args.nproc * args.nnodes, identify=False)


def _select(args: argparse.Namespace, ds, world_size: int = 1, identify: bool = True):
    """The split's first ``--limit`` images: ``(split, n, images, labels, source record)`` (the record,
    which hashes the pixels, only with ``identify``)."""
    from bench.datasets.identity import source_record

    if ds.native and world_size > 1:
        raise InputError("a native-size dataset (prepare --size native) is encoded by one process: "
                         "run without --nproc / torchrun", args.prepared)
    split = ds.split(args.split)
    n = len(split) if args.limit is None else min(len(split), args.limit)
    if n < 1:
        raise InputError(f"split {args.split!r} has no images to encode", args.prepared)
    # the source record ties the store to these images (bench.datasets.identity)
    return split, n, split.images[:n], split.labels[:n], source_record(ds, args.split, args.limit) if identify else None


def _header(args: argparse.Namespace, cfg, ds, split, n: int, where: str) -> str:
    prune = f"dynamic <= {cfg.prune.budget_db:g} dB" if cfg.prune.budget_db is not None else f"{cfg.prune.ratio:g}"
    return (f"encode {ds.root} [{args.split}] {n} images {split.image_size[0]}x{split.image_size[1]}: {cfg.fit.arch}, "
            f"{cfg.fit.iterations} iterations, {cfg.fit.step} fit step, lr {cfg.fit.lr}, bits {list(cfg.quant.bits)}, "
            f"prune {prune}, " + (f"early stop at {cfg.fit.target_psnr:g} dB, " if cfg.fit.target_psnr else "")
            + (f"each step on {cfg.fit.pixel_fraction:g} of the pixels, " if cfg.fit.pixel_fraction < 1 else "") + where)


def _quiet_compile(cfg) -> None:
    """The compiled fit step builds C++ kernels: drop torch's CUDA_HOME note about it on a CPU machine."""
    if cfg.fit.step == "compiled":
        quiet_cuda_home_note()


def _progress_bar(args: argparse.Namespace, total: int, desc: str, disable: bool = False):
    """A tqdm bar and the ``progress(n, psnr)`` callback that advances it with the running mean PSNR."""
    import numpy as np

    psnrs: list[np.ndarray] = []
    bar = progress_bar(total, desc, "img", enabled=not (args.no_progress or disable), dynamic_ncols=True)

    def progress(k: int, p) -> None:
        psnrs.append(np.asarray(p, dtype=np.float64))
        bar.update(k)
        bar.set_postfix(psnr=f"{np.nanmean(np.concatenate(psnrs)):.2f}dB")

    return bar, progress


def _encode(args: argparse.Namespace) -> int:
    from bench.datasets.prepared import open_prepared
    from inr.encode import encode_split

    cfg = build_config(args)
    _quiet_compile(cfg)
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    ds = open_prepared(args.prepared)
    if ds.native:  # images of different sizes: fitted in groups of one size (inr.native)
        return _encode_native(args, cfg, ds)
    split, n, images, labels, source = _select(args, ds)
    shown: dict = {}  # the header and the bar, once the work folder is checked (a refusal of it comes first)

    def start() -> None:
        print(_header(args, cfg, ds, split, n, f"device {args.device}"), flush=True)
        shown["bar"], shown["progress"] = _progress_bar(args, n, "encode")

    try:
        out = encode_split(images, labels, cfg, args.out, device=args.device, source=source,
                           progress=lambda k, p: shown["progress"](k, p), keep_work=args.keep_work,
                           fit_cache=args.fit_cache, overwrite=args.overwrite, log=_log, on_start=start)
    finally:
        if "bar" in shown:
            shown["bar"].close()
    return _finish(out, args, "raw RGB")


def _log(line: str) -> None:
    """A note (``encode: resuming ...``) on stdout that does not break a progress bar being drawn."""
    import sys

    from tqdm import tqdm

    tqdm.write(line)
    sys.stdout.flush()


def _run_rank(args: argparse.Namespace, world) -> int:
    """One rank of ``encode`` under torchrun, ended by ``bench.dist.run_rank`` (``os._exit`` when it
    owns the process group; the status back to an in-process driver that joined the group itself)."""
    import torch.distributed as tdist

    owner = not (tdist.is_available() and tdist.is_initialized())
    return dist.run_rank(lambda: _encode_distributed(args, world, owner))


def _encode_distributed(args: argparse.Namespace, world, owner: bool = True) -> int:
    """One rank of ``encode`` under torchrun: its shards on its device; rank 0 merges and reports.
    ``owner``: this call joins the process group and leaves it at the end."""
    from bench.datasets.prepared import open_prepared
    from inr.encode import shard_ranges

    with dist.said_once_per_node(world):  # the same refusal on every rank of a node: said once
        device = dist.rank_device(args.device, world)
        cfg = build_config(args)
        ds = open_prepared(args.prepared)
        split, n, images, labels, source = _select(args, ds, world.world_size)
    _quiet_compile(cfg)
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    world = dist.init(device, args.dist_timeout)
    try:
        if world.is_main:
            print(_header(args, cfg, ds, split, n, f"{world.world_size} processes ({world.backend}), "
                                                   f"device {args.device}"), flush=True)
        mine = sum(e - s for si, (s, e) in enumerate(shard_ranges(n, cfg.shard_size))
                   if si % world.world_size == world.rank)
        bar, progress = _progress_bar(args, mine, f"encode rank {world.rank}/{world.world_size}",
                                      disable=not world.is_main)
        try:
            out, ranks = encode_split_distributed(
                images, labels, cfg, args.out, world, device=device, source=source, progress=progress,
                keep_work=args.keep_work, fit_cache=args.fit_cache, overwrite=args.overwrite,
                log=_log if world.is_main else None)
        except PeerFailed:
            return 2  # rank 0 prints the one line naming the failed rank
        finally:
            bar.close()
        if out is None:
            return 0
        print("shards per rank: " + "; ".join(
            f"rank {r['rank']} {len(r['fitted'])} fitted, {len(r['resumed'])} resumed ({r['images']} images)"
            for r in ranks))
        return _finish(out, args, "raw RGB")
    finally:
        if owner:
            dist.shutdown()


class PeerFailed(Exception):
    """Another rank of a distributed encode failed; rank 0 reports it (``encode_split_distributed``)."""


def encode_split_distributed(
    images, labels, cfg, out, world, device: str = "cpu", source: dict | None = None, progress=None,
    keep_work: bool = False, fit_cache=None, overwrite: bool = False, log=None,
) -> tuple[Any, list[dict]]:
    """``encode_split`` as one rank: rank 0 claims ``out`` and opens the work folder, every rank fits shards
    ``si % world_size == rank``, rank 0 merges -> ``(out or None, per-rank summaries)``; a failed rank is
    an ``InputError`` on rank 0 naming it (``PeerFailed`` on the others)."""
    from pathlib import Path

    from bench import workdir
    from inr.encode import (
        _split,
        claim_store,
        encode_shards,
        finished_shards,
        merge_work,
        resume_line,
    )

    out = Path(out)
    sp = status = None
    with contextlib.ExitStack() as held:
        if world.is_main:
            try:
                out = held.enter_context(claim_store(out, source, fit_cache, overwrite))
                sp = _split(images, labels, cfg, out, source)
                if not workdir.create_or_check(sp.work, "encode", sp.job) and log is not None:
                    every = finished_shards(sp, cfg)  # every rank's: rank 0 speaks for the run
                    resumed = sum(p is not None for p in every.values())
                    if resumed:
                        log(resume_line(resumed, len(every), sp.work))
            except (InputError, OSError) as e:
                status = _message(e)
        status, out = dist.broadcast_object((status, str(out)))
        out = Path(out)  # rank 0's resolved path
        if status is not None:
            if world.is_main:
                raise InputError(status)
            raise PeerFailed(status)
        done: dict = {"rank": world.rank}
        try:
            if not world.is_main:
                sp = _split(images, labels, cfg, out, source)
                if not (sp.work / workdir.WORK_JSON).is_file():
                    raise InputError(f"rank {world.rank} does not see the work folder rank 0 created (the ranks "
                                     "need one shared file system)", sp.work)
                workdir.check(sp.work, "encode", sp.job)
            done = encode_shards(sp, cfg, device, progress, fit_cache, world.rank, world.world_size)
        except (InputError, OSError) as e:
            status = _message(e)
        ranks = dist.all_gather_object({**done, "error": status})
        failed = [r for r in ranks if r["error"] is not None]
        if failed:
            if not world.is_main:
                raise PeerFailed(status)
            what = "; ".join(f"rank {r['rank']}: {r['error']}" for r in failed)
            raise InputError(f"{len(failed)} of {world.world_size} ranks failed ({what}); finished shards are kept in "
                             f"{sp.work.name}: rerun to resume")
        if not world.is_main:
            return None, ranks
        return merge_work(sp, cfg, out, source, keep_work), ranks


def _message(e: BaseException) -> str:
    """One line for an ``InputError`` or ``OSError`` (as ``bench.errors.guarded`` prints it)."""
    return one_line(os_error_message(e) if isinstance(e, OSError) else str(e))


def _encode_native(args: argparse.Namespace, cfg, ds) -> int:
    """``encode`` of a native-size split (``prepare --size native``): one store, images grouped by size."""
    from bench.datasets.identity import source_record
    from inr.native import encode_native, size_groups

    split = ds.native_split(args.split)
    n = len(split) if args.limit is None else min(len(split), args.limit)
    if n < 1:
        raise InputError(f"split {args.split!r} has no images to encode", args.prepared)
    source = source_record(ds, args.split, args.limit)
    shown: dict = {}  # the header and the bar, once the work folder is checked (a refusal of it comes first)

    def start() -> None:
        print(f"encode {ds.root} [{args.split}] {n} images, native sizes ({len(size_groups(split.sizes[:n]))} size "
              f"groups): {cfg.fit.arch}, {cfg.fit.iterations} iterations, {cfg.fit.step} fit step, "
              f"bits {list(cfg.quant.bits)}, device {args.device}", flush=True)
        shown["bar"] = progress_bar(n, "encode", "img", enabled=not args.no_progress, dynamic_ncols=True)

    try:
        out = encode_native(list(split.images[:n]), split.labels[:n], cfg, args.out, device=args.device, source=source,
                            progress=lambda k, p: shown["bar"].update(k), overwrite=args.overwrite,
                            fit_cache=args.fit_cache, keep_work=args.keep_work, log=_log, on_start=start)
    finally:
        if "bar" in shown:
            shown["bar"].close()
    return _finish(out, args, "mean raw RGB")


def _finish(out, args: argparse.Namespace, raw_label: str) -> int:
    """Print the written store's one-line summary."""
    import numpy as np

    from inr.store import load

    if getattr(args, "at_rest", None):  # written packed (inr.encode.write_final)
        st = load(out, "cpu")
        n, per_image, raw, p, note = st.num_images, st.bytes_per_image, st.raw_bytes_per_image, st.psnr, _packed_note(st)
    else:  # verified in bounded memory (inr.store.StoreStream): a large store is not loaded whole for one line
        from inr.store import StoreStream

        ss = StoreStream(out)
        n, note = ss.num_images, ""
        per_image = out.stat().st_size / max(1, n)
        sizes = ss.read_array("sizes").astype(np.float64) if ss.entry("sizes") else None
        raw = float((sizes[:, 0] * sizes[:, 1]).mean() * 3) if sizes is not None else ss.image_size[0] * ss.image_size[1] * 3
        p = ss.psnr
    p = p.astype(np.float64)
    print(f"wrote {out}: {n} images, {per_image:.1f} bytes/image "
          f"({100 * per_image / raw:.1f}% of {raw_label}{note}), "
          f"PSNR mean {p.mean():.2f} dB (min {p.min():.2f})")
    return 0


def _packed_note(st) -> str:
    if st.at_rest is None:
        return ""
    return f"; packed on disk ({st.at_rest['codec']}), store {st.store_bytes / max(1, st.num_images):.1f} bytes/image resident layout"
