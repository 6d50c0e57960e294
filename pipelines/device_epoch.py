"""The epoch of the adapters that render their batches on the device (``raw``, ``inr``, ``torch-nvjpeg``):
the base class holds the rank's samples' labels, draws each epoch and each batch's crops; an adapter
implements ``load`` (hold these samples) and ``render`` (these samples at these crops)."""

from __future__ import annotations

import abc
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

import numpy as np
import torch

from pipelines.base import Batch, Pipeline, PipelineConfig
from pipelines.crops import Crops, batch_slices, sample_crops, to_device
from pipelines.shard import config_epoch, held_samples, num_batches

if TYPE_CHECKING:
    from bench.datasets.prepared import PreparedDataset, PreparedSplit


def nbytes(t: torch.Tensor | None) -> int:
    """Bytes of tensor ``t`` (0 for None)."""
    return 0 if t is None else t.numel() * t.element_size()


class DeviceEpochPipeline(Pipeline):
    """Holds ``labels`` int64 ``[M]`` on ``device``, one per held sample (None once closed); ``n``: the
    split's samples; ``height``/``width``: its image size."""

    releases: ClassVar[tuple[str, ...]] = ()  # attributes ``close`` drops besides ``labels``

    def __init__(self, data: PreparedDataset, config: PipelineConfig, store: Path | None = None):
        super().__init__(data, config, store)
        split = data.split(config.split)
        self.device = torch.device(config.device)
        self.n = len(split)
        self.height, self.width = split.image_size
        self.epoch = 0  # ``__iter__`` calls so far
        self.labels: torch.Tensor | None = self.load(split, held_samples(self.n, config))

    @abc.abstractmethod
    def load(self, split: PreparedSplit, held: torch.Tensor) -> torch.Tensor:
        """Hold split indices ``held`` (int64 ``[M]``, position ``k`` is sample ``held[k]``) for ``render``;
        their labels, int64 ``[M]`` on ``device``."""

    def split_labels(self, split: PreparedSplit, held: torch.Tensor) -> torch.Tensor:
        """The prepared labels of ``held``, int64 ``[M]`` on ``device``."""
        return torch.from_numpy(np.asarray(split.labels)[held.numpy()]).to(self.device, torch.int64)

    @abc.abstractmethod
    def render(self, positions: torch.Tensor, positions_dev: torch.Tensor, crops: Crops) -> torch.Tensor:
        """Held samples ``positions`` (int64 ``[B]`` on the host; ``positions_dev``: the same on the
        device) at ``crops``: float32 ``[B, 3, size, size]`` normalized, on the device."""

    def __len__(self) -> int:
        return num_batches(self.n, self.config)

    def __iter__(self) -> Iterator[Batch]:
        if self.labels is None:
            raise RuntimeError(f"{self.name} pipeline is closed")
        cfg = self.config
        part = config_epoch(self.n, cfg, self.epoch)
        self.epoch += 1
        order_dev = to_device(part.positions, self.device)
        for sl in batch_slices(part.positions.numel(), cfg.batch_size, cfg.drop_last):
            idx = order_dev[sl]
            crops = sample_crops(cfg.augment, idx.numel(), self.height, self.width, part.generator)
            yield Batch(images=self.render(part.positions[sl], idx, crops), labels=self.labels[idx])

    def close(self) -> None:
        for attr in ("labels", *self.releases):
            setattr(self, attr, None)
