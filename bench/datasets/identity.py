"""A store belongs to its images: ``source_record`` (what ``encode`` records: split and image hashes) and
``check_store_source`` (run by every consumer; unrecorded -> refused unless ``--allow-unverified-store``)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np

from bench.datasets.prepared import PreparedDataset, sha256_array
from bench.errors import InputError


def _first(ds: PreparedDataset, split: str, n: int | None) -> tuple[int, str, str]:
    """(count, sha256 of the first ``n`` images' pixels, of their labels); native sizes: pixels concatenated."""
    s = ds.native_split(split) if ds.native else ds.split(split)
    k = len(s) if n is None else min(len(s), n)
    px = s.images[:k] if not ds.native else (np.concatenate([im.reshape(-1) for im in s.images[:k]]) if k
                                             else np.zeros(0, np.uint8))
    return len(s), sha256_array(px), sha256_array(s.labels[:k])


def source_record(ds: PreparedDataset, split: str, limit: int | None = None) -> dict[str, Any]:
    """``meta["source"]`` for a store of the first ``limit`` (default all) images of ``split``."""
    count, px, lab = _first(ds, split, limit)
    n = count if limit is None else min(count, limit)
    info = ds.manifest["splits"][split]
    return {
        "prepared": str(ds.root), "split": split, "limit": limit, "count": count,
        "pixels_sha256": info.get("pixels_sha256"), "labels_sha256": info.get("labels_sha256"),
        "encoded_count": n, "encoded_pixels_sha256": px, "encoded_labels_sha256": lab,
    }


def _short(h: Any) -> str:
    return f"{h[:12]}..." if isinstance(h, str) else str(h)


def check_store_source(store: Any, ds: PreparedDataset, split: str, *, allow_unverified: bool = False) -> bool:
    """Refuse (``InputError``) a store whose images are not the first ``store.num_images`` of ``split``: the
    manifest's hashes match (cheap), else the first images are hashed. True when verified, False for an
    unverified store let through by ``allow_unverified``."""
    where = f"split {split!r} of {ds.root}"
    meta = store.meta if isinstance(store.meta, dict) else {}
    src = meta.get("source")
    if not isinstance(src, dict) or not (src.get("pixels_sha256") or src.get("encoded_pixels_sha256")):
        msg = (f"the store records no source pixels hash (not written by `inrbench encode`, or by an older "
               f"version), so it cannot be tied to {where}")
        if allow_unverified:
            print(f"inrbench: warning: {store.path}: {msg}; used anyway (--allow-unverified-store)", file=sys.stderr)
            return False
        raise InputError(f"{msg}; re-encode it, or pass --allow-unverified-store to use it anyway", store.path)
    info = ds.manifest["splits"][split]
    n = int(store.num_images)
    full, labels = info.get("pixels_sha256"), info.get("labels_sha256")
    if full and src.get("pixels_sha256") == full and src.get("labels_sha256") in (None, labels):
        return True  # encoded from this very split (all of it, or its first n images)
    enc = src.get("encoded_pixels_sha256")
    if enc and n <= int(info["count"]):
        _, px, lab = _first(ds, split, n)
        if px == enc and src.get("encoded_labels_sha256") in (None, lab):
            return True
    encode = encode_command(ds, split, src.get("limit"))
    other = _other_split_of(ds, src)
    if other is not None and other != split:
        raise InputError(
            f"the store was encoded from split {other!r} of this dataset ({ds.root}), not from split {split!r}: "
            f"use split {other!r} (`--split {other}`), or a store of split {split!r} (`{encode}`)", store.path,
        )
    origin = f"{src.get('prepared', '?')} [{src.get('split', '?')}]"
    raise InputError(
        f"the store was encoded from other images (or labels) than {where}: its source is {origin} with pixels sha256 "
        f"{_short(src.get('pixels_sha256'))}, this split's is {_short(full)}; use a store encoded from "
        f"this split (`{encode}`)", store.path,
    )


def check_store_shape(store: Any, n: int, image_size: Any, path: Any, *, at_least: bool = False) -> None:
    """The store's header claims ``n`` images (``at_least``: n or more) of ``image_size``, checked before any
    decode: a header may claim any size."""
    have, (h, w) = int(store.num_images), tuple(store.image_size)
    if (have < n if at_least else have != n) or (h, w) != tuple(image_size):
        raise InputError(f"store holds {have} images of {h}x{w}, the split has {n} of "
                         f"{image_size[0]}x{image_size[1]}", path)


def encode_command(ds: PreparedDataset, split: str, limit: Any = None) -> str:
    """The ``inrbench encode`` command line of a store of ``split`` of ``ds`` (with the refused store's ``--limit``)."""
    import shlex

    lim = f" --limit {int(limit)}" if isinstance(limit, int) and not isinstance(limit, bool) else ""
    return f"inrbench encode {shlex.quote(str(Path(ds.root)))} --split {shlex.quote(split)}{lim} --out STORE.inr"


def _other_split_of(ds: PreparedDataset, src: dict) -> str | None:
    """The split of ``ds`` a store's ``source`` record names, when it is this very dataset (same hashes, or
    the same folder)."""
    name = src.get("split")
    info = ds.manifest.get("splits", {}).get(name) if isinstance(name, str) else None
    if not isinstance(info, dict):
        return None
    same_pixels = bool(info.get("pixels_sha256")) and src.get("pixels_sha256") == info.get("pixels_sha256")
    same_labels = src.get("labels_sha256") in (None, info.get("labels_sha256"))
    try:
        same_folder = Path(str(src.get("prepared"))).resolve() == Path(ds.root).resolve()
    except (OSError, RuntimeError):
        same_folder = False
    return name if (same_pixels and same_labels) or (same_folder and not info.get("pixels_sha256")) else None
