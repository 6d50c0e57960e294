"""The whole encode of a split: fit -> prune -> (QAT) -> quantize -> store, in resumable shards; seeded
per image with fixed shard bounds, so a resumed encode writes an uninterrupted one's bytes."""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from bench import workdir
from bench.atomic import atomic_write_bytes
from bench.datasets.prepared import sha256_array
from bench.errors import InputError
from bench.outputs import claim
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


def work_path(out: Path) -> Path:
    return workdir.work_path(out, "encode")


@dataclass(frozen=True)
class EncodeConfig:
    """fit / prune / quant as in their modules; ``qat_iterations`` > 0: a quantization-aware fine-tune first."""

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

    layers: list[QLayer]
    psnr: np.ndarray
    stages: dict = field(default_factory=dict)  # mean PSNR after each stage, prune ratios


def _cached_fit(imgs: np.ndarray, cfg: EncodeConfig, dev, first_index: int, cache: Path | None, progress) -> FitResult:
    """``fit``, or its float32 result from ``cache`` (a store keyed by fit config, images, first index)."""
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
    """Encode uint8 ``[N, H, W, 3]`` images (a shard); ``fit_cache``: a folder of float32 fits reused by
    encodes of the same images and ``FitConfig``."""
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
    """Shards' ``QLayer``s along the image axis (a layer pruned in any shard gets masks everywhere)."""
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


def shards_kept(total: int) -> Callable[[Path], str | None]:
    """What a failed encode leaves in its work folder to resume (``workdir.opened``)."""
    def kept(work: Path) -> str | None:
        k = sum((work / f"shard_{si:05d}.inr").is_file() for si in range(total))
        return f"{k} of {total} fitted shards" if k else None
    return kept


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
    """Encode uint8 ``[N, H, W, 3]`` ``images`` with int64 ``labels`` into the store ``out`` (claimed first), resumably.
    ``source`` (the prepared dataset's identity) is recorded and part of the job; ``progress(n, psnr)`` as images
    finish; ``on_start()`` once the work folder is checked; ``log(line)`` gets the resume and kept notes."""
    with claim_store(out, source, fit_cache, overwrite) as out:
        return _encode_split(images, labels, cfg, out, device, source, progress, keep_work, fit_cache, log, on_start)


@contextlib.contextmanager
def claim_store(out: str | Path, source: dict | None, fit_cache: str | Path | None,
                overwrite: bool) -> Iterator[Path]:
    """``claim`` of the store ``out`` for the block, and ``fit_cache`` checked: neither overlaps the prepared
    dataset in ``source``, nor may the cache lie in the work folder; yields ``out`` resolved."""
    inputs = {"prepared dataset": (source or {}).get("prepared"), "fit cache (--fit-cache)": fit_cache}
    with claim(out, "store", inputs=inputs, mode="replace" if overwrite else "new") as claimed:
        if fit_cache is not None:
            work = work_path(claimed)
            cache = Path(fit_cache).expanduser().resolve()
            if cache == work or work in cache.parents:
                raise InputError(f"--fit-cache {fit_cache}: lies in this encode's work folder {work}, which is "
                                 "removed once the store is written; choose another --fit-cache")
            with claim(fit_cache, "fit-cache", inputs={"prepared dataset": inputs["prepared dataset"]},
                       mode="append", option="--fit-cache", lock=False):
                pass  # created and marked as a fit cache
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
    return _Split(imgs, labels, work_path(out), _job(cfg, source, n, h, w))


def shard_ranges(n: int, shard_size: int) -> list[tuple[int, int]]:
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
    """Shard ``si`` of this rank -> its PSNRs when finished and intact in the work folder, else None."""
    return {si: _finished(sp.work / f"shard_{si:05d}.inr", e - s)
            for si, (s, e) in enumerate(shard_ranges(sp.shape[0], cfg.shard_size)) if si % world_size == rank}


def resume_line(resumed: int, total: int, work: Path) -> str:
    return f"encode: resuming, {resumed} of {total} shards already fitted (work folder {work})"


def encode_shards(sp: _Split, cfg: EncodeConfig, device, progress, fit_cache, rank: int = 0,
                  world_size: int = 1, finished: dict[int, np.ndarray | None] | None = None) -> dict:
    """Fit this rank's unfinished shards (``si % world_size == rank``), each an atomic store in the work folder;
    -> ``{"fitted": [si...], "resumed": [si...], "images": k}``."""
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
    """Merge the shards into the store ``out`` (``inr.merge``, streamed) and remove the work folder."""
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
        workdir.remove(sp.work, "encode")
    return out


def write_final(out: Path, work: Path, at_rest: str | None, write: Callable[[Path], object]) -> None:
    """``write(path)`` writes the store: to ``out``, or (packed at rest) to the work folder, then packed to ``out``."""
    if not at_rest:
        write(out)
        return
    staged = work / "store.inr"
    write(staged)
    atomic_write_bytes(out, atrest.pack(staged.read_bytes(), at_rest))
    staged.unlink()


def early_stop_record(shards: list[tuple[int, dict]], fit_cfg: FitConfig) -> dict:
    """What early stop did over a store's shards (``(images, stages)`` each): mean iterations, images stopped."""
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
    total = len(shard_ranges(sp.shape[0], cfg.shard_size))
    with workdir.opened(sp.work, "encode", sp.job, shards_kept(total), log):
        finished = finished_shards(sp, cfg)
        if on_start is not None:
            on_start()
        resumed = sum(p is not None for p in finished.values())
        if resumed and log is not None:
            log(resume_line(resumed, len(finished), sp.work))
        encode_shards(sp, cfg, device, progress, fit_cache, finished=finished)
        return merge_work(sp, cfg, out, source, keep_work)
