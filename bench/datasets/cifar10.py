"""``cifar10``: the official "python version" batches (``--root``: their folder or its parent), uint8
``[10000, 3072]`` each; read by an unpickler taking only containers and arrays (no code can run)."""

from __future__ import annotations

import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from bench.datasets.config import PrepareConfig
from bench.datasets.prepared import SplitData
from bench.datasets.resize import resize_image
from bench.datasets.sources import Loaded, Source, register_source
from bench.datasets.splitting import limit_indices
from bench.errors import InputError

TRAIN_BATCHES = tuple(f"data_batch_{i}" for i in range(1, 6))
TEST_BATCHES = ("test_batch",)
META = "batches.meta"
SUBFOLDER = "cifar-10-batches-py"

_ALLOWED_GLOBALS = {
    ("numpy.core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "_reconstruct"),
    ("numpy", "ndarray"),
    ("numpy", "dtype"),
    ("numpy.core.numeric", "_frombuffer"),
    ("numpy._core.numeric", "_frombuffer"),
    ("_codecs", "encode"),  # protocol-2 pickles written by Python 3 store bytes this way
}


class _SafeUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _ALLOWED_GLOBALS:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"refusing to load global {module}.{name}")


def _unpickle(path: Path) -> Any:
    try:
        with open(path, "rb") as f:
            return _SafeUnpickler(f, encoding="bytes").load()
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, IndexError) as e:
        raise InputError(f"not a CIFAR-10 python batch (unpickling failed: {e or type(e).__name__})", path) from None
    except OSError as e:
        raise InputError(f"cannot read file ({e.strerror or e})", path) from None


def read_batch(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """One batch file -> images uint8 ``[N, 32, 32, 3]``, labels int64 ``[N]``."""
    d = _unpickle(path)
    if not isinstance(d, dict) or b"data" not in d or b"labels" not in d:
        raise InputError("not a CIFAR-10 python batch (no b'data'/b'labels' entries)", path)
    data = np.asarray(d[b"data"])
    labels = np.asarray(d[b"labels"], dtype=np.int64)
    if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3072:
        raise InputError(f"b'data' is {data.dtype} {data.shape}, expected uint8 [N, 3072]", path)
    if labels.shape != (data.shape[0],):
        raise InputError(f"{labels.shape[0]} labels for {data.shape[0]} images", path)
    if labels.size and (labels.min() < 0 or labels.max() > 9):
        raise InputError(f"labels outside 0..9 (min {labels.min()}, max {labels.max()})", path)
    return data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1), labels


@register_source("cifar10")
class Cifar10(Source):
    splits_by_ratio = False  # the official splits
    description = "CIFAR-10 python batches (data_batch_1..5, test_batch, batches.meta); 32x32, 10 classes"
    default_size = None
    default_resize_policy = "resize"

    def load(
        self, cfg: PrepareConfig, progress: Callable[[int], None] | None = None, scratch: Path | None = None
    ) -> Loaded:
        folder = Path(cfg.root)
        if not (folder / "data_batch_1").exists() and (folder / SUBFOLDER / "data_batch_1").exists():
            folder = folder / SUBFOLDER
        for name in (*TRAIN_BATCHES, *TEST_BATCHES, META):
            if not (folder / name).is_file():
                raise InputError(
                    f"missing {name}: not a CIFAR-10 python-version folder "
                    "(expected data_batch_1..5, test_batch, batches.meta)",
                    folder / name,
                )
        meta = _unpickle(folder / META)
        names = meta.get(b"label_names") if isinstance(meta, dict) else None
        if not isinstance(names, list) or len(names) != 10:
            raise InputError("no list of 10 b'label_names'", folder / META)
        classes = [n.decode() if isinstance(n, bytes) else str(n) for n in names]
        splits = {}
        for k, (split, files) in enumerate((("train", TRAIN_BATCHES), ("test", TEST_BATCHES))):
            parts = [read_batch(folder / f) for f in files]
            ids = [f"{f}:{i}" for f, (_, lab) in zip(files, parts, strict=True) for i in range(lab.size)]
            images = np.concatenate([p[0] for p in parts])
            labels = np.concatenate([p[1] for p in parts])
            sel = limit_indices(labels.size, cfg.limit, cfg.seed + k)
            images, labels, ids = images[sel], labels[sel], [ids[i] for i in sel]
            if cfg.size is not None and cfg.size != 32:
                images = np.stack([resize_image(im, cfg.size, cfg.resize_policy) for im in images])
            splits[split] = SplitData(images=np.ascontiguousarray(images), labels=labels, ids=ids)
            if progress is not None:
                progress(int(labels.size))
        native = cfg.size is None or cfg.size == 32
        return Loaded(
            splits=splits, classes=classes, meta={"folder": str(folder)}, resize_policy="none" if native else None
        )
