"""The headline's verdict: up to three sentences per dataset (training, loader, INR vs JPEG), a difference
stated only where its 95% interval excludes none, else *no difference detected* with the interval."""

from __future__ import annotations

import pandas as pd

from bench import stats as S
from bench.compare.table import psnr_diff_text
from bench.report import names as N
from bench.report import tables as T

LEADS = {"train": "End to end", "loader": "Loader alone"}


def _pair(sp: pd.DataFrame, ds: str, mode: str, a: str, b: str) -> S.Interval | None:
    """``a``'s speed relative to ``b``'s (> 1: ``a`` faster) in ``mode`` with its interval, from the speedup rows
    of either direction; None where the two were not compared, a sanity check failed, or there is no interval."""
    sel = sp[(sp["dataset"] == ds) & (sp["mode"] == mode)]
    for p, base, flip in ((a, b, False), (b, a, True)):
        hit = sel[(sel["pipeline"] == p) & (sel["baseline"] == base)]
        if len(hit) and not hit.iloc[0]["flagged"]:
            r = hit.iloc[0]
            iv = S.Interval(1 / r["ratio"], 1 / r["hi"], 1 / r["lo"]) if flip else S.Interval(r["ratio"], r["lo"], r["hi"])
            return iv if iv.ok else None
    return None


def speed_sentence(medians: dict[str, float], sp: pd.DataFrame, ds: str, mode: str) -> str | None:
    """``End to end, `dali` had the highest median (3,275 img/s): 1.20x [1.03-1.40] as fast as `torch-jpeg`; no
    difference detected against `raw` [0.99-1.11].`` ``medians``: pipeline -> median img/s in ``mode``; ``sp``:
    ``tables.speedups`` rows. None with fewer than two pipelines measured."""
    medians = {p: v for p, v in medians.items() if pd.notna(v)}
    if len(medians) < 2:
        return None
    fastest = max(medians, key=medians.__getitem__)
    ahead, alike = [], []
    for p in T.order_key([p for p in medians if p != fastest], N.PIPELINE_ORDER):
        iv = _pair(sp, ds, mode, fastest, p)
        if iv is None:
            continue
        text = S.fmt_ratio(iv)
        if iv.excludes(1.0):
            ahead.append(f"{text} as fast as `{p}`")
        else:
            alike.append(f"`{p}` {text[len(S.NO_DIFFERENCE) + 1:]}")
    head = f"{LEADS[mode]}, `{fastest}` had the highest median ({T.fmt_num(medians[fastest])} img/s)"
    if not ahead and not alike:
        return f"{head}; no comparison with it has an interval (one process a side, or a failed sanity check)."
    parts = [" and ".join([", ".join(ahead[:-1]), ahead[-1]] if len(ahead) > 1 else ahead)] if ahead else []
    if alike:
        parts.append(f"{S.NO_DIFFERENCE} against {', '.join(alike)}")
    return f"{head}: {'; '.join(parts)}."


def inr_sentence(summary: pd.DataFrame, variant: str | None) -> str | None:
    """Where INR stands against JPEG at matched bytes (whole files): the variant the ``inr`` pipeline reads
    (``variant``) and the best one, each with the paired per-image interval of INR minus JPEG PSNR."""
    s = summary[summary["method"] == "jpeg-matched"]
    if "match" in s:
        s = s[s["match"].fillna("file").astype(str).isin(["file", ""])]
    s = s.dropna(subset=["psnr_diff"]) if "psnr_diff" in s else s.iloc[0:0]
    if s.empty:
        return None
    inr = summary[summary["method"] == "inr"].set_index("variant")

    def one(r) -> str:
        v = str(r["variant"])
        known = v in inr.index and "file_bytes" in inr and pd.notna(inr.loc[v, "file_bytes"])
        size = f", {T.fmt_num(inr.loc[v, 'file_bytes'])} bytes/image" if known else ""
        return f"{psnr_diff_text(r)} for `{v}`{size}"

    best = s.loc[s["psnr_diff"].idxmax()]
    read = s[s["variant"].astype(str) == variant] if variant else s.iloc[0:0]
    said = [f"{one(read.iloc[0])} (the store `inr` trains from)"] if len(read) else []
    if not len(read) or str(best["variant"]) != variant:
        said.append(f"{one(best)} (the best variant)")
    return f"At matched bytes, INR minus JPEG PSNR (per image, paired) is {' and '.join(said)}."
