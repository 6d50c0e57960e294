"""Encode images of different sizes (``prepare --size native``) into one store, resumably: one batched
group per size, shard files in a work folder, the store assembled from them alone."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from bench import workdir
from bench.datasets.prepared import sha256_array
from bench.errors import InputError
from inr import store
from inr.encode import (
    EncodeConfig,
    _job,
    claim_store,
    concat_layers,
    early_stop_record,
    encode_images,
    resume_line,
    shards_kept,
    work_path,
    write_final,
)
from inr.meta import init_record
from inr.quantize import QLayer


def size_groups(sizes: np.ndarray) -> dict[tuple[int, int], list[int]]:
    """``(H, W) -> image indices`` in first-appearance order (indices ascending within a group)."""
    groups: dict[tuple[int, int], list[int]] = {}
    for i, (h, w) in enumerate(np.asarray(sizes).reshape(-1, 2).tolist()):
        groups.setdefault((int(h), int(w)), []).append(i)
    return groups


@dataclass(frozen=True)
class NativeShard:
    """One unit of work: images ``index`` (int positions in the split, ascending) of size ``(h, w)``;
    ``first_index``: the seed index of its first image (``encode_images``), the group's first image
    plus the shard's offset in the group, so splitting a group does not change any image's seed."""

    h: int
    w: int
    index: list[int]
    first_index: int


def native_shards(sizes: np.ndarray, shard_size: int) -> list[NativeShard]:
    """The shards of images of ``sizes`` (int ``[N, 2]``, (H, W)): each size group in first-appearance
    order, cut into pieces of at most ``shard_size`` images; shard ``si`` is ``shard_{si:05d}.inr``."""
    out = []
    for (h, w), idx in size_groups(sizes).items():
        for s in range(0, len(idx), shard_size):
            out.append(NativeShard(h, w, idx[s : s + shard_size], idx[0] + s))
    return out


def reorder(layers: Sequence[QLayer], order: np.ndarray) -> list[QLayer]:
    """The layers' images taken in ``order`` (an index array over the image axis)."""
    idx = torch.as_tensor(np.asarray(order, dtype=np.int64))

    def pick(t: torch.Tensor | None) -> torch.Tensor | None:
        return None if t is None else t.index_select(0, idx)

    return [QLayer(q.bits, pick(q.codes), pick(q.lo), pick(q.step), pick(q.mask)) for q in layers]


def _finished(path: Path, sh: NativeShard) -> store.StoredINR | None:
    """The shard at ``path`` when it is intact and holds ``sh``'s images (count and size), else None."""
    if not path.is_file():
        return None
    try:
        st = store.load(path, "cpu")  # every CRC checked
    except InputError:
        return None  # a damaged shard is refitted
    if st.num_images != len(sh.index) or tuple(st.image_size) != (sh.h, sh.w) or st.psnr is None:
        return None
    return st


def _finished_psnr(path: Path, sh: NativeShard) -> np.ndarray | None:
    """The per-image PSNRs of the finished shard ``sh`` at ``path`` (``_finished``), else None."""
    st = _finished(path, sh)
    return None if st is None else st.psnr


def encode_native(
    images: Sequence[np.ndarray], labels, cfg: EncodeConfig, out: str | Path, device: str | torch.device = "cpu",
    source: dict | None = None, progress: Callable[[int, np.ndarray], None] | None = None,
    overwrite: bool = False, fit_cache: str | Path | None = None, keep_work: bool = False,
    log: Callable[[str], None] | None = None, on_start: Callable[[], None] | None = None,
) -> Path:
    """Encode uint8 ``[H_i, W_i, 3]`` images (one per label) into ``out``, resumably, claimed as
    ``encode_split``'s; ``source`` recorded and checked on resume; ``progress(n, psnr [n])`` per shard;
    ``log``, ``on_start``, ``keep_work`` as ``encode_split``'s."""
    labels = np.asarray(labels, dtype=np.int64).reshape(-1)
    if len(images) != labels.shape[0] or not len(images):
        raise InputError(f"{len(images)} images but {labels.shape[0]} labels (need at least one)", out)
    sizes = np.array([im.shape[:2] for im in images], dtype=np.int64)
    with claim_store(out, source, fit_cache, overwrite) as out:
        work = work_path(out)
        shards = native_shards(sizes, cfg.shard_size)
        # the job: configuration, source and the sizes (which fix the shards); h, w of the first image
        job = {**_job(cfg, source, len(images), *map(int, sizes[0])), "native_sizes_sha256": sha256_array(sizes)}
        with workdir.opened(work, "encode", job, shards_kept(len(shards)), log):
            finished = {si: _finished_psnr(work / f"shard_{si:05d}.inr", sh) for si, sh in enumerate(shards)}
            if on_start is not None:
                on_start()
            resumed = sum(p is not None for p in finished.values())
            if resumed and log is not None:
                log(resume_line(resumed, len(shards), work))
            for si, sh in enumerate(shards):
                _encode_shard(images, labels, cfg, work / f"shard_{si:05d}.inr", si, sh, device, progress, fit_cache,
                              finished.pop(si))
        _assemble(out, work, shards, labels, sizes, cfg, source)
        if not keep_work:
            workdir.remove(work, "encode")
    return out


def _encode_shard(images, labels: np.ndarray, cfg: EncodeConfig, path: Path, si: int, sh: NativeShard, device,
                  progress, fit_cache, done: np.ndarray | None) -> None:
    """Fit shard ``sh`` into ``path`` (one-size store, written atomically) unless ``done``, its PSNRs
    when it was found finished there before the run started (``_finished_psnr``), says it is there."""
    if done is not None:
        if progress is not None:
            progress(len(sh.index), done)
        return
    group = np.stack([np.asarray(images[i]) for i in sh.index])
    enc = encode_images(group, cfg, device=device, first_index=sh.first_index, progress=progress, fit_cache=fit_cache)
    store.save(path, cfg.fit.arch, (sh.h, sh.w), labels[sh.index], enc.layers, psnr=enc.psnr,
               meta={"shard": si, "index": sh.index, "first_index": sh.first_index, "stages": enc.stages},
               per_channel=cfg.quant.per_channel)


def _assemble(out: Path, work: Path, shards: list[NativeShard], labels: np.ndarray, sizes: np.ndarray,
              cfg: EncodeConfig, source: dict | None) -> None:
    """The final store from the shard files alone (so a resumed encode writes the same bytes)."""
    parts, order, psnrs, done = [], [], [], []
    for si, sh in enumerate(shards):
        path = work / f"shard_{si:05d}.inr"
        st = _finished(path, sh)
        if st is None:
            raise InputError(f"shard {path.name} is missing or damaged; rerun to fit it", work)
        parts.append(st.quantized_layers())
        order += sh.index
        psnrs.append(st.psnr)
        done.append({"size": [sh.h, sh.w], "images": len(sh.index), **st.meta.get("stages", {})})
    inverse = np.argsort(np.asarray(order))  # position in the concatenation of each original image
    layers = reorder(concat_layers(parts), inverse)
    psnr = np.concatenate(psnrs)[inverse]
    meta = {"encode": cfg.to_dict(), "source": source or {}, "fit": cfg.fit.to_dict(), "bits": list(cfg.quant.bits),
            "native": {"groups": len(size_groups(sizes)), "shards": done}}
    if cfg.fit.target_psnr:
        meta["early_stop"] = early_stop_record([(d["images"], d) for d in done], cfg.fit)
    if cfg.fit.init_sha256:  # the learned init this store was fitted from (inrbench meta-init)

        meta["init"] = init_record(cfg.fit.init, cfg.fit.init_sha256)
    write_final(out, work, cfg.at_rest, lambda path: store.save(
        path, cfg.fit.arch, tuple(sizes[0]), labels, layers, psnr=psnr, meta=meta,
        per_channel=cfg.quant.per_channel, image_sizes=sizes))
