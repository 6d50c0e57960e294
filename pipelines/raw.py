"""``raw``: the uint8 pixels resident on the device, cropped/flipped/normalized there per image.

The ceiling that shows when no codec is needed: one gather and one ``grid_sample`` per batch.

Sharding: rank ``config.rank`` iterates its slice of the epoch's global permutation and draws its
crops from its own generator (``pipelines.shard.epoch_shard``); every rank holds the whole split.

Host syncs: none in an epoch's steady state. The epoch's order and each batch's crops are drawn on
the CPU and copied with ``pipelines.crops.to_device`` (pinned, non-blocking on CUDA); indexing
with a device index tensor and ``grid_sample`` are queued kernels. The one documented exception:
the first batch ever on a device builds the normalization constants (``crops.norm_constants``).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

from bench.datasets.prepared import PreparedDataset
from pipelines.base import Batch, Pipeline, PipelineConfig, register
from pipelines.crops import (
    batch_slices,
    normalize_,
    sample_crops,
    to_device,
    warp,
)
from pipelines.shard import epoch_shard, num_batches


@register("raw")
class RawPipeline(Pipeline):
    """Holds ``images`` uint8 ``[N, 3, H, W]`` and ``labels`` int64 ``[N]`` on ``config.device``."""

    def __init__(self, data: PreparedDataset, config: PipelineConfig, store: Path | None = None):
        super().__init__(data, config, store)
        split = data.split(config.split)
        self.device = torch.device(config.device)
        pixels = torch.from_numpy(np.array(split.images))  # copy out of the memmap
        self.images: torch.Tensor | None = pixels.permute(0, 3, 1, 2).contiguous().to(self.device)
        self.labels: torch.Tensor | None = torch.from_numpy(split.labels).to(self.device)
        self.n = len(split)
        self.height, self.width = split.image_size
        self.epoch = 0

    def __len__(self) -> int:
        """Batches per epoch on this rank (``pipelines.shard``: the same on every rank)."""
        return num_batches(self.n, self.config)

    def __iter__(self) -> Iterator[Batch]:
        if self.images is None or self.labels is None:
            raise RuntimeError("raw pipeline is closed")
        cfg, aug = self.config, self.config.augment
        part = epoch_shard(self.n, cfg.seed, self.epoch, cfg.shuffle, cfg.rank, cfg.world_size, cfg.drop_last)
        self.epoch += 1
        order = to_device(part.indices, self.device)
        for sl in batch_slices(order.numel(), cfg.batch_size, cfg.drop_last):
            idx = order[sl]
            crops = sample_crops(aug, idx.numel(), self.height, self.width, part.generator)
            x = warp(self.images[idx].float(), crops, aug)
            yield Batch(images=normalize_(x, aug), labels=self.labels[idx])

    def close(self) -> None:
        self.images = None
        self.labels = None

    def resident_bytes(self) -> dict[str, int]:
        """``device``: bytes held on ``config.device`` (even when that is the CPU); ``host``: 0."""
        held = sum(t.numel() * t.element_size() for t in (self.images, self.labels) if t is not None)
        return {"device": held, "host": 0}
