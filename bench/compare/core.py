"""Per-image rows of ``inrbench compare``: each INR variant, each codec at matched bytes and over its sweep.
Matched: the highest quality whose bytes fit the variant's; none fits -> an ``unreachable`` row, kept."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from bench.compare.codecs import Codec, Ladder
from bench.compare.codecs import create as create_codec
from bench.compare.config import CompareConfig
from bench.compare.jpeg import exhaustive_quality, search_quality
from bench.compare.quality import psnr, ssim

COLUMNS = [
    "method",  # inr | <codec>-matched | <codec>-sweep (jpeg-matched, webp-sweep, ...)
    "codec",  # jpeg | webp | avif | jxl | jp2 ("" for INR)
    "variant",  # INR variant name ("" for the sweep)
    "match",  # file | header-free ("" unless jpeg-matched)
    "image",  # index in the split
    "quality",  # codec quality 1..100 (NaN for INR and unreachable targets)
    "target_bytes",  # the INR bytes per image a matched JPEG had to fit
    "file_bytes",  # bytes on disk (INR: store file bytes / N, header amortized)
    "header_free_bytes",  # JPEG: entropy-coded bytes; INR: packed arrays / N (store header excluded); other codecs NaN
    "overhead_bytes",  # codecs: file bytes minus the coded payload (bench.compare.codecs); NaN where not measurable
    "status",  # ok | unreachable
    "min_bytes",  # unreachable only: smallest file the codec achieved (by the match key)
    "psnr",  # dB, bench.metrics convention
    "ssim",
]


@dataclass(frozen=True)
class InrDecoded:
    """One INR store decoded: ``decoded`` uint8 ``[N, H, W, 3]`` (native sizes: a list of ``[H_i, W_i, 3]``);
    ``bytes_per_image``: store file / N; ``header_free_bytes_per_image``: the weight arrays / N;
    ``weights``: layer name -> 1-D dequantized weights of sampled images, in layer order (first .. last)."""

    name: str
    bytes_per_image: float
    decoded: np.ndarray
    header_free_bytes_per_image: float | None = None
    path: str = ""
    arch: str = ""
    weights: dict[str, np.ndarray] = field(default_factory=dict)
    resident_bytes_per_image: float | None = None  # device bytes (codes, scales, masks) / N
    at_rest: str | None = None  # the at-rest codec when the file is packed (inr.atrest): bytes_per_image is disk bytes


def _row(**kw) -> dict:
    base = dict.fromkeys(COLUMNS, np.nan)
    base.update(method="", codec="", variant="", match="", status="ok")
    base.update(kw)
    return base


def _codec_rows(codec: Codec, image: np.ndarray, i: int, variants: Sequence[InrDecoded], cfg: CompareConfig,
                find) -> list[dict]:
    """The sweep and matched rows of one uint8 ``[H, W, 3]`` image under one codec."""
    rows: list[dict] = []
    ladder = Ladder(codec, image)
    keys = [k for k in cfg.match_keys if k == "file" or codec.header_free]
    base = dict(codec=codec.name, image=i)
    pending: list[tuple[int, dict]] = [(q, dict(base, method=f"{codec.name}-sweep", quality=q)) for q in cfg.qualities]
    for v in variants:
        for key in keys:
            size = ladder.size(key)
            q = find(size, v.bytes_per_image)
            common = dict(base, method=f"{codec.name}-matched", variant=v.name, match=key,
                          target_bytes=float(v.bytes_per_image))
            if q is None:
                # the qualities the search already tried: all 100, or 1..window
                top = 100 if cfg.search == "exhaustive" else max(cfg.window, 1)
                tried = [size(c) for c in range(1, top + 1)]
                rows.append(_row(**common, status="unreachable", min_bytes=float(min(tried))))
            else:
                pending.append((q, dict(common, quality=q)))
    # each distinct quality decoded once, one PSNR call for all of them
    qs = sorted({q for q, _ in pending})
    if not qs:
        return rows
    dec = np.stack([codec.decode(ladder(q).data) for q in qs])
    ref = np.broadcast_to(image, dec.shape)
    score = dict(zip(qs, zip(psnr(dec, ref), ssim(dec, np.ascontiguousarray(ref)), strict=True), strict=True))
    for q, r in pending:
        e = ladder(q)
        hf = e.payload_bytes if codec.header_free else np.nan
        ov = np.nan if e.overhead_bytes is None else float(e.overhead_bytes)
        rows.append(_row(**r, file_bytes=e.file_bytes, header_free_bytes=hf, overhead_bytes=ov,
                         psnr=float(score[q][0]), ssim=float(score[q][1])))
    return rows


def compare_images(
    images: np.ndarray | Sequence[np.ndarray],
    variants: Sequence[InrDecoded],
    cfg: CompareConfig,
    progress: Callable[[int], None] | None = None,
    codecs: Sequence[Codec] | None = None,
) -> pd.DataFrame:
    """All per-image rows (``COLUMNS`` plus ``bpp``, ``bpp_header_free``, ``pct_raw``).
    images: uint8 ``[N, H, W, 3]`` or a list of ``[H_i, W_i, 3]``; variants' ``decoded`` match that shape."""
    ragged = isinstance(images, (list, tuple))
    if not ragged:
        images = np.asarray(images)
    n = len(images)
    want = [im.shape for im in images] if ragged else [images.shape]
    rows: list[dict] = []
    for v in variants:
        have = [d.shape for d in v.decoded] if ragged else [v.decoded.shape]
        if have != want:
            raise ValueError(f"variant {v.name}: decoded {have[:3]} vs images {want[:3]}")
        pairs = ([(np.ascontiguousarray(d)[None], np.ascontiguousarray(im)[None])
                  for d, im in zip(v.decoded, images, strict=True)] if ragged else [(v.decoded, images)])
        p = np.concatenate([psnr(d, im) for d, im in pairs])
        s = np.concatenate([ssim(d, im) for d, im in pairs])
        hf = np.nan if v.header_free_bytes_per_image is None else float(v.header_free_bytes_per_image)
        rows += [_row(method="inr", variant=v.name, image=i, file_bytes=float(v.bytes_per_image),
                      header_free_bytes=hf, psnr=p[i], ssim=s[i]) for i in range(n)]

    def find(size, target):
        if cfg.search == "exhaustive":
            return exhaustive_quality(size, target)
        return search_quality(size, target, window=cfg.window)

    if codecs is None:
        codecs = [create_codec(c, cfg.subsampling) for c in cfg.codecs]
    for i in range(n):
        for codec in codecs:
            rows += _codec_rows(codec, images[i], i, variants, cfg, find)
        if progress is not None:
            progress(1)
    df = pd.DataFrame(rows, columns=COLUMNS)
    pixels = np.array([im.shape[0] * im.shape[1] for im in images], dtype=np.float64)
    px = pixels[df["image"].to_numpy(int)] if n else np.zeros(0)
    df["bpp"] = df["file_bytes"] * 8.0 / px
    df["bpp_header_free"] = df["header_free_bytes"] * 8.0 / px
    df["pct_raw"] = df["file_bytes"] * 100.0 / (px * 3)
    return df
