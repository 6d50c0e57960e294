"""``synthetic``: procedural images whose label ``recover_labels`` reads back from any crop, flip or mildly
lossy copy (pixels within ``MAX_DEVIATION`` of their class colour; colours >= 88 apart in a channel)."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from pathlib import Path

import numpy as np

from bench.datasets.config import PrepareConfig
from bench.datasets.prepared import SplitData
from bench.datasets.sources import Loaded, Source, register_source
from bench.datasets.splitting import limit_indices
from bench.errors import InputError

LEVELS = (40, 128, 216)
MAX_CLASSES = len(LEVELS) ** 3
PATTERN_AMPLITUDE = 24
NOISE_AMPLITUDE = 6
MAX_DEVIATION = PATTERN_AMPLITUDE + NOISE_AMPLITUDE
DEFAULT_CLASSES = 10
DEFAULT_PER_CLASS = 50
DEFAULT_TEST_FRACTION = 0.2


def palette(num_classes: int = MAX_CLASSES) -> np.ndarray:
    """uint8 ``[K, 3]`` class colours: the 8 cube corners first, then the other level mixes."""
    if not 1 <= num_classes <= MAX_CLASSES:
        raise ValueError(f"synthetic supports 1..{MAX_CLASSES} classes, got {num_classes}")
    allc = list(itertools.product(LEVELS, repeat=3))
    corners = [c for c in allc if all(v != LEVELS[1] for v in c)]
    rest = [c for c in allc if c not in corners]
    return np.asarray((corners + rest)[:num_classes], dtype=np.uint8)


def generate(labels: np.ndarray, size: int, rng: np.random.Generator, num_classes: int) -> np.ndarray:
    """labels int ``[N]`` -> uint8 ``[N, size, size, 3]`` images of those classes."""
    labels = np.asarray(labels, dtype=np.int64)
    n = labels.shape[0]
    base = palette(num_classes)[labels].astype(np.float32)  # [N, 3]
    yy, xx = np.meshgrid(np.linspace(0, 1, size, dtype=np.float32), np.linspace(0, 1, size, dtype=np.float32), indexing="ij")
    theta = rng.uniform(0, np.pi, n).astype(np.float32)
    freq = rng.uniform(1.0, 6.0, n).astype(np.float32) * 2 * np.pi
    phase = rng.uniform(0, 2 * np.pi, n).astype(np.float32)
    amp = rng.uniform(-PATTERN_AMPLITUDE, PATTERN_AMPLITUDE, (n, 3)).astype(np.float32)  # per channel
    proj = np.cos(theta)[:, None, None] * xx + np.sin(theta)[:, None, None] * yy  # [N, S, S]
    wave = np.sin(freq[:, None, None] * proj + phase[:, None, None])  # [N, S, S]
    img = base[:, None, None, :] + wave[..., None] * amp[:, None, None, :]
    img += rng.uniform(-NOISE_AMPLITUDE, NOISE_AMPLITUDE, img.shape).astype(np.float32)
    return np.clip(np.rint(img), 0, 255).astype(np.uint8)


def recover_labels(images: np.ndarray, num_classes: int = MAX_CLASSES) -> np.ndarray:
    """uint8 ``[N, H, W, 3]`` or ``[H, W, 3]`` (floats in 0..1 are scaled by 255) -> int64 ``[N]`` (or a
    scalar): the class whose colour is nearest each image's per-channel median."""
    a = np.asarray(images)
    single = a.ndim == 3
    if single:
        a = a[None]
    a = a.astype(np.float32)
    if a.size and a.max() <= 1.0:
        a = a * 255.0
    med = np.median(a.reshape(a.shape[0], -1, 3), axis=1)  # [N, 3]
    pal = palette(num_classes).astype(np.float32)
    d = ((med[:, None, :] - pal[None]) ** 2).sum(-1)
    out = d.argmin(1).astype(np.int64)
    return out[0] if single else out


@register_source("synthetic")
class Synthetic(Source):
    description = "built in: procedural colour-coded images, label recoverable from pixels (for tests)"
    needs_root = False
    default_size = 32
    default_resize_policy = "generated"

    def load(
        self, cfg: PrepareConfig, progress: Callable[[int], None] | None = None, scratch: Path | None = None
    ) -> Loaded:
        size = cfg.size or self.default_size
        k = cfg.num_classes or DEFAULT_CLASSES
        if k > MAX_CLASSES:
            raise InputError(f"synthetic supports at most {MAX_CLASSES} classes, got --num-classes {k}")
        per_class = cfg.per_class or DEFAULT_PER_CLASS
        frac = cfg.val_fraction if cfg.val_fraction is not None else DEFAULT_TEST_FRACTION
        n_test = min(max(1, round(frac * per_class)), per_class - 1)
        splits = {}
        for s, (name, n_per) in enumerate((("train", per_class - n_test), ("test", n_test))):
            rng = np.random.default_rng([cfg.seed, s])
            labels = rng.permutation(np.repeat(np.arange(k, dtype=np.int64), n_per))
            labels = labels[limit_indices(labels.size, cfg.limit, cfg.seed + s)]
            images = generate(labels, size, rng, k)
            splits[name] = SplitData(images=images, labels=labels, ids=[f"{name}:{i}" for i in range(labels.size)])
            if progress is not None:
                progress(int(labels.size))
        classes = ["rgb({},{},{})".format(*map(int, c)) for c in palette(k)]
        meta = {"per_class": per_class, "test_per_class": n_test, "max_deviation": MAX_DEVIATION}
        return Loaded(splits=splits, classes=classes, meta=meta)
