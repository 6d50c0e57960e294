"""Figures of ``inrbench compare``: ``rd_figure``, ``spread_figure``, ``weights_figure`` (paper Fig. 4).
Every series has a ``label`` and a stable ``gid`` (``jpeg-sweep:file``, ``inr:8bit``) that tests read."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pandas as pd

from bench import plotstyle
from bench.atomic import atomic_write_bytes
from bench.compare import references
from bench.compare.table import codec_label, codecs_in

plotstyle.use_agg()
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import FormatStrFormatter, LogLocator, NullFormatter  # noqa: E402


def _new(nrows=1, ncols=1, figsize=(7.0, 4.5)):
    with plt.rc_context(plotstyle.RC):
        fig, axes = plt.subplots(nrows, ncols, figsize=figsize, squeeze=False)
    return fig, axes.ravel()


def save(fig, path: str | Path) -> Path:
    """Write ``fig`` as PNG atomically and close it."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", bbox_inches="tight")
    plt.close(fig)
    atomic_write_bytes(path, buf.getvalue())
    return Path(path)


REFERENCE_STYLES = ("-", "--", "-.", ":")
REFERENCE_GREYS = ("#4d4d4d", "#7f7f7f", "#a6a6a6")


def rd_figure(summary: pd.DataFrame, image_size: tuple[int, int], title: str = "", reference: str | None = None,
              pixels: float | None = None):
    """PSNR (dB) vs bytes per image. ``reference``: that dataset's published curves in grey, converted from
    bpp at these images' size (their data, not these). ``pixels``: per image, where sizes differ (the mean)."""
    px = float(pixels) if pixels is not None else image_size[0] * image_size[1]
    fig, (ax,) = _new()
    if reference:
        for k, c in enumerate(references.curves(reference)):
            x = np.asarray(c.bpp) * px / 8.0
            col, ls = REFERENCE_GREYS[k % len(REFERENCE_GREYS)], REFERENCE_STYLES[k % len(REFERENCE_STYLES)]
            ax.plot(x, c.psnr, ls=ls, lw=1.0, marker=".", ms=3, color=col, alpha=0.9, zorder=1,
                    label=f"{c.method} ({reference}, published{', approx.' if c.approximate else ''})",
                    gid=f"reference:{c.method}")
            ax.annotate(c.method, (x[-1], c.psnr[-1]), textcoords="offset points", xytext=(2, 0), fontsize=6,
                        color=col)
    for codec in codecs_in(summary):
        sw = summary[(summary["method"] == f"{codec}-sweep") & summary["psnr"].notna()].sort_values("quality")
        if not len(sw):
            continue
        ax.plot(sw["file_bytes"], sw["psnr"], "-", marker=".", color=plotstyle.color(codec),
                label=f"{codec_label(codec)} quality sweep (file bytes)", gid=f"{codec}-sweep:file")
        if codec == "jpeg":
            ax.plot(sw["header_free_bytes"], sw["psnr"], "--", marker=".", color=plotstyle.color("jpeg-header-free"),
                    label="JPEG quality sweep (header-free bytes)", gid="jpeg-sweep:header-free")
            ax.axvline(float(sw["file_bytes"].min()), ls=":", lw=1, color=plotstyle.color("jpeg"), gid="jpeg-floor",
                       label=f"smallest JPEG file in sweep (q={int(sw['quality'].min())})")
    inr = summary[summary["method"] == "inr"]
    for _, r in inr.iterrows():
        m = plotstyle.inr_method(r["variant"])
        ax.plot([r["file_bytes"]], [r["psnr"]], ls="", marker=plotstyle.marker(m), ms=8,
                color=plotstyle.color(m), label=m, gid=f"inr:{r['variant']}")
        ax.annotate(r["variant"], (r["file_bytes"], r["psnr"]), textcoords="offset points", xytext=(5, -9),
                    fontsize=6.5, color=plotstyle.color(m))
    matched = summary["method"].str.endswith("-matched")
    mt = summary[matched & (summary["n_ok"] > 0)]
    labelled = set()
    for _, r in mt.iterrows():
        m = plotstyle.inr_method(r["variant"])
        codec = r["method"].removesuffix("-matched")
        key = codec if r["match"] == "file" else f"{codec}-header-free"
        x = r["file_bytes"] if r["match"] == "file" else r["header_free_bytes"]
        # one legend entry per codec and match kind; the marker says which INR variant it was matched to
        label = "_nolegend_" if key in labelled else (
            f"{codec_label(codec)} at each INR's bytes ({r['match']}; hollow, that INR's marker)")
        labelled.add(key)
        ax.plot([x], [r["psnr"]], ls="", marker=plotstyle.marker(m), ms=8, mfc="none", mew=1.5,
                color=plotstyle.color(key), label=label, gid=f"{codec}-matched:{r['match']}:{r['variant']}")
    unreach = summary[matched & (summary["status"] == "unreachable")]
    if len(unreach):
        codec_of = unreach["method"].str.replace("-matched", "", regex=False)
        notes = []
        for codec in dict.fromkeys(codec_of):
            u = unreach[codec_of == codec]
            names = ", ".join(f"{v} ({mm})" for v, mm in zip(u["variant"], u["match"], strict=True))
            notes.append(f"{codec_label(codec)} cannot reach the bytes of: {names}")
        ax.text(0.01, 0.01, "\n".join(notes), transform=ax.transAxes, fontsize=7, va="bottom", wrap=True)
    ax.set_xscale("log")
    ax.set_xlabel("bytes per image")
    ax.set_ylabel("PSNR (dB)")
    top = ax.secondary_xaxis("top", functions=(lambda b: b * 8.0 / px, lambda bpp: bpp * px / 8.0))
    top.set_xlabel("bits per pixel" if pixels is None else f"bits per pixel (at the mean image size, {px:,.0f} px)")
    top.xaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
    top.xaxis.set_major_formatter(FormatStrFormatter("%g"))
    top.xaxis.set_minor_formatter(NullFormatter())
    ax.set_title(title or f"PSNR vs bytes per image ({image_size[0]}x{image_size[1]})")
    ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0))
    return fig


def spread_groups(per_image: pd.DataFrame) -> list[tuple[str, str, np.ndarray]]:
    """``(label, palette key, per-image PSNR)`` for each box of ``spread_figure``, in order."""
    groups = []
    ok = per_image[per_image["status"] == "ok"]
    for v in per_image.loc[per_image["method"] == "inr", "variant"].unique():
        m = plotstyle.inr_method(v)
        groups.append((m, m, ok[(ok["method"] == "inr") & (ok["variant"] == v)]["psnr"].to_numpy(float)))
        matched = ok[ok["method"].str.endswith("-matched") & (ok["variant"] == v)]
        for method in dict.fromkeys(matched["method"]):  # jpeg first, then the other codecs in run order
            codec = method.removesuffix("-matched")
            for match in ("file", "header-free"):
                g = matched[(matched["method"] == method) & (matched["match"] == match)]
                if len(g):
                    key = codec if match == "file" else f"{codec}-header-free"
                    groups.append((f"{codec}@{m} ({match})", key, g["psnr"].to_numpy(float)))
    return groups


def spread_figure(per_image: pd.DataFrame, title: str = ""):
    """Per-image PSNR box plots (with the points) for every INR variant and matched JPEG."""
    groups = [g for g in spread_groups(per_image) if np.isfinite(g[2]).any()]
    fig, (ax,) = _new(figsize=(max(5.0, 0.55 * len(groups) + 1.5), 4.5))
    if not groups:
        ax.text(0.5, 0.5, "no per-image PSNR to show", ha="center", transform=ax.transAxes)
        return fig
    data = [g[2][np.isfinite(g[2])] for g in groups]
    bp = ax.boxplot(data, patch_artist=True, widths=0.6, showfliers=False)
    ax.set_xticks(range(1, len(groups) + 1), [g[0] for g in groups], fontsize=7, rotation=40, ha="right",
                  rotation_mode="anchor")
    for i, ((label, key, _), box, med) in enumerate(zip(groups, bp["boxes"], bp["medians"], strict=True)):
        box.set_facecolor(plotstyle.color(key))
        box.set_alpha(0.6)
        med.set_color("black")
        med.set_gid(f"median:{label}")
        jitter = np.random.default_rng(i).uniform(-0.15, 0.15, len(data[i]))
        ax.plot(i + 1 + jitter, data[i], ls="", marker=".", ms=3, color=plotstyle.color(key), gid=f"points:{label}")
    ax.set_ylabel("PSNR per image (dB)")
    ax.set_title(title or "per-image PSNR")
    return fig


def weight_histograms(weights: dict[str, np.ndarray], bins: int = 80) -> list[tuple[str, np.ndarray, np.ndarray, int]]:
    """``(group, counts [bins], edges [bins + 1], zeros left out)`` of the nonzero weights of the first,
    hidden (pooled) and last layers; ``weights``: layer name -> 1-D weights, in layer order."""
    names = list(weights)
    if not names:
        return []
    groups = {"first": [names[0]], "hidden": names[1:-1], "last": [names[-1]] if len(names) > 1 else []}
    out = []
    for g, layer_names in groups.items():
        if not layer_names:
            continue
        w = np.concatenate([np.asarray(weights[n], dtype=np.float64).ravel() for n in layer_names])
        nz = w[w != 0]
        counts, edges = np.histogram(nz, bins=bins) if len(nz) else (np.zeros(bins, int), np.linspace(-1, 1, bins + 1))
        out.append((g, counts, edges, int(len(w) - len(nz))))
    return out


def weights_figure(weights: dict[str, np.ndarray], variant: str, bins: int = 80):
    """Histograms of the first, hidden and last layers' weights (one panel each)."""
    hists = weight_histograms(weights, bins)
    fig, axes = _new(1, max(1, len(hists)), figsize=(4.0 * max(1, len(hists)), 3.4))
    col = plotstyle.color(plotstyle.inr_method(variant))
    for ax, (g, counts, edges, zeros) in zip(axes, hists, strict=False):
        ax.stairs(counts, edges, fill=True, color=col, alpha=0.8, gid=f"hist:{g}")
        nz = counts.sum()
        centres = (edges[:-1] + edges[1:]) / 2
        mean = float((counts * centres).sum() / nz) if nz else float("nan")
        std = float(np.sqrt((counts * (centres - mean) ** 2).sum() / nz)) if nz else float("nan")
        ax.set_title(f"{g} layer(s): {nz} weights\nmean {mean:+.3f}, std {std:.3f}"
                     + (f", {zeros} zeros (pruned) left out" if zeros else ""), fontsize=9)
        ax.set_xlabel("weight")
    axes[0].set_ylabel("count")
    fig.suptitle(f"weight distributions, {plotstyle.inr_method(variant)}", fontsize=10, y=1.06)
    return fig
