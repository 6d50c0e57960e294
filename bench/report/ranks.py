"""Per-rank epoch times of data-parallel runs (``inrbench bench --nproc N``): which rank lags.

Reads the per-rank rows (``ReportInputs.rank_rows``: ``rank`` = r, each rank's own clock on its
own shard), never the aggregate rows. Per dataset x mode x pipeline x rank: the median epoch time
(s) over the rank's steady-state samples (repeats x epochs) with its IQR, the measure the speedup
tables use; and, where the rows carry the per-step split, the wait share = median data wait /
(median data wait + median compute), as in the epoch-split table. The spread of a pipeline is
the epoch time of its slowest rank / that of its fastest (the aggregate rows take the slowest
rank's time): the ratio of the two ranks' geometric-mean epoch times with Welch's t interval on the
logs of their epochs (``bench.stats.log_ratio_ci``). The two ranks are picked by those geometric means
(so the ratio is never below 1; picked by medians, a rank with a few slow epochs could print 0.7x as
'slowest / fastest'), out of k (k - 1) / 2 possible pairs: a plain 95% interval of the picked pair excludes 1.0 far more often
than 5% when all ranks are alike (21 of 100 simulated 8-rank runs, ``tests/test_report_ranks.py``), so
the interval is at the Bonferroni level ``bench.stats.bonferroni(k (k - 1) / 2)`` (99.82% for 8 ranks),
which holds for every pair at once and so for the one picked. (It was a bootstrap of the medians,
which with 3 epochs a rank excluded 1.0 in 29% of alike 4-rank runs at the stated family-wise 5%.)
Welch's interval keeps its level at any number of epochs (wide with few). One epoch on a rank, or no
spread: the ratio, no interval. The samples are the ranks' epochs, not their
repeats (unlike the speedups, ``bench.stats.unit_ratio_ci``): the question is which rank lagged
in this run, whose epochs are the population, and every rank is one process for the whole run. Runs of one (dataset, mode) pool per rank, like the main tables pool runs. A
(dataset, mode) with fewer than two ranks gets no table.
"""

from __future__ import annotations

import pandas as pd

from bench import stats as S
from bench.report import names as N
from bench.report import tables as T

RANK_GROUP = [*T.GROUP, "rank"]
PER_RANK_COLUMNS = ["dataset", "mode", "pipeline", "rank", "epoch_s", "epoch_s_iqr", "wait_share"]
SPREAD_COLUMNS = ["dataset", "mode", "pipeline", "slowest", "fastest", "ratio", "lo", "hi", "n", "why"]
SPREAD_ROW = "slowest / fastest"


def per_rank(rank_rows: pd.DataFrame | None) -> pd.DataFrame:
    """One row per dataset x mode x pipeline x rank with ok epoch samples: median epoch time, its
    IQR and the wait share (NaN where the rows carry no data-wait / compute split)."""
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
    """Per dataset x mode x pipeline with at least two ranks: the slowest and fastest rank (by
    geometric-mean epoch time), ``ratio`` = their ratio of geometric-mean epoch times (>= 1), and Welch's t ``lo``/``hi``
    on the logs at the Bonferroni level over the k (k - 1) / 2 rank pairs; ``n`` = the fewer epochs of
    the two; NaN bounds (``why`` says why) with one epoch on a rank, or no spread."""
    per = per_rank(rank_rows) if per is None else per
    out = []
    for (ds, mode, p), g in per.groupby(["dataset", "mode", "pipeline"], sort=False):
        if len(g) < 2:
            continue
        # picked by the geometric means the ratio compares (by medians the printed ratio could fall below 1)
        samples = {int(r): _rank_samples(rank_rows, ds, p, mode, int(r)) for r in g["rank"]}
        gm = pd.Series({r: _log_mean(x) for r, x in samples.items()}).dropna()
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


def _log_mean(x) -> float:
    """Mean log of the positive finite samples ``x`` (NaN without any): what ``log_ratio_ci`` compares."""
    import numpy as np

    v = np.asarray(x, dtype=float)
    v = v[np.isfinite(v) & (v > 0)]
    return float(np.log(v).mean()) if v.size else float("nan")


def _rank_samples(rank_rows: pd.DataFrame, dataset: str, pipeline: str, mode: str, rank: int):
    return T.samples(rank_rows[rank_rows["rank"] == rank], N.EPOCH_S, dataset, pipeline, mode)


def fmt_rank(h) -> str:
    """``0.52 (IQR 0.01), wait 12%`` (no wait part without the split)."""
    s = T.fmt_median_iqr(h["epoch_s"], h["epoch_s_iqr"])
    return s if pd.isna(h["wait_share"]) else f"{s}, wait {100 * h['wait_share']:.0f}%"


def fmt_spread(h) -> str:
    """``1.50x [1.36-1.64] (rank 1 / rank 0)`` (``bench.stats.fmt_ratio``'s rounding); ``: no difference
    detected`` when the interval holds 1.0; ``1.50x (rank 1 / rank 0): no interval (no spread), not a result``
    without one."""
    iv = S.Interval(h["ratio"], h["lo"], h["hi"])
    who = f"(rank {h['slowest']} / rank {h['fastest']})"
    if not iv.ok:
        why = h.get("why") if isinstance(h.get("why"), str) and h.get("why") else S.NO_SPREAD
        return f"{iv.value:.2f}x {who}: no interval ({why}), not a result"
    if not iv.excludes(1.0):
        return f"{iv.value:.2f}x {S.fmt_ratio(iv).removeprefix(S.NO_DIFFERENCE + ' ')} {who}: {S.NO_DIFFERENCE}"
    text = S.fmt_ratio(iv)
    return f"{text} {who}"


def rank_tables(rank_rows: pd.DataFrame | None) -> dict[tuple[str, str], pd.DataFrame]:
    """(dataset, mode) with at least two ranks -> rows ``rank`` (0..N-1, then ``slowest / fastest``),
    columns pipeline: ``fmt_rank`` of each rank, ``fmt_spread`` in the last row; ``—`` where a
    pipeline has no ok epoch of that rank."""
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
                col = {str(r): fmt_rank(hits[r]) if r in hits else "—" for r in ranks}
                s = sp[(sp["dataset"] == ds) & (sp["mode"] == mode) & (sp["pipeline"] == p)]
                col[SPREAD_ROW] = fmt_spread(s.iloc[0]) if len(s) else "—"
                table[p] = col
            out[(ds, mode)] = pd.DataFrame(table).rename_axis("rank")
    return out
