"""Decode image files to S x S uint8 arrays in a thread pool, with ``--on-error fail|skip``."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from PIL import Image

from bench.datasets.prepared import SplitData
from bench.datasets.resize import resize_image
from bench.datasets.splitting import limit_indices
from bench.errors import InputError

if TYPE_CHECKING:
    from bench.datasets.config import PrepareConfig

# Splits bigger than this are decoded into a memory-mapped scratch file, not RAM
# (mini-ImageNet at 224 x 224 is 9 GB of pixels).
MEMMAP_BYTES = 1 << 30

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".webp", ".ppm", ".tif", ".tiff")


def is_image_file(p: Path) -> bool:
    return p.is_file() and not p.name.startswith(".") and p.suffix.lower() in IMAGE_EXTENSIONS


def read_image(path: Path, size: int, policy: str) -> np.ndarray:
    """One file -> uint8 ``[S, S, 3]``. Raises ``InputError`` naming the file when it cannot be read."""
    try:
        with Image.open(path) as img:
            img.load()  # decode fully now: a truncated file fails here, not later
            return resize_image(img, size, policy)
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as e:
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise InputError(f"cannot read image ({msg})", path) from None


def decode_files(
    paths: Sequence[Path],
    size: int,
    policy: str,
    on_error: str,
    workers: int | None = None,
    progress: Callable[[int], None] | None = None,
    scratch: Path | None = None,
) -> tuple[np.ndarray, np.ndarray, list[dict[str, str]]]:
    """Decode ``paths`` in order.

    Returns images uint8 ``[M, S, S, 3]`` of the readable files, ``kept`` int64 ``[M]``
    (their indices into ``paths``) and ``skipped`` (``{"file", "error"}`` per unreadable
    file; empty unless ``on_error == "skip"``: with ``fail`` the first one raises).
    Splits over ``MEMMAP_BYTES`` are held in a memory-mapped file under ``scratch``.
    """
    n = len(paths)
    out = allocate((n, size, size, 3), scratch)
    ok = np.zeros(n, dtype=bool)
    skipped: list[dict[str, str]] = []

    def one(i: int) -> InputError | None:
        try:
            out[i] = read_image(paths[i], size, policy)
        except InputError as e:
            return e
        ok[i] = True
        return None

    workers = workers or min(8, os.cpu_count() or 1)
    with ThreadPoolExecutor(max_workers=workers) as pool:
        for i, err in enumerate(pool.map(one, range(n))):
            if err is not None:
                if on_error == "fail":
                    pool.shutdown(wait=True, cancel_futures=True)
                    raise err
                msg = str(err).removeprefix(f"{paths[i]}: ")
                skipped.append({"file": str(paths[i]), "error": msg})
            if progress is not None:
                progress(1)
    kept = np.flatnonzero(ok).astype(np.int64)
    for j, i in enumerate(kept):  # compact in place (rows only move down): no second copy
        if j != i:
            out[j] = out[i]
    return out[: kept.size], kept, skipped


def allocate(shape: tuple[int, ...], scratch: Path | None) -> np.ndarray:
    """uint8 array of ``shape``: in memory, or a ``.npy`` memmap under ``scratch`` when it is big."""
    nbytes = int(np.prod(shape))
    if scratch is None or nbytes <= MEMMAP_BYTES:
        return np.empty(shape, dtype=np.uint8)
    fd, name = tempfile.mkstemp(suffix=".npy", dir=scratch)
    os.close(fd)
    return np.lib.format.open_memmap(name, mode="w+", dtype=np.uint8, shape=shape)


def split_from_files(
    paths: Sequence[Path],
    labels: Sequence[int] | np.ndarray,
    cfg: PrepareConfig,
    root: Path,
    split_index: int,
    progress: Callable[[int], None] | None = None,
    scratch: Path | None = None,
) -> tuple[SplitData, list[dict[str, str]]]:
    """``--limit`` subset, decode, drop skipped files -> (``SplitData``, skipped list).

    cfg: a resolved ``PrepareConfig`` (size and resize policy set). ids are paths relative to ``root``.
    """

    labels = np.asarray(labels, dtype=np.int64)
    sel = limit_indices(len(paths), cfg.limit, cfg.seed + split_index)
    chosen = [paths[i] for i in sel]
    images, kept, skipped = decode_files(chosen, cfg.size, cfg.resize_policy, cfg.on_error, cfg.workers, progress, scratch)
    ids = [_rel(chosen[i], root) for i in kept]
    return SplitData(images=images, labels=labels[sel][kept], ids=ids), skipped


def _rel(p: Path, root: Path) -> str:
    try:
        return str(Path(p).relative_to(root))
    except ValueError:
        return str(p)
