"""Image quality per image: PSNR (the project convention, ``bench.metrics``) and SSIM.

PSNR: ``bench.metrics.psnr_per_image`` — decode, clamp, round to 8 bits, per image; the
set mean is ``bench.metrics.mean_psnr``. Not re-implemented here.

SSIM: ``skimage.metrics.structural_similarity`` on the uint8 images, ``channel_axis=-1``,
``data_range=255``, skimage's defaults otherwise: a 7x7 *uniform* window (not Gaussian),
K1 = 0.01, K2 = 0.03, sample covariance, SSIM per channel averaged over R, G, B. The mean
skips a 3-pixel border (half the window), so on a 32x32 image it is the mean over the
26x26 interior positions; each window sees 49 pixels, so SSIM at 32x32 is noisier than at
224x224 and not comparable across image sizes. Images smaller than 7 pixels use the
largest odd window that fits.
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
