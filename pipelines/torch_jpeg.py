"""``torch-jpeg``: the baseline; ``DataLoader`` workers decode with PIL, crop with torchvision, ship uint8
batches, seeded per batch from the rank's generator (crops independent of workers); bad files come back
as ``BadJpeg`` batches (docs/pipelines.md)."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from PIL import Image

from bench.datasets.prepared import PreparedDataset
from bench.errors import InputError
from pipelines.base import Augment, Batch, Pipeline, PipelineConfig, installed_version, register
from pipelines.crops import batch_slices, normalize_
from pipelines.jpeg_header import (
    jpeg_bytes_per_image,
    layout_problem,
    read_file,
    size_mismatch,
    too_long,
)
from pipelines.shard import batch_seeds, config_epoch, num_batches


def build_transform(aug: Augment, height: int, width: int) -> Any:
    """The torchvision per-sample transform: PIL image -> uint8 ``[3, size, size]``. The classic
    ``transforms`` API: what most training scripts use, and cheaper than ``v2`` on PIL images."""
    import torchvision.transforms as T

    if aug.crop == "random-resized":
        crop = [T.RandomResizedCrop(aug.size, scale=aug.scale, ratio=aug.ratio, antialias=True)]
    elif aug.crop == "random-pad":
        crop = [T.RandomCrop(aug.size, padding=aug.pad, fill=0)]
    else:
        crop = [T.CenterCrop(min(height, width)), T.Resize(aug.size, antialias=True)]
    flip = [T.RandomHorizontalFlip(0.5)] if aug.flip else []
    return T.Compose([*crop, *flip, T.PILToTensor()])


@dataclass(frozen=True)
class BadJpeg:
    """A file a worker refuses, handed back as the batch (``collate``); ``message``: what is wrong."""

    path: str
    message: str

    def error(self) -> InputError:
        return InputError(self.message, self.path)


def collate(items: list[Any]) -> Any:
    """``default_collate``, except that a ``BadJpeg`` in the batch is the whole result."""
    for it in items:
        if isinstance(it, BadJpeg):
            return it
    return torch.utils.data.default_collate(items)


def leave_ctrl_c_to_the_parent(worker_id: int) -> None:
    """A worker ignores SIGINT (Ctrl-C reaches the whole process group; one dying mid-``put`` printed a
    traceback): the parent stops it as it unwinds."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def walk_problems(paths: tuple[Path, ...], size: tuple[int, int]) -> dict[int, str]:
    """``{position: problem}`` of the files whose markers do not walk or that are too long (not read); a file
    that cannot be read or is no JPEG is left to PIL, which names it when an epoch reaches it."""
    out = {}
    for k, p in enumerate(paths):
        try:
            n = os.stat(p).st_size
        except OSError:
            continue
        if (problem := too_long(n, size)) is not None:
            out[k] = problem
            continue
        try:
            raw = read_file(p, size)
        except InputError:
            continue
        if raw[:2] == b"\xff\xd8" and (problem := layout_problem(raw)) is not None:
            out[k] = problem
    return out


class JpegFiles(torch.utils.data.Dataset):
    """Items are ``(index, batch_seed)``; ``__getitems__`` returns ``[(uint8 [3, s, s], label), ...]``, or
    ``[BadJpeg]`` for a file that does not decode, is no JPEG, not ``size``, or is in ``problems``."""

    def __init__(self, paths: tuple[Path, ...], labels: list[int], transform: Any, size: tuple[int, int],
                 problems: dict[int, str] | None = None):
        self.paths = paths
        self.labels = labels
        self.transform = transform
        self.size = tuple(size)
        self.problems = problems or {}

    def __len__(self) -> int:
        return len(self.paths)

    def _load(self, i: int) -> tuple[torch.Tensor, int] | str:
        """Item ``i``, or what is wrong with its file."""
        try:
            with Image.open(self.paths[i]) as im:
                if im.format != "JPEG":  # an MPO: the walk's line, as the other JPEG adapters give it
                    return self.problems.get(i) or f"not a JPEG (a {im.format} file)"
                if (im.height, im.width) != self.size:
                    return size_mismatch((im.height, im.width), self.size)
                rgb = im.convert("RGB")
            # a file PIL decodes but whose markers do not walk: refused as the other JPEG adapters do
            return self.problems[i] if i in self.problems else (self.transform(rgb), self.labels[i])
        except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as e:  # a damaged file
            return f"cannot decode JPEG ({' '.join(f'{type(e).__name__}: {e}'.split())})"

    def __getitem__(self, item: tuple[int, int]) -> tuple[torch.Tensor, int]:
        return self.__getitems__([item])[0]

    def __getitems__(self, items: list[tuple[int, int]]) -> list[Any]:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(items[0][1])
            out = []
            for i, _ in items:
                got = self._load(i)
                if isinstance(got, str):
                    return [BadJpeg(str(self.paths[i]), got)]
                out.append(got)
            return out


class EpochBatches:
    """Batch sampler: this rank's epoch ``epoch`` (``shard.config_epoch``) as lists of ``(index, batch_seed)``."""

    def __init__(self, n: int, config: PipelineConfig):
        self.n, self.config, self.epoch = n, config, 0

    def __len__(self) -> int:
        return num_batches(self.n, self.config)

    def __iter__(self) -> Iterator[list[tuple[int, int]]]:
        cfg = self.config
        part = config_epoch(self.n, cfg, self.epoch)
        slices = batch_slices(part.indices.numel(), cfg.batch_size, cfg.drop_last)
        seeds = batch_seeds(len(slices), cfg.rank, cfg.world_size, part.generator).tolist()
        order = part.indices.tolist()
        for seed, sl in zip(seeds, slices, strict=True):
            yield [(i, seed) for i in order[sl]]


@register("torch-jpeg")
class TorchJpegPipeline(Pipeline):
    def __init__(self, data: PreparedDataset, config: PipelineConfig, store: Path | None = None):
        super().__init__(data, config, store)
        split = data.split(config.split)
        self.device = torch.device(config.device)
        h, w = split.image_size
        self.dataset = JpegFiles(split.jpeg_paths, split.labels.tolist(), build_transform(config.augment, h, w), (h, w),
                                 walk_problems(split.jpeg_paths, (h, w)))
        self.batches = EpochBatches(len(self.dataset), config)
        self.loader: torch.utils.data.DataLoader | None = torch.utils.data.DataLoader(
            self.dataset,
            batch_sampler=self.batches,
            num_workers=config.workers,
            pin_memory=self.device.type == "cuda",
            persistent_workers=config.workers > 0,
            collate_fn=collate,
            worker_init_fn=leave_ctrl_c_to_the_parent,
        )
        self.epoch = 0

    def __len__(self) -> int:
        return len(self.batches)

    def __iter__(self) -> Iterator[Batch]:
        if self.loader is None:
            raise RuntimeError("torch-jpeg pipeline is closed")
        self.batches.epoch, self.epoch = self.epoch, self.epoch + 1
        for batch in self.loader:
            if isinstance(batch, BadJpeg):
                raise batch.error()
            images, labels = batch
            x = images.to(self.device, non_blocking=True).float()
            yield Batch(images=normalize_(x, self.config.augment), labels=labels.to(self.device, non_blocking=True))

    def close(self) -> None:
        if self.loader is not None:
            it = getattr(self.loader, "_iterator", None)  # persistent workers live here
            if it is not None and hasattr(it, "_shutdown_workers"):
                it._shutdown_workers()
            self.loader = None

    def dataset_bytes_per_image(self) -> float | None:
        """The split's JPEG files, mean bytes (``jpeg_header.jpeg_bytes_per_image``)."""
        return jpeg_bytes_per_image(self.data, self.config.split)

    @classmethod
    def libraries(cls) -> dict[str, str | None]:
        """PIL decodes (Pillow or pillow-simd), torchvision's transforms crop."""
        simd = installed_version("pillow-simd")
        pil = f"pillow-simd {simd}" if simd else f"Pillow {installed_version('pillow')}"
        return {"PIL": pil, "torchvision": installed_version("torchvision")}
