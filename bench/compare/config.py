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
    """The options of ``inrbench compare`` (``bench.commands.compare`` documents each); ``batch``: images
    per INR forward (no CLI option); ``inr_bytes``: what an INR image costs, ``file`` (store file / N)
    or ``payload`` (its weight arrays / N, no header, as COIN counts it)."""

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
        for opt, value, choices in (("--match", self.match, MATCH_CHOICES), ("search", self.search, SEARCH_CHOICES),
                                    ("--subsampling", self.subsampling, SUBSAMPLINGS),
                                    ("--inr-bytes", self.inr_bytes, INR_BYTES)):
            if value not in choices:
                raise ValueError(f"{opt} must be one of {', '.join(choices)}, got {value!r}")
        for opt, value, least in (("--limit", self.limit, 1), ("--window", self.window, 0),
                                  ("--weight-images", self.weight_images, 1), ("batch (images per INR forward)", self.batch, 1)):
            if value is not None and value < least:
                raise ValueError(f"{opt} must be >= {least}, got {value}")
        from bench.compare import codecs as registry
        from bench.compare.references import DATASETS

        names = tuple(dict.fromkeys(str(c).strip().lower() for c in self.codecs if str(c).strip()))
        if not names:
            raise ValueError("--codecs needs at least one codec")
        for c in names:
            if c not in registry.names():
                raise ValueError(f"--codecs: unknown codec {c!r}; known: {', '.join(registry.names())}")
        object.__setattr__(self, "codecs", names)
        if self.reference is not None and self.reference not in DATASETS:
            raise ValueError(f"--reference: unknown reference {self.reference!r}; known: {', '.join(DATASETS)}")
        if self.assert_kodak and self.reference != "kodak":
            raise ValueError("--assert-kodak needs --reference kodak")

    @property
    def match_keys(self) -> tuple[str, ...]:
        return MATCH_KEYS if self.match == "both" else (self.match,)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["qualities"] = list(self.qualities)
        d["codecs"] = list(self.codecs)
        return d
