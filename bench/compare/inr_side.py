"""Load INR stores for the comparison: decode every image to uint8 and sample weights.

Uses the codec's public API only (``inr.store.load(path, device) -> StoredINR`` with
``decode(idx) -> [B, 3, H, W]`` float in [0, 1], ``weights(idx)`` -> list over layers of
``(W [B, in, out], b [B, 1, out])`` dequantized, ``labels``, ``bytes_on_disk``,
``bytes_per_image``, ``header`` with its array table). The variant name is the store
header's ``meta["variant"]`` (or ``meta["name"]``) when present, else the file name
without its suffix.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from bench.compare.core import InrDecoded
from bench.datasets.identity import check_store_shape
from bench.errors import InputError
from bench.metrics import to_uint8


def variant_name(store, path: Path) -> str:
    """``meta["variant"]`` / ``meta["name"]`` of the store header, else the file name's stem."""
    meta = getattr(store, "meta", None)
    if isinstance(meta, dict):
        for key in ("variant", "name"):
            if isinstance(meta.get(key), str) and meta[key]:
                return meta[key]
    return path.name.split(".")[0]


WEIGHT_ARRAYS = ("codes", "scales", "mask")
PIXELS_PER_FORWARD = 1 << 21


def weight_data_bytes(store) -> int | None:
    """Bytes of the packed weight arrays (codes, scales, masks) from the store's array table:
    the INR's "header-free" bytes (no file header, labels, recorded PSNR or alignment padding).
    ``None`` when the store does not expose its array table."""
    header = getattr(store, "header", None)
    if not isinstance(header, dict) or "arrays" not in header:
        return None
    return int(sum(a["nbytes"] for a in header["arrays"] if str(a["name"]).startswith(WEIGHT_ARRAYS)))


def _count(store) -> int:
    n = getattr(store, "num_images", None)
    if n is None:
        n = len(store)
    return int(n)


def _decode_native(store, path: Path, sizes: np.ndarray, batch: int, device: str) -> list[np.ndarray]:
    """Decode images of different sizes, batched within each size; ``InputError`` when the store's
    sizes are not the split's."""
    from inr.native import size_groups

    n = len(sizes)
    have = store.image_sizes[:n] if store.image_sizes is not None else np.tile(np.array(store.image_size), (n, 1))
    if not np.array_equal(have, sizes):
        raise InputError("image sizes differ from the prepared split's: is it a store of another dataset?", path)
    out: list[np.ndarray | None] = [None] * n
    for (h, w), idx in size_groups(sizes).items():
        step = max(1, min(batch, PIXELS_PER_FORWARD // (h * w)))
        for s in range(0, len(idx), step):
            ii = torch.as_tensor(idx[s : s + step], device=device)
            x = to_uint8(store.decode(ii)).permute(0, 2, 3, 1).cpu().numpy()
            for k, i in enumerate(idx[s : s + step]):
                out[i] = x[k]
    return out


def load_variant(
    path: str | Path,
    n_images: int,
    image_size: tuple[int, int],
    labels: np.ndarray | None = None,
    batch: int = 64,
    weight_images: int = 256,
    device: str = "cpu",
    check=None,
    sizes: np.ndarray | None = None,
) -> InrDecoded:
    """Decode the first ``n_images`` images of the store at ``path`` to uint8 ``[n, H, W, 3]``.

    Refuses (``InputError`` naming the file) a store with fewer images, another image size
    or labels that differ from the prepared split's. ``check(store)``, when given, runs right
    after loading, before any decoding (``run.load_variants``: the store's source identity).
    """
    path = Path(path)
    if path.is_dir():
        raise InputError("is a folder, not an INR store file", path)
    if not path.is_file():
        raise InputError("no such INR store file", path)
    from inr.store import load

    store = load(path, device)
    if check is not None:
        check(store)
    n_store = _count(store)
    if sizes is None:  # bench's check (native sizes: _decode_native checks each image's size before decoding)
        check_store_shape(store, n_images, image_size, path, at_least=True)
    elif n_store < n_images:
        raise InputError(f"store has {n_store} images, the split (after --limit) has {n_images}", path)
    if labels is not None and getattr(store, "labels", None) is not None:
        sl = np.asarray(torch.as_tensor(store.labels).cpu())[:n_images]
        if not np.array_equal(sl, np.asarray(labels)[:n_images]):
            raise InputError("labels differ from the prepared split's: is it a store of another dataset or split?", path)
    decoded = []
    # at most ~2M pixels per forward (activations [B, H*W, hidden] float32 stay ~0.25 GB at 32 wide)
    step = max(1, min(batch, PIXELS_PER_FORWARD // (image_size[0] * image_size[1]))) if sizes is None else 1
    with torch.no_grad():
        if sizes is not None:  # native sizes: ``decoded`` is a list, one [H_i, W_i, 3] per image
            decoded = _decode_native(store, path, np.asarray(sizes)[:n_images], batch, device)
        for s in range(0, n_images if sizes is None else 0, step):
            idx = torch.arange(s, min(n_images, s + step), device=device)
            x = store.decode(idx)
            decoded.append(to_uint8(x).permute(0, 2, 3, 1).cpu().numpy())
        k = min(n_store, weight_images)
        layers = store.weights(torch.arange(k, device=device))
    weights = {}
    for i, (w, b) in enumerate(layers):
        weights[f"layer{i}"] = torch.as_tensor(w).float().cpu().numpy().ravel()
        del b  # biases are not part of the paper's Figure 4
    bpi = float(getattr(store, "bytes_per_image", None) or store.bytes_on_disk / n_store)
    packed = getattr(store, "at_rest", None)
    # a packed file's arrays are compressed together: no header-free count of its disk bytes
    hf = None if packed else weight_data_bytes(store)
    resident = getattr(store, "resident_bytes", None)
    return InrDecoded(
        resident_bytes_per_image=None if resident is None else float(resident()) / n_store,
        at_rest=None if not packed else str(packed.get("codec")),
        name=variant_name(store, path),
        bytes_per_image=bpi,
        header_free_bytes_per_image=None if hf is None else float(hf) / n_store,
        decoded=decoded if sizes is not None else np.concatenate(decoded),
        path=str(path),
        arch=str(getattr(store, "arch", "")),
        weights=weights,
    )


def payload_variant(v: InrDecoded) -> InrDecoded:
    """``v`` counted by its payload (``CompareConfig.inr_bytes == "payload"``): bytes per image =
    the packed weight arrays / N (codes, scales, masks), no store header. ``InputError`` when the
    store exposes no array table (a store packed at rest: its arrays are compressed together)."""
    if v.header_free_bytes_per_image is None:
        raise InputError("INR bytes 'payload' need the store's array table (none for a store packed at rest)", v.path)
    return InrDecoded(**{**v.__dict__, "bytes_per_image": float(v.header_free_bytes_per_image)})
