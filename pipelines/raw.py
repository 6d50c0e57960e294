"""``raw``: the uint8 pixels resident on the device, cropped, flipped and normalized there per image.

The ceiling when no codec is needed: one gather and one ``grid_sample`` per batch.
"""

from __future__ import annotations

import numpy as np
import torch

from bench.datasets.prepared import PreparedSplit
from pipelines.base import register
from pipelines.crops import Crops, normalize_, warp
from pipelines.device_epoch import DeviceEpochPipeline, nbytes

LOAD_CHUNK_BYTES = 256 << 20  # host memory one step of ``load_nchw`` holds


def load_nchw(images: np.ndarray, rows: np.ndarray | None, device: torch.device) -> torch.Tensor:
    """uint8 ``[M, 3, H, W]`` on ``device`` from the prepared ``[N, H, W, 3]`` memmap (``rows``: which, in
    order; None: all), a chunk of ``LOAD_CHUNK_BYTES`` at a time, transposed on the host into ``out``:
    the host never holds the whole split, and no device temporary stays in torch's cache."""
    n = images.shape[0] if rows is None else len(rows)
    h, w = images.shape[1:3]
    out = torch.empty((n, 3, h, w), dtype=torch.uint8, device=device)
    step = max(1, LOAD_CHUNK_BYTES // max(1, h * w * 3))
    for s in range(0, n, step):
        part = images[s:s + step] if rows is None else images[rows[s:s + step]]
        chunk = torch.from_numpy(np.array(part, dtype=np.uint8))  # out of the memmap (read-only)
        out[s:s + chunk.shape[0]].copy_(chunk.permute(0, 3, 1, 2))
    return out


@register("raw")
class RawPipeline(DeviceEpochPipeline):
    """Holds ``images`` uint8 ``[M, 3, H, W]`` on ``config.device``."""

    releases = ("images",)

    def load(self, split: PreparedSplit, held: torch.Tensor) -> torch.Tensor:
        rows = None if self.config.resident == "all" else held.numpy()  # "shard": reads only its rows
        self.images: torch.Tensor | None = load_nchw(split.images, rows, self.device)
        return self.split_labels(split, held)

    def render(self, positions: torch.Tensor, positions_dev: torch.Tensor, crops: Crops) -> torch.Tensor:
        aug = self.config.augment
        return normalize_(warp(self.images[positions_dev].float(), crops, aug), aug)

    def resident_bytes(self) -> dict[str, int]:
        """``device``: pixels and labels on ``config.device`` (even the CPU)."""
        return {"device": nbytes(self.images) + nbytes(self.labels), "host": 0}

    def dataset_bytes_per_image(self) -> float:
        """The uint8 pixels of one image: H*W*3."""
        return float(self.height * self.width * 3)
