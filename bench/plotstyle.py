"""One fixed colour (and marker) per method, for every figure in the project.

Every figure — ``inrbench compare``, ``inrbench report``, sweeps — takes its colours
from here, so ``dali`` is the same green in a throughput bar chart as in a memory plot,
and ``inr-8bit`` the same in a rate-distortion curve as in a PSNR box plot.

Keys are method names as they appear in result rows: the four pipelines
(``torch-jpeg``, ``dali``, ``inr``, ``raw``, ``torch-nvjpeg``), the codecs (``jpeg`` and its header-free
variant ``jpeg-header-free``) and the INR store variants (``inr-fp32``, ``inr-pruned``,
``inr-16bit``, ``inr-8bit``, ``inr-pruned-8bit``, ...). A name not in the table takes the entry of the longest known
key it ends with (``inr-5x13-8bit`` -> ``inr-8bit``'s colour: same method, another
architecture; a ratio after ``pruned`` is ignored: ``inr-pruned15-8bit`` -> ``inr-pruned-8bit``);
failing that a colour from ``EXTRA`` chosen by a stable hash of the name
(same name -> same colour, in every process), never a matplotlib default that depends on
plotting order.
"""

from __future__ import annotations

import hashlib
import re

# Colour-blind-safe base (Okabe-Ito + Tol), fixed forever: add keys, never recolour one.
COLORS: dict[str, str] = {
    # pipelines
    "torch-jpeg": "#E69F00",  # orange
    "dali": "#009E73",  # bluish green
    "inr": "#0072B2",  # blue
    "raw": "#555555",  # dark grey
    "torch-nvjpeg": "#F0E442",  # yellow: the other torch JPEG loader
    # codecs
    "jpeg": "#D55E00",  # vermillion
    "jpeg-header-free": "#F4A582",  # light vermillion: same codec, payload bytes only
    "webp": "#999933",  # olive
    "avif": "#661100",  # dark red
    "jxl": "#EE6677",  # rose
    "jp2": "#01665E",  # dark teal (not the sand of inr-6bit)
    # INR store variants (shades of the `inr` family: blues/purples)
    "inr-fp32": "#0072B2",
    "inr-pruned": "#56B4E9",
    "inr-16bit": "#332288",
    "inr-8bit": "#CC79A7",
    "inr-pruned-8bit": "#882255",
    "inr-4bit": "#AA4499",
    "inr-pruned-16bit": "#44AA99",
    "inr-demo": "#117733",
    "inr-6bit": "#DDCC77",
    "inr-16-8-16bit": "#6699CC",
    "inr-pruned-16-8-16bit": "#BB5566",
}

EXTRA: tuple[str, ...] = ("#999933", "#661100", "#888888", "#AA4466", "#4477AA", "#228833", "#CCBB44", "#EE6677")

MARKERS: dict[str, str] = {
    "torch-jpeg": "s",
    "dali": "D",
    "inr": "o",
    "raw": "^",
    "torch-nvjpeg": "v",
    "jpeg": "x",
    "jpeg-header-free": "+",
    "webp": "1",
    "avif": "2",
    "jxl": "3",
    "jp2": "4",
    "inr-fp32": "o",
    "inr-pruned": "v",
    "inr-16bit": "s",
    "inr-8bit": "D",
    "inr-pruned-8bit": "P",
    "inr-4bit": "*",
    "inr-pruned-16bit": "h",
    "inr-demo": "p",
    "inr-6bit": "X",
    "inr-16-8-16bit": "<",
    "inr-pruned-16-8-16bit": ">",
}
_EXTRA_MARKERS = ("p", "h", "<", ">", "*", "X", "d")


def _stable_index(name: str, n: int) -> int:
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:4], "big") % n


def _by_suffix(method: str, table: dict[str, str]) -> str | None:
    if method in table:
        return table[method]
    method = re.sub(r"pruned[0-9.]+", "pruned", method)  # "pruned15-8bit" is a "pruned-8bit"
    # "inr-5x13-8bit" -> the longest key whose variant part ("8bit") ends the name
    best = None
    for key in table:
        part = key[4:] if key.startswith("inr-") else None
        if part and method.startswith("inr-") and method.endswith("-" + part):
            if best is None or len(key) > len(best):
                best = key
    return None if best is None else table[best]


def color(method: str) -> str:
    """The colour of ``method`` (hex string); stable for names not in ``COLORS``."""
    return _by_suffix(method, COLORS) or EXTRA[_stable_index(method, len(EXTRA))]


def marker(method: str) -> str:
    """The matplotlib marker of ``method``; stable for names not in ``MARKERS``."""
    return _by_suffix(method, MARKERS) or _EXTRA_MARKERS[_stable_index(method, len(_EXTRA_MARKERS))]


def inr_method(variant: str) -> str:
    """Palette key of an INR store variant: ``"8bit"`` -> ``"inr-8bit"`` (already prefixed kept)."""
    return variant if variant.startswith("inr") else f"inr-{variant}"


def use_agg() -> None:
    """Select the non-interactive Agg backend (call before importing pyplot)."""
    import matplotlib

    matplotlib.use("Agg", force=True)


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
