"""The one resize of ``prepare`` (Pillow bicubic, antialiased), per ``resize_policy``:
``shorter-side-center-crop`` (= ``Resize(S)`` + ``CenterCrop(S)``), ``resize`` or ``native``."""

from __future__ import annotations

import numpy as np
from PIL import Image

FILTER = "bicubic"
CHUNK_PIXELS = 1 << 20  # 16-bit and float images are scaled to 8 bits this many pixels at a time


def resample_info() -> dict[str, str]:
    """Manifest record of how images were resampled."""
    import PIL

    return {"library": "PIL", "pil_version": PIL.__version__, "filter": FILTER, "antialias": "yes"}


def to_rgb(img: Image.Image) -> Image.Image:
    """Any PIL mode (L, P, RGBA, CMYK, I;16, ...) -> RGB."""
    if img.mode == "RGB":
        return img
    if img.mode in ("RGBA", "LA", "PA") or (img.mode == "P" and "transparency" in img.info):
        # composited on black, so transparent pixels are defined
        rgba = img.convert("RGBA")
        bg = Image.new("RGBA", rgba.size, (0, 0, 0, 255))
        return Image.alpha_composite(bg, rgba).convert("RGB")
    if img.mode.startswith("I;16") or img.mode in ("I", "F"):
        hi = _full_scale(img)
        w, h = img.size
        out = np.empty((h, w), dtype=np.uint8)
        step = max(1, CHUNK_PIXELS // max(1, w))  # rows at a time: float64 copies stay small
        for y in range(0, h, step):
            a = np.asarray(img.crop((0, y, w, min(h, y + step))), dtype=np.float64)
            if img.mode == "F" and not np.isfinite(a).all():  # PIL's extrema leave NaN out
                raise ValueError("a float image with NaN or infinite values: only floats in 0..1 are read")
            out[y : y + step] = np.clip(a / hi * 255.0 + 0.5, 0, 255).astype(np.uint8)
        return Image.fromarray(out).convert("RGB")
    return img.convert("RGB")


def _full_scale(img: Image.Image) -> float:
    """The value read as 255: 1.0 for a float image (values outside 0..1 refused, not guessed), 65535 for
    16 bits (or a 32-bit integer image over 255), else 255."""
    lo, hi = img.getextrema()
    if img.mode == "F":
        if not (0.0 <= lo and hi <= 1.0):
            raise ValueError(f"a float image with values {lo:g}..{hi:g}: only floats in 0..1 are read "
                             "(save it with 8 or 16 bits per channel)")
        return 1.0
    return 65535.0 if img.mode.startswith("I;16") or hi > 255 else 255.0


def resize_image(img: Image.Image | np.ndarray, size: int | None, policy: str) -> np.ndarray:
    """PIL image or uint8 ``[H, W, 3]`` -> uint8 ``[S, S, 3]`` RGB (``size=None``: no resampling)."""
    if isinstance(img, np.ndarray):
        img = Image.fromarray(img)
    img = to_rgb(img)
    w, h = img.size
    if size is None:
        if w != h:
            raise ValueError(f"image is {w}x{h}; a non-square source needs a size")
        return np.asarray(img, dtype=np.uint8)
    if policy == "shorter-side-center-crop":
        m = min(w, h)
        left, top = (w - m) / 2.0, (h - m) / 2.0
        box = (left, top, left + m, top + m)
    elif policy == "resize":
        box = (0.0, 0.0, float(w), float(h))
    else:
        raise ValueError(f"unknown resize policy {policy!r}")
    if (w, h) == (size, size) and box == (0.0, 0.0, float(w), float(h)):
        return np.asarray(img, dtype=np.uint8)
    out = img.resize((size, size), Image.Resampling.BICUBIC, box=box)
    return np.asarray(out, dtype=np.uint8)


NATIVE_POLICY = "native"


def native_size(width: int, height: int, max_side: int | None) -> tuple[int, int]:
    """``(W, H)`` of a ``width`` x ``height`` image kept: its own, or its long side scaled to ``max_side``."""
    if max_side is None or max(width, height) <= max_side:
        return width, height
    f = max_side / max(width, height)
    return max(1, round(width * f)), max(1, round(height * f))


def native_image(img: Image.Image | np.ndarray, max_side: int | None = None) -> np.ndarray:
    """PIL image or uint8 ``[H, W, 3]`` -> uint8 RGB at its own size, downscaled only past ``max_side``."""
    if isinstance(img, np.ndarray):
        img = Image.fromarray(img)
    img = to_rgb(img)
    w, h = native_size(img.width, img.height, max_side)
    if (w, h) != img.size:
        img = img.resize((w, h), Image.Resampling.BICUBIC)
    return np.ascontiguousarray(np.asarray(img, dtype=np.uint8))


def crop_resize(img: Image.Image, box: tuple[float, float, float, float], size: int) -> np.ndarray:
    """Crop ``box`` = (left, top, right, bottom) (float pixels) and resample to uint8 ``[S, S, 3]``."""
    out = to_rgb(img).resize((size, size), Image.Resampling.BICUBIC, box=box)
    return np.asarray(out, dtype=np.uint8)
