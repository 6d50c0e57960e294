"""Report tables: numbers as tidy frames (for figures) and formatted frames (for markdown).

Statistics are over the raw ok samples (repeats x epochs): median and IQR. A table cell with
no ok sample shows the run's status and reason (``skip: ...`` / ``error: ...``), never a 0.
Speedup of pipeline P over baseline B is ``median(epoch_s of B) / median(epoch_s of P)``
(> 1: P is faster); its spread is the interval ``[q25(B)/q75(P), q75(B)/q25(P)]``.
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from bench.report import names as N

GROUP = ["dataset", "pipeline", "mode"]


def order_key(values, order) -> list:
    """Sort by a preferred order, unknown values after it alphabetically."""
    rank = {v: i for i, v in enumerate(order)}
    return sorted(values, key=lambda v: (rank.get(v, len(rank)), str(v)))


def fmt_num(x: float, digits: int = 3) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "—"
    ax = abs(x)
    if ax >= 1000:
        return f"{x:,.0f}"
    if ax >= 100:
        return f"{x:.0f}"
    return f"{x:.{digits}g}"


def fmt_bytes(x: float) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "—"
    for unit, k in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(x) >= k:
            return f"{x / k:.3g} {unit}"
    return f"{x:.0f} B"


def fmt_median_iqr(median: float, iqr: float, fmt=fmt_num) -> str:
    return f"{fmt(median)} (IQR {fmt(iqr)})"


def stats(rows: pd.DataFrame, metric_names: tuple[str, ...], steady: bool = True) -> pd.DataFrame:
    """median/q25/q75/iqr/n of the first present metric, per dataset x pipeline x mode.

    steady: only rows with an epoch index (steady-state samples) when any have one.
    """
    m = N.first_present(rows["metric"].dropna().unique(), metric_names)
    cols = [*GROUP, "median", "q25", "q75", "iqr", "n"]
    if m is None:
        return pd.DataFrame(columns=cols)
    d = rows[(rows["metric"] == m) & (rows["status"] == "ok")]
    if steady and d["epoch"].notna().any():
        d = d[d["epoch"].notna()]
    if d.empty:
        return pd.DataFrame(columns=cols)
    g = d.groupby(GROUP, dropna=False)["value"]
    res = g.agg(median="median", q25=lambda s: s.quantile(0.25), q75=lambda s: s.quantile(0.75),
                n="count").reset_index()
    res["iqr"] = res["q75"] - res["q25"]
    return res[cols]


def status_of(rows: pd.DataFrame, dataset: str, pipeline: str, mode: str) -> str:
    """``skip: reason`` / ``error: reason`` for a combination without ok samples, else ``not run``."""
    sel = rows[(rows["dataset"] == dataset) & (rows["pipeline"] == pipeline) & (rows["mode"] == mode)]
    for metric in ("run", "cell_s"):
        bad = sel[(sel["metric"] == metric) & (sel["status"].isin(["skip", "error"]))]
        if len(bad):
            r = bad.iloc[0]
            return f"{r['status']}: {r['reason']}"
    return "not run"


def bench_rows(rows: pd.DataFrame) -> pd.DataFrame:
    return rows[rows["mode"].isin(N.MODE_ORDER) & rows["pipeline"].fillna("").ne("")]


def combos(rows: pd.DataFrame) -> dict[str, tuple[list[str], list[str]]]:
    """dataset -> (pipelines, modes) that appear in bench rows (ok or not), in display order."""
    b = bench_rows(rows)
    out = {}
    for ds in sorted(b["dataset"].dropna().unique()):
        d = b[b["dataset"] == ds]
        out[ds] = (order_key(d["pipeline"].unique(), N.PIPELINE_ORDER), order_key(d["mode"].unique(), N.MODE_ORDER))
    return out


def pivot_metric(rows: pd.DataFrame, metric_names: tuple[str, ...], fmt=fmt_num, steady: bool = True
                 ) -> dict[str, pd.DataFrame]:
    """dataset -> table (rows pipeline, columns mode) of ``median (IQR)`` or the status."""
    st = stats(rows, metric_names, steady=steady)
    out = {}
    for ds, (pipes, modes) in combos(rows).items():
        table = {}
        for p in pipes:
            r = {}
            for mode in modes:
                hit = st[(st["dataset"] == ds) & (st["pipeline"] == p) & (st["mode"] == mode)]
                r[mode] = (fmt_median_iqr(hit.iloc[0]["median"], hit.iloc[0]["iqr"], fmt) if len(hit)
                           else status_of(rows, ds, p, mode))
            table[p] = r
        out[ds] = pd.DataFrame.from_dict(table, orient="index", columns=modes).rename_axis("pipeline")
    return out


SPEEDUP_MODES = ("loader", "train")  # replay times the model alone: a speedup there is noise


def speedups(rows: pd.DataFrame) -> pd.DataFrame:
    """One row per dataset x mode x pipeline x baseline: ratio, lo, hi (see the module docstring)."""
    st = stats(rows, N.EPOCH_S)
    st = st[st["mode"].isin(SPEEDUP_MODES)]
    out = []
    for (ds, mode), g in st.groupby(["dataset", "mode"], dropna=False):
        by = g.set_index("pipeline")
        for base in N.BASELINES:
            if base not in by.index:
                continue
            b = by.loc[base]
            for p, r in by.iterrows():
                out.append({
                    "dataset": ds, "mode": mode, "pipeline": p, "baseline": base,
                    "ratio": b["median"] / r["median"],
                    "lo": b["q25"] / r["q75"], "hi": b["q75"] / r["q25"],
                })
    return pd.DataFrame(out, columns=["dataset", "mode", "pipeline", "baseline", "ratio", "lo", "hi"])


def speedup_tables(rows: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """dataset -> rows pipeline, columns ``vs <baseline> (<mode>)``: ``3.1x [2.8-3.4]`` or a status."""
    sp = speedups(rows)
    st = stats(rows, N.EPOCH_S)
    out = {}
    for ds, (pipes, modes) in combos(rows).items():
        def have(p: str, m: str, ds: str = ds) -> bool:
            return bool(((st["dataset"] == ds) & (st["pipeline"] == p) & (st["mode"] == m)).any())

        cols = [(b, m) for b in N.BASELINES for m in modes if m in SPEEDUP_MODES]
        table = {}
        for p in pipes:
            r = {}
            for b, m in cols:
                hit = sp[(sp["dataset"] == ds) & (sp["pipeline"] == p) & (sp["baseline"] == b) & (sp["mode"] == m)]
                if len(hit):
                    h = hit.iloc[0]
                    r[f"vs {b} ({m})"] = f"{h['ratio']:.2f}x [{h['lo']:.2f}-{h['hi']:.2f}]"
                elif not have(p, m):
                    r[f"vs {b} ({m})"] = status_of(rows, ds, p, m)
                else:  # the baseline has no samples: say why, once per column
                    r[f"vs {b} ({m})"] = f"n/a: {b} {status_of(rows, ds, b, m)}"
            table[p] = r
        out[ds] = pd.DataFrame.from_dict(table, orient="index").rename_axis("pipeline")
    return out


def epoch_split(rows: pd.DataFrame) -> pd.DataFrame:
    """Per dataset x pipeline x mode: median epoch time, data wait and compute (s)."""
    parts = {"epoch_s": N.EPOCH_S, "data_wait_s": N.DATA_WAIT_S, "compute_s": N.COMPUTE_S}
    frames = []
    for name, metric_names in parts.items():
        st = stats(rows, metric_names)[[*GROUP, "median", "iqr"]]
        frames.append(st.rename(columns={"median": name, "iqr": f"{name}_iqr"}).set_index(GROUP))
    df = pd.concat(frames, axis=1).reset_index() if frames else pd.DataFrame()
    return df


def cells_table(markers: dict[str, dict[str, Any]], cells: list[dict[str, Any]]) -> pd.DataFrame:
    """Every cell of the sweep: kind, status (``not finished`` when it has no marker), wall time, reason."""
    out = []
    for c in cells:
        m = markers.get(c["id"])
        out.append({
            "cell": c["id"], "kind": c["kind"],
            "status": m["status"] if m else "not finished",
            "wall s": f"{m['wall_s']:.1f}" if m else "—",
            "reason": (m.get("reason") or "") if m else "",
        })
    return pd.DataFrame(out, columns=["cell", "kind", "status", "wall s", "reason"])


COMPARE_COLUMNS = {
    "method": "method", "variant": "variant", "match": "match", "quality": "JPEG q",
    "file_bytes": "bytes/img", "header_free_bytes": "header-free bytes/img", "bpp": "bpp",
    "pct_raw": "% raw RGB", "psnr": "PSNR dB", "ssim": "SSIM", "status": "status",
}


def compare_table(summary: pd.DataFrame) -> pd.DataFrame:
    """The PSNR/size table of one compare cell: INR variants and JPEG at matched bytes
    (the plain quality sweep is a figure, not table rows). Unreachable targets stay as rows."""
    s = summary[summary["method"] != "jpeg-sweep"].copy()
    out = pd.DataFrame()
    for col, title in COMPARE_COLUMNS.items():
        if col not in s:
            continue
        v = s[col]
        if col in ("file_bytes", "header_free_bytes"):
            out[title] = [fmt_num(x) for x in v]
        elif col in ("bpp", "pct_raw", "psnr", "quality"):
            out[title] = [("—" if pd.isna(x) else f"{x:.2f}" if col != "quality" else f"{x:.0f}") for x in v]
        elif col == "ssim":
            out[title] = ["—" if pd.isna(x) else f"{x:.3f}" for x in v]
        else:
            out[title] = ["" if pd.isna(x) else str(x) for x in v]
    if "status" in s and "min_bytes" in s:
        out["status"] = [
            f"unreachable (smallest JPEG {fmt_num(mb)} B)" if st == "unreachable" and not pd.isna(mb) else st
            for st, mb in zip(s["status"], s["min_bytes"], strict=True)
        ]
    return out.reset_index(drop=True)


def headline(rows: pd.DataFrame, bytes_per_image) -> dict[str, pd.DataFrame]:
    """dataset -> one row per pipeline: bytes/image, loader and train images/s, train speedups, accuracy.

    bytes_per_image: ``f(dataset, pipeline) -> float`` (NaN when unknown).
    """
    ips = stats(rows, N.IMAGES_PER_S)
    acc = stats(rows, N.ACCURACY, steady=False)
    sp = speedups(rows)
    out = {}
    for ds, (pipes, modes) in combos(rows).items():
        recs = []
        for p in pipes:
            r: dict[str, str] = {"pipeline": p, "bytes/image": fmt_num(bytes_per_image(ds, p))}
            for m in ("loader", "train"):
                if m not in modes:
                    continue
                hit = ips[(ips["dataset"] == ds) & (ips["pipeline"] == p) & (ips["mode"] == m)]
                r[f"{m} img/s"] = fmt_num(hit.iloc[0]["median"]) if len(hit) else status_of(rows, ds, p, m)
            if "train" in modes:
                for b in N.BASELINES:
                    hit = sp[(sp["dataset"] == ds) & (sp["pipeline"] == p) & (sp["baseline"] == b)
                             & (sp["mode"] == "train")]
                    r[f"train speedup vs {b}"] = f"{hit.iloc[0]['ratio']:.2f}x" if len(hit) else "—"
                hit = acc[(acc["dataset"] == ds) & (acc["pipeline"] == p) & (acc["mode"] == "train")]
                r["test acc %"] = f"{100 * hit.iloc[0]['median']:.1f}" if len(hit) else "—"
            recs.append(r)
        out[ds] = pd.DataFrame(recs)
    return out
