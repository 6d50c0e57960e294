"""``PrepareConfig``: every knob of ``inrbench prepare``, validated once and saved in the manifest."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from bench.errors import InputError

RESIZE_POLICIES = ("shorter-side-center-crop", "resize")
ON_ERROR = ("fail", "skip")

# Largest image ``prepare`` decodes (width x height, from the header): every common camera sensor
# passes, a giant (a 200 KB PNG may claim 10000 x 10000) is refused. ``--max-pixels`` raises it.
DEFAULT_MAX_PIXELS = 50_000_000
NATIVE = "native"  # --size native: every image keeps its own size (compression studies)


@dataclass(frozen=True)
class PrepareConfig:
    """The options of ``inrbench prepare`` (its ``--help`` documents each); ``None``: the source's default.
    ``size`` is the side S of S x S images, or ``"native"``: each image's own size, capped by ``max_side``."""

    source: str
    root: str | None = None
    size: int | str | None = None
    limit: int | None = None
    jpeg_quality: int = 90
    on_error: str = "fail"
    seed: int = 0
    resize_policy: str | None = None
    per_class: int | None = None
    num_classes: int | None = None
    val_fraction: float | None = None
    workers: int | None = None
    max_pixels: int = DEFAULT_MAX_PIXELS
    max_side: int | None = None

    @property
    def native(self) -> bool:
        return self.size == NATIVE

    def __post_init__(self) -> None:
        if isinstance(self.size, str) and self.size != NATIVE:
            try:
                object.__setattr__(self, "size", int(self.size))
            except ValueError:
                raise InputError(f"--size must be an integer side or 'native', got {self.size!r}") from None
        if self.size is not None and not self.native and not 8 <= self.size <= 4096:
            raise InputError(f"--size must be between 8 and 4096, got {self.size}")
        if self.max_side is not None and (not self.native or not 8 <= self.max_side <= 16384):
            raise InputError(f"--max-side needs --size native and a value in 8..16384, got {self.max_side}")
        if not 1 <= self.jpeg_quality <= 100:
            raise InputError(f"--jpeg-quality must be between 1 and 100, got {self.jpeg_quality}")
        if self.on_error not in ON_ERROR:
            raise InputError(f"--on-error must be one of {ON_ERROR}, got {self.on_error!r}")
        if self.resize_policy is not None and self.resize_policy not in RESIZE_POLICIES:
            raise InputError(f"--resize-policy must be one of {RESIZE_POLICIES}, got {self.resize_policy!r}")
        if self.per_class is not None and self.per_class < 2:
            raise InputError(f"--per-class must be >= 2 (one train and one test image), got {self.per_class}")
        if self.val_fraction is not None and not 0.0 < self.val_fraction < 1.0:
            raise InputError(f"--val-fraction must be in (0, 1), got {self.val_fraction}")
        for opt, value, least in (("--limit", self.limit, 1), ("--num-classes", self.num_classes, 2),
                                  ("--workers", self.workers, 1), ("--max-pixels", self.max_pixels, 1)):
            if value is not None and value < least:
                raise InputError(f"{opt} must be >= {least}, got {value}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
