"""The Kodak self-check of ``inrbench compare --reference kodak`` (docs/codecs.md): on the Kodak images,
each codec's sweep against the published Kodak curve of the same library (``SAME_LIBRARY``); a mean
gap beyond ``TOLERANCE_DB`` either way reads "settings differ from the published run".
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence

import numpy as np
import pandas as pd

from bench.compare.references import curves

TOLERANCE_DB = 0.5

# First 16 hex digits of the SHA-256 of each Kodak image's RGB pixels (uint8 H x W x 3, row-major),
# from the PNG copy in github.com/Zelex/images kodak/ (commit 0b8a89d); no published file hashes
# were found. Six are portrait (512 wide): kodim04, 09, 10, 17, 18, 19.
PIXEL_SHA256 = {
    "kodim01": "a002107433535944", "kodim02": "ae5a495df4ec40e0", "kodim03": "234e61f585503f2a",
    "kodim04": "e88e788fca00e6c7", "kodim05": "ed3d1ee770909d3b", "kodim06": "7f45158999fa297d",
    "kodim07": "4e3664bf6fe865b4", "kodim08": "889c3740e4ed54ca", "kodim09": "f8453140e63a4230",
    "kodim10": "fabe11b5c4f02839", "kodim11": "ab4dd9bf8431e717", "kodim12": "f412db2168e59994",
    "kodim13": "875703d56fb9396f", "kodim14": "2bd5029ee75ac169", "kodim15": "b5353e7511277009",
    "kodim16": "ed21745fd32fce95", "kodim17": "566bc866664e9b06", "kodim18": "3475af71066f3ca8",
    "kodim19": "7956408ef24222d3", "kodim20": "666ce8f2db5566a1", "kodim21": "2d6902daf7c4486b",
    "kodim22": "f430842120c108b6", "kodim23": "81992a83592267e6", "kodim24": "e3e3ccc3e795b82a",
}
SHAPES = {(512, 768, 3), (768, 512, 3)}

# codec -> the published Kodak curves (``reference_rd.csv`` methods) run with the same library
SAME_LIBRARY: dict[str, tuple[str, ...]] = {
    "jpeg": ("JPEG",), "jpeg-opt": ("JPEG",),
    "webp": ("WebP",), "webp-m6": ("WebP",),
    "avif": ("AV1 (libaom 4:4:4)",), "avif-s4": ("AV1 (libaom 4:4:4)",),
    "jp2": ("JPEG 2000", "JPEG 2000 (OpenJPEG, TFC)"), "jp2-97": ("JPEG 2000", "JPEG 2000 (OpenJPEG, TFC)"),
}


def pixel_hash(image: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(image, dtype=np.uint8).tobytes()).hexdigest()[:16]


def identify(images: Sequence[np.ndarray], asserted: bool = False) -> dict:
    """``{"kodak": bool, "how": str, "n": int, "matched": int}`` for uint8 ``[H, W, 3]`` images:
    Kodak when every image's pixels are a distinct Kodak image's, or when ``asserted``."""
    known = {h: k for k, h in PIXEL_SHA256.items()}
    hashes = [pixel_hash(im) for im in images]
    names = sorted({known[h] for h in hashes if h in known})
    n, k = len(hashes), sum(h in known for h in hashes)
    if n and k == n and len(names) == n:
        how = f"recognised by their pixels: {n} of the 24 Kodak images"
        return dict(kodak=True, how=how, n=n, matched=k)
    shapes = all(tuple(im.shape) in SHAPES for im in images)
    why = (f"{k} of {n} images are Kodak images by their pixels"
           + ("; all have Kodak's sizes (768x512 or 512x768): another copy or a conversion?" if shapes and n else ""))
    if asserted:
        return dict(kodak=True, how=f"asserted by --assert-kodak ({why})", n=n, matched=k)
    return dict(kodak=False, how=why, n=n, matched=k)


def gaps(summary: pd.DataFrame) -> list[dict]:
    """Per codec with a same-library published curve, per such curve: the mean gap (dB) of our sweep."""
    published = {c.method: c for c in curves("kodak")}
    out = []
    for codec, methods in SAME_LIBRARY.items():
        sw = summary[(summary["method"] == f"{codec}-sweep") & (summary["status"] == "ok")].sort_values("bpp")
        if sw.empty:
            continue
        for m in methods:
            c = published[m]
            pts = [(float(b), float(p) - c.psnr_at(float(b))) for b, p in zip(sw["bpp"], sw["psnr"], strict=True)
                   if math.isfinite(c.psnr_at(float(b)))]
            row = dict(codec=codec, curve=m, paper=c.paper, points=len(pts), gap_db=math.nan,
                       bpp_lo=math.nan, bpp_hi=math.nan, verdict="no sweep point inside the published bpp range")
            if pts:
                g = float(np.mean([d for _, d in pts]))
                row.update(gap_db=g, bpp_lo=pts[0][0], bpp_hi=pts[-1][0],
                           verdict="matches" if abs(g) <= TOLERANCE_DB else "settings differ from the published run")
            out.append(row)
    return out


def check(images: Sequence[np.ndarray], summary: pd.DataFrame, codecs: Sequence[str], asserted: bool = False) -> dict:
    """The self-check record (``config.json`` ``kodak_check``): ``identify`` plus, on Kodak, ``gaps`` and the
    codecs run here without a same-library published curve (``unchecked``)."""
    d = identify(images, asserted)
    d["gaps"] = gaps(summary) if d["kodak"] else []
    d["unchecked"] = [c for c in codecs if c not in SAME_LIBRARY]
    return d


def lines(check: dict) -> list[str]:
    """The markdown lines of the self-check (``check``: the ``check`` record)."""
    head = ["", "Kodak self-check (`--reference kodak`): our quality sweep of each codec against the published "
                "Kodak curve of the same library (mean of our PSNR minus theirs at our bpp over our sweep points "
                f"inside their bpp range; more than {TOLERANCE_DB} dB either way: settings differ from the "
                "published run; docs/codecs.md):", ""]
    if not check["kodak"]:
        return head[:2] + [f"- the check needs the 24 Kodak images; these are not ({check['how']}). "
                           "`--assert-kodak` runs it anyway."]
    out = head + [f"- images: {check['how']}"]
    if check["unchecked"]:
        out.append(f"- {', '.join(check['unchecked'])}: no published Kodak curve of the same library found, unchecked")
    for g in check["gaps"]:
        if g["points"]:
            out.append(f"- {g['codec']} vs {g['curve']} ({g['paper']}): {g['gap_db']:+.2f} dB mean over {g['points']} "
                       f"points, {g['bpp_lo']:.2f}-{g['bpp_hi']:.2f} bpp: {g['verdict']}")
        else:
            out.append(f"- {g['codec']} vs {g['curve']}: {g['verdict']}")
    return out
