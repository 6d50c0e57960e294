"""Encode images of different sizes (``prepare --size native``) into one store.

Images are grouped by size; each group is fitted batched by ``inr.encode.encode_images``
(coordinates ``inr.siren.coord_grid``: each axis normalized to [-1, 1] on its own, so the
aspect is kept by the grid's spacing), the groups' quantized layers are put back in the
split's image order and written as one version-2 store that records every image's size
(``inr.store``: ``sizes`` array). Unlike ``inr.encode.encode_split`` there are no shards and
no resume: a native-size split is a compression study of tens of images, not a training set.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch

from inr import store
from inr.encode import EncodeConfig, concat_layers, encode_images
from inr.quantize import QLayer


def size_groups(sizes: np.ndarray) -> dict[tuple[int, int], list[int]]:
    """``(H, W) -> image indices`` in first-appearance order (indices ascending within a group)."""
    groups: dict[tuple[int, int], list[int]] = {}
    for i, (h, w) in enumerate(np.asarray(sizes).reshape(-1, 2).tolist()):
        groups.setdefault((int(h), int(w)), []).append(i)
    return groups


def reorder(layers: Sequence[QLayer], order: np.ndarray) -> list[QLayer]:
    """The layers' images taken in ``order`` (an index array over the image axis)."""
    idx = torch.as_tensor(np.asarray(order, dtype=np.int64))

    def pick(t: torch.Tensor | None) -> torch.Tensor | None:
        return None if t is None else t.index_select(0, idx)

    return [QLayer(q.bits, pick(q.codes), pick(q.lo), pick(q.step), pick(q.mask)) for q in layers]


def encode_native(
    images: Sequence[np.ndarray], labels, cfg: EncodeConfig, out: str | Path, device: str | torch.device = "cpu",
    source: dict | None = None, progress: Callable[[int, np.ndarray], None] | None = None,
    overwrite: bool = False, fit_cache: str | Path | None = None,
) -> Path:
    """Encode uint8 ``[H_i, W_i, 3]`` images (one per label) into the store ``out``.

    ``source`` is recorded in the store's meta (``bench.datasets.identity``); ``out`` is claimed
    like ``encode_split``'s (never inside the prepared dataset; replaced only with ``overwrite``).
    """
    from bench.errors import InputError
    from bench.outputs import claim

    labels = np.asarray(labels, dtype=np.int64).reshape(-1)
    if len(images) != labels.shape[0] or not len(images):
        raise InputError(f"{len(images)} images but {labels.shape[0]} labels (need at least one)", out)
    sizes = np.array([im.shape[:2] for im in images], dtype=np.int64)
    inputs = {"prepared dataset": (source or {}).get("prepared"), "fit cache (--fit-cache)": fit_cache}
    with claim(out, "store", inputs=inputs, mode="replace" if overwrite else "new") as out:
        parts, order, psnrs, stages = [], [], [], {}
        for (h, w), idx in size_groups(sizes).items():
            group = np.stack([np.asarray(images[i]) for i in idx])
            enc = encode_images(group, cfg, device=device, first_index=idx[0], progress=progress, fit_cache=fit_cache)
            parts.append(enc.layers)
            order += idx
            psnrs.append(enc.psnr)
            stages[f"{h}x{w}"] = dict(enc.stages, images=len(idx))
        inverse = np.argsort(np.asarray(order))  # position in the concatenation of each original image
        layers = reorder(concat_layers(parts), inverse)
        psnr = np.concatenate(psnrs)[inverse]
        meta = {"encode": cfg.to_dict(), "source": source or {}, "fit": cfg.fit.to_dict(), "bits": list(cfg.quant.bits),
                "native": {"groups": len(stages), "stages": stages}}
        if cfg.fit.init_sha256:  # the learned init this store was fitted from (inrbench meta-init)
            from inr.meta import init_record

            meta["init"] = init_record(cfg.fit.init, cfg.fit.init_sha256)
        store.save(out, cfg.fit.arch, tuple(sizes[0]), labels, layers, psnr=psnr, meta=meta,
                   per_channel=cfg.quant.per_channel, image_sizes=sizes)
    return out
