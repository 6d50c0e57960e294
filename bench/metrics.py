"""The one PSNR convention (encoder logs, compare, reports): clamp to [0, 1], round to 8 bits, PSNR per
image against the original uint8, mean over images with ``inf`` (identical images) counted as
``PSNR_CAP_DB``."""

from __future__ import annotations

import numpy as np
import torch

PSNR_CAP_DB = 100.0


def to_uint8(images: torch.Tensor) -> torch.Tensor:
    """Float images in [0, 1] (any shape) -> uint8 by clamp then round-half-to-even."""
    return torch.round(images.detach().float().clamp(0.0, 1.0) * 255.0).to(torch.uint8)


def psnr_per_image(decoded: torch.Tensor | np.ndarray, original: torch.Tensor | np.ndarray) -> torch.Tensor:
    """float64 ``[N]`` PSNR in dB (``inf``: identical) of ``decoded`` ``[N, ...]`` (float in [0, 1], or uint8)
    against ``original`` (uint8, the same shape)."""
    dec = torch.as_tensor(decoded)
    ref = torch.as_tensor(original)
    if dec.shape != ref.shape:
        raise ValueError(f"shape mismatch: decoded {tuple(dec.shape)} vs original {tuple(ref.shape)}")
    if ref.dtype != torch.uint8:
        raise ValueError(f"original must be uint8, got {ref.dtype}")
    if dec.dtype != torch.uint8:
        dec = to_uint8(dec)
    diff = dec.to(torch.float64) - ref.to(torch.float64)
    mse = diff.flatten(1).pow(2).mean(dim=1)
    return 10.0 * torch.log10(255.0**2 / mse)


def mean_psnr(per_image: torch.Tensor | np.ndarray) -> float:
    """Mean over images, ``inf`` (lossless images) counted as ``PSNR_CAP_DB``."""
    p = torch.as_tensor(per_image, dtype=torch.float64)
    return float(torch.where(torch.isinf(p), torch.full_like(p, PSNR_CAP_DB), p).mean())
