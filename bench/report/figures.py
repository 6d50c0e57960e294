"""Report figures (PNG, matplotlib Agg), one colour per method (``bench.plotstyle``): each takes tidy frames
from ``bench.report.tables`` and returns a figure, or None with nothing to draw."""

from __future__ import annotations

import numpy as np
import pandas as pd

from bench import plotstyle
from bench.report import names as N
from bench.report.tables import order_key, order_rank

plotstyle.use_agg()
import matplotlib.pyplot as plt  # noqa: E402

plt.rcParams.update(plotstyle.RC)


def _grouped_bars(ax, table: pd.DataFrame, value: str, lo: str | None = None, hi: str | None = None,
                  group: str = "mode", series: str = "pipeline", solid: str | None = None) -> None:
    """Bars of ``value`` grouped by ``group``, one colour per ``series``; rows whose ``solid`` is False faded."""
    groups = order_key(table[group].unique(), N.MODE_ORDER)
    series_vals = order_key(table[series].unique(), N.PIPELINE_ORDER)
    width = 0.8 / max(1, len(series_vals))
    for j, s in enumerate(series_vals):
        xs, ys, err, faded = [], [], [], []
        for i, g in enumerate(groups):
            hit = table[(table[group] == g) & (table[series] == s)]
            if hit.empty:
                continue
            h = hit.iloc[0]
            xs.append(i + (j - (len(series_vals) - 1) / 2) * width)
            ys.append(h[value])
            faded.append(bool(solid) and not bool(h[solid]))
            if lo and hi:
                err.append((h[value] - h[lo], h[hi] - h[value]))
        if not xs:
            continue
        yerr = np.array(err).T if err else None
        bars = ax.bar(xs, ys, width, color=plotstyle.color(s), label=s, yerr=yerr, capsize=3 if err else 0)
        for b, f in zip(bars, faded, strict=True):
            if f:
                b.set_alpha(0.35)
                b.set_hatch("//")
    ax.set_xticks(range(len(groups)), groups)
    ax.legend()


def speedup_figure(sp: pd.DataFrame, dataset: str):
    """Speedup bars per mode, a panel per baseline, 95% interval error bars; faded: no difference detected;
    flagged train speedups are not drawn."""
    d = sp[(sp["dataset"] == dataset) & ~sp["flagged"].astype(bool)].dropna(subset=["ratio", "lo", "hi"])
    if d.empty:
        return None
    bases = [b for b in N.BASELINES if b in set(d["baseline"])]
    fig, axes = plt.subplots(1, len(bases), figsize=(5.5 * len(bases), 4), squeeze=False)
    for ax, b in zip(axes[0], bases, strict=True):
        _grouped_bars(ax, d[d["baseline"] == b], "ratio", "lo", "hi", solid="detected")
        ax.axhline(1.0, color="black", lw=0.8)
        ax.set_ylabel(f"speedup vs {b} (epoch time ratio, 95% CI)")
        ax.set_title(f"{dataset}: speedup vs {b}")
    return fig


def epoch_split_figure(split: pd.DataFrame, dataset: str):
    """Stacked bars per pipeline and mode: data wait (hatched) + compute = epoch time (s)."""
    d = split[(split["dataset"] == dataset)].dropna(subset=["data_wait_s", "compute_s"])
    if d.empty:
        return None
    modes = order_key(d["mode"].unique(), N.MODE_ORDER)
    fig, axes = plt.subplots(1, len(modes), figsize=(4.2 * len(modes), 4), squeeze=False)
    for ax, m in zip(axes[0], modes, strict=True):
        dm = d[d["mode"] == m]
        pipes = order_key(dm["pipeline"].unique(), N.PIPELINE_ORDER)
        for i, p in enumerate(pipes):
            r = dm[dm["pipeline"] == p].iloc[0]
            c = plotstyle.color(p)
            ax.bar(i, r["compute_s"], color=c, label="compute" if i == 0 else None)
            ax.bar(i, r["data_wait_s"], bottom=r["compute_s"], color=c, alpha=0.45, hatch="//",
                   label="data wait" if i == 0 else None)
        ax.set_xticks(range(len(pipes)), pipes)
        ax.set_title(f"{dataset} — {m}")
        ax.set_ylabel("seconds per epoch (median)")
        ax.legend()
    return fig


def bars_figure(st: pd.DataFrame, dataset: str, ylabel: str, scale: float = 1.0, title: str = ""):
    """Median (IQR error bars) per pipeline, grouped by mode."""
    d = st[st["dataset"] == dataset].copy()
    if d.empty:
        return None
    for c in ("median", "q25", "q75"):
        d[c] = d[c] / scale
    fig, ax = plt.subplots(figsize=(7, 4))
    _grouped_bars(ax, d, "median", "q25", "q75")
    ax.set_ylabel(ylabel)
    ax.set_title(title or dataset)
    return fig


def accuracy_figure(acc: pd.DataFrame):
    """Test accuracy (%) against dataset bytes per image, one marker per pipeline."""
    d = acc.dropna(subset=["bytes_per_image", "median"])
    if d.empty:
        return None
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    d = d.assign(_k=[order_rank(p, N.PIPELINE_ORDER)[0] for p in d["pipeline"]]).sort_values(["dataset", "_k", "pipeline"])
    for _, r in d.iterrows():
        p = r["pipeline"]
        ax.errorbar(r["bytes_per_image"], 100 * r["median"],
                    yerr=[[100 * (r["median"] - r["q25"])], [100 * (r["q75"] - r["median"])]],
                    fmt=plotstyle.marker(p), color=plotstyle.color(p), label=f"{p} ({r['dataset']})", capsize=3)
    ax.set_xscale("log")
    ax.set_xlabel("dataset bytes per image (log)")
    ax.set_ylabel("test accuracy (%)")
    ax.legend()
    return fig


def design_space_figure(ds: pd.DataFrame):
    """PSNR against each swept encoder parameter (others at their most common value)."""
    if ds.empty:
        return None
    params = list(dict.fromkeys(ds["param"]))
    fig, axes = plt.subplots(1, len(params), figsize=(3.6 * len(params), 3.4), squeeze=False)
    for ax, p in zip(axes[0], params, strict=True):
        d = ds[ds["param"] == p].sort_values("value")
        ax.plot(d["value"], d["psnr"], marker="o", color=plotstyle.color("inr"))
        if p in ("lr", "iterations") and (d["value"] > 0).all():
            ax.set_xscale("log")
            ax.minorticks_off()
        ax.set_xticks(list(d["value"]), [f"{v:g}" for v in d["value"]])
        ax.set_xlabel(p)
        ax.set_ylabel("PSNR (dB)")
    fig.suptitle("INR design space")
    return fig
