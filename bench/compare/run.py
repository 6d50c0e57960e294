"""One ``inrbench compare`` run: read a prepared split and INR stores, compute, write the output folder
atomically (its files: docs/compare.md, "Output folder")."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd

from bench import envinfo
from bench.atomic import atomic_dir, atomic_write_json, atomic_write_text
from bench.compare import figures, kodak, references
from bench.compare.codecs import create as create_codec
from bench.compare.config import CompareConfig
from bench.compare.core import InrDecoded, compare_images
from bench.compare.inr_side import load_variants, payload_variant
from bench.compare.table import markdown, summarize
from bench.datasets.prepared import open_prepared
from bench.outputs import claim


@dataclass(frozen=True)
class CompareResult:
    out: Path
    per_image: pd.DataFrame
    summary: pd.DataFrame


def write_outputs(out: Path, per_image: pd.DataFrame, summary: pd.DataFrame, variants: Sequence[InrDecoded],
                  meta: dict) -> None:
    """Write every output file into the existing folder ``out``."""
    atomic_write_text(out / "per_image.csv", per_image.to_csv(index=False))
    atomic_write_text(out / "summary.csv", summary.to_csv(index=False))
    atomic_write_text(out / "summary.md", markdown(summary, meta, per_image))
    native = meta.get("native")
    if native:  # the figure's bpp axis at the mean pixel count
        px = float(meta["image_sizes"]["mean_pixels"])
        size = (round(px ** 0.5),) * 2
    else:
        size = tuple(meta["image_size"])
        px = float(size[0] * size[1])
    title = (f"{meta['dataset']} {'native sizes' if native else f'{size[0]}x{size[1]}'} "
             f"({meta['split']}, {meta['n_images']} images)")
    figures.save(figures.rd_figure(summary, size, f"PSNR vs bytes per image — {title}", reference=meta.get("reference"),
                                   pixels=px if native else None), out / "psnr_vs_bytes.png")
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
    """Compare the INR stores (or decoded ``variants``) with the codecs on one split encoded from its images.
    ``progress(total)`` returns a per-image callable; ``out`` is claimed first (only a compare output replaced)."""
    with claim(out, "compare", inputs={"prepared dataset": prepared, "store": list(stores)}, mode="replace") as out:
        ds = open_prepared(prepared)
        split = ds.native_split(cfg.split) if ds.native else ds.split(cfg.split)
        n = len(split) if cfg.limit is None else min(cfg.limit, len(split))
        if ds.native:
            images = [np.array(im) for im in split.images[:n]]  # writable copies, one per image
            sizes = np.asarray(split.sizes[:n])
        else:
            images = np.array(split.images[:n])  # a writable copy, not the read-only memmap
            sizes = np.tile(np.array(split.image_size, np.int64), (n, 1))
        if variants is None:
            variants = load_variants(stores, ds, cfg.split, sizes, split.labels,
                                     image_size=None if ds.native else split.image_size, batch=cfg.batch,
                                     weight_images=cfg.weight_images, allow_unverified=allow_unverified_store)
        else:
            variants = [replace(v, decoded=v.decoded[:n]) for v in variants]
        if cfg.inr_bytes == "payload":
            counted = [payload_variant(v) for v in variants]
        else:
            counted = list(variants)
        codecs = [create_codec(c, cfg.subsampling) for c in cfg.codecs]
        usable = [c for c in codecs if c.unavailable() is None]
        per_image = compare_images(images, counted, cfg, progress=None if progress is None else progress(n),
                                   codecs=usable)
        summary = summarize(per_image)
        skipped = [dict(method=f"{c.name}-matched", codec=c.name, variant="", match="", n_images=n, n_ok=0,
                        status="skipped", note=c.unavailable()) for c in codecs if c not in usable]
        if skipped:
            summary = pd.concat([summary, pd.DataFrame(skipped, columns=summary.columns)], ignore_index=True)
        pixels = sizes[:, 0] * sizes[:, 1]
        meta = dict(
            schema_version=1, dataset=str(ds.manifest.get("source", Path(prepared).name)),
            prepared=str(Path(prepared).resolve()), split=cfg.split, n_images=n,
            image_size=None if ds.native else list(split.image_size), native=ds.native,
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
            meta["kodak_check"] = kodak.check(images, summary, [c.name for c in usable], asserted=cfg.assert_kodak)
        if env:
            meta["env"] = envinfo.collect()
        with atomic_dir(out, kind="compare", overwrite=True) as tmp:
            write_outputs(tmp, per_image, summary, variants, meta)
        return CompareResult(out=out, per_image=per_image, summary=summary)
