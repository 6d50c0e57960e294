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
from pipelines.shard import config_epoch, held_samples, num_batches


@register("raw")
class RawPipeline(Pipeline):
    """Holds ``images`` uint8 ``[M, 3, H, W]`` and ``labels`` int64 ``[M]`` on ``config.device``: the held
    samples (``shard.held_samples``: all ``N``, or the rank's fixed shard)."""

    def __init__(self, data: PreparedDataset, config: PipelineConfig, store: Path | None = None):
        super().__init__(data, config, store)
        split = data.split(config.split)
        self.device = torch.device(config.device)
        self.n = len(split)
        held = held_samples(self.n, config).numpy()
        if config.resident == "all":
            pixels = torch.from_numpy(np.array(split.images))  # copy out of the memmap
        else:
            pixels = torch.from_numpy(np.asarray(split.images[held]))  # reads only the shard's rows
        self.images: torch.Tensor | None = pixels.permute(0, 3, 1, 2).contiguous().to(self.device)
        self.labels: torch.Tensor | None = torch.from_numpy(np.asarray(split.labels)[held]).to(self.device)
        self.height, self.width = split.image_size
        self.epoch = 0

    def __len__(self) -> int:
        """Batches per epoch on this rank (``pipelines.shard``: the same on every rank)."""
        return num_batches(self.n, self.config)

    def __iter__(self) -> Iterator[Batch]:
        if self.images is None or self.labels is None:
            raise RuntimeError("raw pipeline is closed")
        cfg, aug = self.config, self.config.augment
        part = config_epoch(self.n, cfg, self.epoch)
        self.epoch += 1
        order = to_device(part.positions, self.device)
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
