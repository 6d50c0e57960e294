"""`inrbench prepare SOURCE`: read a dataset once and write the canonical prepared folder."""

from __future__ import annotations

import argparse

from bench.argtypes import seed
from bench.datasets.config import DEFAULT_MAX_PIXELS, RESIZE_POLICIES, PrepareConfig

HELP = "read a dataset source once and write pixels + labels, a JPEG tree and manifest.json"


def _size(text: str) -> int | str:
    """``--size``: an integer side, or ``native``."""
    if text == "native":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid int value: {text!r} (an integer side, or 'native')") from None


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("source", metavar="SOURCE", help="dataset source (see `inrbench datasets`)")
    p.add_argument("--root", help="folder holding the dataset (not for built-in photos/synthetic)")
    p.add_argument("--out", required=True, help="output folder (written atomically; an interrupted read of image "
                                                "files resumes from .OUT.inrbench-prepare.work beside it)")
    p.add_argument("--size", type=_size, help="output side S, images are S x S (default: the source's); `native`: every "
                                  "image keeps its own size (photos; for `inrbench compare`)")
    p.add_argument("--max-side", type=int, help="with --size native: downscale (aspect kept) an image whose long "
                                                "side exceeds this (recorded in the manifest)")
    p.add_argument("--limit", type=int, help="at most N images per split (a seeded subset)")
    p.add_argument("--jpeg-quality", type=int, default=90, help="JPEG quality of the JPEG tree (default 90)")
    p.add_argument("--on-error", choices=("fail", "skip"), default="fail",
                   help="an unreadable image: stop (default) or skip it and list it in the manifest "
                        "(a class whose every image is skipped is refused)")
    p.add_argument("--seed", type=seed, default=0, help="seed of every random choice (default 0)")
    p.add_argument("--resize-policy", choices=RESIZE_POLICIES,
                   help="how file images become S x S (default shorter-side-center-crop)")
    p.add_argument("--per-class", type=int, help="photos/synthetic: images per class (default 50)")
    p.add_argument("--num-classes", type=int, help="synthetic: number of classes (default 10)")
    p.add_argument("--val-fraction", type=float,
                   help="held-out fraction per class where a source splits by ratio (imagefolder one tree or "
                        "flat folder, mini-imagenet, photos, synthetic); refused for an imagefolder tree with its "
                        "own val/ or test/")
    p.add_argument("--workers", type=int, help="decode threads (default min(8, CPUs))")
    p.add_argument("--max-pixels", type=int, default=DEFAULT_MAX_PIXELS,
                   help="refuse (or with --on-error skip, skip) an image file with more pixels than this, "
                        f"read from its header before decoding (default {DEFAULT_MAX_PIXELS:,})")
    p.add_argument("--overwrite", action="store_true", help="replace an existing output folder")


def build_config(args: argparse.Namespace):
    """The ``PrepareConfig`` of the options, validated (``InputError``); reads no file. ``resolve`` then
    checks it against its source (``inrbench sweep`` does both when a sweep file is loaded)."""
    return PrepareConfig(
        source=args.source, root=args.root, size=args.size, limit=args.limit,
        jpeg_quality=args.jpeg_quality, on_error=args.on_error, seed=args.seed,
        resize_policy=args.resize_policy, per_class=args.per_class, num_classes=args.num_classes,
        val_fraction=args.val_fraction, workers=args.workers, max_pixels=args.max_pixels, max_side=args.max_side,
    )


def run(args: argparse.Namespace) -> int:
    import time

    from bench.datasets.prepare import prepare_config
    from bench.datasets.prepared import open_prepared

    t0 = time.perf_counter()
    cfg = build_config(args)
    from tqdm import tqdm

    # tqdm.write: a line printed while a progress bar is drawn (stdout) does not break the bar
    out = prepare_config(cfg, args.out, overwrite=args.overwrite, progress=True, log=tqdm.write)
    wall = time.perf_counter() - t0
    ds = open_prepared(out)
    if ds.native:
        sizes = sorted({tuple(ds.native_split(n, verify=False).sizes[i]) for n in ds.splits
                        for i in range(ds.manifest["splits"][n]["count"])})
        size_text = f"native sizes ({len(sizes)} distinct, {sizes[0][0]}x{sizes[0][1]} .. {sizes[-1][0]}x{sizes[-1][1]})"
    else:
        h, w = ds.image_size
        size_text = f"{h}x{w}"
    nbytes = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    counts = ", ".join(f"{n} {ds.manifest['splits'][n]['count']}" for n in ds.splits)
    skipped = len(ds.manifest.get("skipped", []))
    print(f"prepared {ds.manifest['source']} -> {out}")
    print(f"  splits: {counts}; {ds.num_classes} classes; {size_text}; resize {ds.manifest['resize_policy']}")
    print(f"  size on disk: {nbytes / 1e6:.1f} MB; skipped: {skipped}; wall time: {wall:.1f} s")
    oriented = ds.manifest.get("source_meta", {}).get("exif_orientation", {}).get("files", 0)
    if oriented:
        print(f"  note: {oriented:,} images carry an EXIF orientation (to be shown rotated or mirrored); their "
              "pixels are stored as they lie in the file, not rotated, as torchvision's ImageFolder reads them "
              "(listed in manifest.json, source_meta.exif_orientation)")
    return 0
