"""Aggregate ``bench.compare.core``'s rows: one summary row per (method, variant, match, quality), means
over ``ok`` images; matched rows carry INR minus codec PSNR with its 95% paired interval
(``bench.stats.paired_diff_ci``; lossless = ``PSNR_CAP_DB``), and ``crossovers`` (docs/measurement.md)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from bench import stats
from bench.compare import kodak, references
from bench.metrics import PSNR_CAP_DB, mean_psnr

SUMMARY_COLUMNS = [
    "method", "codec", "variant", "match", "quality", "quality_min", "quality_max", "n_images", "n_ok",
    "status", "target_bytes", "file_bytes", "header_free_bytes", "bpp", "bpp_header_free",
    "pct_raw", "psnr", "psnr_median", "psnr_min", "ssim", "min_bytes", "inr_psnr_same_images",
    "psnr_diff", "psnr_diff_lo", "psnr_diff_hi", "psnr_diff_interval", "psnr_diff_n", "overhead_bytes", "note",
]

CODEC_LABELS = {"jpeg": "JPEG", "webp": "WebP", "avif": "AVIF", "jxl": "JPEG XL", "jp2": "JPEG 2000",
                "jpeg-opt": "JPEG (optimized, progressive)", "webp-m6": "WebP (method 6)", "avif-s4": "AVIF (speed 4)",
                "jxl-e9": "JPEG XL (effort 9)", "jp2-97": "JPEG 2000 (9/7)"}


def codec_label(codec: str) -> str:
    """The codec's name in prose (``jp2`` -> ``JPEG 2000``)."""
    return CODEC_LABELS.get(codec, codec)


def codecs_in(summary: pd.DataFrame) -> list[str]:
    """Codecs with rows in ``summary`` (skipped ones included), in order of appearance."""
    c = summary.loc[summary["method"] != "inr", "method"].str.replace(r"-(matched|sweep)$", "", regex=True)
    return list(dict.fromkeys(c))


def summarize(per_image: pd.DataFrame) -> pd.DataFrame:
    """Per-image rows -> one summary row per group (see the module docstring)."""
    out = []
    df = per_image.copy()
    df["codec"] = df["method"].str.replace(r"-(matched|sweep)$", "", regex=True).where(df["method"] != "inr", "")
    df["_q"] = np.where(df["method"].str.endswith("-sweep"), df["quality"], -1)
    inr = df[df["method"] == "inr"].set_index(["variant", "image"])["psnr"]
    for (method, variant, match, qkey), g in df.groupby(["method", "variant", "match", "_q"], sort=False):
        ok = g[g["status"] == "ok"]
        n, k = len(g), len(ok)
        row = dict(
            method=method, codec=g["codec"].iloc[0], variant=variant, match=match, n_images=n, n_ok=k,
            status="ok" if k == n else ("unreachable" if k == 0 else "partial"),
            target_bytes=g["target_bytes"].mean(),
            quality=qkey if method.endswith("-sweep") else ok["quality"].mean(),
            quality_min=ok["quality"].min(), quality_max=ok["quality"].max(),
            min_bytes=g["min_bytes"].mean(),
        )
        for col in ("file_bytes", "header_free_bytes", "bpp", "bpp_header_free", "pct_raw", "ssim", "overhead_bytes"):
            row[col] = ok[col].mean() if k else np.nan
        row["psnr"] = mean_psnr(ok["psnr"].to_numpy(float, copy=True)) if k else np.nan
        row["psnr_median"] = ok["psnr"].median() if k else np.nan
        row["psnr_min"] = ok["psnr"].min() if k else np.nan
        if method.endswith("-matched") and k:
            same = inr.loc[[(variant, int(i)) for i in ok["image"]]].to_numpy(float, copy=True)
            row["inr_psnr_same_images"] = mean_psnr(same)
            jpeg = ok["psnr"].to_numpy(float, copy=True)
            d = stats.paired_diff_ci(np.minimum(same, PSNR_CAP_DB), np.minimum(jpeg, PSNR_CAP_DB))
            # the interval's own n: pairs with a non-finite side (e.g. a NaN INR PSNR) are dropped from it
            row.update(psnr_diff=d.value, psnr_diff_lo=d.lo, psnr_diff_hi=d.hi,
                       psnr_diff_interval=stats.paired_diff_method(d.n), psnr_diff_n=d.n)
        out.append(row)
    return pd.DataFrame(out).reindex(columns=SUMMARY_COLUMNS)


def inr_frontier(summary: pd.DataFrame) -> pd.DataFrame:
    """INR variants on the rate-distortion frontier: sorted by bytes, each with a higher mean
    PSNR than every cheaper variant (dominated variants, e.g. a badly pruned one, dropped)."""
    inr = summary[summary["method"] == "inr"].sort_values(["file_bytes", "psnr"], ascending=[True, False])
    keep, best = [], -math.inf
    for i, r in inr.iterrows():
        if r["psnr"] > best:
            keep.append(i)
            best = r["psnr"]
    return inr.loc[keep]


@dataclass(frozen=True)
class CurveGap:
    """One INR variant against a codec's sweep at the INR's bytes per image: ``diff``, the mean over images
    of INR PSNR minus the codec's PSNR on that image's own sweep (linear in log bytes) with its paired
    interval; ``inr`` / ``codec``: the two mean PSNRs; ``n_in`` of ``n`` images' sweeps span the bytes."""

    inr: float
    codec: float
    diff: stats.Interval
    n_in: int
    n: int


def _image_curves(per_image: pd.DataFrame, bytes_col: str, codec: str) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """Each image's sweep of ``codec``: image -> (bytes, PSNR capped at ``PSNR_CAP_DB``) sorted by bytes."""
    sw = per_image[(per_image["method"] == f"{codec}-sweep") & (per_image["status"] == "ok")]
    sw = sw[np.isfinite(sw[bytes_col].to_numpy(float)) & (sw[bytes_col].to_numpy(float) > 0)
            & sw["psnr"].notna()].sort_values(["image", bytes_col])
    return {int(i): (g[bytes_col].to_numpy(float), np.minimum(g["psnr"].to_numpy(float), PSNR_CAP_DB))
            for i, g in sw.groupby("image", sort=False)}


def curve_gap(per_image: pd.DataFrame, variant: str, curves: dict) -> CurveGap | None:
    """INR ``variant`` against the per-image sweeps ``curves`` (``_image_curves``) at its bytes per image;
    ``None`` where no image's sweep spans those bytes."""
    inr = per_image[(per_image["method"] == "inr") & (per_image["variant"] == variant)]
    xs, ys = [], []
    for _, row in inr.iterrows():
        c = curves.get(int(row["image"]))
        b = float(row["file_bytes"])
        if c is None or not (c[0][0] <= b <= c[0][-1]):
            continue
        xs.append(min(float(row["psnr"]), PSNR_CAP_DB))
        ys.append(float(np.interp(np.log(b), np.log(c[0]), c[1])))
    if not xs:
        return None
    x, y = np.asarray(xs), np.asarray(ys)
    ok = np.isfinite(x) & np.isfinite(y)
    return CurveGap(mean_psnr(x[ok]) if ok.any() else math.nan, mean_psnr(y[ok]) if ok.any() else math.nan,
                    stats.paired_diff_ci(x, y), int(len(xs)), int(len(inr)))


def gap_text(g: CurveGap, name: str) -> str:
    """``INR behind: INR − JPEG -2.11 dB [-2.52, -1.70] ...``, ``... no difference detected ...``, or the
    value said to be a point reading; ``k/n imgs`` where the sweep spans the INR's bytes on only k."""
    iv = g.diff
    if not math.isfinite(iv.value):
        return f"INR − {name}: no image with a finite PSNR on both sides, no result"
    text = psnr_diff_text(dict(psnr_diff=iv.value, psnr_diff_lo=iv.lo, psnr_diff_hi=iv.hi, psnr_diff_n=iv.n,
                               psnr_diff_interval=stats.paired_diff_method(iv.n)))
    if not iv.ok:
        text = (text.replace("not a result)", "a point reading, not a result)") if "not a result" in text
                else f"{iv.value:+.2f} dB (no interval: a point reading, not a result)")
    who = ("INR ahead: " if iv.value > 0 else "INR behind: ") if iv.excludes(0.0) else ""
    part = f", {g.n_in}/{g.n} imgs" if g.n_in < g.n else ""
    return f"{who}INR − {name} {text}{part}"


def crossovers(summary: pd.DataFrame, pixels: int, bytes_col: str = "file_bytes", codec: str = "jpeg", *,
               per_image: pd.DataFrame) -> list[str]:
    """Plain-language lines: each INR variant's gap to a codec's sweep (``curve_gap``), and the bpp where
    the INR frontier crosses it: a result only where the gaps on both sides exclude 0."""
    inr = summary[summary["method"] == "inr"].sort_values("file_bytes")
    curves = _image_curves(per_image, bytes_col, codec)
    if inr.empty or not curves:
        return []
    lines = []
    name = codec_label(codec)
    label = f"{name} file bytes" if bytes_col == "file_bytes" else f"{name} header-free bytes"
    gaps = {}
    for _, r in inr.iterrows():
        b, bpp = float(r["file_bytes"]), float(r["file_bytes"]) * 8 / pixels
        g = gaps[r["variant"]] = curve_gap(per_image, r["variant"], curves)
        if g is None:
            lo, hi = min(c[0][0] for c in curves.values()), max(c[0][-1] for c in curves.values())
            where = "below the smallest" if b < lo else "above the largest" if b > hi else "outside the range of"
            lines.append(f"inr-{r['variant']} at {bpp:.2f} bpp: {where} {label} of every image's sweep "
                         f"({lo * 8 / pixels:.2f}-{hi * 8 / pixels:.2f} bpp); no {name} point to compare")
            continue
        lines.append(f"inr-{r['variant']} at {bpp:.2f} bpp: {g.inr:.2f} dB vs {name} {g.codec:.2f} dB "
                     f"({label}, per image at the INR's bytes): {gap_text(g, name)}")
    front = inr_frontier(summary)
    fg = [gaps.get(v) for v in front["variant"]]
    bx = front["file_bytes"].to_numpy(float)
    for a in range(len(fg) - 1):
        g0, g1 = fg[a], fg[a + 1]
        if g0 is None or g1 is None:
            continue
        d0, d1 = g0.diff.value, g1.diff.value
        if math.isnan(d0) or math.isnan(d1) or (d0 > 0) == (d1 > 0):
            continue
        t = d0 / (d0 - d1)
        xb = math.exp(math.log(bx[a]) + t * (math.log(bx[a + 1]) - math.log(bx[a])))
        who = f"INR ahead of {name} below, behind above" if d0 > 0 else f"INR overtakes {name} above"
        b0, b1 = bx[a] * 8 / pixels, bx[a + 1] * 8 / pixels
        at = f"~{xb * 8 / pixels:.2f} bpp (~{xb:.0f} bytes/image)"
        if g0.diff.excludes(0.0) and g1.diff.excludes(0.0):
            lines.append(f"crossing ({label}): {who} {at}: the gaps at {b0:.2f} and {b1:.2f} bpp both exclude 0, "
                         "so the curves cross between them; where exactly is interpolated (no interval)")
        else:
            lines.append(f"crossing ({label}): {who} {at}: a point reading, not a result (the gap at "
                         f"{b0:.2f} or {b1:.2f} bpp is not shown to differ from 0)")
    return lines


def _fmt(v, nd=2) -> str:
    if isinstance(v, str):
        return v
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "–"
    if isinstance(v, float) and v.is_integer() and nd == 0:
        return f"{int(v)}"
    return f"{v:.{nd}f}"


def psnr_diff_text(r) -> str:
    """A summary row's INR − codec difference: ``+1.23 dB [0.95, 1.51]``, ``no difference detected [-0.20,
    0.31] dB`` (``bench.stats.fmt_diff``), ``(t interval, 4 images ...)`` below the bootstrap's minimum,
    the value said to be no result for one image or no spread, ``–`` without the columns."""
    v, lo, hi = (r.get(c, np.nan) for c in ("psnr_diff", "psnr_diff_lo", "psnr_diff_hi"))
    if v is None or pd.isna(v):
        return "–"
    n = r.get("psnr_diff_n", np.nan)
    if any(x is None or pd.isna(x) for x in (lo, hi)):
        if n == 1:
            return f"{v:+.2f} dB (one image: no interval, not a result)"
        if n == n and n > 1:
            return f"{v:+.2f} dB (the same on all {int(n)} images: no spread, no interval, not a result)"
        return "–"
    how = r.get("psnr_diff_interval")
    tag = (f" (t interval, {int(n)} images: fewer than {stats.BOOTSTRAP_MIN_N} for a bootstrap)"
           if how == "t" and n == n else "")
    iv = stats.Interval(float(v), float(lo), float(hi), int(n) if n == n else 0)
    text = stats.fmt_diff(iv, scale=1.0, unit="dB", digits=2)
    return f"{text}{'' if iv.excludes(0.0) else ' dB'}{tag}"


def reference_lines(summary: pd.DataFrame, dataset: str, pixels: int) -> list[str]:
    """Markdown lines: each INR variant's PSNR beside each published curve of ``dataset``
    interpolated at that variant's bpp (``bench.compare.references``)."""
    curves = references.curves(dataset)
    inr = summary[summary["method"] == "inr"].sort_values("file_bytes")
    if inr.empty:
        return ["", f"Published {dataset} curves are drawn in `psnr_vs_bytes.png` (their numbers on their data, "
                    "sources in `config.json`); no INR variant here to place on them."]
    lines = [
        "", f"Published {dataset} curves at each INR variant's bpp (`--reference {dataset}`): these are "
        f"their numbers on their data ({'the 24 Kodak images, 768x512' if dataset == 'kodak' else 'the CIFAR-10 test set, 32x32'}), "
        "copied from public result files (sources in `config.json` and `bench/compare/data/reference_rd.csv`), "
        "not measured here nor on these images; PSNR linear in log(bpp) between published points, "
        "`–` outside a curve's range.", "",
        "| INR variant | bpp | INR PSNR dB (these images) | " + " | ".join(c.method for c in curves) + " |",
        "|---|---|---|" + "---|" * len(curves),
    ]
    for _, r in inr.iterrows():
        bpp = float(r["file_bytes"]) * 8 / pixels
        cells = " | ".join(_fmt(c.psnr_at(bpp)) for c in curves)
        lines.append(f"| inr-{r['variant']} | {bpp:.2f} | {r['psnr']:.2f} | {cells} |")
    return lines


def markdown(summary: pd.DataFrame, meta: dict, per_image: pd.DataFrame) -> str:
    """The short README-style summary (``summary.md``) of ``summary`` and the per-image rows it came from."""
    native = bool(meta.get("native"))
    if native:
        px = float(meta["image_sizes"]["mean_pixels"])
        sz = meta["image_sizes"]
        shape = (f"native sizes: {sz['distinct']} distinct, {sz['smallest'][0]}x{sz['smallest'][1]} .. "
                 f"{sz['largest'][0]}x{sz['largest'][1]}")
    else:
        h, w = meta["image_size"]
        px, shape = h * w, f"{h}x{w}"
    codecs = codecs_in(summary) or ["jpeg"]
    names = ", ".join(codec_label(c) for c in codecs)
    lines = [
        f"# INR vs {names} — {meta['dataset']} ({meta['split']}, {meta['n_images']} images, {shape})",
        "",
        "PSNR: decode, clamp, round to 8 bits, per image, mean (`bench.metrics`). SSIM: skimage, "
        "7x7 uniform window, data_range 255, mean over RGB. Bytes per image: INR = "
        + ("its payload: the packed weight arrays (codes, scales, masks) / N, no store header (the network's "
           "bits, as COIN counts them; `inr_bytes=payload`)"
           if meta.get("config", {}).get("inr_bytes") == "payload" else "store file / N (header amortized)")
        + "; codecs = whole file, or for JPEG also header-free = entropy-coded data only. "
        "Matched codec = highest quality (1..100) whose bytes fit the INR's bytes per image, per image. "
        + (f"Raw RGB = {px * 3:.0f} bytes/image (mean; each image has its own size). bpp and % raw are per image "
         "(its own pixels), averaged, of the bytes a row is matched on; curve positions (crossings, published "
         "curves) convert bytes at the mean image size. " if native else
         f"Raw RGB = {px * 3:.0f} bytes/image. bpp and % raw are of the bytes a row is matched on ")
        + "(header-free rows: header-free bytes). Overhead = file bytes minus the codec's coded payload "
        "(JPEG: markers; WebP: RIFF/chunk headers; AVIF: boxes outside `mdat`; JPEG 2000: JP2 boxes and "
        "codestream headers; JPEG XL: not measured, `–`). `unreachable`: even the codec's smallest output "
        "is larger than the target. INR − codec: mean per-image PSNR difference over the images the codec "
        f"reached, with its 95% paired bootstrap interval (Student's t on the per-image differences below "
        f"{stats.BOOTSTRAP_MIN_N} images, where a bootstrap is too narrow; none for one image); an interval "
        "holding 0 reads `no difference detected`.",
        "",
        "| method | match | file bytes/img | header-free bytes/img | overhead bytes/img | bpp | % raw | quality | PSNR dB | SSIM | images reached | status |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    rows = summary[~summary["method"].str.endswith("-sweep") & (summary["status"] != "skipped")]
    for variant in rows["variant"].unique():
        for _, r in rows[rows["variant"] == variant].iterrows():
            name = f"inr-{variant}" if r["method"] == "inr" else f"{r['codec'] or 'jpeg'} @ inr-{variant}"
            if r["status"] == "unreachable":
                by = f"≥{r['min_bytes']:.0f} needed (target {r['target_bytes']:.0f})"
                cells = (by, "–") if r["match"] == "file" else ("–", by)
                lines.append(f"| {name} | {r['match']} | {cells[0]} | {cells[1]} | – | – | – | – | – | – | 0/{r['n_images']} | unreachable |")
                continue
            bpp = r["bpp_header_free"] if r["match"] == "header-free" else r["bpp"]
            q = "–" if r["method"] == "inr" else f"{r['quality']:.1f} ({r['quality_min']:.0f}-{r['quality_max']:.0f})"
            extra = ""
            if r["method"].endswith("-matched"):
                extra = (f" (INR {r['inr_psnr_same_images']:.2f} on same; INR − {codec_label(r['codec'] or 'jpeg')} "
                         f"{psnr_diff_text(r)})")
            lines.append(
                f"| {name} | {r['match'] or '–'} | {r['file_bytes']:.0f} | {_fmt(r['header_free_bytes'], 0)} | "
                f"{_fmt(r.get('overhead_bytes', np.nan), 0)} | {bpp:.2f} | {bpp * 100 / 24:.1f} | {q} | "
                f"{r['psnr']:.2f}{extra} | {r['ssim']:.3f} | {r['n_ok']}/{r['n_images']} | {r['status']} |"
            )
    for _, r in summary[summary["status"] == "skipped"].iterrows():
        lines.append(f"| {r['codec']} | – | – | – | – | – | – | – | – | – | – | skipped: {r['note']} |")
    for c in sorted(codecs, key=lambda c: c != "jpeg"):  # JPEG's sweep first, with its header-free bytes
        sw = summary[summary["method"] == f"{c}-sweep"].sort_values("quality")
        if not len(sw):
            continue
        cols = ["header-free bytes", "bpp (header-free)"] if c == "jpeg" else ["overhead bytes"]
        cols = ["quality", "file bytes", "bpp", *cols, "PSNR dB", "SSIM"]
        lines += ["", f"{codec_label(c)} quality sweep (means over images):", "", f"| {' | '.join(cols)} |",
                  "|---" * len(cols) + "|"]
        for _, r in sw.iterrows():
            mid = (f"{r['header_free_bytes']:.0f} | {r['bpp_header_free']:.2f}" if c == "jpeg"
                   else _fmt(r["overhead_bytes"], 0))
            lines.append(f"| {r['quality']:.0f} | {r['file_bytes']:.0f} | {r['bpp']:.2f} | {mid} | "
                         f"{r['psnr']:.2f} | {r['ssim']:.3f} |")
    cross = []
    for c in codecs:
        cross += crossovers(summary, px, "file_bytes", c, per_image=per_image)
        if c == "jpeg":
            cross += crossovers(summary, px, "header_free_bytes", c, per_image=per_image)
    if cross:
        front = ", ".join(f"inr-{v}" for v in inr_frontier(summary)["variant"])
        how = ("each gap is the mean over images of INR PSNR minus the codec's PSNR on that image's quality sweep at "
               "the INR's bytes (linear in log bytes), with its paired 95% interval as above")
        lines += ["", f"Where INR stands against each codec's curve (INR frontier: {front}; {how}):", ""]
        lines += [f"- {c}" for c in cross]
    stores = [st for st in meta.get("stores", []) if st.get("resident_bytes_per_image")]
    if stores:
        lines += ["", "Disk bytes (the file, header amortized; packed with `encode --at-rest` where noted) against "
                      "device-resident bytes (codes, scales, masks as loaded; decode speed depends on these):", "",
                  "| INR variant | on disk | disk bytes/img | disk bpp | resident bytes/img | resident bpp |",
                  "|---|---|---|---|---|---|"]
        for st in stores:
            d, r = float(st["bytes_per_image"]), float(st["resident_bytes_per_image"])
            kind = f"packed ({st['at_rest']})" if st.get("at_rest") else "store"
            lines.append(f"| inr-{st['name']} | {kind} | {d:.0f} | {d * 8 / px:.2f} | {r:.0f} | {r * 8 / px:.2f} |")
    if meta.get("reference"):
        lines += reference_lines(summary, meta["reference"], px)
    if meta.get("kodak_check"):
        lines += kodak.lines(meta["kodak_check"])
    return "\n".join(lines) + "\n"
