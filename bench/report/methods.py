"""The training-method axis of a report: each pipeline's expand runs paired with its dense runs (time and
CPU-seconds ratios, accuracy, FLOPs, stages, time-to-accuracy); other sections read dense runs only."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pandas as pd

from bench import plotstyle
from bench import stats as S
from bench.report.figures import plt
from bench.report.tables import fmt_mcnemar, fmt_num, mcnemar_runs

METHOD_COL = "cfg.method"


def method_of(rows: pd.DataFrame) -> pd.Series:
    if METHOD_COL not in rows:
        return pd.Series("dense", index=rows.index)
    return rows[METHOD_COL].fillna("dense").astype(str)


def dense_inputs(x: Any) -> Any:
    """``ReportInputs`` less the method comparison's runs (non-dense, and dense ``--eval-every-epoch``)."""
    keep = _pipeline_run(x.rows)
    rank_rows = x.rank_rows
    keep_ranks = None if rank_rows is None else _pipeline_run(rank_rows)
    if keep.all() and (keep_ranks is None or keep_ranks.all()):
        return x
    rows = x.rows[keep]
    preds = x.predictions
    if preds is not None and len(preds):
        preds = preds[preds["run_id"].isin(set(rows["run_id"].dropna()))]
    if keep_ranks is not None:
        rank_rows = rank_rows[keep_ranks]
    return dataclasses.replace(x, rows=rows, predictions=preds, rank_rows=rank_rows)


def _pipeline_run(rows: pd.DataFrame) -> pd.Series:
    return (method_of(rows) == "dense") & ~_per_epoch_eval(rows)


def _per_epoch_eval(rows: pd.DataFrame) -> pd.Series:
    if "cfg.eval_every_epoch" not in rows:
        return pd.Series(False, index=rows.index)
    return rows["cfg.eval_every_epoch"].astype("boolean").fillna(False).astype(bool)


def pair_rows(rows: pd.DataFrame) -> pd.DataFrame:
    """Every non-dense run, and per dataset x pipeline the pair's dense runs (``--eval-every-epoch``) if any,
    else every dense run."""
    dense = method_of(rows) == "dense"
    paired = _per_epoch_eval(rows)
    key = rows["dataset"].astype(str) + "\0" + rows["pipeline"].astype(str)
    has_pair_dense = set(key[dense & paired])
    drop = dense & ~paired & key.isin(has_pair_dense)
    return rows[~drop]


def _train_ok(rows: pd.DataFrame) -> pd.DataFrame:
    d = rows[(rows["mode"] == "train") & (rows["status"] == "ok")].copy()
    d["method"] = method_of(d)
    return d


def _scheduled(d: pd.DataFrame) -> pd.DataFrame:
    """Per-epoch rows of scheduled epochs only (not autorange extras): epoch < warmup + epochs."""
    d = d[d["epoch"].notna()]
    if "cfg.warmup" in d and "cfg.epochs" in d:
        d = d[d["epoch"] < d["cfg.warmup"].astype(float) + d["cfg.epochs"].astype(float)]
    return d


def per_epoch(rows: pd.DataFrame) -> pd.DataFrame:
    """Per scheduled train epoch (dataset, pipeline, method, run_id, repeat, epoch): ``seconds``, ``cum_s``
    and the per-epoch metrics present."""
    d = _scheduled(_train_ok(rows))
    keys = ["dataset", "pipeline", "method", "run_id", "repeat", "epoch"]
    d = d[d["metric"].isin(["warmup_epoch_s", "epoch_s", "model_params", "model_flops_per_image", "expand_stage",
                            "expand_width", "expand_depth", "train_loss", "epoch_test_acc"])]
    if d.empty:
        return pd.DataFrame(columns=[*keys, "seconds", "cum_s"])
    w = d.pivot_table(index=keys, columns="metric", values="value", aggfunc="first").reset_index()
    w["seconds"] = w.get("epoch_s", pd.Series(np.nan, index=w.index)).fillna(
        w.get("warmup_epoch_s", pd.Series(np.nan, index=w.index)))
    w = w.sort_values(keys)
    w["cum_s"] = w.groupby(keys[:-1])["seconds"].cumsum()
    return w


def cpu_seconds(rows: pd.DataFrame) -> pd.DataFrame:
    """Per train run x repeat: CPU seconds of the process tree (images / ``images_per_cpu_s``); NaN for a
    run with warm-up epochs (their CPU time is not measured)."""
    d = _train_ok(rows)
    keys = ["dataset", "pipeline", "method", "run_id", "repeat"]
    ipc = d[d["metric"] == "images_per_cpu_s"][[*keys, "value"]].rename(columns={"value": "ipc"})
    img = _scheduled(d)
    img = img[img["metric"] == "images"].groupby(keys)["value"].sum().rename("images").reset_index()
    m = ipc.merge(img, on=keys)
    m["cpu_s"] = m["images"] / m["ipc"]
    if "cfg.warmup" in d:
        warm = d.groupby("run_id")["cfg.warmup"].first().astype(float)
        m.loc[m["run_id"].map(warm).fillna(0) > 0, "cpu_s"] = np.nan
    return m


def pairs(rows: pd.DataFrame) -> list[tuple[str, str]]:
    """(dataset, pipeline) with train runs of dense and of at least one other method."""
    d = _train_ok(rows)
    out = []
    for (ds, p), g in d.groupby(["dataset", "pipeline"]):
        ms = set(g["method"])
        if "dense" in ms and len(ms) > 1:
            out.append((str(ds), str(p)))
    return out


def _by_run(d: pd.DataFrame, value: str) -> list[np.ndarray]:
    """``value`` per repeat, one array per run (process): the units ``unit_ratio_ci`` counts once."""
    d = d.dropna(subset=[value])
    return [g[value].to_numpy(float) for _, g in d.groupby("run_id", sort=True)]


def comparison(rows: pd.DataFrame, predictions: pd.DataFrame | None) -> pd.DataFrame:
    """One row per dataset x pipeline x method (dense first): totals, speedup, FLOPs, accuracy."""
    ep = per_epoch(rows)
    d = _train_ok(rows)
    n = d[d["metric"] == "test_images"][["run_id", "repeat", "value"]].rename(columns={"value": "n"})
    acc = d[d["metric"] == "test_acc"][["dataset", "pipeline", "method", "run_id", "repeat", "value"]].merge(
        n, on=["run_id", "repeat"], how="left")
    cpu = cpu_seconds(rows)
    recs = []
    for ds, p in pairs(rows):
        e = ep[(ep["dataset"] == ds) & (ep["pipeline"] == p)]
        totals = {m: _by_run(g.groupby(["run_id", "repeat"])["seconds"].sum().reset_index(), "seconds")
                  for m, g in e.groupby("method")}
        flops = {m: g["model_flops_per_image"].mean() if "model_flops_per_image" in g else np.nan
                 for m, g in e.groupby("method")}
        c = cpu[(cpu["dataset"] == ds) & (cpu["pipeline"] == p)]
        cpus = {m: _by_run(g, "cpu_s") for m, g in c.groupby("method")}
        a = acc[(acc["dataset"] == ds) & (acc["pipeline"] == p)]
        dense_run = sorted(a.loc[a["method"] == "dense", "run_id"].unique())
        for m in sorted(set(e["method"]) | set(a["method"]), key=lambda v: (v != "dense", v)):
            t = totals.get(m, [])
            g = a[a["method"] == m]
            if len(g):  # repeats share the seed (timing repeats): one trained model per method
                first = g.sort_values(["run_id", "repeat"]).iloc[0]
                g = g[(g["run_id"] == first["run_id"]) & (g["repeat"] == first["repeat"])]
            flat = np.concatenate(t) if t else np.array([])
            each = sorted({len(a) for a in t})
            r: dict[str, Any] = {"dataset": ds, "pipeline": p, "method": m, "repeats": len(flat), "processes": len(t),
                                 "repeats_each": each[0] if len(each) == 1 else np.nan,
                                 "total_s": float(np.median(flat)) if len(flat) else np.nan}
            iv = S.unit_ratio_ci(totals.get("dense", []), t) if m != "dense" else S.NAN
            r.update(speedup=iv.value, lo=iv.lo, hi=iv.hi, why=iv.why)
            cs = cpus.get(m, [])
            civ = S.unit_ratio_ci(cpus.get("dense", []), cs) if m != "dense" else S.NAN
            r.update(cpu_s=float(np.median(np.concatenate(cs))) if cs else np.nan, cpu_ratio=civ.value,
                     cpu_lo=civ.lo, cpu_hi=civ.hi, cpu_why=civ.why)
            r["flops_rel"] = flops.get(m, np.nan) / flops.get("dense", np.nan)
            if len(g) and g["n"].notna().all():
                k, n = int(np.round(g["value"] * g["n"]).sum()), int(g["n"].sum())
                w = S.wilson(k, n)
                r.update(k=k, n=n, acc=w.value, acc_lo=w.lo, acc_hi=w.hi)
            mine = sorted(g["run_id"].unique())
            r["mcnemar"] = (mcnemar_runs(predictions, mine[0], dense_run[0]) if m != "dense" and mine and dense_run
                            else None)
            recs.append(r)
    return pd.DataFrame(recs)


def _no_interval(why, one: str) -> str:
    """Why a ratio has no interval: no spread (equal units on both sides), or one unit a side."""
    return "no spread: no interval, not a result" if why == S.NO_SPREAD else f"no interval: 1 {one}"


def fmt_comparison(c: pd.DataFrame, units: tuple[str, str] = ("process", "processes")) -> pd.DataFrame:
    """``comparison`` as table text; ``units``: what a run is, singular and plural (``perf expand``'s
    runs share one Python process)."""
    one, many = units

    def ratio(r, key: str, prefix: str) -> str:
        if r["method"] == "dense":
            return "(baseline)"
        if pd.isna(r[key]):
            return "—"
        if pd.isna(r[f"{prefix}lo"]):
            return f"{fmt_num(r[key])}x ({_no_interval(r.get(f'{prefix}why'), one)})"
        return S.fmt_ratio(S.Interval(r[key], r[f"{prefix}lo"], r[f"{prefix}hi"]))

    out = []
    for _, r in c.iterrows():
        sp, cpu_sp = ratio(r, "speedup", ""), ratio(r, "cpu_ratio", "cpu_")
        acc = (f"{100 * r['acc']:.1f} [{100 * r['acc_lo']:.1f}-{100 * r['acc_hi']:.1f}]"
               if pd.notna(r.get("acc", np.nan)) else "—")
        vs = fmt_mcnemar(r["mcnemar"])
        out.append({"dataset": r["dataset"], "pipeline": r["pipeline"], "method": r["method"],
                    "total train s (median)": fmt_num(r["total_s"]), "speedup vs dense [95% CI]": sp,
                    "CPU-s (median)": fmt_num(r["cpu_s"]), "CPU-s ratio [95% CI]": cpu_sp,
                    "FLOPs/image vs dense": f"{r['flops_rel']:.2f}x" if pd.notna(r["flops_rel"]) else "—",
                    "test acc % [95% CI]": acc, "vs dense (McNemar)": vs,
                    f"{many} x repeats": (f"{int(r['processes'])} x {int(r['repeats_each'])}"
                                            if pd.notna(r["repeats_each"])
                                            else f"{int(r['processes'])} ({int(r['repeats'])} repeats in all)")})
    return pd.DataFrame(out)


def stages(rows: pd.DataFrame) -> pd.DataFrame:
    """Per dataset x pipeline x method x stage: width, depth, epochs, params, FLOPs, epoch time, loss."""
    ep = per_epoch(rows)
    keep = {(ds, p) for ds, p in pairs(rows)}
    ep = ep[[(d, p) in keep for d, p in zip(ep["dataset"], ep["pipeline"], strict=True)]] if len(ep) else ep
    if ep.empty:
        return pd.DataFrame()
    if "expand_stage" not in ep:
        ep["expand_stage"] = np.nan
    ep["stage"] = ep["expand_stage"].fillna(0).astype(int)
    out = []
    for (ds, p, m, s), g in ep.groupby(["dataset", "pipeline", "method", "stage"]):
        epochs_per_repeat = g.groupby(["run_id", "repeat"]).size().median()
        out.append({"dataset": ds, "pipeline": p, "method": m, "stage": s,
                    "width": fmt_num(g["expand_width"].iloc[0]) if "expand_width" in g and pd.notna(g["expand_width"].iloc[0]) else "1",
                    "depth": fmt_num(g["expand_depth"].iloc[0]) if "expand_depth" in g and g["expand_depth"].iloc[0] > 0 else "dense",
                    "epochs": int(epochs_per_repeat),
                    "params": f"{g['model_params'].median():,.0f}" if "model_params" in g else "—",
                    "MFLOPs/image": fmt_num(g["model_flops_per_image"].median() / 1e6) if "model_flops_per_image" in g else "—",
                    "epoch s (median)": fmt_num(g["seconds"].median()),
                    "loss (last epoch)": fmt_num(g.sort_values("epoch")["train_loss"].iloc[-1]) if "train_loss" in g else "—"})
    df = pd.DataFrame(out)
    df["_m"] = df["method"] != "dense"
    return df.sort_values(["dataset", "pipeline", "_m", "method", "stage"]).drop(columns="_m")


def time_to_accuracy_figure(rows: pd.DataFrame, dataset: str):
    """Test accuracy per scheduled epoch against cumulative training seconds, per pipeline x method
    (dense solid, expand dashed); None without ``epoch_test_acc`` rows."""
    ep = per_epoch(rows)
    ep = ep[ep["dataset"] == dataset]
    if ep.empty or "epoch_test_acc" not in ep or ep["epoch_test_acc"].isna().all():
        return None
    fig, ax = plt.subplots(figsize=(6, 4))
    for (p, m), g in ep.groupby(["pipeline", "method"]):
        if (dataset, p) not in set(pairs(rows)):
            continue
        med = g.groupby("epoch")[["cum_s", "epoch_test_acc"]].median().reset_index()
        ax.plot(med["cum_s"], 100 * med["epoch_test_acc"], linestyle="-" if m == "dense" else "--",
                marker=plotstyle.marker(p), color=plotstyle.color(p), label=f"{p} {m}")
    ax.set_xlabel("cumulative training seconds (scheduled epochs, median over repeats)")
    ax.set_ylabel("test accuracy %")
    ax.set_title(f"time to accuracy: dense vs expand ({dataset})")
    ax.legend(fontsize=8)
    return fig


def section(doc: Any, x: Any) -> None:
    """The "Training method: dense vs expand" section (nothing when no pair was run)."""
    x = dataclasses.replace(x, rows=pair_rows(x.rows))
    if not pairs(x.rows):
        return
    doc.add("## Training method: dense vs expand")
    doc.add()
    doc.add("`expand` trains a sub-network and grows it into the dense backbone on a schedule; `dense` trains the "
            "backbone as built, on the same pipeline, data and epochs. Total training time: every scheduled epoch, "
            "warm-up included; speedup = dense / expand over processes, as the pipeline speedups (> 1: expand is "
            "faster). CPU-s: CPU seconds of the process tree, compared the same way. Accuracy: Wilson interval, "
            "expand against dense by McNemar (one model per method). These runs are kept out of the pipeline "
            "tables (inr-bench's `docs/training-methods.md`).")
    doc.add()
    comp = comparison(x.rows, x.predictions)
    table = fmt_comparison(comp)
    if len(comp) and comp["cpu_s"].isna().all():  # every run had warm-up epochs: CPU-s is not measured
        table = table.drop(columns=["CPU-s (median)", "CPU-s ratio [95% CI]"])
        doc.add("No CPU-s columns: every run here had warm-up epochs, whose CPU time is not measured, "
                "and a schedule's warm-up is part of its cost (`--warmup 0` measures it all).")
        doc.add()
    doc.table(table, index=False)
    st = stages(x.rows)
    if len(st):
        doc.add("Per stage (medians over repeats):")
        doc.add()
        doc.table(st, index=False)
    for ds in sorted({d for d, _ in pairs(x.rows)}):
        doc.figure(time_to_accuracy_figure(x.rows, ds), f"time_to_accuracy_{ds}.png",
                   f"time to accuracy, dense vs expand ({ds})")
