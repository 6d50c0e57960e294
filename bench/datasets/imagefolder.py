"""``imagefolder``: class-per-folder trees under ``--root``: pre-split, one tree split by ``--val-fraction``,
or a flat folder as one class; labels index sorted class names (layouts and symlinks: docs/datasets.md)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from bench.datasets.config import PrepareConfig
from bench.datasets.decode import is_image_name
from bench.datasets.paths import ReadOnce, list_dir, list_tree
from bench.datasets.sources import FileSource, Parts, register_source
from bench.datasets.splitting import ratio_split
from bench.errors import InputError

DEFAULT_VAL_FRACTION = 0.2
HELD_OUT = ("val", "test")


def _class_dirs(folder: Path, once: ReadOnce) -> list[Path]:
    dirs = [p for p in list_dir(folder) if p.is_dir() and not p.name.startswith(".")]
    for d in dirs:
        real = once.inside(d)
        if folder.resolve().is_relative_to(real):
            raise InputError(f"is a symlink to {real}, which holds this folder (a loop)", d)
    return dirs


def scan(
    folder: Path, classes: list[str] | None = None, once: ReadOnce | None = None
) -> tuple[list[str], list[Path], np.ndarray]:
    """``folder/<class>/<image>`` -> (class names, image paths, int64 labels ``[N]``), sorted; ``once``: the
    files already taken from this root."""
    once = once if once is not None else ReadOnce(folder)
    dirs = _class_dirs(folder, once)
    if not dirs:
        raise InputError("no class folders and no images (expected CLASS/image.jpg, train/CLASS/... and "
                         "val/CLASS/..., or image files directly in it)", folder)
    names = [d.name for d in dirs]
    if classes is None:
        classes = names
    else:
        extra = sorted(set(names) - set(classes))
        if extra:
            raise InputError(f"class folder {extra[0]!r} is not in train/ ({len(extra)} unknown)", folder / extra[0])
    index = {c: i for i, c in enumerate(classes)}
    paths, labels = [], []
    for d in dirs:
        files = _image_entries(d)
        if not files:
            raise InputError("class folder holds no images (.jpg/.jpeg/.png/...)", d)
        for p in files:
            once.take(p)
        paths += files
        labels += [index[d.name]] * len(files)
    return classes, paths, np.asarray(labels, dtype=np.int64)


@register_source("imagefolder")
class ImageFolder(FileSource):
    description = ("class-per-folder JPEG/PNG tree: train/ + val/ (or test/) subfolders, or one tree split by ratio; "
                   "or a flat folder of images (one class)")

    def parts(self, cfg: PrepareConfig, root: Path) -> tuple[Parts, list[str], dict]:
        once = ReadOnce(root)
        held = [h for h in HELD_OUT if (root / h).is_dir()]
        if (root / "train").is_dir() and held:
            if cfg.val_fraction is not None:
                raise InputError(f"--val-fraction {cfg.val_fraction:g} does not apply: this tree is split already "
                                 f"(train/ + {'/ + '.join(held)}/); leave it out", root)
            classes, tr_paths, tr_labels = scan(root / "train", once=once)
            parts = {"train": (tr_paths, tr_labels)}
            for h in held:
                _, p, lab = scan(root / h, classes, once)
                parts[h] = (p, lab)
            rule = f"folders: train/ + {'/ + '.join(held)}/"
        else:
            flat = [] if _class_dirs(root, once) else _flat(root, once)
            if flat:  # no class folders: one class named after the folder
                classes, paths, labels = [root.name or "images"], flat, np.zeros(len(flat), dtype=np.int64)
            else:
                classes, paths, labels = scan(root, once=once)
            if flat and cfg.val_fraction is None:
                parts = {"train": (paths, labels)}
                rule = "flat folder: one class named after the folder, every image in train"
            else:
                frac = cfg.val_fraction if cfg.val_fraction is not None else DEFAULT_VAL_FRACTION
                tr, va = ratio_split(labels, frac, cfg.seed)
                parts = {"train": ([paths[i] for i in tr], labels[tr]), "val": ([paths[i] for i in va], labels[va])}
                rule = f"seeded per-class ratio: val_fraction {frac}, seed {cfg.seed}"
        counts = {n: len(p) for n, (p, _) in parts.items()}
        return parts, classes, {"split_rule": rule, "counts_before_limit": counts}


def _image_entries(folder: Path) -> list[Path]:
    """Every entry under ``folder`` named like an image, sorted: files, and the non-files (a dangling
    symlink, a folder ``x.jpg``), whose read fails or is listed as skipped."""
    entries = [p for p in list_tree(folder) if is_image_name(p)]
    for top, dirs, _ in os.walk(folder, followlinks=False):
        entries += [Path(top) / d for d in dirs if is_image_name(Path(d))]
    return sorted(entries)


def _flat(root: Path, once: ReadOnce) -> list[Path]:
    """The image files directly under ``root`` (sorted, each taken once), for a folder without class folders."""
    files = [p for p in list_dir(root) if is_image_name(p) and not p.is_dir()]
    for p in files:
        once.take(p)
    return files

