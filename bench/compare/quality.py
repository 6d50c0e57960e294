"""Image quality per image: PSNR (``bench.metrics``: decode, clamp, round to 8 bits) and SSIM
(skimage on uint8, ``data_range=255``, its 7x7 uniform window, mean over R, G, B; smaller images use
the largest odd window that fits). SSIM at 32x32 averages 26x26 windows: not comparable across sizes.
"""

from __future__ import annotations

import numpy as np
import torch

from bench.metrics import psnr_per_image

SSIM_WINDOW = 7


def psnr(decoded: np.ndarray | torch.Tensor, original: np.ndarray) -> np.ndarray:
    """``[N, H, W, 3]`` (uint8, or float in [0, 1]) vs uint8 original -> ``[N]`` float64 dB."""
    return psnr_per_image(_writable(decoded), _writable(original)).numpy()


def _writable(a):
    """torch warns on read-only arrays (memmaps, PIL buffers): hand it a copy of those."""
    if isinstance(a, np.ndarray) and not (a.flags.writeable and a.flags.c_contiguous):
        return np.array(a, order="C")
    return a


def ssim_window(h: int, w: int) -> int:
    """The SSIM window used for an ``h x w`` image (7, or the largest odd size that fits)."""
    side = min(h, w, SSIM_WINDOW)
    return side if side % 2 == 1 else side - 1


def ssim(decoded: np.ndarray, original: np.ndarray) -> np.ndarray:
    """uint8 ``[N, H, W, 3]`` vs uint8 ``[N, H, W, 3]`` -> ``[N]`` float64 SSIM."""
    from skimage.metrics import structural_similarity

    if decoded.shape != original.shape or decoded.dtype != np.uint8 or original.dtype != np.uint8:
        raise ValueError(f"ssim needs two uint8 arrays of one shape, got {decoded.dtype}{decoded.shape} and {original.dtype}{original.shape}")
    win = ssim_window(*original.shape[1:3])
    return np.array(
        [
            structural_similarity(d, o, channel_axis=-1, data_range=255, win_size=win)
            for d, o in zip(decoded, np.asarray(original), strict=True)
        ],
        dtype=np.float64,
    )
