"""Which pixels a subsampled fit step sees (``FitConfig.pixel_fraction``): each image walks a seeded
permutation in cycles covering every pixel once, so the pixels depend only on the image and its iteration."""

from __future__ import annotations

import math

import numpy as np
import torch

MAPS = 64  # affine maps of the pixel positions, cycled through (cycle c uses map c mod MAPS)


def pixels_per_step(pixels: int, fraction: float) -> int:
    """Pixels a step sees: ``ceil(fraction * pixels)``, at least 1 and at most ``pixels``."""
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"pixel fraction must be in (0, 1], got {fraction}")
    return max(1, min(pixels, math.ceil(fraction * pixels - 1e-9)))


def image_orders(ids: np.ndarray, pixels: int, seed: int) -> np.ndarray:
    """int64 ``[len(ids), pixels]``: each image's own random permutation of its pixels, from ``(seed, id)``."""
    ids = np.asarray(ids, dtype=np.int64)
    out = np.empty((len(ids), pixels), dtype=np.int64)
    for r, i in enumerate(ids):
        out[r] = np.random.default_rng([seed, int(i), 0x5AB5]).permutation(pixels)
    return out


_MASK = (1 << 32) - 1


def _hash32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer hash (``lowbias32``'s shifts, multipliers below 2**31 so that int64 never overflows),
    elementwise on int64 values in ``0 .. 2**32 - 1``: the same bits on every device."""
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & _MASK
    x = x ^ (x >> 15)
    x = (x * 0x5BD1E995) & _MASK
    return x ^ (x >> 16)


def device_orders(ids: np.ndarray, pixels: int, seed: int, device: torch.device | str) -> torch.Tensor:
    """int64 ``[len(ids), pixels]`` on ``device``: each image's own random permutation of its pixels, from
    ``(seed, id)``, drawn on the device (pixels sorted by a hash of ``(seed, id, pixel)``, ties by position):
    no host work at a refill, and the same permutations on every device. Not ``image_orders``' draws."""
    ids_t = torch.as_tensor(np.asarray(ids, dtype=np.int64), device=device) & _MASK
    img = _hash32(_hash32(torch.full_like(ids_t, (seed ^ 0x5AB5) & _MASK)) ^ ids_t)  # [B]
    pos = torch.arange(pixels, dtype=torch.int64, device=device)
    keys = _hash32((img.unsqueeze(1) + pos * 0x61C88647) & _MASK)  # [B, P]
    return torch.sort(keys, dim=1, stable=True).indices


def orders(ids: np.ndarray, pixels: int, seed: int, device: torch.device | str) -> torch.Tensor:
    """The rows' pixel orders on ``device``: on the CPU ``image_orders`` (the CPU encode's, bit for bit); on an
    accelerator ``device_orders``, so that a refill does not leave the device idle while the host draws."""
    if torch.device(device).type == "cpu":
        return torch.from_numpy(image_orders(ids, pixels, seed))
    return device_orders(ids, pixels, seed, device)


def cycle_maps(pixels: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``MAPS`` affine maps ``j -> (a * j + b) mod pixels`` of the pixel positions onto themselves:
    int64 ``a [MAPS]`` (coprime with ``pixels``: a bijection) and ``b [MAPS]``. Map 0 is the identity."""
    rng = np.random.default_rng([seed, pixels, 0xC7C1])
    a = np.ones(MAPS, dtype=np.int64)
    for k in range(1, MAPS):  # a multiplier coprime with ``pixels``: drawn until one is (P / phi(P) draws on average)
        while pixels > 1:
            a[k] = rng.integers(1, pixels)
            if math.gcd(int(a[k]), pixels) == 1:
                break
    b = rng.integers(0, max(pixels, 1), size=MAPS, dtype=np.int64)
    b[0] = 0
    return a, b


def window(order: torch.Tensor, it: torch.Tensor, per_step: int, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The pixels each row's next step sees: int64 ``[B, per_step]``, from order int64 ``[B, P]``, iterations
    ``it`` ``[B]``, maps a, b int64 ``[MAPS]``; plain tensor arithmetic, no host sync (compilable)."""
    P = order.shape[1]
    steps = -(-P // per_step)  # steps per cycle
    itl = it.to(torch.int64)
    cycle = torch.div(itl, steps, rounding_mode="floor")
    k = torch.remainder(cycle, a.shape[0])
    j = torch.remainder(itl, steps).unsqueeze(1) * per_step + torch.arange(per_step, device=order.device)
    pos = torch.remainder(a[k].unsqueeze(1) * j + b[k].unsqueeze(1), P)
    return order.gather(1, pos)


def gather(a0: torch.Tensor, t01: torch.Tensor, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The rows' subsets: ``a0 [3, P]`` (coordinates + ones) and ``t01 [B, 3, P]`` at ``idx [B, Ps]`` ->
    ``([B, 3, Ps], [B, 3, Ps])``."""
    a0s = a0[:, idx].permute(1, 0, 2)
    t01s = t01.gather(2, idx.unsqueeze(1).expand(-1, t01.shape[1], -1))
    return a0s, t01s
