"""Report tables: tidy frames (figures) and formatted frames (markdown); a cell without ok samples shows
its status, never 0. Statistics and protocol: ``bench.stats``, docs/measurement.md."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from bench import stats as S
from bench.compare.table import psnr_diff_text
from bench.report import names as N
from bench.report import settings

GROUP = ["dataset", "pipeline", "mode"]


def order_rank(v, order) -> tuple[int, str]:
    """A sort key: the preferred ``order`` first, unknown values after it alphabetically."""
    return (order.index(v) if v in order else len(order), str(v))


def order_key(values, order) -> list:
    """``values`` sorted by ``order_rank``."""
    return sorted(values, key=lambda v: order_rank(v, order))


def fmt_num(x: float, digits: int = 3) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "—"
    ax = abs(x)
    if ax >= 999.5:  # 999.7 rounds to 1,000: thousands separated like its neighbours
        return f"{x:,.0f}"
    if ax >= 100:
        return f"{x:.0f}"
    if 0 < ax < 1e-3:  # positional, never 8.85e-05
        return np.format_float_positional(x, precision=digits, fractional=False, trim="-")
    return f"{x:.{digits}g}"


def fmt_bytes(x: float) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "—"
    for unit, k in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(x) >= k:
            v = x / k
            return f"{v:.3g} {unit}" if abs(v) < 1000 else f"{v:,.0f} {unit}"  # never 1.01e+03 KiB
    return f"{x:.0f} B"


def fmt_median_iqr(median: float, iqr: float, fmt=fmt_num, n: int | None = None) -> str:
    """``12.3 (IQR 0.4)``; ``12.3 (one sample)`` when ``n`` is 1 (an IQR of 0 would read as no spread)."""
    if n == 1:
        return f"{fmt(median)} (one sample)"
    return f"{fmt(median)} (IQR {fmt(iqr)})"


def stats(rows: pd.DataFrame, metric_names: tuple[str, ...], steady: bool = True,
          group: list[str] = GROUP) -> pd.DataFrame:
    """median/q25/q75/iqr/n of the first present metric per ``group``; ``steady``: epoch rows only, if any."""
    m = N.first_present(rows["metric"].dropna().unique(), metric_names)
    cols = [*group, "median", "q25", "q75", "iqr", "n"]
    if m is None:
        return pd.DataFrame(columns=cols)
    d = rows[(rows["metric"] == m) & (rows["status"] == "ok")]
    if steady and d["epoch"].notna().any():
        d = d[d["epoch"].notna()]
    if d.empty:
        return pd.DataFrame(columns=cols)
    g = d.groupby(group, dropna=False)["value"]
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
                r[mode] = (fmt_median_iqr(hit.iloc[0]["median"], hit.iloc[0]["iqr"], fmt, int(hit.iloc[0]["n"])) if len(hit)
                           else status_of(rows, ds, p, mode))
            table[p] = r
        out[ds] = pd.DataFrame.from_dict(table, orient="index", columns=modes).rename_axis("pipeline")
    return out


SPEEDUP_MODES = ("loader", "train")  # replay times the model alone: a speedup there is noise
SPEEDUP_COLUMNS = ["dataset", "mode", "pipeline", "baseline", "ratio", "lo", "hi", "detected", "flagged", "why"]
MEASUREMENT_PROBLEM = "measurement problem (see Sanity checks)"
ONE_PROCESS = "one process: no interval, not a result"


def _ok(rows: pd.DataFrame, metric_names: tuple[str, ...], dataset: str, pipeline: str, mode: str) -> pd.DataFrame:
    """The ok steady-state rows (epoch rows, if any) of the first present metric for one combination."""
    m = N.first_present(rows["metric"].dropna().unique(), metric_names)
    d = rows[(rows["metric"] == m) & (rows["status"] == "ok") & (rows["dataset"] == dataset)
             & (rows["pipeline"] == pipeline) & (rows["mode"] == mode)]
    return d[d["epoch"].notna()] if d["epoch"].notna().any() else d


def samples(rows: pd.DataFrame, metric_names: tuple[str, ...], dataset: str, pipeline: str, mode: str) -> np.ndarray:
    """The ok samples (repeats x epochs) of the first present metric for one combination."""
    return _ok(rows, metric_names, dataset, pipeline, mode)["value"].to_numpy(float)


CEILING_MARGIN = 0.05  # raw is a ceiling where it is shown to train within 5% of its replay


def unit_samples(rows: pd.DataFrame, metric_names: tuple[str, ...], dataset: str, pipeline: str,
                 mode: str) -> list[np.ndarray]:
    """``samples``, one array per run (process): the unit ``bench.stats.unit_ratio_ci`` counts once."""
    d = _ok(rows, metric_names, dataset, pipeline, mode)
    return [g.to_numpy(float) for _, g in d["value"].groupby(d["run_id"].astype(str), sort=True)]


def epoch_ratio(rows: pd.DataFrame, dataset: str, ref: tuple[str, str], other: tuple[str, str]) -> S.Interval:
    """Epoch time of ``ref`` = (pipeline, mode) / that of ``other``, processes (runs) as units."""
    return S.unit_ratio_ci(unit_samples(rows, N.EPOCH_S, dataset, *ref), unit_samples(rows, N.EPOCH_S, dataset, *other))


def _settings_differ(rows: pd.DataFrame, dataset: str, a: tuple[str, str], b: tuple[str, str]) -> list[str]:
    """Short names of the settings in which the runs of (pipeline, mode) ``a`` and ``b`` differ."""
    def sel(pm: tuple[str, str]) -> pd.DataFrame:
        return rows[(rows["dataset"] == dataset) & (rows["pipeline"] == pm[0]) & (rows["mode"] == pm[1])
                    & rows["run_id"].notna() & ~rows["run_id"].astype(str).str.startswith("sweep:")]

    return [settings.short(k) for k in settings.differing(sel(a), sel(b))]


def sanity_checks(rows: pd.DataFrame) -> pd.DataFrame:
    """Impossible orderings per dataset and pipeline: faster than raw end to end (raw train / P train)
    and train faster than replay (P replay / P train); ``flagged`` where the interval lies above its
    bound. raw is a ceiling only where its replay / train interval lies at or above ``1 - CEILING_MARGIN``
    (bound ``1 / lo``); elsewhere ``note`` says why the raw check does not apply."""
    st = stats(rows, N.EPOCH_S)
    have = set(zip(st["dataset"], st["pipeline"], st["mode"], strict=True))
    out = []
    for ds, (pipes, _) in combos(rows).items():
        raw_note, raw_bound = "not applicable: no raw replay run shows raw's own compute ceiling", 1.0
        if (ds, "raw", "train") in have and (ds, "raw", "replay") in have:
            own = epoch_ratio(rows, ds, ("raw", "replay"), ("raw", "train"))
            shown = f"({own.value:.2f} [{own.lo:.2f}-{own.hi:.2f}])"
            diff = _settings_differ(rows, ds, ("raw", "replay"), ("raw", "train"))
            if diff:
                raw_note = (f"not applicable: raw's replay and train ran at different settings "
                            f"({', '.join(diff)}): no proven ceiling")
            elif not own.ok:
                raw_note = "not applicable: raw's replay / train interval needs 2 processes of each"
            elif own.lo >= 1.0 - CEILING_MARGIN:
                raw_note, raw_bound = "", max(1.0, 1.0 / own.lo)
            elif own.hi < 1.0:
                raw_note = (f"not applicable: raw trains slower than its replay {shown}, its data work is "
                            "not hidden: no ceiling here")
            else:
                raw_note = (f"not applicable: raw is not shown to train within {CEILING_MARGIN:.0%} of its "
                            f"replay {shown}: no proven ceiling")
        for p in pipes:
            if (ds, p, "train") not in have:
                continue
            checks = []
            if p != "raw" and (ds, "raw", "train") in have:
                checks.append(("faster than raw end to end (raw train / train)", ("raw", "train"), raw_note, raw_bound))
            if (ds, p, "replay") in have:
                checks.append(("train faster than replay (replay / train)", (p, "replay"), "", 1.0))
            for name, ref, note, bound in checks:
                iv = epoch_ratio(rows, ds, ref, (p, "train"))
                if not iv.ok and not note:
                    note = "cannot be checked: needs 2 processes of each"
                if not note and ref[1] != "train":  # across modes: only alike settings compare
                    diff = _settings_differ(rows, ds, ref, (p, "train"))
                    if diff:
                        note = f"not applicable: {ref[1]} and train ran at different settings ({', '.join(diff)})"
                out.append({"dataset": ds, "pipeline": p, "check": name, "ratio": iv.value, "lo": iv.lo,
                            "hi": iv.hi, "flagged": bool(iv.ok and iv.lo > bound and not note), "note": note})
    return pd.DataFrame(out, columns=["dataset", "pipeline", "check", "ratio", "lo", "hi", "flagged", "note"])


def flagged_train(rows: pd.DataFrame, checks: pd.DataFrame | None = None) -> set[tuple[str, str]]:
    """(dataset, pipeline) whose train epochs failed a sanity check."""
    c = sanity_checks(rows) if checks is None else checks
    return {(d, p) for d, p in zip(c.loc[c["flagged"], "dataset"], c.loc[c["flagged"], "pipeline"], strict=True)}


def speedups(rows: pd.DataFrame, checks: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per dataset x mode x pipeline x baseline: epoch-time ratio, interval, ``detected`` (excludes 1.0)
    and ``flagged`` (the pipeline's or baseline's train epochs failed a sanity check; ``checks``: those of
    ``rows`` where already computed)."""
    st = stats(rows, N.EPOCH_S)
    st = st[st["mode"].isin(SPEEDUP_MODES)]
    bad = flagged_train(rows, checks)
    out = []
    for (ds, mode), g in st.groupby(["dataset", "mode"], dropna=False):
        pipes = list(g["pipeline"])
        for base in N.BASELINES:
            if base not in pipes:
                continue
            for p in pipes:
                iv = epoch_ratio(rows, ds, (base, mode), (p, mode))
                out.append({
                    "dataset": ds, "mode": mode, "pipeline": p, "baseline": base,
                    "ratio": iv.value, "lo": iv.lo, "hi": iv.hi, "detected": p != base and iv.excludes(1.0),
                    "flagged": mode == "train" and ((ds, p) in bad or (ds, base) in bad),
                    "why": iv.why,
                })
    return pd.DataFrame(out, columns=SPEEDUP_COLUMNS)


def fmt_speedup(h) -> str:
    """One speedup row -> ``1.21x [0.97-1.48]``, ``no difference detected [...]``, baseline or problem note."""
    if h["flagged"]:
        return MEASUREMENT_PROBLEM
    if h["pipeline"] == h["baseline"]:
        return "1.00x (baseline)"
    iv = S.Interval(h["ratio"], h["lo"], h["hi"])
    if not iv.ok and math.isfinite(h["ratio"]):
        if h.get("why") == S.NO_SPREAD:
            return f"{h['ratio']:.2f}x (no spread: no interval, not a result)"
        return f"{h['ratio']:.2f}x ({ONE_PROCESS})"
    return S.fmt_ratio(iv)


def speedup_tables(rows: pd.DataFrame, sp: pd.DataFrame | None = None) -> dict[str, pd.DataFrame]:
    """dataset -> rows pipeline, columns ``vs <baseline> (<mode>)``: ``3.1x [2.8-3.4]`` or a status (``sp``: the
    ``speedups`` of ``rows`` where already computed)."""
    sp = speedups(rows) if sp is None else sp
    st = stats(rows, N.EPOCH_S)
    out = {}
    for ds, (pipes, modes) in combos(rows).items():
        cols = [(b, m) for b in N.BASELINES for m in modes if m in SPEEDUP_MODES]
        table = {p: {f"vs {b} ({m})": _speedup_cell(rows, sp, st, (ds, p, m), b, status_of(rows, ds, p, m))
                     for b, m in cols} for p in pipes}
        out[ds] = pd.DataFrame.from_dict(table, orient="index").rename_axis("pipeline")
    return out


def _speedup_cell(rows: pd.DataFrame, sp: pd.DataFrame, st: pd.DataFrame, at: tuple[str, str, str], base: str,
                  missing: str) -> str:
    """The speedup of (dataset, pipeline, mode) ``at`` over ``base``; ``missing`` where the pipeline has no
    ``st`` samples; else the baseline's status."""
    ds, p, m = at
    hit = sp[(sp["dataset"] == ds) & (sp["pipeline"] == p) & (sp["baseline"] == base) & (sp["mode"] == m)]
    if len(hit):
        return fmt_speedup(hit.iloc[0])
    has = ((st["dataset"] == ds) & (st["pipeline"] == p) & (st["mode"] == m)).any()
    return f"n/a: {base} {status_of(rows, ds, base, m)}" if has else missing


COMPARE_COLUMNS = {
    "method": "method", "variant": "variant", "match": "match", "quality": "JPEG q",
    "file_bytes": "bytes/img", "header_free_bytes": "header-free bytes/img", "bpp": "bpp",
    "pct_raw": "% raw RGB", "psnr": "PSNR dB", "ssim": "SSIM", "status": "status",
}


def compare_table(summary: pd.DataFrame) -> pd.DataFrame:
    """One compare cell's PSNR/size table: INR variants and JPEG at matched bytes (not the quality sweep)."""
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
    if "psnr_diff" in s:
        out["INR − JPEG dB [95% CI]"] = [psnr_diff_text(r) if r["method"] == "jpeg-matched" else ""
                                         for _, r in s.iterrows()]
    if "status" in s and "min_bytes" in s:
        out["status"] = [
            f"unreachable (smallest JPEG {fmt_num(mb)} B)" if st == "unreachable" and not pd.isna(mb) else st
            for st, mb in zip(s["status"], s["min_bytes"], strict=True)
        ]
    return out.reset_index(drop=True)


ACC_REFERENCES = ("raw", "torch-jpeg")  # accuracy is compared against the original pixels and the baseline
ACC_COLUMNS = ["dataset", "pipeline", "k", "n", "acc", "lo", "hi", "repeats", "seed", "run_id"]


OTHER_LOAD_WARN = 0.25  # cores busy outside the run, per repeat, above which the report warns


def other_load(rows: pd.DataFrame) -> pd.DataFrame:
    """Per dataset x pipeline x mode with a repeat over ``OTHER_LOAD_WARN`` other cores busy: median, max, count."""
    cols = [*GROUP, "median", "max", "repeats_over", "repeats"]
    d = rows[(rows["metric"].isin(N.OTHER_BUSY)) & (rows["status"] == "ok")]
    if d.empty:
        return pd.DataFrame(columns=cols)
    g = d.groupby(GROUP, dropna=False)["value"]
    out = g.agg(median="median", max="max", repeats_over=lambda v: int((v > OTHER_LOAD_WARN).sum()),
                repeats="count").reset_index()
    return out[out["repeats_over"] > 0][cols].reset_index(drop=True)


SEED = "cfg.pipe.seed"  # bench's --seed: shuffling, augmentation and model init
NO_SEED = 0  # the seed of a run that did not record one (older results; bench's default)
SEED_COLUMNS = ["dataset", "pipeline", "seed", "run_id", "acc"]
OVER_SEEDS_COLUMNS = ["dataset", "pipeline", "seeds", "acc", "lo", "hi"]


def run_seeds(rows: pd.DataFrame) -> dict[str, int]:
    """run_id -> its training seed (``cfg.pipe.seed``); ``NO_SEED`` where a run recorded none."""
    runs = pd.unique(rows["run_id"].dropna())
    if SEED not in rows:
        return {str(r): NO_SEED for r in runs}
    s = pd.to_numeric(rows.groupby("run_id", sort=False)[SEED].first(), errors="coerce")
    return {str(r): int(s[r]) if r in s.index and pd.notna(s[r]) else NO_SEED for r in runs}


def _train_acc(rows: pd.DataFrame) -> pd.DataFrame:
    """ok train-mode accuracy rows: dataset, pipeline, run_id, repeat, value, seed."""
    m = N.first_present(rows["metric"].dropna().unique(), N.ACCURACY)
    if m is None:
        return pd.DataFrame(columns=["dataset", "pipeline", "run_id", "repeat", "value", "seed"])
    ok = rows[(rows["status"] == "ok") & (rows["mode"] == "train") & (rows["metric"] == m)]
    a = ok[["dataset", "pipeline", "run_id", "repeat", "value"]].copy()
    a["seed"] = a["run_id"].map(run_seeds(rows)).astype("Int64")
    return _one_schedule(a, rows)


SCHEDULE = ("cfg.warmup", "cfg.epochs")  # a train run's length: not a timing setting, but accuracy's


def schedules(rows: pd.DataFrame) -> dict[str, str]:
    """run_id -> its training schedule, ``"W+E epochs"`` (warm-up + measured); ``""`` where not recorded."""
    cols = [c for c in SCHEDULE if c in rows]
    if len(cols) < len(SCHEDULE):
        return {}
    first = rows.groupby("run_id", sort=False)[cols].first()
    return {str(r): (f"{int(w)}+{int(e)} epochs" if pd.notna(w) and pd.notna(e) else "")
            for r, (w, e) in first.iterrows()}


def _one_schedule(a: pd.DataFrame, rows: pd.DataFrame) -> pd.DataFrame:
    """``a`` (accuracy rows) with, per dataset, only the runs of the schedule most runs used (ties: the
    longest): models trained for other epoch counts are not samples of one accuracy."""
    sched = schedules(rows)
    if not sched or a.empty:
        return a
    a = a.assign(schedule=a["run_id"].astype(str).map(sched).fillna(""))
    keep = []
    for _, g in a.groupby("dataset"):
        runs = g.drop_duplicates("run_id")["schedule"].value_counts()
        if len(runs) > 1:
            # ties: the longest ("1+29 epochs" -> 30 epochs; "" not recorded -> 0)
            best = max(runs.index, key=lambda sc: (runs[sc], sum(int(v) for v in sc.split()[0].split("+")) if sc else 0))
            g = g[g["schedule"] == best]
        keep.append(g)
    return pd.concat(keep).drop(columns="schedule")


def dropped_schedules(rows: pd.DataFrame) -> dict[str, dict[str, int]]:
    """dataset -> {schedule: train runs} that ``_one_schedule`` leaves out."""
    m = N.first_present(rows["metric"].dropna().unique(), N.ACCURACY)
    if m is None:
        return {}
    ok = rows[(rows["status"] == "ok") & (rows["mode"] == "train") & (rows["metric"] == m)]
    sched = schedules(rows)
    kept = set(_train_acc(rows)["run_id"].astype(str))
    out: dict[str, dict[str, int]] = {}
    for ds, g in ok.drop_duplicates("run_id").groupby("dataset"):
        left = [sched.get(str(r), "") for r in g["run_id"].astype(str) if str(r) not in kept]
        if left:
            out[str(ds)] = {sc or "unrecorded": left.count(sc) for sc in dict.fromkeys(left)}
    return out


def model_seeds(a: pd.DataFrame) -> dict[tuple[str, str], int]:
    """(dataset, pipeline) -> the seed of the model shown: the lowest seed all the dataset's pipelines
    have, else the pipeline's own lowest. ``a``: ``_train_acc`` rows."""
    out = {}
    for ds, g in a.groupby("dataset"):
        per_pipe = {p: set(int(s) for s in gp["seed"]) for p, gp in g.groupby("pipeline")}
        common = set.intersection(*per_pipe.values())
        for p, seeds in per_pipe.items():
            out[(ds, p)] = min(common) if common else min(seeds)
    return out


def accuracy(rows: pd.DataFrame) -> pd.DataFrame:
    """Test accuracy of one trained model per dataset x pipeline (first run of its ``model_seeds`` seed):
    the mean over that run's repeats as ``k`` of one repeat's ``n`` test images, with its Wilson interval
    (repeats score the same images: pooling them would narrow it falsely). No ``test_images``: median, NaN."""
    a = _train_acc(rows)
    if a.empty:
        return pd.DataFrame(columns=ACC_COLUMNS)
    ok = rows[(rows["status"] == "ok") & (rows["mode"] == "train")]
    n = ok[ok["metric"].isin(N.TEST_IMAGES)][["run_id", "repeat", "value"]].rename(columns={"value": "n"})
    a = a.merge(n, on=["run_id", "repeat"], how="left")
    seed_of = model_seeds(a)
    out = []
    for (ds, p), g in a.groupby(["dataset", "pipeline"]):
        seed = seed_of[(ds, p)]
        g = g[g["seed"] == seed]
        run = sorted(g["run_id"].astype(str).unique())[0]  # run ids sort by start time
        g = g[g["run_id"].astype(str) == run]
        k = n1 = np.nan
        iv = S.Interval(g["value"].median(), np.nan, np.nan)
        if g["n"].notna().all():
            n1 = int(g["n"].min())
            k = int(round(float((g["value"] * g["n"]).sum() / g["n"].sum()) * n1))
            iv = S.wilson(k, n1)
        out.append({"dataset": ds, "pipeline": p, "k": k, "n": n1, "acc": iv.value, "lo": iv.lo,
                    "hi": iv.hi, "repeats": len(g), "seed": seed, "run_id": run})
    return pd.DataFrame(out, columns=ACC_COLUMNS)


def fmt_accuracy(h) -> str:
    """``93.8 [86.2-97.3]`` (%, Wilson), or the bare percentage without an interval."""
    if pd.isna(h["lo"]):
        return f"{100 * h['acc']:.1f}"
    return f"{100 * h['acc']:.1f} [{100 * h['lo']:.1f}-{100 * h['hi']:.1f}]"


def seed_accuracy(rows: pd.DataFrame) -> pd.DataFrame:
    """Per dataset x pipeline x training seed: the test accuracy of that seed's first run, first repeat
    (further runs of one seed train the same model)."""
    a = _train_acc(rows)
    if a.empty:
        return pd.DataFrame(columns=SEED_COLUMNS)
    a = a.sort_values(["run_id", "repeat"], kind="stable")
    a = a.groupby(["dataset", "pipeline", "run_id"], sort=False).head(1)  # each run's first repeat
    a = a.groupby(["dataset", "pipeline", "seed"], sort=True).head(1)  # each seed's first run
    a = a.rename(columns={"value": "acc"}).sort_values(["dataset", "pipeline", "seed"])
    return a[SEED_COLUMNS].reset_index(drop=True)


def accuracy_over_seeds(per_seed: pd.DataFrame) -> pd.DataFrame:
    """Per dataset x pipeline: mean accuracy over ``seed_accuracy``'s seeds with Student's t 95% interval."""
    out = []
    for (ds, p), g in per_seed.groupby(["dataset", "pipeline"]):
        iv = S.mean_ci(g["acc"].astype(float))
        out.append({"dataset": ds, "pipeline": p, "seeds": len(g), "acc": iv.value, "lo": iv.lo, "hi": iv.hi})
    return pd.DataFrame(out, columns=OVER_SEEDS_COLUMNS)


def seed_diff(per_seed: pd.DataFrame, dataset: str, pipeline: str, reference: str) -> S.Interval:
    """Accuracy of ``pipeline`` minus ``reference``, paired by common training seed, paired t interval."""
    d = per_seed[per_seed["dataset"] == dataset]
    x = d[d["pipeline"] == pipeline].set_index("seed")["acc"]
    y = d[d["pipeline"] == reference].set_index("seed")["acc"]
    common = sorted(set(x.index) & set(y.index))
    if not common:
        return S.NAN
    return S.paired_mean_diff_ci(x[common].astype(float), y[common].astype(float))


def fmt_over_seeds(h) -> str:
    """``91.2 [88.0-94.4]`` (%, t interval clipped to 0-100), or ``—`` with fewer than 2 seeds."""
    iv = S.Interval(h["acc"], h["lo"], h["hi"])
    if not iv.ok:
        return f"{100 * iv.value:.1f}, the same at all {int(h['seeds'])} seeds (no interval)" if h["seeds"] >= 2 else "—"
    return f"{100 * iv.value:.1f} [{100 * max(iv.lo, 0.0):.1f}-{100 * min(iv.hi, 1.0):.1f}]"


def mcnemar_runs(predictions: pd.DataFrame | None, run_a: str, run_b: str) -> S.McNemar | None:
    """Exact McNemar test of ``run_a``'s model against ``run_b``'s (first repeats), paired by test image."""
    if predictions is None or predictions.empty:
        return None
    sel = []
    for r in (run_a, run_b):
        d = predictions[predictions["run_id"].astype(str) == str(r)]
        if d.empty:
            return None
        sel.append(d[d["repeat"] == d["repeat"].min()])
    m = sel[0].merge(sel[1], on="image", suffixes=("_a", "_b"))
    if m.empty or len(m) != len(sel[0]) or (m["label_a"] != m["label_b"]).any():
        return None
    return S.mcnemar(m["prediction_a"] == m["label_a"], m["prediction_b"] == m["label_b"])


def fmt_mcnemar(t: S.McNemar | None) -> str:
    """``better (p=0.004)`` / ``worse (p=0.01)`` / ``no difference detected (p=0.39)``."""
    if t is None:
        return "—"
    if not t.significant():
        return f"{S.NO_DIFFERENCE} (p={t.p_value:.2g})"
    return f"{'better' if t.only_a > t.only_b else 'worse'} (p={t.p_value:.2g})"


def headline(rows: pd.DataFrame, bytes_per_image, sp: pd.DataFrame | None = None) -> dict[str, pd.DataFrame]:
    """dataset -> per pipeline: bytes/image (``bytes_per_image(ds, p)``), loader/train img/s (img/CPU-s on
    a CPU), train speedups and accuracy with their intervals."""
    ips = stats(rows, N.IMAGES_PER_S)
    cpu_ips = stats(rows, N.IMAGES_PER_CPU_S, steady=False)
    acc = accuracy(rows)
    sp = speedups(rows) if sp is None else sp
    b = bench_rows(rows)
    out = {}
    for ds, (pipes, modes) in combos(rows).items():
        device = b.loc[b["dataset"] == ds, "cfg.pipe.device"].dropna().astype(str) if "cfg.pipe.device" in b else ()
        on_cpu = bool(len(device)) and bool(device.str.startswith("cpu").all())  # the dataset's runs ran on the CPU
        recs = []
        for p in pipes:
            r: dict[str, str] = {"pipeline": p, "bytes/image": fmt_num(bytes_per_image(ds, p))}
            for m in ("loader", "train"):
                if m not in modes:
                    continue
                hit = ips[(ips["dataset"] == ds) & (ips["pipeline"] == p) & (ips["mode"] == m)]
                r[f"{m} img/s"] = fmt_num(hit.iloc[0]["median"]) if len(hit) else status_of(rows, ds, p, m)
            if "train" in modes and on_cpu:
                hit = cpu_ips[(cpu_ips["dataset"] == ds) & (cpu_ips["pipeline"] == p) & (cpu_ips["mode"] == "train")]
                r["train img/CPU-s"] = fmt_num(hit.iloc[0]["median"]) if len(hit) else "—"
            if "train" in modes:
                for b in N.BASELINES:  # no train samples: the train img/s column says why
                    r[f"train speedup vs {b}"] = _speedup_cell(rows, sp, ips, (ds, p, "train"), b, "—")
                hit = acc[(acc["dataset"] == ds) & (acc["pipeline"] == p)]
                r["test acc % [95% CI]"] = fmt_accuracy(hit.iloc[0]) if len(hit) else "—"
            recs.append(r)
        out[ds] = pd.DataFrame(recs)
    return out
