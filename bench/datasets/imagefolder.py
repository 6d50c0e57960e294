"""``imagefolder``: class-per-folder image trees (ImageNet-style and the like).

Three layouts under ``--root``:

- pre-split: ``train/<class>/*.jpg`` plus ``val/<class>/...`` and/or ``test/<class>/...``;
  each present subfolder becomes a split. Classes are the sorted folder names under
  ``train/``; a class folder in ``val``/``test`` that ``train`` lacks is an error. ``--val-fraction``
  is refused here (the tree has its own split).
- one tree: ``<class>/*.jpg``; each class is split by a seeded ratio into ``train`` and
  ``val`` (``--val-fraction``, default 0.2; ``bench.datasets.splitting.ratio_split``).
- a flat folder: ``*.png`` directly under ``--root`` and no class folders (Kodak, CLIC: a
  compression test set): one class named after the folder, every image in one split
  ``train``; with ``--val-fraction`` it is split by ratio as one tree is.

``--size native`` keeps every image at its own size, mixed sizes and orientations in one split
(downscaled, aspect kept, only past ``--max-side``; ``bench.datasets.decode``); the guards on
broken files and pixel bombs are the same.

Files: JPEG, PNG (and BMP/WebP/PPM/TIFF), any mode converted to RGB; hidden files are
ignored. An entry named like an image that is not a file (a dangling symlink, a folder
``x.jpg``) is an unreadable image: it stops the run, or with ``--on-error skip`` is listed in
the manifest's ``skipped`` (a folder's own images are still read). Label = index of the class name in sorted order (like torchvision ``ImageFolder``).

Symlinks (``bench.datasets.paths``): a symlinked class folder or image file is read when
it resolves inside ``--root``; one that resolves outside it, or that reaches a file the
tree already holds (a class folder linked to another, or back to the root), stops the run
with one line naming it. Symlinked folders inside a class folder are not followed.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from bench.datasets.config import PrepareConfig
from bench.datasets.decode import is_image_name
from bench.datasets.paths import ReadOnce, list_dir, list_tree
from bench.datasets.sources import Loaded, Source, loaded_from_files, register_source
from bench.datasets.splitting import ratio_split
from bench.errors import InputError

if TYPE_CHECKING:
    from bench.datasets.resume import PrepareWork

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
    """``folder/<class>/<image>`` -> (class names, image paths, int64 labels ``[N]``), sorted.

    once: the files (resolved) already taken from this root; each file is taken once.
    """
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
class ImageFolder(Source):
    description = ("class-per-folder JPEG/PNG tree: train/ + val/ (or test/) subfolders, or one tree split by ratio; "
                   "or a flat folder of images (one class)")
    needs_root = True
    default_size = 224
    resumable = True  # bench.datasets.resume
    supports_native = True  # --size native

    def load(
        self, cfg: PrepareConfig, progress: Callable[[int], None] | None = None, scratch: Path | None = None,
        work: PrepareWork | None = None,
    ) -> Loaded:
        root = Path(cfg.root)
        once = ReadOnce(root)
        held = [h for h in HELD_OUT if (root / h).is_dir()]
        if (root / "train").is_dir() and held:
            if cfg.val_fraction is not None:  # it would be recorded in the manifest as if it had split something
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
        return loaded_from_files(parts, classes, {"split_rule": rule, "counts_before_limit": counts}, cfg, root,
                                 progress, scratch, work)


def _image_entries(folder: Path) -> list[Path]:
    """Everything under ``folder`` named like an image, sorted: its files, and the entries that are
    not files (a dangling symlink, a folder ``x.jpg``) so that reading them fails or lists them
    as skipped instead of dropping them unseen."""
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

