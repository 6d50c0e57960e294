"""One ``inrbench compare`` run: read a prepared split and INR stores, compute, write.

Output folder (written as a whole: a temp folder renamed into place)::

    per_image.csv      every number: one row per (method, variant, match, quality, image)
    summary.csv        one row per (method, variant, match, sweep quality); see bench.compare.table
    summary.md         the README-style table and where INR stands against JPEG
    weights_hist.csv   the histograms behind weights_<variant>.png
    psnr_vs_bytes.png  psnr_spread.png  weights_<variant>.png
    config.json        the CompareConfig, inputs (paths, bytes, arch), image size, each codec's
                       library/version/settings (or why it was skipped), reference sources, env record
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from bench.atomic import atomic_dir, atomic_write_json, atomic_write_text
from bench.compare import figures, references
from bench.compare.codecs import create as create_codec
from bench.compare.config import CompareConfig
from bench.compare.core import InrDecoded, compare_images
from bench.compare.table import markdown, summarize
from bench.datasets.prepared import PreparedDataset, open_prepared
from bench.errors import InputError


@dataclass(frozen=True)
class CompareResult:
    out: Path
    per_image: pd.DataFrame
    summary: pd.DataFrame


def load_variants(paths: Sequence[str | Path], n: int, image_size, labels, cfg: CompareConfig,
                  ds: PreparedDataset | None = None, allow_unverified_store: bool = False,
                  sizes=None) -> list[InrDecoded]:
    """Load and decode the stores. With ``ds``, each store must have been encoded from the
    split's images (``bench.datasets.identity.check_store_source``), checked before decoding."""
    from bench.compare.inr_side import load_variant
    from bench.datasets.identity import check_store_source

    def check(store) -> None:
        if ds is not None:
            check_store_source(store, ds, cfg.split, allow_unverified=allow_unverified_store)

    variants = [
        load_variant(p, n, image_size, labels, batch=cfg.batch, weight_images=cfg.weight_images, check=check, sizes=sizes)
        for p in paths
    ]
    names = [v.name for v in variants]
    if len(set(names)) != len(names):
        # Two stores with one variant name (e.g. both "demo"): tell them apart by file name.
        variants = [
            InrDecoded(**{**v.__dict__, "name": Path(v.path).name.split(".")[0]}) if names.count(v.name) > 1 else v
            for v in variants
        ]
        names = [v.name for v in variants]
        if len(set(names)) != len(names):
            raise InputError(f"two stores share the variant name and file name: {names}")
    return variants


def image_geometry(meta: dict) -> tuple[tuple[int, int], float]:
    """``(image size, pixels per image)`` of a compare run: native sizes use the mean pixel count
    (for the figure's bpp axis and curve positions; table bpp stay per image)."""
    if meta.get("native"):
        px = float(meta["image_sizes"]["mean_pixels"])
        side = round(px ** 0.5)
        return (side, side), px
    h, w = meta["image_size"]
    return (int(h), int(w)), float(h * w)


def write_outputs(out: Path, per_image: pd.DataFrame, summary: pd.DataFrame, variants: Sequence[InrDecoded],
                  meta: dict) -> None:
    """Write every output file into ``out`` (an existing folder)."""
    atomic_write_text(out / "per_image.csv", per_image.to_csv(index=False))
    atomic_write_text(out / "summary.csv", summary.to_csv(index=False))
    atomic_write_text(out / "summary.md", markdown(summary, meta, per_image))
    size, px = image_geometry(meta)
    shape = "native sizes" if meta.get("native") else f"{size[0]}x{size[1]}"
    title = f"{meta['dataset']} {shape} ({meta['split']}, {meta['n_images']} images)"
    figures.save(figures.rd_figure(summary, size, f"PSNR vs bytes per image — {title}", reference=meta.get("reference"),
                                   pixels=px if meta.get("native") else None), out / "psnr_vs_bytes.png")
    figures.save(figures.spread_figure(per_image, f"per-image PSNR — {title}"), out / "psnr_spread.png")
    hist_rows = []
    for v in variants:
        if not v.weights:
            continue
        for g, counts, edges, zeros in figures.weight_histograms(v.weights):
            hist_rows += [dict(variant=v.name, group=g, bin_left=edges[k], bin_right=edges[k + 1],
                               count=int(counts[k]), zeros_left_out=zeros) for k in range(len(counts))]
        figures.save(figures.weights_figure(v.weights, v.name), out / f"weights_{v.name}.png")
    if hist_rows:
        atomic_write_text(out / "weights_hist.csv", pd.DataFrame(hist_rows).to_csv(index=False))
    atomic_write_json(out / "config.json", meta)


def run_compare(prepared: str | Path, stores: Sequence[str | Path], cfg: CompareConfig, out: str | Path,
                variants: Sequence[InrDecoded] | None = None, progress=None, env: bool = True,
                allow_unverified_store: bool = False) -> CompareResult:
    """Compare the INR stores (or already decoded ``variants``) with JPEG on one split.

    ``variants`` bypasses store loading (tests, or callers that hold decoded images);
    ``progress(total)`` (optional) returns the callable advanced by one per image done.
    Each store must be encoded from the split's images (``bench.datasets.identity``); one that
    records no source is refused unless ``allow_unverified_store``.
    ``out`` is claimed first (``bench.outputs.claim``): a previous compare output there is
    replaced; anything else, or an ``out`` overlapping the dataset or a store, is refused.
    """
    from bench.outputs import claim

    with claim(out, "compare", inputs={"prepared dataset": prepared, "store": list(stores)}, mode="replace") as out:
        return _run(prepared, stores, cfg, out, variants, progress, env, allow_unverified_store)


def _run(prepared, stores, cfg: CompareConfig, out: Path, variants, progress, env: bool,
         allow_unverified_store: bool = False) -> CompareResult:
    ds = open_prepared(prepared)
    if ds.native:
        split = ds.native_split(cfg.split)
        n = len(split) if cfg.limit is None else min(cfg.limit, len(split))
        images = [np.array(im) for im in split.images[:n]]  # writable copies, one per image
        sizes = split.sizes[:n]
    else:
        split = ds.split(cfg.split)
        n = len(split) if cfg.limit is None else min(cfg.limit, len(split))
        images = np.array(split.images[:n])  # a writable copy, not the read-only memmap
        sizes = np.tile(np.array(split.image_size, np.int64), (n, 1))
    if variants is None:
        variants = load_variants(stores, n, None if ds.native else split.image_size, split.labels, cfg, ds=ds,
                                 allow_unverified_store=allow_unverified_store, sizes=sizes if ds.native else None)
    else:
        variants = [InrDecoded(**{**v.__dict__, "decoded": v.decoded[:n]}) for v in variants]
    pixels = sizes[:, 0] * sizes[:, 1]
    codecs = [create_codec(c, cfg.subsampling) for c in cfg.codecs]
    usable = [c for c in codecs if c.unavailable() is None]
    if cfg.inr_bytes == "payload":
        from bench.compare.inr_side import payload_variant

        counted = [payload_variant(v) for v in variants]
    else:
        counted = list(variants)
    per_image = compare_images(images, counted, cfg, progress=None if progress is None else progress(n), codecs=usable)
    summary = summarize(per_image)
    skipped = [dict(method=f"{c.name}-matched", codec=c.name, variant="", match="", n_images=n, n_ok=0,
                    status="skipped", note=c.unavailable()) for c in codecs if c not in usable]
    if skipped:
        summary = pd.concat([summary, pd.DataFrame(skipped, columns=summary.columns)], ignore_index=True)
    meta = dict(
        schema_version=1,
        dataset=str(ds.manifest.get("source", Path(prepared).name)),
        prepared=str(Path(prepared).resolve()),
        split=cfg.split,
        n_images=n,
        image_size=None if ds.native else list(split.image_size),
        native=ds.native,
        image_sizes=dict(distinct=len({tuple(x) for x in sizes.tolist()}), mean_pixels=float(pixels.mean()),
                         smallest=[int(x) for x in sizes[int(pixels.argmin())]],
                         largest=[int(x) for x in sizes[int(pixels.argmax())]]) if ds.native else None,
        raw_bytes_per_image=float(pixels.mean() * 3) if ds.native else int(pixels[0] * 3),
        config=cfg.to_dict(),
        jpeg_encoder="PIL baseline (bench.datasets.prepared.encode_jpeg), no optimize",
        codecs={c.name: c.describe() for c in codecs},
        reference=cfg.reference,
        reference_sources=None if cfg.reference is None else [
            dict(method=c.method, paper=c.paper, sources=list(c.sources), approximate=c.approximate,
                 points=len(c.bpp)) for c in references.curves(cfg.reference)],
        stores=[dict(name=v.name, path=v.path, arch=v.arch, bytes_per_image=v.bytes_per_image,
                     counted_bytes_per_image=c.bytes_per_image,
                     header_free_bytes_per_image=v.header_free_bytes_per_image,
                     resident_bytes_per_image=v.resident_bytes_per_image, at_rest=v.at_rest)
                for v, c in zip(variants, counted, strict=True)],
    )
    if cfg.reference == "kodak":
        from bench.compare import kodak

        meta["kodak_check"] = kodak.check(images, summary, [c.name for c in usable], asserted=cfg.assert_kodak)
    if env:
        from bench import envinfo

        meta["env"] = envinfo.collect()
    with atomic_dir(out, kind="compare", overwrite=True) as tmp:
        write_outputs(tmp, per_image, summary, variants, meta)
    return CompareResult(out=out, per_image=per_image, summary=summary)
