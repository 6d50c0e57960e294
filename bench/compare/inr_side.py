"""The INR side of ``inrbench compare``: load stores, check they hold the split's images, decode to uint8."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from bench.compare.core import InrDecoded
from bench.datasets.identity import check_store_shape, check_store_source
from bench.datasets.prepared import PreparedDataset
from bench.errors import InputError
from bench.metrics import to_uint8

WEIGHT_ARRAYS = ("codes", "scales", "mask")
PIXELS_PER_FORWARD = 1 << 21  # activations [B, H*W, hidden] float32 stay ~0.25 GB at 32 wide


def variant_name(store, path: Path) -> str:
    """``meta["variant"]`` / ``meta["name"]`` of the store header, else the file name's stem."""
    meta = store.meta if isinstance(store.meta, dict) else {}  # a crafted header may hold anything
    for key in ("variant", "name"):
        if isinstance(meta.get(key), str) and meta[key]:
            return meta[key]
    return path.name.split(".")[0]


def _decode(store, sizes: np.ndarray, batch: int) -> list[np.ndarray]:
    """Images ``0..n-1`` of ``sizes`` (int ``[n, 2]``) as uint8 ``[H_i, W_i, 3]``, batched within each size."""
    from inr.native import size_groups

    out: list = [None] * len(sizes)
    for (h, w), idx in size_groups(sizes).items():
        step = max(1, min(batch, PIXELS_PER_FORWARD // (h * w)))
        for s in range(0, len(idx), step):
            x = to_uint8(store.decode(torch.as_tensor(idx[s : s + step]))).permute(0, 2, 3, 1).cpu().numpy()
            for k, i in enumerate(idx[s : s + step]):
                out[i] = x[k]
    return out


def load_variant(path: Path, ds: PreparedDataset, split: str, sizes: np.ndarray, labels: np.ndarray,
                 image_size: tuple[int, int] | None, batch: int = 64, weight_images: int = 256,
                 allow_unverified: bool = False) -> InrDecoded:
    """Decode the first ``len(sizes)`` images of the store at ``path`` (``image_size``: the split's, ``None``
    for native sizes). Refuses (``InputError`` naming the file) a store not encoded from the split, with
    fewer images, other sizes or other labels, each checked before anything is decoded."""
    from inr.store import load

    store = load(path, "cpu")  # refuses a missing path, a folder, a FIFO ... naming what it is
    check_store_source(store, ds, split, allow_unverified=allow_unverified)
    n = len(sizes)
    native = image_size is None
    if not native:
        check_store_shape(store, n, image_size, path, at_least=True)
    elif store.num_images < n:
        raise InputError(f"store has {store.num_images} images, the split (after --limit) has {n}", path)
    elif not np.array_equal(store.image_sizes[:n] if store.image_sizes is not None
                            else np.tile(np.array(store.image_size), (n, 1)), sizes):
        raise InputError("image sizes differ from the prepared split's: is it a store of another dataset?", path)
    if not np.array_equal(store.labels.cpu().numpy()[:n], np.asarray(labels)[:n]):
        raise InputError("labels differ from the prepared split's: is it a store of another dataset or split?", path)
    with torch.no_grad():
        decoded = _decode(store, sizes, batch)
        layers = store.weights(torch.arange(min(store.num_images, weight_images)))
    packed = store.at_rest  # a packed file's arrays are compressed together: no header-free count
    weight_bytes = sum(a["nbytes"] for a in store.header["arrays"] if str(a["name"]).startswith(WEIGHT_ARRAYS))
    return InrDecoded(
        name=variant_name(store, path), bytes_per_image=float(store.bytes_per_image),
        decoded=decoded if native else np.stack(decoded),
        header_free_bytes_per_image=None if packed else weight_bytes / store.num_images,
        path=str(path), arch=str(store.arch),
        weights={f"layer{i}": w.float().cpu().numpy().ravel() for i, (w, _) in enumerate(layers)},  # no biases
        resident_bytes_per_image=store.resident_bytes() / store.num_images,
        at_rest=None if not packed else str(packed.get("codec")),
    )


def load_variants(paths: Sequence[str | Path], ds: PreparedDataset, split: str, sizes: np.ndarray,
                  labels: np.ndarray, **kw) -> list[InrDecoded]:
    """``load_variant`` of each store; two stores with one variant name are told apart by file name."""
    variants = [load_variant(Path(p), ds, split, sizes, labels, **kw) for p in paths]
    names = [v.name for v in variants]
    if len(set(names)) != len(names):
        variants = [replace(v, name=Path(v.path).name.split(".")[0]) if names.count(v.name) > 1 else v
                    for v in variants]
        names = [v.name for v in variants]
        if len(set(names)) != len(names):
            raise InputError(f"two stores share the variant name and file name: {names}")
    return variants


def payload_variant(v: InrDecoded) -> InrDecoded:
    """``v`` counted by its payload (``--inr-bytes payload``): the weight arrays / N, no store header;
    ``InputError`` for a store packed at rest (its arrays are compressed together)."""
    if v.header_free_bytes_per_image is None:
        raise InputError("INR bytes 'payload' need the store's array table (none for a store packed at rest)", v.path)
    return replace(v, bytes_per_image=float(v.header_free_bytes_per_image))
