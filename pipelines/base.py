"""The contract every loader implements: ``Augment``, ``Batch``, ``Pipeline``, ``Unavailable``, registry.

A pipeline is built from a prepared dataset (``bench.datasets.prepared``), optionally an
encoded store (the ``inr`` codec file), and a ``PipelineConfig``. Iterating it yields one
epoch of ``Batch``es; every adapter implements the *same* ``Augment`` natively and draws
crop and flip parameters per image. The harness only ever talks to this interface.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

if TYPE_CHECKING:
    import torch

    from bench.datasets.prepared import PreparedDataset

CropKind = Literal["random-resized", "random-pad", "center"]
# What a rank keeps resident (pipelines.shard): the whole split, or only its fixed shard.
RESIDENT = ("all", "shard")
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


class Unavailable(RuntimeError):
    """This adapter cannot run here (no DALI, no GPU, no store); the message says why.

    Raised from ``__init__``. The harness records a skip row with the reason; tests skip with it.
    """


@dataclass(frozen=True)
class Augment:
    """Per-image training augmentation, identical in meaning for every adapter.

    crop: ``random-resized`` (torchvision ``RandomResizedCrop`` semantics: area fraction in
      ``scale``, aspect ratio log-uniform in ``ratio``, 10 tries then a centre crop fallback,
      resized to ``size``), ``random-pad`` (zero-pad by ``pad`` on every side, then a random
      ``size`` x ``size`` window: the CIFAR recipe), or ``center`` (centre crop of the largest
      square, resized to ``size``: evaluation).
    flip: horizontal flip with probability 0.5, drawn per image.
    mean/std: per-channel normalization applied to RGB in [0, 1].
    """

    crop: CropKind = "random-resized"
    size: int = 32
    scale: tuple[float, float] = (0.08, 1.0)
    ratio: tuple[float, float] = (3 / 4, 4 / 3)
    pad: int = 4
    flip: bool = True
    mean: tuple[float, float, float] = IMAGENET_MEAN
    std: tuple[float, float, float] = IMAGENET_STD

    def __post_init__(self) -> None:
        if self.crop not in ("random-resized", "random-pad", "center"):
            raise ValueError(f"Augment.crop must be random-resized|random-pad|center, got {self.crop!r}")
        if self.size < 1:
            raise ValueError(f"Augment.size must be >= 1, got {self.size}")
        if not (0 < self.scale[0] <= self.scale[1] <= 1):
            raise ValueError(f"Augment.scale must satisfy 0 < lo <= hi <= 1, got {self.scale}")
        if not (0 < self.ratio[0] <= self.ratio[1]):
            raise ValueError(f"Augment.ratio must satisfy 0 < lo <= hi, got {self.ratio}")
        if self.pad < 0:
            raise ValueError(f"Augment.pad must be >= 0, got {self.pad}")
        if len(self.mean) != 3 or len(self.std) != 3 or min(self.std) <= 0:
            raise ValueError("Augment.mean/std need 3 channels and std > 0")

    @classmethod
    def eval_for(cls, train: Augment) -> Augment:
        """The evaluation transform matching a training ``Augment``: centre crop, no flip."""
        return dataclasses.replace(train, crop="center", flip=False)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class PipelineConfig:
    """Everything that shapes an epoch, saved with every result row."""

    batch_size: int = 256
    augment: Augment = field(default_factory=Augment)
    split: str = "train"
    device: str = "cpu"
    workers: int = 2
    seed: int = 0
    shuffle: bool = True
    drop_last: bool = False
    # Let adapters compile their device-side work with torch.compile (paid in the first batch).
    compile: bool = False
    # A store that records no source pixels hash cannot be tied to the split (bench.datasets.identity):
    # refused unless this is set (--allow-unverified-store); the row records it.
    allow_unverified_store: bool = False
    # Data parallelism (bench.dist): this process is rank ``rank`` of ``world_size`` and iterates its
    # shard of every epoch only (pipelines.shard: the rank's slice of one seeded global permutation,
    # DistributedSampler's padding; batch_size is per rank). world_size 1 = the whole split.
    rank: int = 0
    world_size: int = 1
    # "all": every rank holds the whole split (and files are read from all of it); "shard": rank r holds
    # only its fixed shard for the whole run, samples never move between ranks (pipelines.shard,
    # --resident). The same with one rank.
    resident: str = "all"

    def __post_init__(self) -> None:
        if self.world_size < 1 or not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank must be in [0, world_size), got rank {self.rank} of {self.world_size}")
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
        if self.workers < 0:
            raise ValueError(f"workers must be >= 0, got {self.workers}")
        if self.resident not in RESIDENT:
            raise ValueError(f"resident must be one of {'|'.join(RESIDENT)}, got {self.resident!r}")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class Batch:
    """images: float32 ``[B, 3, size, size]`` normalized, on the device; labels: int64 ``[B]`` on the device."""

    images: torch.Tensor
    labels: torch.Tensor


class Pipeline(abc.ABC):
    """One way of feeding images. Subclasses register with ``@register("name")``.

    Epoch ``e`` (0-based count of ``__iter__`` calls) draws its permutation and its
    augmentation from ``seed`` and ``e`` only (and ``rank``: each rank iterates its shard with its
    own augmentation draws, ``pipelines.shard``), so a run is reproducible. ``len`` counts this
    rank's batches, the same on every rank.
    """

    name: ClassVar[str] = ""
    # True when the pipeline reads an encoded store: without one it cannot run, and `inrbench bench`
    # refuses the command line (a usage error, exit 2) instead of recording a skip
    needs_store: ClassVar[bool] = False

    def __init__(self, data: PreparedDataset, config: PipelineConfig, store: Path | None = None):
        self.data = data
        self.config = config
        self.store = store

    @abc.abstractmethod
    def __iter__(self) -> Iterator[Batch]: ...

    @abc.abstractmethod
    def __len__(self) -> int:
        """Batches per epoch."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release device memory, workers and files. Idempotent."""

    @abc.abstractmethod
    def resident_bytes(self) -> dict[str, int]:
        """Bytes this pipeline keeps resident for the dataset: ``{"device": ..., "host": ...}``."""

    def dataset_bytes_per_image(self) -> float | None:
        """Mean bytes per image of what this pipeline reads the dataset from, for the split it was
        built on: the uint8 pixels (``raw``: H*W*3), the JPEG files (their sizes), the encoded store
        (the file's bytes, header amortized, / images). Not what it holds resident (that is
        ``resident_bytes``): what the dataset costs to keep, per image, in this pipeline's form.

        ``inrbench bench`` records it once per repeat, after the build is timed (the metric
        ``dataset_bytes_per_image``), and the report's "bytes/image" column reads it, so a new
        adapter needs no report edit. Cheap: no file is read for it (a manifest entry, a ``stat``,
        what the build already holds). None: not stated (the row is a skip saying so, the report
        shows "—"); the shared tests want a positive finite number from every registered adapter.
        """
        return None

    @classmethod
    def libraries(cls) -> dict[str, str | None]:
        """``{library: version}`` of what this adapter's numbers depend on beyond torch (its decoder,
        its reader); None: not installed here. ``bench.envinfo`` records them for every registered
        adapter in ``env.json`` (``pipelines.<name>``) and in the code identity a sweep cell's hash
        covers (``library_versions``), so a new decoder version makes the cells stale. Read from
        package metadata (``installed_version``), nothing heavy imported; never raises. Adapters that
        name one library give the same version string for it (read from the same place)."""
        return {}

    def __enter__(self) -> Pipeline:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def installed_version(dist: str) -> str | None:
    """The installed version of distribution ``dist`` from its metadata (nothing imported), or None."""
    import importlib.metadata as md

    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None


_REGISTRY: dict[str, type[Pipeline]] = {}


def register(name: str) -> Callable[[type[Pipeline]], type[Pipeline]]:
    def deco(cls: type[Pipeline]) -> type[Pipeline]:
        if name in _REGISTRY and _REGISTRY[name] is not cls:
            raise ValueError(f"pipeline {name!r} is already registered by {_REGISTRY[name].__qualname__}")
        cls.name = name
        _REGISTRY[name] = cls
        return cls

    return deco


def names() -> list[str]:
    """Registered pipeline names (importing ``pipelines`` registers the built-in ones)."""
    return sorted(_REGISTRY)


def needs_store(name: str) -> bool:
    """Pipeline ``name`` reads an encoded store (``Pipeline.needs_store``); False for an unknown name."""
    return name in _REGISTRY and _REGISTRY[name].needs_store


def pipeline_class(name: str) -> type[Pipeline]:
    """The class registered as ``name``; unknown names fail loudly with the known ones listed."""
    if name not in _REGISTRY:
        raise KeyError(f"unknown pipeline {name!r}; known: {', '.join(names())}")
    return _REGISTRY[name]


def create(name: str, data: PreparedDataset, config: PipelineConfig, store: Path | None = None) -> Pipeline:
    """Build pipeline ``name``; unknown names fail loudly with the known ones listed.

    Raises ``Unavailable`` when the adapter cannot run here.
    """
    return pipeline_class(name)(data, config, store=store)
