"""``mini-imagenet``: ``images/`` + ``train.csv``/``val.csv``/``test.csv`` (``filename,label``). The official
csvs split classes (few-shot); for classification all rows are pooled and each class split by a seeded
ratio into train and val (``--val-fraction``, default 12/54: the paper's 12,000 : 42,000).
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

from bench.datasets.config import PrepareConfig
from bench.datasets.paths import cannot_read, inside_root
from bench.datasets.sources import FileSource, Parts, register_source
from bench.datasets.splitting import ratio_split
from bench.errors import InputError

CSVS = ("train.csv", "val.csv", "test.csv")
DEFAULT_VAL_FRACTION = 12 / 54


def read_csv(path: Path, images: Path) -> list[tuple[Path, str]]:
    """Rows of one csv as (image path, wnid); a malformed row or a missing image is an ``InputError``."""
    rows = []
    try:
        with open(path, newline="") as f:
            for lineno, row in enumerate(csv.reader(f), start=1):
                if not row or (lineno == 1 and row[0].strip().lower() == "filename"):
                    continue
                if len(row) != 2 or not row[0].strip() or not row[1].strip():
                    raise InputError(f"line {lineno}: expected 'filename,label', got {','.join(row)!r}", path)
                img = inside_root(images, row[0].strip(), path, row=lineno)
                if not img.is_file():
                    raise InputError(f"line {lineno}: names image {row[0].strip()!r}, which is not in {images}", path)
                rows.append((img, row[1].strip()))
    except UnicodeDecodeError:
        raise InputError("not a text csv file", path) from None
    except OSError as e:
        raise cannot_read(e, path) from None
    return rows


@register_source("mini-imagenet")
class MiniImageNet(FileSource):
    description = "mini-ImageNet: images/ + train/val/test.csv (filename,label); all classes pooled, per-class seeded split"

    def parts(self, cfg: PrepareConfig, root: Path) -> tuple[Parts, list[str], dict]:
        images = root / "images"
        if not images.is_dir():
            raise InputError("missing images/ folder: not a mini-ImageNet folder (expected images/ + train.csv/val.csv/test.csv)", images)
        present = [c for c in CSVS if (root / c).is_file()]
        if not present:
            raise InputError("no train.csv/val.csv/test.csv: not a mini-ImageNet folder", root / "train.csv")
        rows: list[tuple[Path, str]] = []
        for c in present:
            rows += read_csv(root / c, images)
        if not rows:
            raise InputError("csv files list no images", root / present[0])
        seen: dict[Path, str] = {}
        for p, w in rows:
            if seen.setdefault(p, w) != w:
                raise InputError(f"image listed twice with labels {seen[p]!r} and {w!r}", p)
        classes = sorted({w for _, w in rows})
        index = {c: i for i, c in enumerate(classes)}
        paths = [p for p, _ in rows]
        labels = np.asarray([index[w] for _, w in rows], dtype=np.int64)
        frac = cfg.val_fraction if cfg.val_fraction is not None else DEFAULT_VAL_FRACTION
        tr, va = ratio_split(labels, frac, cfg.seed)
        parts = {"train": ([paths[i] for i in tr], labels[tr]), "val": ([paths[i] for i in va], labels[va])}
        meta = {
            "split_rule": f"all csv rows pooled; seeded per-class ratio: val_fraction {frac:.6f}, seed {cfg.seed}",
            "csvs": present,
            "counts_before_limit": {"train": int(tr.size), "val": int(va.size)},
        }
        return parts, classes, meta
