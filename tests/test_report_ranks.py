"""The report's per-rank section (data-parallel runs) on result folders with known per-rank times.

The runs go through the harness's own merge (``bench.harness.ranks.merge``): rows.csv holds the
aggregate rows and each rank's rows exactly as ``inrbench bench --nproc N`` writes them.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from bench import results as R
from bench import stats as S
from bench.harness.ranks import RankResult, merge
from bench.report import ranks as RK
from bench.report.build import build_report
from bench.report.load import load
from tests.report_tables import _quick_reports, parse_tables  # noqa: F401
from tests.test_stats import pooled_ratio

FIX = Path(__file__).resolve().parent / "fixtures" / "results" / "sweep"
IMAGES = 160  # per rank per epoch


def _dp_run(out: Path, pipeline: str, mode: str, epochs: list[list[float]], dataset: str = "syn",
            split: list[tuple[float, float]] | None = None, fail_rank: int | None = None) -> None:
    """One data-parallel run of ``len(epochs)`` ranks, repeat 0: rank r's measured epochs take
    ``epochs[r]`` s; ``split[r]`` = (data wait s, compute s) of each of rank r's epochs."""
    world = len(epochs)
    run_id = f"dp-{dataset}-{pipeline}-{mode}"

    def cfg(r: int) -> dict:
        return {"pipe": {"device": "cpu", "rank": r, "world_size": world}}

    results = []
    for r, times in enumerate(epochs):
        rr = R.RunRows(run_id, pipeline, dataset, mode, cfg(r), rank=r)
        if r == fail_rank:
            rr.error("RuntimeError: injected")
            results.append(RankResult.of(r, rr, 1))
            continue
        for e, t in enumerate(times):
            rr.add("epoch_s", t, "s", repeat=0, epoch=e + 1)
            rr.add("images_per_s", IMAGES / t, "img/s", repeat=0, epoch=e + 1)
            rr.add("images", IMAGES, "1", repeat=0, epoch=e + 1)
            if split is not None:
                rr.add("data_wait_s", split[r][0], "s", repeat=0, epoch=e + 1)
                rr.add("compute_s", split[r][1], "s", repeat=0, epoch=e + 1)
        results.append(RankResult.of(r, rr, 0))
    run = R.RunRows(run_id, pipeline, dataset, mode, cfg(0))
    merge(run, results)
    R.write_run(out, run)


def _single_run(out: Path, pipeline: str, mode: str, times: list[float], dataset: str = "syn") -> None:
    run = R.RunRows(f"sp-{dataset}-{pipeline}-{mode}", pipeline, dataset, mode, {"pipe": {"device": "cpu"}})
    for e, t in enumerate(times):
        run.add("epoch_s", t, "s", repeat=0, epoch=e + 1)
        run.add("images_per_s", IMAGES / t, "img/s", repeat=0, epoch=e + 1)
    R.write_run(out, run)


# rank 0 median 1.0 s (wait 0.1 / compute 0.9: 10%), rank 1 median 1.5 s (0.6 / 0.9: 40%)
INR_LOADER = [[0.9, 1.0, 1.1, 1.05, 0.95], [1.4, 1.5, 1.6, 1.55, 1.45]]
RAW_LOADER = [[1.0, 1.02, 0.98, 1.01, 0.99], [1.01, 0.99, 1.03, 1.0, 1.02]]  # medians 1.00 / 1.01
BIG_TRAIN = [[1.0, 1.0, 1.0], [1.2, 1.1, 1.3], [0.8, 0.85, 0.75], [1.1, 1.1, 1.1]]  # medians 1.0/1.2/0.8/1.1


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """syn: a single-process torch-jpeg run and 2-rank inr/raw loader runs (so the 2-rank runs are
    labelled ``syn (2 processes)``) and a 2-rank dali train run that failed on rank 1; big: a
    4-rank inr train run without the wait/compute split."""
    base = tmp_path_factory.mktemp("ranks")
    out = base / "results"
    _single_run(out, "torch-jpeg", "loader", [2.0, 2.1, 1.9])
    _dp_run(out, "inr", "loader", INR_LOADER, split=[(0.1, 0.9), (0.6, 0.9)])
    _dp_run(out, "raw", "loader", RAW_LOADER, split=[(0.2, 0.8), (0.2, 0.8)])
    _dp_run(out, "dali", "train", [[1.0, 1.0], [1.0, 1.0]], fail_rank=1)
    _dp_run(out, "inr", "train", BIG_TRAIN, dataset="big")
    rep = base / "report"
    build_report(out, rep)
    return out, (rep / "README.md").read_text()


def _rank_table(text: str, dataset: str, mode: str):
    t = parse_tables(text)[f"{dataset} — {mode} — epoch time per rank"][0]
    return t.set_index("rank")


def _median_iqr(cell: str) -> tuple[float, float]:
    med, rest = cell.split(" (IQR ")
    return float(med), float(rest.split(")")[0])


def test_per_rank_table_holds_each_ranks_median_and_wait_share(folder):
    _, text = folder
    assert "## Data-parallel runs: epoch time per rank (s)" in text
    t = _rank_table(text, "syn (2 processes)", "loader")
    assert list(t.columns) == ["raw", "inr"]  # pipeline order; the single-process torch-jpeg is not here
    assert list(t.index) == ["0", "1", RK.SPREAD_ROW]
    for r, times in enumerate(INR_LOADER):
        med, iqr = _median_iqr(t.loc[str(r), "inr"])
        q75, q25 = np.percentile(times, [75, 25])
        assert med == pytest.approx(np.median(times), abs=1e-3) and iqr == pytest.approx(q75 - q25, abs=1e-3)
    assert t.loc["0", "inr"].endswith(", wait 10%") and t.loc["1", "inr"].endswith(", wait 40%")
    assert t.loc["0", "raw"].endswith(", wait 20%")


def test_spread_is_slowest_over_fastest_rank(folder):
    _, text = folder
    t = _rank_table(text, "syn (2 processes)", "loader")
    inr = t.loc[RK.SPREAD_ROW, "inr"]  # 1.5 / 1.0, the interval excludes 1.0
    assert inr.startswith("1.50x [") and inr.endswith("(rank 1 / rank 0)")
    lo, hi = (float(v) for v in inr.split("[")[1].split("]")[0].split("-"))
    assert 1.0 < lo <= 1.5 <= hi
    raw = t.loc[RK.SPREAD_ROW, "raw"]  # 1.01 / 1.00: noise
    assert raw.startswith("1.01x [") and raw.endswith("(rank 1 / rank 0): no difference detected")

    big = _rank_table(text, "big", "train")  # one world size: the dataset keeps its name
    assert list(big.index) == ["0", "1", "2", "3", RK.SPREAD_ROW]
    assert ", wait" not in big.loc["0", "inr"]  # no wait/compute split in these rows
    medians = [_median_iqr(big.loc[str(r), "inr"])[0] for r in range(4)]
    assert medians == pytest.approx([1.0, 1.2, 0.8, 1.1])
    sp = big.loc[RK.SPREAD_ROW, "inr"]
    assert float(sp.split("x")[0]) == pytest.approx(max(medians) / min(medians), abs=0.005)  # 1.50
    assert sp.endswith("(rank 1 / rank 2)")


def test_spreads_frame_and_equal_ranks(folder):
    out, _ = folder
    x = load(out)
    assert x.rows["rank"].isna().all() or (x.rows.loc[x.rows["rank"].notna(), "metric"] == "run").all()
    sp = RK.spreads(x.rank_rows).set_index(["dataset", "mode", "pipeline"])
    # ratio of the two ranks' geometric-mean epochs (Welch's t on the logs: the interval's own estimate)
    gm = np.exp(np.log(BIG_TRAIN[1]).mean() - np.log(BIG_TRAIN[2]).mean())
    assert sp.loc[("big", "train", "inr"), "ratio"] == pytest.approx(gm) and gm == pytest.approx(1.5, abs=0.002)
    assert sp.loc[("big", "train", "inr"), "n"] == 3
    assert sp.loc[("syn (2 processes)", "loader", "inr"), ["slowest", "fastest"]].tolist() == [1, 0]
    # the failed run has no per-rank epochs: no spread for it
    assert ("syn (2 processes)", "train", "dali") not in sp.index
    same = x.rank_rows[(x.rank_rows["dataset"] == "big") & (x.rank_rows["rank"] == 0)]
    twin = same.assign(rank=1)  # two ranks with identical samples (1.0 s every epoch): 1.00x, two different ranks
    s = RK.spreads(R.to_frame([*same.to_dict("records"), *twin.to_dict("records")]))
    assert s["ratio"].tolist() == [1.0] and sorted(s[["slowest", "fastest"]].iloc[0]) == [0, 1]
    # no spread at all: no zero-width interval, and the text says why (it printed "1.00x [1.00-1.00]")
    text = RK.fmt_spread(s.iloc[0])
    assert text.startswith("1.00x (rank ") and text.endswith(": no interval (no spread), not a result")


def test_failed_data_parallel_run_shows_its_error_not_nothing(folder):
    _, text = folder
    t = parse_tables(text)["syn (2 processes) — images/s, median (IQR)"][0].set_index("pipeline")
    assert t.loc["dali", "train"] == "error: rank 1: RuntimeError: injected"
    assert "syn (2 processes) — train — epoch time per rank" not in text  # no per-rank epochs there


def test_no_rank_rows_no_section(tmp_path):
    out = tmp_path / "results"
    _single_run(out, "raw", "loader", [1.0, 1.1, 0.9])
    _single_run(out, "inr", "loader", [0.5, 0.6, 0.4])
    build_report(out, tmp_path / "rep")
    text = (tmp_path / "rep" / "README.md").read_text()
    assert "per rank" not in text and "Data-parallel" not in text
    assert RK.rank_tables(load(out).rank_rows) == {}


def test_sweep_folder_reads_rank_rows(tmp_path):
    """A sweep cell holding a 2-rank run: the report of the sweep folder has its per-rank table."""
    src = tmp_path / "sweep"
    keep = ("prep", "bench-inr-loader")  # the fixture sweep cut to the cell and the dataset it reads
    shutil.copytree(FIX, src, ignore=lambda d, names: [n for n in names if Path(d).name == "cells" and n not in keep])
    sweep = json.loads((src / "sweep.json").read_text())
    sweep["cells"] = [c for c in sweep["cells"] if c["id"] in keep]
    (src / "sweep.json").write_text(json.dumps(sweep))
    cell = src / "cells" / "bench-inr-loader"  # the fixture's cells hold their runs directly
    _dp_run(cell, "inr", "loader", INR_LOADER, dataset="photos32")
    build_report(src, tmp_path / "rep")
    text = (tmp_path / "rep" / "README.md").read_text()
    t = _rank_table(text, "photos32 (2 processes)", "loader")
    assert t.loc[RK.SPREAD_ROW, "inr"].startswith("1.50x [")


def _alike_ranks(rng: np.random.Generator, ranks: int, epochs: int, slow: float = 1.0):
    """Rank rows of one 'inr' loader run: every rank's epochs ~ lognormal(0, 5%), rank 0's
    multiplied by ``slow``; and each rank's epochs as drawn."""
    rows, drawn = [], []
    for r in range(ranks):
        rr = R.RunRows("dp", "inr", "syn", "loader", rank=r)
        drawn.append(np.exp(rng.normal(0.0, 0.05, epochs)) * (slow if r == 0 else 1.0))
        for e, t in enumerate(drawn[-1]):
            rr.add("epoch_s", t, "s", repeat=0, epoch=e + 1)
        rows += rr.rows()
    return R.to_frame(rows), drawn


def _spread(rows, ranks: int):
    """``RK.spreads(rows)``'s one row, given its group listing (``per``: the ranks of the one
    dataset/mode/pipeline, what ``per_rank`` lists for it) so that the Monte Carlo draws below skip
    per_rank's medians, IQRs and wait shares; the first draw of each test checks it is the same row."""
    per = pd.DataFrame({"dataset": "syn", "mode": "loader", "pipeline": "inr", "rank": range(ranks)})
    return RK.spreads(rows, per).iloc[0]


def _same_as_without_per(rows, s, drawn) -> None:
    full = RK.spreads(rows).iloc[0]
    assert full.to_dict() == s.to_dict()
    for r, x in enumerate(drawn):
        assert np.array_equal(RK._rank_samples(rows, "syn", "inr", "loader", r), x)


def test_spread_interval_holds_for_the_pair_picked_among_many_ranks():
    """8 ranks drawn alike: the slowest / fastest pair is picked by its epoch times, so a plain 95%
    interval of that pair excludes 1.0 in about a fifth of runs. The Bonferroni-level interval
    (28 pairs) keeps false alarms under 5%, and still sees one rank 20% slower every time."""
    rng = np.random.default_rng(1)
    plain = bonf = 0
    for i in range(100):
        rows, drawn = _alike_ranks(rng, ranks=8, epochs=9)
        s = _spread(rows, 8)
        if i == 0:
            _same_as_without_per(rows, s, drawn)
        bonf += S.Interval(s["ratio"], s["lo"], s["hi"]).excludes(1.0)
        pick = [drawn[int(s[k])] for k in ("slowest", "fastest")]  # RK._rank_samples of the pair
        plain += pooled_ratio(*pick).excludes(1.0)
    assert plain >= 15  # 21 of 100 with this seed: the selection effect is real
    assert bonf <= 5  # 0 with this seed
    assert S.bonferroni(28) == pytest.approx(1 - 0.05 / 28)

    found = 0
    for _ in range(20):  # (Welch on the logs of 9 epochs at 99.82%)
        s = _spread(_alike_ranks(rng, ranks=8, epochs=9, slow=1.2)[0], 8)
        found += s["slowest"] == 0 and S.Interval(s["ratio"], s["lo"], s["hi"]).excludes(1.0)
    assert found == 20


def test_spread_interval_keeps_its_level_with_three_epochs_a_rank():
    """4 alike ranks of 3 epochs: the bootstrap of medians this replaced excluded 1.0 in 29% of runs at the
    stated family-wise 5%; Welch's t on the logs at the Bonferroni level (6 pairs) stays under it."""
    rng = np.random.default_rng(4)
    false = 0
    for i in range(100):
        rows, drawn = _alike_ranks(rng, ranks=4, epochs=3)
        s = _spread(rows, 4)
        if i == 0:
            _same_as_without_per(rows, s, drawn)
        false += S.Interval(s["ratio"], s["lo"], s["hi"]).excludes(1.0)
    assert false <= 5, false  # 0 with this seed
    assert s["n"] == 3 and s["lo"] < s["ratio"] < s["hi"]
    assert RK.fmt_spread(s).endswith(f"(rank {s['slowest']} / rank {s['fastest']}): {S.NO_DIFFERENCE}")


def test_slowest_and_fastest_are_picked_by_the_ratio_the_row_prints():
    """Ranks picked by their medians but compared by geometric means could print a 'slowest / fastest' below 1
    (rank 1's median 1.1 s > rank 0's 1.0 s, yet rank 0's two 3 s epochs make it the slower by geometric mean:
    0.71x). The pair is picked by the geometric means the ratio compares, so the row is never below 1."""
    rows = []
    for r, eps in ((0, [1.0, 1.0, 1.0, 3.0, 3.0]), (1, [1.1, 1.1, 1.1, 1.1, 1.101])):
        rr = R.RunRows("dp", "inr", "syn", "loader", rank=r)
        for e, t in enumerate(eps):
            rr.add("epoch_s", t, "s", repeat=0, epoch=e + 1)
        rows += rr.rows()
    s = RK.spreads(R.to_frame(rows)).iloc[0]
    assert (s["slowest"], s["fastest"]) == (0, 1)
    assert s["ratio"] == pytest.approx(np.exp(np.log([1, 1, 1, 3, 3]).mean() - np.log([1.1] * 4 + [1.101]).mean()))
    assert s["ratio"] >= 1.0 and RK.fmt_spread(s).startswith(f"{s['ratio']:.2f}x")
