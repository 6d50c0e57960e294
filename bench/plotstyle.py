"""One fixed colour and marker per method (pipeline, codec, INR store variant), for every figure: an unknown
``inr-`` name takes its variant's (``inr-5x13-8bit`` -> ``inr-8bit``), any other one hashed from its name.
"""

from __future__ import annotations

import hashlib
import re

# Colour-blind-safe (Okabe-Ito + Tol), fixed forever: add keys, never restyle one.
STYLE: dict[str, tuple[str, str]] = {
    # pipelines
    "torch-jpeg": ("#E69F00", "s"),  # orange
    "dali": ("#009E73", "D"),  # bluish green
    "inr": ("#0072B2", "o"),  # blue
    "raw": ("#555555", "^"),  # dark grey
    "torch-nvjpeg": ("#F0E442", "v"),  # yellow
    # codecs
    "jpeg": ("#D55E00", "x"),  # vermillion
    "jpeg-header-free": ("#F4A582", "+"),  # light vermillion: the same codec, payload bytes only
    "webp": ("#999933", "1"),
    "avif": ("#661100", "2"),
    "jxl": ("#EE6677", "3"),
    "jp2": ("#01665E", "4"),
    # INR store variants (blues and purples, the `inr` family)
    "inr-fp32": ("#0072B2", "o"),
    "inr-pruned": ("#56B4E9", "v"),
    "inr-16bit": ("#332288", "s"),
    "inr-8bit": ("#CC79A7", "D"),
    "inr-pruned-8bit": ("#882255", "P"),
    "inr-4bit": ("#AA4499", "*"),
    "inr-pruned-16bit": ("#44AA99", "h"),
    "inr-demo": ("#117733", "p"),
    "inr-6bit": ("#DDCC77", "X"),
    "inr-16-8-16bit": ("#6699CC", "<"),
    "inr-pruned-16-8-16bit": ("#BB5566", ">"),
}
EXTRA: tuple[str, ...] = ("#999933", "#661100", "#888888", "#AA4466", "#4477AA", "#228833", "#CCBB44", "#EE6677")
EXTRA_MARKERS = ("p", "h", "<", ">", "*", "X", "d")

RC: dict[str, object] = {
    "figure.dpi": 110,
    "savefig.dpi": 150,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "legend.fontsize": 8,
    "legend.frameon": False,
}


def _style(method: str) -> tuple[str, str]:
    if method in STYLE:
        return STYLE[method]
    name = re.sub(r"pruned[0-9.]+", "pruned", method)
    variants = [k for k in STYLE if k.startswith("inr-") and name.startswith("inr-") and name.endswith("-" + k[4:])]
    if variants:
        return STYLE[max(variants, key=len)]
    h = int.from_bytes(hashlib.sha256(method.encode()).digest()[:4], "big")
    return EXTRA[h % len(EXTRA)], EXTRA_MARKERS[h % len(EXTRA_MARKERS)]


def color(method: str) -> str:
    """The colour of ``method`` (hex string)."""
    return _style(method)[0]


def marker(method: str) -> str:
    """The matplotlib marker of ``method``."""
    return _style(method)[1]


def inr_method(variant: str) -> str:
    """Palette key of an INR store variant: ``"8bit"`` -> ``"inr-8bit"`` (already prefixed kept)."""
    return variant if variant.startswith("inr") else f"inr-{variant}"


def use_agg() -> None:
    """Select the non-interactive Agg backend (call before importing pyplot)."""
    import matplotlib

    matplotlib.use("Agg", force=True)
