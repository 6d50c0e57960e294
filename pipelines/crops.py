"""Per-image crop/flip sampling (torchvision's semantics, drawn on the CPU) and the crop -> affine-grid
geometry the device-side adapters sample with. Nothing here syncs the host with the device.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from pipelines.base import Augment

RRC_TRIES = 10


def batch_slices(n: int, batch_size: int, drop_last: bool) -> list[slice]:
    """Batch boundaries over ``n`` samples (the last one partial unless ``drop_last``)."""
    stop = (n // batch_size) * batch_size if drop_last else n
    return [slice(s, min(s + batch_size, n)) for s in range(0, stop, batch_size)]


@dataclass(frozen=True)
class Crops:
    """boxes: float32 ``[B, 4]`` = ``(top, left, height, width)`` in input pixels; flip: bool ``[B]``."""

    boxes: torch.Tensor
    flip: torch.Tensor


def to_device(t: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """``t`` on ``device`` without a host sync: CPU -> CUDA pinned and non-blocking; anything else a
    blocking ``.to`` (a non-blocking copy to the host could be read before it lands)."""
    device = torch.device(device)
    if t.device == device:
        return t
    if device.type == "cuda" and t.device.type == "cpu":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)


def _random_resized(aug: Augment, n: int, h: int, w: int, g: torch.Generator) -> torch.Tensor:
    area = float(h * w)
    target = area * torch.empty(n, RRC_TRIES, dtype=torch.float64).uniform_(*aug.scale, generator=g)
    logr = torch.empty(n, RRC_TRIES, dtype=torch.float64).uniform_(
        math.log(aug.ratio[0]), math.log(aug.ratio[1]), generator=g
    )
    ar = torch.exp(logr)
    cw = torch.round(torch.sqrt(target * ar))
    ch = torch.round(torch.sqrt(target / ar))
    ok = (cw > 0) & (cw <= w) & (ch > 0) & (ch <= h)
    first = ok.to(torch.int8).argmax(dim=1, keepdim=True)  # first successful try
    found = ok.any(dim=1)
    cw = cw.gather(1, first).squeeze(1)
    ch = ch.gather(1, first).squeeze(1)
    u = torch.rand(n, 2, dtype=torch.float64, generator=g)
    top = torch.floor(u[:, 0] * (h - ch + 1)).clamp(max=h - ch)
    left = torch.floor(u[:, 1] * (w - cw + 1)).clamp(max=w - cw)
    # torchvision's fallback after RRC_TRIES failures: clamp the aspect ratio, centre crop.
    in_ratio = w / h
    if in_ratio < min(aug.ratio):
        fw, fh = w, int(round(w / min(aug.ratio)))
    elif in_ratio > max(aug.ratio):
        fw, fh = int(round(h * max(aug.ratio))), h
    else:
        fw, fh = w, h
    fb = torch.tensor([(h - fh) // 2, (w - fw) // 2, fh, fw], dtype=torch.float64)
    boxes = torch.stack([top, left, ch, cw], dim=1)
    return torch.where(found[:, None], boxes, fb)


def sample_crops(aug: Augment, n: int, height: int, width: int, generator: torch.Generator) -> Crops:
    """Draw ``n`` independent crops and flips for ``height`` x ``width`` inputs (on the CPU)."""
    if aug.crop == "random-resized":
        boxes = _random_resized(aug, n, height, width, generator)
    elif aug.crop == "random-pad":
        span_h, span_w = height + 2 * aug.pad - aug.size, width + 2 * aug.pad - aug.size
        if span_h < 0 or span_w < 0:
            raise ValueError(f"random-pad: size {aug.size} exceeds the padded image {height}x{width} + 2*{aug.pad}")
        top = torch.randint(0, span_h + 1, (n,), generator=generator) - aug.pad
        left = torch.randint(0, span_w + 1, (n,), generator=generator) - aug.pad
        size = torch.full((n,), aug.size)
        boxes = torch.stack([top, left, size, size], dim=1).double()
    else:  # center: largest centred square (torchvision CenterCrop rounding), resized later
        s = min(height, width)
        box = [int(round((height - s) / 2.0)), int(round((width - s) / 2.0)), s, s]
        boxes = torch.tensor(box, dtype=torch.float64).expand(n, 4).clone()
    if aug.flip:
        flip = torch.rand(n, generator=generator) < 0.5
    else:
        flip = torch.zeros(n, dtype=torch.bool)
    return Crops(boxes.float(), flip)


def crop_theta(crops: Crops, height: int, width: int) -> torch.Tensor:
    """float32 ``[B, 2, 3]``: output normalized ``(u, v)`` -> input normalized ``(x, y)``
    (``F.affine_grid``, ``align_corners=False``): ``x = sx * u + tx``, ``sx = ±w / W``, ``tx = (2 left + w) / W - 1``."""
    top, left, h, w = crops.boxes.unbind(1)
    sx = torch.where(crops.flip, -w / width, w / width)
    tx = (2 * left + w) / width - 1
    sy = h / height
    ty = (2 * top + h) / height - 1
    zero = torch.zeros_like(sx)
    return torch.stack([torch.stack([sx, zero, tx], 1), torch.stack([zero, sy, ty], 1)], 1)


def warp(images: torch.Tensor, crops: Crops, aug: Augment) -> torch.Tensor:
    """float ``[B, C, H, W]`` -> float ``[B, C, size, size]``: crop, flip and resize in one bilinear
    ``grid_sample`` (edges clamp; ``random-pad`` reads zeros outside the image)."""
    h, w = images.shape[-2:]
    theta = to_device(crop_theta(crops, h, w), images.device)  # [B, 2, 3]: one copy, no sync
    grid = F.affine_grid(theta, [theta.shape[0], 1, aug.size, aug.size], align_corners=False).to(images.dtype)
    mode = "zeros" if aug.crop == "random-pad" else "border"
    return F.grid_sample(images, grid, mode="bilinear", padding_mode=mode, align_corners=False)


_NORM_CACHE: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}


def norm_constants(aug: Augment, device: torch.device, dtype: torch.dtype,
                   value_range: float = 255.0) -> tuple[torch.Tensor, torch.Tensor]:
    """``(scale, shift)``, each ``[1, 3, 1, 1]`` on ``device``: ``x * scale - shift`` normalizes. Cached:
    a ``torch.tensor(..., device=cuda)`` per batch would be a host sync every batch."""
    key = (str(torch.device(device)), dtype, tuple(aug.mean), tuple(aug.std), float(value_range))
    hit = _NORM_CACHE.get(key)
    if hit is None:
        std = torch.tensor(aug.std, dtype=torch.float64).view(1, 3, 1, 1)
        mean = torch.tensor(aug.mean, dtype=torch.float64).view(1, 3, 1, 1)
        scale, shift = 1.0 / (value_range * std), mean / std
        hit = (scale.to(device=device, dtype=dtype), shift.to(device=device, dtype=dtype))
        _NORM_CACHE[key] = hit
    return hit


def normalize_(images: torch.Tensor, aug: Augment, value_range: float = 255.0) -> torch.Tensor:
    """In place: float ``[B, 3, H, W]`` in ``[0, value_range]`` -> ``(x / value_range - mean) / std``."""
    scale, shift = norm_constants(aug, images.device, images.dtype, value_range)
    return images.mul_(scale).sub_(shift)
