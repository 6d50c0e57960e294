"""Published rate-distortion points (bpp -> PSNR dB) from ``data/reference_rd.csv``, with their sources.
Their numbers on their data, drawn for orientation by ``--reference`` (docs/codecs.md); not measured here."""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

DATA = Path(__file__).with_name("data") / "reference_rd.csv"
DATASETS = ("kodak", "cifar10")
COLUMNS = ("dataset", "method", "bpp", "psnr", "paper", "source", "approximate")


@dataclass(frozen=True)
class Curve:
    """One method's published curve on one dataset (points sorted by bpp)."""

    dataset: str
    method: str
    bpp: tuple[float, ...]
    psnr: tuple[float, ...]
    paper: str
    sources: tuple[str, ...]
    approximate: bool

    def psnr_at(self, bpp: float) -> float:
        """PSNR at ``bpp``, linear in log(bpp) between published points; NaN outside them."""
        if not self.bpp or not (self.bpp[0] <= bpp <= self.bpp[-1]):
            return math.nan
        return float(np.interp(math.log(bpp), np.log(self.bpp), self.psnr))


@lru_cache(maxsize=1)
def _rows() -> tuple[dict, ...]:
    with open(DATA, newline="", encoding="utf-8") as f:
        rows = tuple(csv.DictReader(f))
    for r in rows:
        if tuple(r) != COLUMNS:
            raise ValueError(f"{DATA}: columns {tuple(r)} != {COLUMNS}")
    return rows


def curves(dataset: str) -> list[Curve]:
    """The published curves of ``dataset`` (``kodak`` | ``cifar10``), in file order."""
    if dataset not in DATASETS:
        raise ValueError(f"unknown reference dataset {dataset!r}; known: {', '.join(DATASETS)}")
    by: dict[str, list[dict]] = {}
    for r in _rows():
        if r["dataset"] == dataset:
            by.setdefault(r["method"], []).append(r)
    out = []
    for method, rs in by.items():
        rs = sorted(rs, key=lambda r: float(r["bpp"]))
        out.append(Curve(
            dataset=dataset, method=method,
            bpp=tuple(float(r["bpp"]) for r in rs), psnr=tuple(float(r["psnr"]) for r in rs),
            paper=rs[0]["paper"], sources=tuple(dict.fromkeys(r["source"] for r in rs)),
            approximate=any(r["approximate"] == "yes" for r in rs),
        ))
    return out
