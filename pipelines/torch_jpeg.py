"""``torch-jpeg``: the standard baseline. ``DataLoader`` workers read JPEG files, decode with PIL
(Pillow or pillow-simd, whichever is installed), crop/flip per sample with torchvision
transforms, and ship uint8 ``[B, 3, size, size]`` batches (pinned when the device is CUDA); the
device converts to float and normalizes after a non-blocking copy.

Reproducibility: the batch sampler hands every batch a seed drawn from ``(seed, epoch, rank)``
(``pipelines.shard.augment_generator``, ``batch_seeds``: ranks never share one); the dataset seeds
torch's RNG with it (inside ``fork_rng``) before transforming the batch, so an epoch's crops
depend on neither the worker count nor which worker fetches which batch, and persistent workers
need no re-seeding between epochs.

Sharding: the users' way, a ``DistributedSampler`` (``ShardSampler``) told the epoch with
``set_epoch`` before every epoch, wrapped by the batch sampler. It is a subclass whose ``__iter__``
takes the global permutation from ``pipelines.shard.epoch_shard`` instead of drawing its own
(``randperm`` seeded with ``seed + epoch``): the padding, truncation and ``[rank::world]`` slicing
are ``DistributedSampler``'s, mirrored exactly in ``pipelines.shard.shard``, and the permutation is
the one ``raw``, ``inr`` and ``torch-nvjpeg`` draw, so every rank sees the same samples in the same
order as theirs for the same seed (a cross-adapter comparison feeds every model the same data),
and with one rank the epochs are the single-process ones. ``len(sampler)`` is
``DistributedSampler``'s ``num_samples``. With ``config.resident == "shard"`` nothing more is held
(the files stay on disk), but the sampler iterates the rank's fixed shard
(``pipelines.shard``: the same samples every epoch, reshuffled per epoch), as the resident adapters do.

Host syncs: none in an epoch's steady state. Batches arrive pinned (``pin_memory`` on CUDA) and
are copied with ``non_blocking=True``; the normalization constants live on the device once
(``crops.norm_constants``; built in the first batch ever on a device: the documented exception).
The per-batch seeds are read from a CPU tensor (a host read, not a device sync).

Bad files: each worker checks every file after ``Image.open`` has parsed its header and before it
decodes: a JPEG (PIL's format ``JPEG``; an ``MPO``, a multi-picture JPEG, is refused with the walk's
line below), of the prepared size (a replaced file of another size would
otherwise be cropped and trained on). That costs a comparison per sample, nothing read twice. A
file PIL decodes but whose markers do not walk (``pipelines.jpeg_header.layout_problem``: a stray
restart marker in a scan, an end-of-image marker inside one, data after it, a cut scan followed by
zeros; ``dali`` and ``torch-nvjpeg`` refuse such files at build) is found by the same walk at build
(``walk_problems``: every file read once, ~11 us per file at 32 px and ~21 us at 224 px from the
page cache, in ``build_s``) and refused when an epoch reaches it: a dict lookup per sample, where
walking each sample's bytes in the worker cost 3-4% of the per-sample load every epoch. A file that
fails, or that PIL cannot decode (PIL's message first), comes back as a ``BadJpeg`` and the epoch
stops with one line naming it, so the three JPEG adapters refuse the same files.
"""

from __future__ import annotations

import importlib.metadata
import os
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

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
from pipelines.shard import batch_seeds, epoch_shard


def build_transform(aug: Augment, height: int, width: int) -> Any:
    """The torchvision per-sample transform: PIL image -> uint8 ``[3, size, size]``.

    The classic ``torchvision.transforms`` API: on PIL images it costs ~2x less per sample than
    ``transforms.v2`` here (same sampling semantics), and it is what most training scripts use.
    """
    import torchvision.transforms as T

    if aug.crop == "random-resized":
        crop = [T.RandomResizedCrop(aug.size, scale=aug.scale, ratio=aug.ratio, antialias=True)]
    elif aug.crop == "random-pad":
        crop = [T.RandomCrop(aug.size, padding=aug.pad, fill=0)]
    else:
        crop = [T.CenterCrop(min(height, width)), T.Resize(aug.size, antialias=True)]
    flip = [T.RandomHorizontalFlip(0.5)] if aug.flip else []
    return T.Compose([*crop, *flip, T.PILToTensor()])


def pil_info() -> dict[str, Any]:
    """Which PIL is imported: ``Pillow`` or ``pillow-simd``, its version, libjpeg version, SIMD flag."""
    import PIL
    from PIL import features

    flavor = "unknown"
    for dist in ("pillow-simd", "Pillow-SIMD"):
        try:
            importlib.metadata.distribution(dist)
            flavor = "pillow-simd"
            break
        except importlib.metadata.PackageNotFoundError:
            pass
    else:
        try:
            importlib.metadata.distribution("pillow")
            flavor = "Pillow"
        except importlib.metadata.PackageNotFoundError:
            pass
    # pillow-simd releases carry a ".postN" suffix; a cross-check when metadata is ambiguous.
    if flavor == "unknown" and ".post" in PIL.__version__:
        flavor = "pillow-simd"
    return {
        "flavor": flavor,
        "version": PIL.__version__,
        "libjpeg": features.version("jpg"),  # the libjpeg API version (6.2 for libjpeg-turbo's default)
        "libjpeg_turbo": bool(features.check_feature("libjpeg_turbo")),
        "libjpeg_turbo_version": features.version("libjpeg_turbo"),  # the library's own, e.g. 3.1.2
        "module_path": str(Path(PIL.__file__).parent),
    }


@dataclass(frozen=True)
class BadJpeg:
    """A file a worker could not decode, or whose size is not the prepared one: handed back as the
    batch (``collate``) instead of raised, so the main process reports it in one line naming the
    file (a worker's exception would arrive wrapped in its whole traceback). ``message``: what is
    wrong, without the path."""

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
    """A DataLoader worker ignores SIGINT: Ctrl-C reaches the whole process group, and a worker that died
    of it mid-``put`` printed a multiprocessing ``BrokenPipeError`` traceback. The parent stops it
    (``close``, or the loader's own shutdown) as it unwinds."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


# PIL's format names accepted: a single-image JPEG. Not "MPO" (a camera's multi-picture JPEG, which PIL decodes
# the first image of): the walk refuses it in every JPEG adapter (``jpeg_header.multi_picture``), with its line
JPEG_FORMATS = {"JPEG"}


def walk_problems(paths: tuple[Path, ...], size: tuple[int, int]) -> dict[int, str]:
    """``{position: problem}`` for the files of ``paths`` whose markers do not walk (``layout_problem``) or that
    are longer than a JPEG of ``size`` can be (``jpeg_header.too_long``, not read), each read once. A file that
    cannot be read or is no JPEG is left out: PIL names it when it is reached."""
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
    """Items are ``(index, batch_seed)``; ``__getitems__`` returns ``[(uint8 [3,s,s], label), ...]``
    (or ``[BadJpeg]`` when a file cannot be decoded, is no JPEG, is not ``size`` = ``(height, width)``,
    or is in ``problems``: ``{index: message}`` of the files whose markers do not walk)."""

    def __init__(self, paths: tuple[Path, ...], labels: list[int], transform: Any, size: tuple[int, int],
                 problems: dict[int, str] | None = None):
        self.paths = paths
        self.labels = labels
        self.transform = transform
        self.size = tuple(size)
        self.problems = problems or {}

    def __len__(self) -> int:
        return len(self.paths)

    def _load(self, i: int) -> tuple[torch.Tensor, int] | BadJpeg:
        from PIL import Image

        with Image.open(self.paths[i]) as im:
            # open() has parsed the header: these checks cost nothing, and come before any decode
            if im.format not in JPEG_FORMATS:  # an MPO: the walk's line, as ``dali`` and ``torch-nvjpeg`` give it
                return BadJpeg(str(self.paths[i]), self.problems.get(i) or f"not a JPEG (a {im.format} file)")
            if (im.height, im.width) != self.size:
                return BadJpeg(str(self.paths[i]), size_mismatch((im.height, im.width), self.size))
            rgb = im.convert("RGB")  # a file PIL cannot decode raises here (``__getitems__``)
        if i in self.problems:  # PIL decoded it; the other adapters refuse it (``walk_problems``)
            return BadJpeg(str(self.paths[i]), self.problems[i])
        return self.transform(rgb), self.labels[i]

    def __getitem__(self, item: tuple[int, int]) -> tuple[torch.Tensor, int]:
        return self.__getitems__([item])[0]

    def __getitems__(self, items: list[tuple[int, int]]) -> list[Any]:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(items[0][1])
            from PIL import Image

            out = []
            for i, _ in items:
                try:
                    got = self._load(i)
                except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as e:  # a damaged file
                    reason = " ".join(f"{type(e).__name__}: {e}".split())
                    return [BadJpeg(str(self.paths[i]), f"cannot decode JPEG ({reason})")]
                if isinstance(got, BadJpeg):
                    return [got]
                out.append(got)
            return out


class ShardSampler(torch.utils.data.DistributedSampler):
    """``DistributedSampler`` (rank, world size, shuffle, seed, drop_last from ``PipelineConfig``) whose
    epoch permutation is ``pipelines.shard``'s. After ``__iter__``, ``generator`` holds this rank's
    augmentation generator for the epoch set by ``set_epoch``."""

    def __init__(self, dataset: torch.utils.data.Dataset, config: PipelineConfig):
        super().__init__(dataset, num_replicas=config.world_size, rank=config.rank, shuffle=config.shuffle,
                         seed=config.seed, drop_last=config.drop_last)
        self.resident = config.resident
        self.generator: torch.Generator | None = None

    def __iter__(self) -> Iterator[int]:
        part = epoch_shard(len(self.dataset), self.seed, self.epoch, self.shuffle, self.rank, self.num_replicas,
                           self.drop_last, self.resident)
        assert part.indices.numel() == self.num_samples
        self.generator = part.generator
        return iter(part.indices.tolist())


class EpochBatches:
    """Batch sampler: lists of ``(index, batch_seed)`` over the ``ShardSampler``'s indices for its epoch."""

    def __init__(self, sampler: ShardSampler, batch_size: int, drop_last: bool):
        self.sampler = sampler
        self.slices = batch_slices(len(sampler), batch_size, drop_last)

    def __len__(self) -> int:
        return len(self.slices)

    def __iter__(self) -> Iterator[list[tuple[int, int]]]:
        order = list(self.sampler)
        seeds = batch_seeds(len(self.slices), self.sampler.rank, self.sampler.num_replicas, self.sampler.generator)
        for b, sl in enumerate(self.slices):
            seed = int(seeds[b])
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
        self.sampler = ShardSampler(self.dataset, config)
        self.batches = EpochBatches(self.sampler, config.batch_size, config.drop_last)
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
        """Batches per epoch on this rank (the same on every rank)."""
        return len(self.batches)

    def __iter__(self) -> Iterator[Batch]:
        if self.loader is None:
            raise RuntimeError("torch-jpeg pipeline is closed")
        self.sampler.set_epoch(self.epoch)
        self.epoch += 1
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

    def resident_bytes(self) -> dict[str, int]:
        """Nothing resident: the JPEG files stay on disk (the page cache is the OS's)."""
        return {"device": 0, "host": 0}

    def dataset_bytes_per_image(self) -> float | None:
        """The split's JPEG files, mean bytes (``jpeg_header.jpeg_bytes_per_image``)."""
        return jpeg_bytes_per_image(self.data, self.config.split)

    @classmethod
    def libraries(cls) -> dict[str, str | None]:
        """PIL decodes (which one: Pillow or pillow-simd), torchvision's transforms crop."""
        pil = pil_info()
        return {"PIL": f"{pil['flavor']} {pil['version']}", "torchvision": installed_version("torchvision")}
