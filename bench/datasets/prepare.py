"""``prepare_dataset``: read a source once and write the prepared folder atomically; decoded chunks are
committed to a work folder (``bench.datasets.resume``) so a killed run's rerun decodes only the rest."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path
from typing import Any

from bench.datasets.config import RESIZE_POLICIES, PrepareConfig
from bench.datasets.prepared import write_prepared
from bench.datasets.resize import resample_info
from bench.datasets.resume import InputRefused, PrepareWork, prepare_work
from bench.datasets.sources import get_source, native_source_names
from bench.errors import InputError
from bench.outputs import claim, make_temp_dir


def resolve(cfg: PrepareConfig, read_root: bool = True) -> PrepareConfig:
    """``cfg`` with the source's defaults, checked against its source; ``read_root=False`` reads no file (sweep)."""
    src = get_source(cfg.source)
    if cfg.val_fraction is not None and not src.splits_by_ratio:
        raise InputError(f"--val-fraction {cfg.val_fraction:g} does not apply to {cfg.source}: it has its own "
                         "fixed splits; leave it out")
    if cfg.native:
        _check_native(cfg, src)
    policy = cfg.resize_policy
    if src.default_resize_policy in RESIZE_POLICIES:
        policy = policy or src.default_resize_policy
    elif policy is not None:
        raise InputError(f"source {cfg.source!r} makes its own images; --resize-policy does not apply")
    root = cfg.root
    if src.needs_root:
        if root is None:
            raise InputError(f"source {cfg.source!r} needs --root (the folder holding the dataset)")
        if read_root:
            p = Path(root).expanduser()
            if not p.exists():
                raise InputError("no such file or folder", p)
            if not p.is_dir():
                raise InputError("not a folder", p)
            root = str(p.resolve())
    elif root is not None:
        raise InputError(f"source {cfg.source!r} is built in and takes no --root")
    size = cfg.size if cfg.size is not None else src.default_size
    if cfg.native:
        policy = None  # not resampled (bench.datasets.resize.native_image); the manifest says "native"
    return PrepareConfig(**{**cfg.to_dict(), "root": root, "size": size, "resize_policy": policy})


def _check_native(cfg: PrepareConfig, src) -> None:
    """``--size native`` is for sources that read files of varied sizes, and takes no ``--resize-policy``."""
    if not src.supports_native:
        why = ("its images are all one size already: leave out --size" if src.default_size is None
               else "it makes images of one size")
        raise InputError(f"source {cfg.source!r} does not support --size native ({why}; "
                         f"{', '.join(native_source_names())} do)")
    if cfg.resize_policy is not None:
        raise InputError("--resize-policy does not apply with --size native (images keep their own size; "
                         "--max-side caps the long side)")


def prepare_config(cfg: PrepareConfig, out: str | Path, overwrite: bool = False, progress: bool = False,
                   log: Callable[[str], None] | None = None) -> Path:
    """Run one prepare of ``cfg`` into ``out`` (claimed first: never over ``--root``, replaced only with ``overwrite``);
    resumable sources resume from their work folder; ``log`` gets the one-line notes."""
    cfg = resolve(cfg)
    src = get_source(cfg.source)
    with claim(out, "prepared", inputs={"source root (--root)": cfg.root},
               mode="replace" if overwrite else "new") as out:
        scratch = make_temp_dir(out, ".scratch")
        try:
            with prepare_work(out, cfg, log) if src.resumable else nullcontext() as work:
                _load_and_write(src, cfg, out, scratch, work, overwrite, progress)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    return out


def _load_and_write(src, cfg: PrepareConfig, out: Path, scratch: Path, work: PrepareWork | None, overwrite: bool,
                    progress: bool) -> Path:
    bar = _bar(progress, f"{cfg.source}: read")
    try:
        more = {"work": work} if work is not None else {}
        loaded = src.load(cfg, progress=bar.update if bar is not None else None, scratch=scratch, **more)
    finally:
        if bar is not None:
            bar.close()
    meta: dict[str, Any] = {
        "source": cfg.source,
        "root": cfg.root,
        "classes": list(loaded.classes),
        "resize_policy": loaded.resize_policy or ("native" if cfg.native else cfg.resize_policy or src.default_resize_policy),
        "resample": resample_info(),
        "config": cfg.to_dict(),
        "skipped": list(loaded.skipped),
        "source_meta": dict(loaded.meta),
    }
    total = sum(int(s.labels.shape[0]) for s in loaded.splits.values())
    for name, s in loaded.splits.items():
        if s.labels.shape[0] == 0:
            raise InputRefused(f"split {name!r} has no images after reading{' and skipping' if loaded.skipped else ''}", cfg.root)
    bar = _bar(progress, f"{cfg.source}: write", total)
    try:
        return write_prepared(
            out, loaded.splits, meta, jpeg_quality=cfg.jpeg_quality, overwrite=overwrite,
            progress=bar.update if bar is not None else None,
        )
    finally:
        if bar is not None:
            bar.close()


def prepare_dataset(source: str, out: str | Path, root: str | Path | None = None, *, overwrite: bool = False,
                    progress: bool = False, **options: Any) -> Path:
    """Prepare ``source`` into ``out`` (``options``: the other ``PrepareConfig`` fields); returns ``out``."""
    cfg = PrepareConfig(source=source, root=None if root is None else str(root), **options)
    return prepare_config(cfg, out, overwrite=overwrite, progress=progress)


def _bar(enabled: bool, desc: str, total: int | None = None):
    if not enabled:
        return None
    from tqdm import tqdm

    # disable=None: no bar when stderr is not a terminal (logs, CI, tests).
    return tqdm(total=total, desc=desc, unit="img", disable=None, leave=False)
