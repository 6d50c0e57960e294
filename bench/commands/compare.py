"""`inrbench compare PREPARED_DIR --store FILE...`: INR stores against JPEG (and WebP, AVIF, JPEG XL,
JPEG 2000 with ``--codecs``) at matched bytes; ``--reference``: published curves."""

from __future__ import annotations

import argparse
import importlib

from bench.argtypes import nonnegative_int, positive_int
from bench.cli import list_names, progress_bar
from bench.compare.config import (
    DEFAULT_QUALITIES,
    INR_BYTES,
    MATCH_CHOICES,
    SUBSAMPLINGS,
    CompareConfig,
)
from bench.errors import InputError

HELP = "compare INR stores with JPEG/WebP/AVIF/JPEG XL/JPEG 2000 at matched bytes: PSNR/SSIM/bytes table, CSV, figures"


def quality(text: str) -> int:
    """``--jpeg-qualities``: an integer in 1..100."""
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer quality in 1..100, got {text!r}") from None
    if not 1 <= v <= 100:
        raise argparse.ArgumentTypeError(f"a quality must be in 1..100, got {v}")
    return v


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("prepared", metavar="PREPARED_DIR", help="prepared dataset folder (`inrbench prepare`)")
    p.add_argument("--store", nargs="*", default=[], metavar="FILE",
                   help="INR store file(s) of that split (`inrbench encode`); none = JPEG sweep only")
    p.add_argument("--allow-unverified-store", action="store_true",
                   help="use stores that record no source pixels hash (not from `inrbench encode`); "
                        "default: refuse them, since they cannot be tied to PREPARED_DIR")
    p.add_argument("--split", default="train", help="split to compare (default train)")
    p.add_argument("--jpeg-qualities", type=quality, nargs="+", default=list(DEFAULT_QUALITIES), metavar="Q",
                   help=f"JPEG quality sweep (default {' '.join(map(str, DEFAULT_QUALITIES))})")
    p.add_argument("--limit", type=positive_int, help="only the first N images of the split")
    p.add_argument("--match", choices=MATCH_CHOICES, default="both",
                   help="JPEG bytes that must fit the INR's bytes per image: whole file, "
                        "header-free (entropy-coded data only) or both (default)")
    p.add_argument("--exhaustive-jpeg", action="store_true",
                   help="try all 100 qualities per image instead of binary search + repair window")
    p.add_argument("--window", type=nonnegative_int, default=5,
                   help="repair window of the binary search (qualities tried above its answer; default 5)")
    p.add_argument("--subsampling", choices=SUBSAMPLINGS, default="4:2:0", help="JPEG chroma subsampling")
    list_names(p.add_argument("--codecs", default="jpeg", metavar="LIST",
                              help="comma-separated codecs at matched bytes, each with the same quality search and "
                                   "sweep: {names}; a codec this machine lacks (jxl needs the optional extra "
                                   "inr-bench[jxl]) is a skip row with the reason"),
               lambda: importlib.import_module("bench.compare.codecs").names())
    list_names(p.add_argument("--reference", metavar="DATASET",
                              help="draw published rate-distortion curves of that dataset ({names}; their numbers "
                                   "on their data) and list them at each INR's bpp"),
               lambda: importlib.import_module("bench.compare.references").DATASETS)
    p.add_argument("--assert-kodak", action="store_true",
                   help="with --reference kodak: treat the images as the Kodak images for the self-check of each "
                        "codec against its library's published curve, even where their pixels are not recognised")
    p.add_argument("--inr-bytes", choices=INR_BYTES, default="file",
                   help="what an INR image costs: file (its share of the whole store file, default) or payload "
                        "(its weight arrays only: codes, scales, masks; no store header, as COIN counts it)")
    p.add_argument("--weight-images", type=positive_int, default=256, help="images sampled for the weight histograms")
    p.add_argument("--out", required=True, help="output folder (written atomically, replaced if present)")
    p.add_argument("--no-progress", action="store_true",
                   help="no progress bar (there is none anyway where stderr is not a terminal)")


def build_config(args: argparse.Namespace):
    """The validated ``CompareConfig`` (``InputError`` on a bad option); reads no file (the sweep checks cells with it)."""
    try:
        return CompareConfig(
            split=args.split, qualities=tuple(args.jpeg_qualities), limit=args.limit, match=args.match,
            search="exhaustive" if args.exhaustive_jpeg else "binary", window=args.window,
            subsampling=args.subsampling, weight_images=args.weight_images,
            codecs=tuple(args.codecs.split(",")), reference=args.reference, inr_bytes=args.inr_bytes,
            assert_kodak=args.assert_kodak,
        )
    except ValueError as e:
        raise InputError(str(e)) from None


def run(args: argparse.Namespace) -> int:
    from bench.compare.run import run_compare

    cfg = build_config(args)
    bars = []

    def progress(total: int):
        bars.append(progress_bar(total, "codec search + metrics", "img", enabled=not args.no_progress, leave=False))
        return bars[-1].update

    try:
        res = run_compare(args.prepared, args.store, cfg, args.out, progress=progress,
                          allow_unverified_store=args.allow_unverified_store)
    finally:
        for b in bars:
            b.close()
    print((res.out / "summary.md").read_text(), end="")
    print(f"wrote {res.out}/ (summary.csv, per_image.csv, summary.md, *.png, config.json)")
    return 0
