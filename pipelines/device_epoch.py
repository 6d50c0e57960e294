"""The epoch of the adapters that render their batches on the device (``raw``, ``inr``, ``torch-nvjpeg``).

The base class draws epoch ``e``'s order for this rank (``pipelines.shard.config_epoch``), each
batch's crops per image from the rank's generator (``pipelines.crops.sample_crops``), and gathers
the labels on the device; an adapter implements ``render`` only: these images at these crops, as a
normalized batch. Host syncs: none; the order is copied once per epoch (``crops.to_device``).
"""

from __future__ import annotations

import abc
from collections.abc import Iterator

import torch

from pipelines.base import Batch, Pipeline
from pipelines.crops import Crops, batch_slices, sample_crops, to_device
from pipelines.shard import config_epoch, num_batches


class DeviceEpochPipeline(Pipeline):
    """Subclasses set ``n`` (samples in the split), ``height``/``width`` (stored image size), ``device``
    and ``labels`` (int64 ``[M]`` on ``device``, one per held sample; None once closed)."""

    n: int
    height: int
    width: int
    device: torch.device
    labels: torch.Tensor | None
    epoch: int = 0  # ``__iter__`` calls so far

    def __len__(self) -> int:
        """Batches per epoch on this rank (``pipelines.shard``: the same on every rank)."""
        return num_batches(self.n, self.config)

    @abc.abstractmethod
    def render(self, positions: torch.Tensor, positions_dev: torch.Tensor, crops: Crops) -> torch.Tensor:
        """Held samples ``positions`` (int64 ``[B]`` on the host; ``positions_dev``: the same on the
        device) at ``crops``: float32 ``[B, 3, size, size]`` normalized, on the device."""

    def __iter__(self) -> Iterator[Batch]:
        if self.labels is None:
            raise RuntimeError(f"{self.name} pipeline is closed")
        cfg, aug = self.config, self.config.augment
        part = config_epoch(self.n, cfg, self.epoch)
        self.epoch += 1
        order_dev = to_device(part.positions, self.device)
        for sl in batch_slices(part.positions.numel(), cfg.batch_size, cfg.drop_last):
            idx = order_dev[sl]
            crops = sample_crops(aug, idx.numel(), self.height, self.width, part.generator)
            yield Batch(images=self.render(part.positions[sl], idx, crops), labels=self.labels[idx])
