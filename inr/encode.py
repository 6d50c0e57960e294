"""The whole encode of a split: fit -> prune -> (QAT) -> quantize -> store, sharded and resumable.

Images are encoded in shards of ``shard_size`` images. Each finished shard is written
atomically as a complete store file in a work folder beside the output
(``OUT.work/shard_00000.inr``, plus ``config.json`` naming the configuration and input).
A rerun with the same configuration and input skips the finished shards; the final file is
the concatenation of the shards' codes, re-packed and written atomically by the streamed merge
(``inr.merge``: bounded memory, whatever the split's size), and the work folder is removed.
Fitting is seeded per image (``inr.siren.init_weights``) and shards have fixed boundaries, so
an interrupted-and-resumed encode writes the same bytes as an uninterrupted one (on the same
machine, device and thread count).

Distributed (``bench.commands.encode.encode_split_distributed``, under torchrun): shard ``si`` is
fitted by rank ``si % world_size``; rank 0 holds the output and merges. Shards are the same
files whichever process fits them, so the store is byte-identical to a one-process encode,
and a rerun after any rank was killed resumes from the shards on disk (with any number of
processes).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from bench.atomic import atomic_write_bytes, create_marked_dir
from bench.datasets.prepared import sha256_array
from bench.errors import InputError
from bench.jsontext import diff_keys
from bench.outputs import check_output, claim
from inr import atrest, store
from inr.fit import (
    FitConfig,
    FitResult,
    as_image_array,
    auto_batch,
    decode_psnr,
    fit,
    images_to_targets,
    optimize,
)
from inr.loop import Loop
from inr.merge import merge_stores
from inr.meta import init_record
from inr.prune import PruneConfig, prune_dynamic, prune_iterative
from inr.quantize import FLOAT_BITS, QLayer, QuantConfig, dequantize, fake_quantize, quantize
from inr.siren import coord_grid

WORK_SUFFIX = ".work"


@dataclass(frozen=True)
class EncodeConfig:
    """fit / prune / quant as in their modules; qat_iterations > 0 adds a quantization-aware
    fine-tune at ``qat_lr`` (straight-through fake quantization) before the final quantization."""

    fit: FitConfig
    quant: QuantConfig
    prune: PruneConfig = field(default_factory=PruneConfig)
    qat_iterations: int = 0
    qat_lr: float = 1e-4
    shard_size: int = 1024
    at_rest: str | None = None  # the store is written packed (inr.atrest); not part of what the fit depends on

    def __post_init__(self) -> None:
        if len(self.quant.bits) != self.fit.arch.num_linear:
            raise ValueError(f"{len(self.quant.bits)} bit widths for {self.fit.arch.num_linear} layers")
        if self.shard_size < 1 or self.qat_iterations < 0:
            raise ValueError(f"shard_size >= 1 and qat_iterations >= 0 required, got {self.shard_size}, "
                             f"{self.qat_iterations}")
        if not 0 < self.qat_lr < float("inf"):
            raise ValueError(f"qat_lr must be > 0 and finite, got {self.qat_lr}")
        if self.at_rest is not None and self.at_rest not in atrest.CODECS:
            raise ValueError(f"unknown at-rest codec {self.at_rest!r} (known: {', '.join(atrest.CODECS)})")

    def to_dict(self) -> dict:
        return {
            "fit": self.fit.to_dict(),
            "quant": self.quant.to_dict(),
            "prune": self.prune.to_dict(),
            "qat_iterations": self.qat_iterations,
            "qat_lr": self.qat_lr,
            "shard_size": self.shard_size,
        }


@dataclass
class Encoded:
    """One encoded block of images: quantized layers and the PSNR of their dequantized weights."""

    layers: list[QLayer]
    psnr: np.ndarray
    stages: dict = field(default_factory=dict)  # mean PSNR after each stage, prune ratios


def _cached_fit(imgs: np.ndarray, cfg: EncodeConfig, dev, first_index: int, cache: Path | None, progress) -> FitResult:
    """``fit``, or its float32 result from ``cache`` (a store file keyed by fit config, images, index)."""
    if cache is None:
        return fit(imgs, cfg.fit, device=dev, first_index=first_index, progress=progress)
    key = hashlib.sha256(json.dumps(
        {"fit": cfg.fit.to_dict(), "first_index": first_index, "pixels": sha256_array(np.asarray(imgs))},
        sort_keys=True, default=str).encode()).hexdigest()[:24]
    path = Path(cache) / f"fit_{key}.inr"
    if path.exists():
        try:
            st = store.load(path, "cpu")
            weights = dequantize(st.quantized_layers())
            psnr = decode_psnr(weights, imgs, cfg.fit.arch, device=dev)
            if progress is not None:
                progress(imgs.shape[0], psnr)
            extra = {"cached": str(path)}
            if "iterations_run" in st.meta:  # the iterations the cached fit ran (early stop)
                extra["iterations_run"] = np.asarray(st.meta["iterations_run"], dtype=np.int64)
            return FitResult(weights=weights, psnr=psnr, config=cfg.fit, extra=extra)
        except InputError:
            pass  # a damaged cache entry is refitted and rewritten
    res = fit(imgs, cfg.fit, device=dev, first_index=first_index, progress=progress)
    layers = quantize(res.weights, QuantConfig((FLOAT_BITS,) * cfg.fit.arch.num_linear))
    store.save(path, cfg.fit.arch, imgs.shape[1:3], np.zeros(imgs.shape[0], np.int64), layers, psnr=res.psnr,
               meta={"fit_cache": cfg.fit.to_dict(), "first_index": first_index,
                     "iterations_run": [int(x) for x in res.extra["iterations_run"]]})
    return res


def encode_images(
    images, cfg: EncodeConfig, device: str | torch.device = "cpu", first_index: int = 0,
    progress: Callable[[int, np.ndarray], None] | None = None, fit_cache: str | Path | None = None,
) -> Encoded:
    """Encode uint8 ``[N, H, W, 3]`` images (no files but the optional fit cache): the unit of work of a shard.

    ``fit_cache``: a folder where float32 fits are kept and reused by later encodes of the same
    images with the same ``FitConfig`` (e.g. the fp32 / 8-bit / pruned variants of one sweep).
    """
    imgs = as_image_array(images)
    dev = torch.device(device)
    arch = cfg.fit.arch
    # progress is reported once the images are final (after prune / quantize) when those stages run
    late = cfg.prune.enabled or cfg.qat_iterations > 0
    res = _cached_fit(imgs, cfg, dev, first_index, None if fit_cache is None else Path(fit_cache), None if late else progress)
    stages = {"fit_psnr": float(res.psnr.mean()) if len(res.psnr) else None}
    ran = res.extra.get("iterations_run")
    if cfg.fit.target_psnr and ran is not None and len(ran):  # early stop: what the fit actually cost
        stages.update(fit_iterations_mean=float(np.mean(ran)),
                      fit_stopped_early=int(np.count_nonzero(ran < cfg.fit.iterations)))
    weights, masks = res.weights, None
    chunk = auto_batch(cfg.fit, max(1, imgs.shape[0]), imgs.shape[1] * imgs.shape[2], dev)
    run = {"chunk": chunk, "workers": cfg.fit.cpu_workers}
    if cfg.prune.budget_db is not None:
        weights, masks, p, ratio = prune_dynamic(weights, imgs, arch, cfg.prune, res.psnr, device=dev, **run)
        stages.update(prune_psnr=float(p.mean()), prune_ratio_mean=float(ratio.mean()))
    elif cfg.prune.ratio > 0:
        weights, masks, p = prune_iterative(weights, imgs, arch, cfg.prune, device=dev, **run)
        stages.update(prune_psnr=float(p.mean()), prune_ratio_mean=cfg.prune.ratio)
    if cfg.qat_iterations > 0 and not cfg.quant.is_float:

        def transform(ws, chunk_masks):
            return fake_quantize(ws, cfg.quant, chunk_masks)

        h, w = imgs.shape[1:3]
        weights, p, _ = optimize(
            weights, images_to_targets(imgs, dev), coord_grid(h, w, device=dev), arch,
            Loop(cfg.qat_iterations, cfg.qat_lr, chunk=chunk, workers=cfg.fit.cpu_workers), masks=masks,
            transform=transform,
        )
        weights = [(W.cpu(), b.cpu()) for W, b in weights]
        stages["qat_psnr"] = float(p.mean())
    layers = quantize(weights, cfg.quant, masks)
    psnr = decode_psnr(dequantize(layers), imgs, arch, device=dev)
    stages["final_psnr"] = float(psnr.mean()) if len(psnr) else None
    if late and progress is not None:
        progress(imgs.shape[0], psnr)
    return Encoded(layers=layers, psnr=psnr, stages=stages)


def concat_layers(parts: list[list[QLayer]]) -> list[QLayer]:
    """Concatenate shards' ``QLayer``s along the image axis (a layer pruned in any shard gets masks everywhere)."""
    out = []
    for li in range(len(parts[0])):
        ls = [p[li] for p in parts]
        any_mask = any(q.mask is not None for q in ls)
        masks = None
        if any_mask:
            masks = torch.cat([q.mask if q.mask is not None else torch.ones(q.codes.shape[0], q.codes.shape[1] - 1, q.codes.shape[2], dtype=torch.bool) for q in ls])
        lo = None if ls[0].lo is None else torch.cat([q.lo for q in ls])
        step = None if ls[0].step is None else torch.cat([q.step for q in ls])
        out.append(QLayer(ls[0].bits, torch.cat([q.codes for q in ls]), lo, step, masks))
    return out


def _job(cfg: EncodeConfig, source: dict | None, n: int, h: int, w: int) -> dict:
    """What a work folder's shards depend on: the configuration and the images (not where they lie)."""
    src = {k: v for k, v in (source or {}).items() if k != "prepared"}  # a moved dataset is the same input
    return json.loads(json.dumps({"encode": cfg.to_dict(), "source": src, "num_images": int(n), "image_size": [h, w]},
                                 default=str))


def _open_work(work: Path, job: dict) -> bool:
    """Create the work folder, or check that an existing one holds shards of this very job.
    Returns True when this call created it: nothing in it to resume. The folder appears with its
    ``config.json`` in one rename (``bench.atomic.create_marked_dir``), so a folder at that name
    without one, even an empty one, is someone else's: refused, never used or removed."""
    if work.is_symlink() or (work.exists() and not work.is_dir()):
        raise InputError("exists and is not an encode work folder; refusing to use or remove it", work)
    work.parent.mkdir(parents=True, exist_ok=True)
    if create_marked_dir(work, "config.json", job):
        return True
    _check_work(work, job)
    return False


@contextlib.contextmanager
def fresh_work(work: Path, job: dict):
    """``_open_work``; if the body then fails (out of memory, a bad option, Ctrl-C) before any shard
    was written in a work folder this call created, the folder is removed: nothing there to resume."""
    created = _open_work(work, job)
    try:
        yield
    except BaseException:
        if created and work.is_dir() and {p.name for p in work.iterdir()} <= {"config.json"}:
            shutil.rmtree(work, ignore_errors=True)
        raise


def _check_work(work: Path, job: dict) -> None:
    """The work folder's ``config.json`` names this very job (else an ``InputError``)."""
    try:
        old = json.loads((work / "config.json").read_text())
    except (OSError, ValueError):
        old = None
    if not isinstance(old, dict) or "encode" not in old:
        raise InputError("exists and is not an encode work folder (no config.json of inrbench encode); "
                         "refusing to use or remove it (an empty one may be left by an older inr-bench "
                         "killed while creating it: delete it to start over)", work)
    old = {**old, "source": {k: v for k, v in old.get("source", {}).items() if k != "prepared"}}
    if old != job:
        diff = sorted(diff_keys(old, job))
        raise InputError(f"holds shards of an encode with other settings ({', '.join(diff[:6])} "
                         f"{'differs' if len(diff) == 1 else 'differ'}); "
                         "delete it to start over, or rerun with those settings to resume", work)


def encode_split(
    images,
    labels,
    cfg: EncodeConfig,
    out: str | Path,
    device: str | torch.device = "cpu",
    source: dict | None = None,
    progress: Callable[[int, np.ndarray], None] | None = None,
    keep_work: bool = False,
    fit_cache: str | Path | None = None,
    overwrite: bool = False,
    log: Callable[[str], None] | None = None,
    on_start: Callable[[], None] | None = None,
) -> Path:
    """Encode ``images`` (uint8 ``[N, H, W, 3]``) with ``labels`` (int64 ``[N]``) into the store ``out``.

    Resumable: finished shards in ``OUT.work/`` are reused when ``config.json`` there matches.
    ``on_start()`` is called once the work folder is opened and checked (a folder of other settings is
    refused before it); ``log(line)`` then gets ``encode: resuming, K of M shards already fitted (work
    folder ...)`` when shards were found finished, and, if the run fails or is interrupted with shards
    on disk, ``encode: K of M shards are fitted and kept in ...: rerun the same command to resume``.
    ``source`` (e.g. the prepared dataset's identity) is recorded in the store's meta and
    checked on resume. ``progress(n_images, psnr [n])`` is called as images finish
    (immediately for shards found finished). ``fit_cache``: see ``encode_images`` (the fit is
    deterministic, so a cached fit gives the same file as a fresh one).

    ``out`` is claimed before any work (``bench.outputs.claim``): it must not overlap the
    prepared dataset named in ``source`` nor ``fit_cache``; an existing store there is replaced
    only with ``overwrite``; anything else there is refused. A second encode to the same
    ``out`` while this one runs is refused (a lock naming this process).
    """
    with claim_store(out, source, fit_cache, overwrite) as out:
        return _encode_split(images, labels, cfg, out, device, source, progress, keep_work, fit_cache, log, on_start)


@contextlib.contextmanager
def claim_store(out: str | Path, source: dict | None, fit_cache: str | Path | None,
                overwrite: bool) -> Iterator[Path]:
    """``bench.outputs.claim`` of the store ``out`` (held while the block runs) and the check of
    ``fit_cache``: neither may overlap the prepared dataset named in ``source``, and the cache may not
    lie in ``OUT.work`` (removed with it after success); yields ``out`` resolved."""
    inputs = {"prepared dataset": (source or {}).get("prepared"), "fit cache (--fit-cache)": fit_cache}
    with claim(out, "store", inputs=inputs, mode="replace" if overwrite else "new") as claimed:
        if fit_cache is not None:
            work = claimed.with_name(claimed.name + WORK_SUFFIX)
            cache = Path(fit_cache).expanduser().resolve()
            if cache == work or work in cache.parents:
                raise InputError(f"--fit-cache {fit_cache}: lies in this encode's work folder {work}, which is "
                                 "removed once the store is written; choose another --fit-cache")
            check_output(fit_cache, "fit-cache", inputs={"prepared dataset": inputs["prepared dataset"]},
                         mode="append", option="--fit-cache")
        yield claimed


@dataclass(frozen=True)
class _Split:
    """What every process of an encode derives from its arguments alone."""

    imgs: np.ndarray  # uint8 [N, H, W, 3]
    labels: np.ndarray  # int64 [N]
    work: Path
    job: dict

    @property
    def shape(self) -> tuple[int, int, int]:
        n, h, w, _ = self.imgs.shape
        return n, h, w


def _split(images, labels, cfg: EncodeConfig, out: Path, source) -> _Split:
    imgs = as_image_array(images, str(out))
    labels = np.asarray(labels, dtype=np.int64).reshape(-1)
    n, h, w, _ = imgs.shape
    if labels.shape[0] != n:
        raise InputError(f"{n} images but {labels.shape[0]} labels", out)
    return _Split(imgs, labels, out.with_name(out.name + WORK_SUFFIX), _job(cfg, source, n, h, w))


def shard_ranges(n: int, shard_size: int) -> list[tuple[int, int]]:
    """``(start, end)`` image ranges of the shards of ``n`` images; shard ``si`` is ``shard_{si:05d}.inr``."""
    return [(s, min(n, s + shard_size)) for s in range(0, n, shard_size)]


def _finished(path: Path, size: int) -> np.ndarray | None:
    """The PSNRs of a finished, intact shard of ``size`` images at ``path``, else None (to be refitted)."""
    if not path.exists():
        return None
    try:
        st = store.StoreStream(path)  # every CRC checked, in bounded memory
    except InputError:
        return None  # a damaged shard is recomputed
    if st.num_images != size:
        return None
    return st.psnr.astype(np.float32) if st.psnr is not None else np.full(size, np.nan, np.float32)


def finished_shards(sp: _Split, cfg: EncodeConfig, rank: int = 0, world_size: int = 1) -> dict[int, np.ndarray | None]:
    """Shard ``si`` (those with ``si % world_size == rank``) -> its PSNRs when it is finished and intact in the
    work folder, else None (to be fitted)."""
    return {si: _finished(sp.work / f"shard_{si:05d}.inr", e - s)
            for si, (s, e) in enumerate(shard_ranges(sp.shape[0], cfg.shard_size)) if si % world_size == rank}


def resume_line(resumed: int, total: int, work: Path) -> str:
    """What a rerun that finds finished shards says (as ``prepare`` and ``meta-init`` do)."""
    return f"encode: resuming, {resumed} of {total} shards already fitted (work folder {work})"


@contextlib.contextmanager
def kept_note(work: Path, total: int, log: Callable[[str], None] | None):
    """If the block fails or is interrupted (Ctrl-C) with fitted shards (``shard_{si:05d}.inr``, ``si <
    total``) in the work folder ``work``, ``log`` says they are kept and how to resume (as ``prepare``
    does); the exception goes on. Shared by the batched and the native-size encode (``inr.native``)."""
    try:
        yield
    except BaseException:
        kept = sum((work / f"shard_{si:05d}.inr").is_file() for si in range(total)) if work.is_dir() else 0
        if kept and log is not None:
            log(f"encode: {kept} of {total} shards are fitted and kept in {work}: rerun the same command to "
                "resume (or delete it)")
        raise


def encode_shards(sp: _Split, cfg: EncodeConfig, device, progress, fit_cache, rank: int = 0,
                  world_size: int = 1, finished: dict[int, np.ndarray | None] | None = None) -> dict:
    """Fit the shards ``si`` with ``si % world_size == rank`` that are not finished in the work folder
    (each written atomically as a complete store); -> ``{"fitted": [si...], "resumed": [si...], "images": k}``.
    ``finished``: ``finished_shards`` of this rank when the caller looked already."""
    n, h, w = sp.shape
    done: dict = {"rank": rank, "fitted": [], "resumed": [], "images": 0}
    if finished is None:
        finished = finished_shards(sp, cfg, rank, world_size)
    for si, (s, e) in enumerate(shard_ranges(n, cfg.shard_size)):
        if si % world_size != rank:
            continue
        path = sp.work / f"shard_{si:05d}.inr"
        done["images"] += e - s
        psnr = finished[si]
        if psnr is not None:
            done["resumed"].append(si)
            if progress is not None:
                progress(e - s, psnr)
            continue
        enc = encode_images(sp.imgs[s:e], cfg, device=device, first_index=s, progress=progress, fit_cache=fit_cache)
        store.save(path, cfg.fit.arch, (h, w), sp.labels[s:e], enc.layers, psnr=enc.psnr,
                   meta={"shard": si, "first_index": s, "stages": enc.stages}, per_channel=cfg.quant.per_channel)
        done["fitted"].append(si)
    return done


def merge_work(sp: _Split, cfg: EncodeConfig, out: Path, source, keep_work: bool) -> Path:
    """Merge the work folder's shards into the store ``out`` (``inr.merge``, streamed) and remove the folder."""
    n, h, w = sp.shape
    paths = [sp.work / f"shard_{si:05d}.inr" for si in range(len(shard_ranges(n, cfg.shard_size)))]
    missing = [p.name for p in paths if not p.is_file()]
    if missing:
        raise InputError(f"shards {', '.join(missing[:4])} are missing; rerun to fit them", sp.work)
    meta = {"encode": cfg.to_dict(), "source": source or {}, "fit": cfg.fit.to_dict(), "bits": list(cfg.quant.bits)}
    if cfg.fit.init_sha256:  # the learned init this store was fitted from (inrbench meta-init)

        meta["init"] = init_record(cfg.fit.init, cfg.fit.init_sha256)
    if cfg.fit.target_psnr:
        heads = [store.read_header(p) for p in paths]
        meta["early_stop"] = early_stop_record([(h["num_images"], h["meta"].get("stages", {})) for h in heads], cfg.fit)
    write_final(out, sp.work, cfg.at_rest, lambda path: merge_stores(
        path, paths, cfg.fit.arch, (h, w), cfg.quant.bits, cfg.quant.per_channel, meta, labels=sp.labels))
    if not keep_work:
        shutil.rmtree(sp.work, ignore_errors=True)
    return out


def write_final(out: Path, work: Path, at_rest: str | None, write: Callable[[Path], object]) -> None:
    """``write(path)`` writes the store; to ``out`` itself, or, packed at rest, to the work folder first, and
    only its complete packed form is renamed to ``out`` (a run killed while packing leaves the work folder to
    resume from and nothing at ``out``)."""
    if not at_rest:
        write(out)
        return
    staged = work / "store.inr"
    write(staged)
    atomic_write_bytes(out, atrest.pack(staged.read_bytes(), at_rest))
    staged.unlink()


def early_stop_record(shards: list[tuple[int, dict]], fit_cfg: FitConfig) -> dict:
    """What ``FitConfig.target_psnr`` did over a store's shards (``(images, stages)`` each, from the shard
    files): the target, the mean fit iterations per image and the images that stopped before ``iterations``."""
    n, its, stopped = 0, 0.0, 0
    for k, st in shards:
        if "fit_iterations_mean" not in st:  # a fit served from --fit-cache: its iterations were not recorded
            return {"target_psnr": fit_cfg.target_psnr, "iterations": fit_cfg.iterations, "recorded": False}
        n, its, stopped = n + k, its + k * float(st["fit_iterations_mean"]), stopped + int(st["fit_stopped_early"])
    return {"target_psnr": fit_cfg.target_psnr, "iterations": fit_cfg.iterations, "recorded": True,
            "fit_iterations_mean": its / max(n, 1), "stopped_early": stopped, "images": n}


def _encode_split(images, labels, cfg: EncodeConfig, out: Path, device, source, progress, keep_work, fit_cache,
                  log=None, on_start=None) -> Path:
    sp = _split(images, labels, cfg, out, source)
    with fresh_work(sp.work, sp.job), kept_note(sp.work, len(shard_ranges(sp.shape[0], cfg.shard_size)), log):
        finished = finished_shards(sp, cfg)
        if on_start is not None:
            on_start()
        resumed = sum(p is not None for p in finished.values())
        if resumed and log is not None:
            log(resume_line(resumed, len(finished), sp.work))
        encode_shards(sp, cfg, device, progress, fit_cache, finished=finished)
        return merge_work(sp, cfg, out, source, keep_work)
