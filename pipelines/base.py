"""The contract every loader implements: ``Augment``, ``PipelineConfig``, ``Batch``, ``Pipeline``, the registry.
A pipeline is built from a prepared dataset, optionally an encoded store, and a ``PipelineConfig``;
iterating it yields one epoch of ``Batch``es, augmented per image the same way by every adapter.
"""

from __future__ import annotations

import abc
import dataclasses
import functools
import importlib.metadata
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

if TYPE_CHECKING:
    import torch

    from bench.datasets.prepared import PreparedDataset

CropKind = Literal["random-resized", "random-pad", "center"]
RESIDENT = ("all", "shard")  # what a rank keeps resident: the whole split, or its fixed shard (pipelines.shard)


class Unavailable(RuntimeError):
    """Raised from ``__init__`` when this adapter cannot run here (no DALI, no GPU, no store): the
    harness records a skip row with the reason; tests skip with it."""


@dataclass(frozen=True)
class Augment:
    """Per-image training augmentation, identical in meaning for every adapter.

    crop: ``random-resized`` (torchvision ``RandomResizedCrop``: area fraction in ``scale``, log-uniform
    aspect ratio in ``ratio``, 10 tries then a centre crop), ``random-pad`` (zero-pad by ``pad``, then a
    random ``size`` window: the CIFAR recipe) or ``center`` (the largest centred square: evaluation),
    resized to ``size``. flip: horizontal, p = 0.5 per image. mean/std: applied to RGB in [0, 1].
    """

    crop: CropKind = "random-resized"
    size: int = 32
    scale: tuple[float, float] = (0.08, 1.0)
    ratio: tuple[float, float] = (3 / 4, 4 / 3)
    pad: int = 4
    flip: bool = True
    mean: tuple[float, float, float] = (0.485, 0.456, 0.406)  # ImageNet's
    std: tuple[float, float, float] = (0.229, 0.224, 0.225)

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

    batch_size: int = 256  # per rank
    augment: Augment = field(default_factory=Augment)
    split: str = "train"
    device: str = "cpu"
    workers: int = 2  # the CPU budget: DataLoader workers, DALI threads
    seed: int = 0
    shuffle: bool = True
    drop_last: bool = False
    compile: bool = False  # adapters may torch.compile their device-side work (paid in the first batch)
    # a store recording no source pixels hash cannot be tied to the split: refused unless set
    allow_unverified_store: bool = False
    # data parallelism: this process iterates its shard of every epoch (pipelines.shard)
    rank: int = 0
    world_size: int = 1
    resident: str = "all"  # RESIDENT: every rank holds the whole split, or only its fixed shard

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
    """One way of feeding images; subclasses register with ``@register("name")``.

    Epoch ``e`` (the ``e``-th ``__iter__`` call) depends on ``seed``, ``e`` and the rank only, so a run
    is reproducible; ``len`` counts this rank's batches, the same on every rank.
    """

    name: ClassVar[str] = ""
    # reads an encoded store: `inrbench bench` refuses the command line without one (exit 2)
    needs_store: ClassVar[bool] = False

    def __init__(self, data: PreparedDataset, config: PipelineConfig, store: Path | None = None):
        self.data = data
        self.config = config
        self.store = store

    @abc.abstractmethod
    def __iter__(self) -> Iterator[Batch]: ...

    @abc.abstractmethod
    def __len__(self) -> int:
        """Batches per epoch on this rank."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release device memory, workers and files. Idempotent."""

    def resident_bytes(self) -> dict[str, int]:
        """Bytes this pipeline keeps resident for the dataset: ``{"device": ..., "host": ...}``."""
        return {"device": 0, "host": 0}

    def dataset_bytes_per_image(self) -> float | None:
        """Mean bytes per image of what this pipeline reads the split from (the pixels, the JPEG files,
        the store file), the report's bytes/image. Cheap: no pass over the files. None: not stated."""
        return None

    @classmethod
    def libraries(cls) -> dict[str, str | None]:
        """``{library: version or None}`` this adapter's numbers depend on beyond torch, from package
        metadata (``installed_version``); recorded in ``env.json`` and in a sweep cell's code identity."""
        return {}

    def __enter__(self) -> Pipeline:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def installed_version(dist: str) -> str | None:
    """The installed version of distribution ``dist`` from its metadata (nothing imported), or None."""
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


@functools.cache
def installed_distributions() -> dict[str, str]:
    """``{name: version}`` of every installed distribution (names lower case, ``-`` for ``_``; the first of a name
    on ``sys.path`` wins), read once per process: the scan parses each one's metadata (~0.05 s for 270)."""
    out: dict[str, str] = {}
    for d in importlib.metadata.distributions():
        meta = d.metadata
        if name := (meta["Name"] or "").lower().replace("_", "-"):
            out.setdefault(name, meta["Version"])
    return out


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
    """Pipeline ``name`` reads an encoded store; False for an unknown name."""
    return name in _REGISTRY and _REGISTRY[name].needs_store


def pipeline_class(name: str) -> type[Pipeline]:
    """The class registered as ``name``; unknown names fail loudly with the known ones listed."""
    if name not in _REGISTRY:
        raise KeyError(f"unknown pipeline {name!r}; known: {', '.join(names())}")
    return _REGISTRY[name]


def create(name: str, data: PreparedDataset, config: PipelineConfig, store: Path | None = None) -> Pipeline:
    """Build pipeline ``name``; raises ``Unavailable`` when it cannot run here."""
    return pipeline_class(name)(data, config, store=store)
