"""Dataset source registry: ``@register_source("name")`` on a ``Source`` subclass, one module each
(listed in ``_MODULES``). A source returns the canonical splits in memory (``Loaded``);
``bench.datasets.prepare`` writes them.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from bench.datasets.config import PrepareConfig
from bench.datasets.decode import native_meta, orientation_meta, split_from_files
from bench.datasets.prepared import SplitData
from bench.datasets.resume import InputRefused, PrepareWork
from bench.errors import InputError

_MODULES = (
    "bench.datasets.cifar10",
    "bench.datasets.flowers102",
    "bench.datasets.imagefolder",
    "bench.datasets.miniimagenet",
    "bench.datasets.photos",
    "bench.datasets.synthetic",
)

_REGISTRY: dict[str, type[Source]] = {}


@dataclass(frozen=True)
class Loaded:
    """splits: name -> ``SplitData`` (uint8 ``[N, S, S, 3]``, native: a list of ``[H_i, W_i, 3]``; int64 labels
    ``[N]``); classes: names by label; skipped: ``{"file", "error"}`` per skipped input; meta: manifest
    fields of the source; resize_policy: set where the source knows better than the config."""

    splits: dict[str, SplitData]
    classes: list[str]
    skipped: list[dict[str, str]] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)
    resize_policy: str | None = None


class Source:
    """One dataset source. Subclasses set the class attributes and implement ``load``."""

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    needs_root: ClassVar[bool] = True
    default_size: ClassVar[int | None] = 224  # without --size; None: the native size (CIFAR: 32)
    default_resize_policy: ClassVar[str] = "shorter-side-center-crop"
    supports_native: ClassVar[bool] = False  # --size native
    resumable: ClassVar[bool] = False  # decodes files chunk by chunk: ``load`` takes ``work``
    splits_by_ratio: ClassVar[bool] = True  # --val-fraction applies (else: fixed splits refuse it)

    def load(
        self, cfg: PrepareConfig, progress: Callable[[int], None] | None = None, scratch: Path | None = None,
        work: PrepareWork | None = None,
    ) -> Loaded:
        """Read (or generate) every split; ``progress(n)`` as ``n`` more images are done; ``scratch``: a folder
        on the output's disk for memory-mapped splits; ``work``: the work folder (``resumable`` only)."""
        raise NotImplementedError


Parts = dict[str, tuple[Sequence[Path], np.ndarray]]  # split name -> (image paths, int64 labels [N])


class FileSource(Source):
    """A source of image files: ``parts`` lists them per split, ``load`` decodes them (resumably)."""

    resumable = True
    supports_native = True

    def parts(self, cfg: PrepareConfig, root: Path) -> tuple[Parts, list[str], dict[str, Any]]:
        """(the files of each split, class names by label, manifest fields), every file checked to exist."""
        raise NotImplementedError

    def load(self, cfg: PrepareConfig, progress: Callable[[int], None] | None = None, scratch: Path | None = None,
             work: PrepareWork | None = None) -> Loaded:
        """Each split decoded in order (split ``k``'s ``--limit`` seed and work folder follow its position)."""
        root = Path(cfg.root)
        parts, classes, meta = self.parts(cfg, root)
        splits, skipped, downscaled, oriented, lost = {}, [], [], [], {}
        for k, (name, (paths, labels)) in enumerate(parts.items()):
            r = split_from_files(paths, labels, cfg, root, k, progress, scratch,
                                 None if work is None else work.split(k, name))
            splits[name] = r.split
            skipped += r.skipped
            downscaled += r.downscaled
            oriented += r.oriented
            label_of = {str(p): int(c) for p, c in zip(paths, labels, strict=True)}
            for s in r.skipped:
                lost.setdefault(label_of[s["file"]], s["file"])
        for c, file in sorted(lost.items()):  # --on-error skip skips files, never a whole class
            if not any(bool((s.labels == c).any()) for s in splits.values()):
                raise InputRefused(f"class {classes[c]!r} has no readable image: all its files were skipped as "
                                   "unreadable (--on-error skip skips files, not classes): fix them or remove the "
                                   "class", file)
        return Loaded(splits=splits, classes=classes, skipped=skipped,
                      meta={**meta, **native_meta(cfg, downscaled), **orientation_meta(oriented)},
                      resize_policy="native" if cfg.native else None)


def register_source(name: str) -> Callable[[type[Source]], type[Source]]:
    def deco(cls: type[Source]) -> type[Source]:
        if name in _REGISTRY and _REGISTRY[name] is not cls:
            raise ValueError(f"dataset source {name!r} registered twice")
        cls.name = name
        _REGISTRY[name] = cls
        return cls

    return deco


def _import_all() -> None:
    for m in _MODULES:
        importlib.import_module(m)


def source_names() -> list[str]:
    """Registered source names, sorted."""
    _import_all()
    return sorted(_REGISTRY)


def native_source_names() -> list[str]:
    """Sources that support ``--size native``, sorted."""
    _import_all()
    return sorted(n for n, c in _REGISTRY.items() if c.supports_native)


def get_source(name: str) -> Source:
    """An instance of source ``name``; unknown names are an ``InputError`` listing the known ones."""
    _import_all()
    if name not in _REGISTRY:
        raise InputError(f"unknown dataset source {name!r} (known: {', '.join(sorted(_REGISTRY))})")
    return _REGISTRY[name]()
