"""``dali``: NVIDIA DALI reads the JPEG files, decodes (``mixed`` on a GPU, ``cpu`` without one),
crops/flips/normalizes per sample with DALI operators, and hands torch tensors to the harness.

``device_id=None`` builds a CPU-only pipeline (no GPU needed); its output is moved to
``config.device``. The reader shuffles a true permutation every epoch (``shuffle_after_epoch``)
and pads the last shard batch so ``LastBatchPolicy.PARTIAL`` yields every sample exactly once.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from bench.datasets.prepared import PreparedDataset
from pipelines.base import Augment, Batch, Pipeline, PipelineConfig, Unavailable, register


def _graph(
    file_root: str, file_list: str, aug: Augment, height: int, width: int, shuffle: bool, shuffle_seed: int, gpu: bool
) -> tuple[Any, Any]:
    """The DALI graph (called inside ``pipeline_def``): returns ``(images [3,s,s] float, labels)``."""
    from nvidia.dali import fn, types

    jpegs, labels = fn.readers.file(
        file_root=file_root,
        file_list=file_list,
        shuffle_after_epoch=shuffle,
        shuffle_after_epoch_seed=shuffle_seed,
        pad_last_batch=True,
        name="Reader",
    )
    images = fn.decoders.image(jpegs, device="mixed" if gpu else "cpu", output_type=types.RGB)
    if aug.crop == "random-resized":
        images = fn.random_resized_crop(
            images, size=[aug.size, aug.size], random_area=list(aug.scale),
            random_aspect_ratio=list(aug.ratio), num_attempts=10, antialias=True,
        )
    elif aug.crop == "random-pad":
        # Anchor (x, y) uniform over the zero-padded image: RandomCrop(size, padding=pad).
        starts = list(range(-aug.pad, width + aug.pad - aug.size + 1))
        ax = fn.random.uniform(values=starts, dtype=types.INT32)
        starts_y = list(range(-aug.pad, height + aug.pad - aug.size + 1))
        ay = fn.random.uniform(values=starts_y, dtype=types.INT32)
        anchor = fn.stack(ax, ay)
        images = fn.slice(
            images, anchor, types.Constant([aug.size, aug.size], dtype=types.INT32),
            axis_names="WH", out_of_bounds_policy="pad", fill_values=0,
        )
    else:
        s = min(height, width)
        images = fn.crop(images, crop=[s, s])
        if s != aug.size:
            images = fn.resize(images, size=[aug.size, aug.size], antialias=True)
    mirror = fn.random.coin_flip(probability=0.5) if aug.flip else 0
    images = fn.crop_mirror_normalize(
        images,
        dtype=types.FLOAT,
        output_layout="CHW",
        mean=[255.0 * m for m in aug.mean],
        std=[255.0 * s for s in aug.std],
        mirror=mirror,
    )
    return images, labels


@register("dali")
class DaliPipeline(Pipeline):
    def __init__(self, data: PreparedDataset, config: PipelineConfig, store: Path | None = None):
        super().__init__(data, config, store)
        try:
            from nvidia.dali import pipeline_def
            from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy
        except Exception as e:  # ImportError, or a broken CUDA runtime inside DALI
            raise Unavailable(f"nvidia.dali cannot be imported: {type(e).__name__}: {e}") from None
        split = data.split(config.split)
        self.device = torch.device(config.device)
        self.n = len(split)
        gpu = self.device.type == "cuda"
        if gpu:
            device_id = self.device.index if self.device.index is not None else torch.cuda.current_device()
        else:
            device_id = None
        h, w = split.image_size
        pipe_fn = pipeline_def(_graph)
        self.pipe = pipe_fn(
            str(split.root), str(split.file_list), config.augment, h, w, config.shuffle, config.seed, gpu,
            batch_size=config.batch_size,
            num_threads=max(1, config.workers),
            device_id=device_id,
            seed=config.seed,
            prefetch_queue_depth=2,
        )
        self.pipe.build()
        policy = LastBatchPolicy.DROP if config.drop_last else LastBatchPolicy.PARTIAL
        self.iterator = DALIGenericIterator(
            [self.pipe], ["images", "labels"], reader_name="Reader", last_batch_policy=policy, auto_reset=True
        )
        self._in_epoch = False

    def __len__(self) -> int:
        b = self.config.batch_size
        return self.n // b if self.config.drop_last else -(-self.n // b)

    def __iter__(self) -> Iterator[Batch]:
        if self.iterator is None:
            raise RuntimeError("dali pipeline is closed")
        if self._in_epoch:  # DALI cannot reset mid-epoch: finish the abandoned one first
            for _ in self.iterator:
                pass
        self._in_epoch = True
        for out in self.iterator:
            d = out[0]
            images = d["images"].to(self.device, non_blocking=True)
            labels = d["labels"].reshape(-1).to(self.device, torch.int64, non_blocking=True)
            yield Batch(images=images, labels=labels)
        self._in_epoch = False

    def close(self) -> None:
        self.iterator = None
        self.pipe = None

    def resident_bytes(self) -> dict[str, int]:
        """DALI's pools are not visible here (use NVML); nothing dataset-sized is held."""
        return {"device": 0, "host": 0}
