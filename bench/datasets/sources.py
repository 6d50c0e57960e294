"""Dataset source registry: ``@register_source("name")`` on a ``Source`` subclass.

A source reads one on-disk format (or generates images) and returns the canonical
splits in memory (``Loaded``); ``bench.datasets.prepare`` writes them with
``write_prepared``. Adding a source is one module listed in ``_MODULES`` plus its tests.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from bench.datasets.config import PrepareConfig
from bench.datasets.prepared import SplitData
from bench.errors import InputError

if TYPE_CHECKING:
    import numpy as np

    from bench.datasets.resume import PrepareWork

# Modules that define sources, imported on first use (keeps ``inrbench --help`` fast).
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
    """What a source returns.

    splits: split name -> ``SplitData`` (uint8 ``[N, S, S, 3]`` + int64 labels ``[N]``; with
    ``--size native`` a list of uint8 ``[H_i, W_i, 3]``);
    classes: class names, index = label; skipped: ``{"file", "error"}`` per skipped input;
    meta: source-specific manifest fields (how splits were made, counts before ``limit``, ...);
    resize_policy: set when the source knows better than the config (e.g. ``"none"``: native size).
    """

    splits: dict[str, SplitData]
    classes: list[str]
    skipped: list[dict[str, str]] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)
    resize_policy: str | None = None


def loaded_from_files(
    parts: dict[str, tuple[Sequence[Path], np.ndarray]], classes: list[str], meta: dict[str, Any], cfg: PrepareConfig,
    root: Path, progress: Callable[[int], None] | None = None, scratch: Path | None = None,
    work: PrepareWork | None = None,
) -> Loaded:
    """What a source reading image files returns: each split of ``parts`` (name -> (image paths, int64
    labels ``[N]``)) read by ``bench.datasets.decode.split_from_files``, in order (split ``k``'s ``--limit``
    seed and work folder follow its position); ``meta`` gets the ``--size native`` and EXIF orientation
    fields added. ``progress``, ``scratch``, ``work``: as ``Source.load`` got them."""
    from bench.datasets.decode import native_meta, orientation_meta, split_from_files

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
    _check_no_class_lost(lost, splits, classes)
    return Loaded(splits=splits, classes=classes, skipped=skipped,
                  meta={**meta, **native_meta(cfg, downscaled), **orientation_meta(oriented)},
                  resize_policy="native" if cfg.native else None)


def _check_no_class_lost(lost: dict[int, str], splits: dict[str, SplitData], classes: list[str]) -> None:
    """``--on-error skip`` skips files, never a whole class: a class whose every read file was skipped
    would stay in ``classes`` with no image (its label never seen), so it is refused. ``lost``: class ->
    one of its skipped files."""
    from bench.datasets.resume import InputRefused

    for c, file in sorted(lost.items()):
        if not any(bool((s.labels == c).any()) for s in splits.values()):
            raise InputRefused(f"class {classes[c]!r} has no readable image: all its files were skipped as unreadable "
                             "(--on-error skip skips files, not classes): fix them or remove the class", file)


class Source:
    """One dataset source. Subclasses set the class attributes and implement ``load``."""

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    needs_root: ClassVar[bool] = True
    #: image side when ``--size`` is not given; ``None`` keeps the native size (CIFAR: 32).
    default_size: ClassVar[int | None] = 224
    #: resize policy when ``--resize-policy`` is not given.
    default_resize_policy: ClassVar[str] = "shorter-side-center-crop"
    #: ``--size native`` keeps every image at its own size (sources reading files of varied sizes).
    supports_native: ClassVar[bool] = False
    #: decodes image files, resumably: ``load`` takes ``work`` (``bench.datasets.resume``). The
    #: others (generated images, CIFAR's pickles) are quick to read again and start over.
    resumable: ClassVar[bool] = False
    #: splits by a seeded per-class ratio (``--val-fraction``); the others have fixed splits of their own
    #: and refuse the option, which their manifest would record as if it had split something.
    splits_by_ratio: ClassVar[bool] = True

    def load(
        self, cfg: PrepareConfig, progress: Callable[[int], None] | None = None, scratch: Path | None = None,
        work: PrepareWork | None = None,
    ) -> Loaded:
        """Read (or generate) every split.

        progress: called with ``n`` as ``n`` more images are done. scratch: a folder on the
        output's disk where big splits may be held as memory-mapped ``.npy`` files. work: the
        work folder a ``resumable`` source keeps decoded chunks in (passed to those only).
        """
        raise NotImplementedError


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
