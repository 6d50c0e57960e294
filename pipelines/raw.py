"""``raw``: the uint8 pixels resident on the device, cropped/flipped/normalized there per image.

The ceiling that shows when no codec is needed: one gather and one ``grid_sample`` per batch.

Sharding: rank ``config.rank`` iterates its slice of the epoch's global permutation and draws its
crops from its own generator (``pipelines.shard.epoch_shard``); every rank holds the whole split,
or with ``config.resident == "shard"`` only the pixels of its fixed shard (``shard.held_samples``).

Host syncs: none in an epoch's steady state. The epoch's order and each batch's crops are drawn on
the CPU and copied with ``pipelines.crops.to_device`` (pinned, non-blocking on CUDA); indexing
with a device index tensor and ``grid_sample`` are queued kernels. The one documented exception:
the first batch ever on a device builds the normalization constants (``crops.norm_constants``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from bench.datasets.prepared import PreparedDataset
from pipelines.base import PipelineConfig, register
from pipelines.crops import Crops, normalize_, warp
from pipelines.device_epoch import DeviceEpochPipeline
from pipelines.shard import held_samples

LOAD_CHUNK_BYTES = 256 << 20  # host memory one step of ``load_nchw`` holds


def load_nchw(images: np.ndarray, rows: np.ndarray | None, device: torch.device) -> torch.Tensor:
    """uint8 ``[M, 3, H, W]`` on ``device`` from the prepared ``[N, H, W, 3]`` memmap (``rows``: which,
    in order; None: all ``N``), a chunk of ``LOAD_CHUNK_BYTES`` at a time: the host never holds more
    than a chunk and its transposed copy (a whole-split copy and its transposed copy held twice the
    split, 18 GB for Mini-ImageNet at 224 px). ``copy_`` transposes on the host, into a contiguous
    slice of ``out``: no device temporary, which torch's cache would keep reserved through the
    measured epochs (and in raw's GPU-memory figures)."""
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
    """Holds ``images`` uint8 ``[M, 3, H, W]`` and ``labels`` int64 ``[M]`` on ``config.device``: the held
    samples (``shard.held_samples``: all ``N``, or the rank's fixed shard)."""

    def __init__(self, data: PreparedDataset, config: PipelineConfig, store: Path | None = None):
        super().__init__(data, config, store)
        split = data.split(config.split)
        self.device = torch.device(config.device)
        self.n = len(split)
        held = held_samples(self.n, config).numpy()
        rows = None if config.resident == "all" else held  # "shard": reads only the shard's rows
        self.images: torch.Tensor | None = load_nchw(split.images, rows, self.device)
        self.labels: torch.Tensor | None = torch.from_numpy(np.asarray(split.labels)[held]).to(self.device)
        self.height, self.width = split.image_size

    def render(self, positions: torch.Tensor, positions_dev: torch.Tensor, crops: Crops) -> torch.Tensor:
        """Gather the held pixels, crop/flip/resize in one ``grid_sample``, normalize."""
        return normalize_(warp(self.images[positions_dev].float(), crops, self.config.augment), self.config.augment)

    def close(self) -> None:
        self.images = None
        self.labels = None

    def resident_bytes(self) -> dict[str, int]:
        """``device``: bytes held on ``config.device`` (even when that is the CPU); ``host``: 0."""
        held = sum(t.numel() * t.element_size() for t in (self.images, self.labels) if t is not None)
        return {"device": held, "host": 0}

    def dataset_bytes_per_image(self) -> float:
        """The uint8 pixels of one image: H*W*3."""
        return float(self.height * self.width * 3)
