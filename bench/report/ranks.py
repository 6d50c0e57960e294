"""Per-rank epoch times of data-parallel runs (``rank_rows``): median (IQR), wait share, and the slowest
/ fastest rank spread (docs/measurement.md, "Per-rank spread")."""

from __future__ import annotations

import numpy as np
import pandas as pd

from bench import stats as S
from bench.report import names as N
from bench.report import tables as T

RANK_GROUP = [*T.GROUP, "rank"]
PER_RANK_COLUMNS = ["dataset", "mode", "pipeline", "rank", "epoch_s", "epoch_s_iqr", "wait_share"]
SPREAD_COLUMNS = ["dataset", "mode", "pipeline", "slowest", "fastest", "ratio", "lo", "hi", "n", "why"]
SPREAD_ROW = "slowest / fastest"


def per_rank(rank_rows: pd.DataFrame | None) -> pd.DataFrame:
    """Per dataset x mode x pipeline x rank: median epoch time, IQR and wait share (NaN without the split)."""
    if rank_rows is None or rank_rows.empty:
        return pd.DataFrame(columns=PER_RANK_COLUMNS)
    ep = T.stats(rank_rows, N.EPOCH_S, group=RANK_GROUP)
    if ep.empty:
        return pd.DataFrame(columns=PER_RANK_COLUMNS)
    out = ep.rename(columns={"median": "epoch_s", "iqr": "epoch_s_iqr"})[[*RANK_GROUP, "epoch_s", "epoch_s_iqr"]]
    for name, metric_names in (("wait", N.DATA_WAIT_S), ("compute", N.COMPUTE_S)):
        st = T.stats(rank_rows, metric_names, group=RANK_GROUP)[[*RANK_GROUP, "median"]]
        out = out.merge(st.rename(columns={"median": name}), on=RANK_GROUP, how="left")
    total = out["wait"] + out["compute"]
    out["wait_share"] = (out["wait"] / total).where(total > 0)
    out["rank"] = out["rank"].astype(int)
    return out[PER_RANK_COLUMNS].reset_index(drop=True)


def spreads(rank_rows: pd.DataFrame | None, per: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per dataset x mode x pipeline with two ranks or more: slowest and fastest rank, their ratio of
    geometric-mean epoch times (>= 1) and its Bonferroni-level interval (NaN bounds: ``why``)."""
    per = per_rank(rank_rows) if per is None else per
    out = []
    for (ds, mode, p), g in per.groupby(["dataset", "mode", "pipeline"], sort=False):
        if len(g) < 2:
            continue
        samples = {int(r): _rank_samples(rank_rows, ds, p, mode, int(r)) for r in g["rank"]}
        # mean log of the positive finite samples: what ``log_ratio_ci`` compares
        gm = pd.Series({r: pd.Series(np.log(x[np.isfinite(x) & (x > 0)])).mean() for r, x in samples.items()}).dropna()
        if len(gm) < 2:
            continue
        slow = int(gm.idxmax())
        fast = int(gm.drop(index=slow).idxmin())  # equal means: still two different ranks
        a, b = samples[slow], samples[fast]
        iv = S.log_ratio_ci(a, b, confidence=S.bonferroni(len(g) * (len(g) - 1) // 2))
        out.append({"dataset": ds, "mode": mode, "pipeline": p, "slowest": slow,
                    "fastest": fast, "ratio": iv.value, "lo": iv.lo, "hi": iv.hi, "n": iv.n,
                    "why": iv.why})
    return pd.DataFrame(out, columns=SPREAD_COLUMNS)


def _rank_samples(rank_rows: pd.DataFrame, dataset: str, pipeline: str, mode: str, rank: int):
    return T.samples(rank_rows[rank_rows["rank"] == rank], N.EPOCH_S, dataset, pipeline, mode)


def fmt_spread(h) -> str:
    """``1.50x [1.36-1.64] (rank 1 / rank 0)``, with ``: no difference detected`` or ``: no interval ...``."""
    iv = S.Interval(h["ratio"], h["lo"], h["hi"])
    who = f"(rank {h['slowest']} / rank {h['fastest']})"
    if not iv.ok:
        why = h.get("why") if isinstance(h.get("why"), str) and h.get("why") else S.NO_SPREAD
        return f"{iv.value:.2f}x {who}: no interval ({why}), not a result"
    if not iv.excludes(1.0):
        return f"{iv.value:.2f}x {S.fmt_ratio(iv).removeprefix(S.NO_DIFFERENCE + ' ')} {who}: {S.NO_DIFFERENCE}"
    return f"{S.fmt_ratio(iv)} {who}"


def rank_tables(rank_rows: pd.DataFrame | None) -> dict[tuple[str, str], pd.DataFrame]:
    """(dataset, mode) with two ranks or more -> rows rank then ``slowest / fastest``, columns pipeline."""
    per = per_rank(rank_rows)
    sp = spreads(rank_rows, per)
    out = {}
    for ds in sorted(per["dataset"].unique()):
        d = per[per["dataset"] == ds]
        for mode in T.order_key(d["mode"].unique(), N.MODE_ORDER):
            g = d[d["mode"] == mode]
            ranks = sorted(g["rank"].unique())
            if len(ranks) < 2:
                continue
            table = {}
            for p in T.order_key(g["pipeline"].unique(), N.PIPELINE_ORDER):
                hits = {h["rank"]: h for h in g[g["pipeline"] == p].to_dict("records")}
                # ``0.52 (IQR 0.01), wait 12%`` (no wait part without the split)
                col = {str(r): "—" if r not in hits else T.fmt_median_iqr(hits[r]["epoch_s"], hits[r]["epoch_s_iqr"])
                       + ("" if pd.isna(hits[r]["wait_share"]) else f", wait {100 * hits[r]['wait_share']:.0f}%")
                       for r in ranks}
                s = sp[(sp["dataset"] == ds) & (sp["mode"] == mode) & (sp["pipeline"] == p)]
                col[SPREAD_ROW] = fmt_spread(s.iloc[0]) if len(s) else "—"
                table[p] = col
            out[(ds, mode)] = pd.DataFrame(table).rename_axis("rank")
    return out
