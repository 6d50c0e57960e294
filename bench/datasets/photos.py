"""``photos``: built-in seeded square crops of scikit-image's (and scikit-learn's) photos, one class per
photo, nothing downloaded; the last ``val_fraction`` of each class is ``test`` (docs/datasets.md)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

from bench.datasets.config import PrepareConfig
from bench.datasets.prepared import SplitData
from bench.datasets.resize import crop_resize, native_image
from bench.datasets.sources import Loaded, Source, register_source
from bench.datasets.splitting import limit_indices

DEFAULT_PER_CLASS = 50
DEFAULT_NATIVE_PER_CLASS = 5  # --size native: 4 train + 1 test per photo (full-size images are large)
DEFAULT_TEST_FRACTION = 0.2
MIN_SIDE_FRACTION = 0.35


@dataclass(frozen=True)
class Photo:
    """loader: () -> uint8 ``[H, W, 3]``; region: (x0, y0, x1, y1) fractions to crop within."""

    name: str
    loader: Callable[[], np.ndarray]
    region: tuple[float, float, float, float] = (0.0, 0.0, 1.0, 1.0)


def _skimage(name: str) -> Callable[[], np.ndarray]:
    def load() -> np.ndarray:
        import skimage.data

        a = getattr(skimage.data, name)()
        return a[0] if isinstance(a, tuple) else a

    return load


def _sklearn(fname: str) -> Callable[[], np.ndarray]:
    def load() -> np.ndarray:
        from sklearn.datasets import load_sample_image

        return load_sample_image(fname)

    return load


def photo_list() -> list[Photo]:
    """The photographs available offline on this machine, in class order."""
    photos = [
        Photo("astronaut", _skimage("astronaut")),
        Photo("chelsea", _skimage("chelsea")),
        Photo("coffee", _skimage("coffee")),
        Photo("hubble_deep_field", _skimage("hubble_deep_field")),
        Photo("immunohistochemistry", _skimage("immunohistochemistry")),
        Photo("retina", _skimage("retina"), (0.2, 0.2, 0.8, 0.8)),  # inside its black disc
        Photo("rocket", _skimage("rocket")),
        Photo("motorcycle", _skimage("stereo_motorcycle")),
    ]
    try:
        import sklearn.datasets  # noqa: F401
    except ImportError:
        pass
    else:
        photos += [Photo("china", _sklearn("china.jpg")), Photo("flower", _sklearn("flower.jpg"))]
    return photos


def crop_boxes(
    width: int, height: int, region: tuple[float, float, float, float], n: int, rng: np.random.Generator
) -> list[tuple[tuple[float, float, float, float], bool]]:
    """``n`` (box, flip) pairs inside ``region`` of a ``width`` x ``height`` photo."""
    rx0, ry0, rx1, ry1 = region[0] * width, region[1] * height, region[2] * width, region[3] * height
    m = min(rx1 - rx0, ry1 - ry0)
    out = []
    for _ in range(n):
        side = rng.uniform(MIN_SIDE_FRACTION, 1.0) * m
        x0 = rng.uniform(rx0, rx1 - side)
        y0 = rng.uniform(ry0, ry1 - side)
        flip = bool(rng.random() < 0.5)
        out.append(((x0, y0, x0 + side, y0 + side), flip))
    return out


def native_boxes(
    width: int, height: int, region: tuple[float, float, float, float], n: int, rng: np.random.Generator
) -> list[tuple[tuple[float, float, float, float], bool]]:
    """``n`` integer (box, flip) pairs for ``--size native``: the whole region, then boxes of independent
    width and height fractions (mixed sizes and orientations)."""
    rx0, ry0 = round(region[0] * width), round(region[1] * height)
    rx1, ry1 = round(region[2] * width), round(region[3] * height)
    out = [((rx0, ry0, rx1, ry1), False)]
    for _ in range(n - 1):
        bw = max(8, round(rng.uniform(MIN_SIDE_FRACTION, 1.0) * (rx1 - rx0)))
        bh = max(8, round(rng.uniform(MIN_SIDE_FRACTION, 1.0) * (ry1 - ry0)))
        x0 = int(rng.integers(rx0, rx1 - bw + 1))
        y0 = int(rng.integers(ry0, ry1 - bh + 1))
        out.append(((x0, y0, x0 + bw, y0 + bh), bool(rng.random() < 0.5)))
    return out


@register_source("photos")
class Photos(Source):
    description = "built in: seeded crops of scikit-image's colour photographs, one class per photo (no download)"
    needs_root = False
    default_size = 32
    default_resize_policy = "seeded-square-crop"
    supports_native = True

    def load(
        self, cfg: PrepareConfig, progress: Callable[[int], None] | None = None, scratch: Path | None = None
    ) -> Loaded:
        native = cfg.native
        size = None if native else (cfg.size or self.default_size)
        per_class = cfg.per_class or (DEFAULT_NATIVE_PER_CLASS if native else DEFAULT_PER_CLASS)
        frac = cfg.val_fraction if cfg.val_fraction is not None else DEFAULT_TEST_FRACTION
        n_test = min(max(1, round(frac * per_class)), per_class - 1)
        photos = photo_list()
        parts: dict[str, tuple[list[np.ndarray], list[int], list[str]]] = {"train": ([], [], []), "test": ([], [], [])}
        for c, ph in enumerate(photos):
            img = Image.fromarray(np.ascontiguousarray(ph.loader()[..., :3]))
            rng = np.random.default_rng([cfg.seed, c])
            boxes = (native_boxes(img.width, img.height, ph.region, per_class, rng) if native
                     else crop_boxes(img.width, img.height, ph.region, per_class, rng))
            for i, (box, flip) in enumerate(boxes):
                a = native_image(img.crop(box), cfg.max_side) if native else crop_resize(img, box, size)
                if flip:
                    a = np.ascontiguousarray(a[:, ::-1])
                split = "train" if i < per_class - n_test else "test"
                parts[split][0].append(a)
                parts[split][1].append(c)
                parts[split][2].append(f"{ph.name}:{i}")
                if progress is not None:
                    progress(1)
        splits = {}
        for k, (name, (ims, labs, ids)) in enumerate(parts.items()):
            # classes mixed by a seeded permutation, then --limit
            order = np.random.default_rng([cfg.seed, 1000 + k]).permutation(len(ims))
            order = order[limit_indices(len(order), cfg.limit, cfg.seed + k)]
            splits[name] = SplitData(
                images=[ims[j] for j in order] if native else np.stack([ims[j] for j in order]),
                labels=np.asarray([labs[j] for j in order], dtype=np.int64),
                ids=[ids[j] for j in order],
            )
        meta = {
            "per_class": per_class,
            "test_per_class": n_test,
            "crop": f"square side U({MIN_SIDE_FRACTION}, 1.0) x shorter side, uniform position, flip p=0.5",
        }
        if native:
            meta["crop"] = (f"native size: image 0 of a class is its whole photo (region), the others a box of width "
                            f"U({MIN_SIDE_FRACTION}, 1.0) x region width and height U({MIN_SIDE_FRACTION}, 1.0) x "
                            "region height (mixed sizes and orientations), uniform position, flip p=0.5; not resampled "
                            "unless the long side exceeds max_side (then downscaled, aspect kept, BICUBIC)")
            meta["max_side"] = cfg.max_side
        return Loaded(splits=splits, classes=[p.name for p in photos], meta=meta,
                      resize_policy="native" if native else None)
