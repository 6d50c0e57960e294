"""The configuration of one ``inrbench compare`` run (validated, saved beside the results)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

DEFAULT_QUALITIES: tuple[int, ...] = (1, 5, 10, 20, 30, 40, 50, 60, 70, 80, 90, 95, 100)
MATCH_KEYS = ("file", "header-free")
MATCH_CHOICES = ("file", "header-free", "both")
SEARCH_CHOICES = ("binary", "exhaustive")
SUBSAMPLINGS = ("4:4:4", "4:2:2", "4:2:0")
INR_BYTES = ("file", "payload")


@dataclass(frozen=True)
class CompareConfig:
    """split: prepared split to read; qualities: JPEG quality sweep; limit: first N images
    (``None`` = all); match: which JPEG bytes must fit the INR's bytes per image;
    search: ``binary`` (+ repair window) or ``exhaustive`` over qualities 1..100;
    subsampling: JPEG chroma subsampling; weight_images: images sampled for the weight
    histograms; batch: images decoded per INR forward; codecs: ``bench.compare.codecs`` names
    compared at matched bytes (the sweep qualities apply to each); reference: published
    curves to draw (``bench.compare.references``: ``kodak`` | ``cifar10``) or ``None``;
    inr_bytes: what an INR image costs, i.e. the bytes the codecs must fit and every INR bpp:
    ``file`` (store file / N, its header amortized) or ``payload`` (the packed weight arrays /
    N: codes, scales, masks, no store header; the network's bits, as COIN counts them); assert_kodak: run the
    Kodak self-check (``bench.compare.kodak``) even where the pixels are not recognised as Kodak's."""

    split: str = "train"
    qualities: tuple[int, ...] = DEFAULT_QUALITIES
    limit: int | None = None
    match: str = "both"
    search: str = "binary"
    window: int = 5
    subsampling: str = "4:2:0"
    weight_images: int = 256
    batch: int = 64
    codecs: tuple[str, ...] = ("jpeg",)
    reference: str | None = None
    inr_bytes: str = "file"
    assert_kodak: bool = False

    def __post_init__(self) -> None:
        if not self.qualities or any(not (1 <= int(q) <= 100) for q in self.qualities):
            raise ValueError(f"--jpeg-qualities: JPEG qualities must be in 1..100, got {list(self.qualities)}")
        object.__setattr__(self, "qualities", tuple(sorted({int(q) for q in self.qualities})))
        if self.limit is not None and self.limit < 1:
            raise ValueError(f"--limit must be >= 1, got {self.limit}")
        if self.match not in MATCH_CHOICES:
            raise ValueError(f"--match must be one of {', '.join(MATCH_CHOICES)}, got {self.match!r}")
        if self.search not in SEARCH_CHOICES:
            raise ValueError(f"search must be one of {', '.join(SEARCH_CHOICES)} (--exhaustive-jpeg: exhaustive), got {self.search!r}")
        if self.window < 0:
            raise ValueError(f"--window must be >= 0, got {self.window}")
        if self.subsampling not in SUBSAMPLINGS:
            raise ValueError(f"--subsampling must be one of {', '.join(SUBSAMPLINGS)}, got {self.subsampling!r}")
        from bench.compare import codecs as registry

        names = tuple(dict.fromkeys(str(c).strip().lower() for c in self.codecs if str(c).strip()))
        if not names:
            raise ValueError("--codecs needs at least one codec")
        for c in names:
            if c not in registry.names():
                raise ValueError(f"--codecs: unknown codec {c!r}; known: {', '.join(registry.names())}")
        object.__setattr__(self, "codecs", names)
        if self.reference is not None:
            from bench.compare.references import DATASETS

            if self.reference not in DATASETS:
                raise ValueError(f"--reference: unknown reference {self.reference!r}; known: {', '.join(DATASETS)}")
        if self.assert_kodak and self.reference != "kodak":
            raise ValueError("--assert-kodak needs --reference kodak")
        if self.inr_bytes not in INR_BYTES:
            raise ValueError(f"--inr-bytes must be one of {', '.join(INR_BYTES)}, got {self.inr_bytes!r}")
        if self.weight_images < 1:
            raise ValueError(f"--weight-images must be >= 1, got {self.weight_images}")
        if self.batch < 1:  # no CLI option: a library caller's value
            raise ValueError(f"batch (images per INR forward) must be >= 1, got {self.batch}")

    @property
    def match_keys(self) -> tuple[str, ...]:
        return MATCH_KEYS if self.match == "both" else (self.match,)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["qualities"] = list(self.qualities)
        d["codecs"] = list(self.codecs)
        return d
