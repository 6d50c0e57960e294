"""The report's intervals, tests and sanity flags on synthetic result folders with known answers."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from bench import results as R
from bench import stats as S
from bench.report import tables as T
from bench.report.build import build_report
from bench.report.load import load
from tests.report_tables import _quick_reports, parse_tables  # noqa: F401

N_TEST = 40
N_EPOCH = ("epoch_s",)


def _ident(cid: str) -> dict:
    return {"id": f"ident-{cid}", "code": {"id": cid, "label": f"commit-{cid} (clean)"},
            "libraries": {"torch": "2.0", "torchvision": "0.1", "nvidia-dali": None, "PIL": "Pillow 11"}}


def _run(out, pipeline: str, mode: str, epochs: list[list[float]], correct: np.ndarray | None = None,
         code: str = "A", processes: bool = True) -> None:
    """Bench runs of ``epochs[r]`` = repeat r's epoch times; train runs get accuracy + predictions.

    processes: each repeat in a run of its own (``run-P-M-r``, repeat 0: one process each, as the
    sweeps run them); False: one run ``run-P-M`` holding every repeat (one process)."""
    if processes:
        for r, times in enumerate(epochs):
            _one_run(out, f"run-{pipeline}-{mode}-{r}", pipeline, mode, [times], correct, code)
    else:
        _one_run(out, f"run-{pipeline}-{mode}", pipeline, mode, epochs, correct, code)


def _one_run(out, run_id: str, pipeline: str, mode: str, epochs: list[list[float]], correct: np.ndarray | None,
             code: str, seed: int | None = None, schedule: tuple[int, int] | None = None) -> None:
    """schedule: (warm-up, measured) epochs recorded as the run's ``cfg.warmup`` / ``cfg.epochs``."""
    pipe = {"device": "cpu"} if seed is None else {"device": "cpu", "seed": seed}
    cfg = {"pipe": pipe} if schedule is None else {"pipe": pipe, "warmup": schedule[0], "epochs": schedule[1]}
    rows = R.RunRows(run_id, pipeline, "syn", mode, cfg)
    for r, times in enumerate(epochs):
        for e, t in enumerate(times):
            rows.add("epoch_s", t, "s", repeat=r, epoch=e + 1)
            rows.add("images_per_s", 320 / t, "img/s", repeat=r, epoch=e + 1)
        rows.add("images_per_cpu_s", 100.0 + len(pipeline), "img/cpu-s", repeat=r)
        if correct is not None:
            rows.add("test_acc", correct.mean(), "1", repeat=r, epoch=len(times))
            rows.add("test_images", len(correct), "1", repeat=r, epoch=len(times))
            labels = np.arange(len(correct)) % 4
            rows.add_predictions(r, labels, np.where(correct, labels, (labels + 1) % 4))
    run_dir = R.write_run(out, rows)
    R.write_env(run_dir, {"schema_version": 1, "code": _ident(code)})


def _noisy(rng, center: float, n: int = 12, sd: float = 0.02) -> list[list[float]]:
    return [list(center * np.exp(rng.normal(0, sd, n // 3))) for _ in range(3)]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """Train epochs: raw 1.0 s; torch-jpeg 2.0 s; inr the same times as torch-jpeg (no difference);
    nvjpeg 0.8 s: faster than raw, the ceiling (flagged); dali 1.0 s but its replay takes 1.3 s
    (train faster than replay: flagged). raw's replay equals its train (raw is the ceiling), torch-jpeg's is faster (ok)."""
    rng = np.random.default_rng(0)
    base = tmp_path_factory.mktemp("res")
    out = base / "results"
    right = np.ones(N_TEST, bool)
    raw_ok = right.copy()
    raw_ok[:4] = False  # 36/40
    jpeg_ok = right.copy()
    jpeg_ok[:4] = False
    jpeg_ok[4:16] = False  # 24/40: 12 images only raw gets right, none the other way
    tj = _noisy(rng, 2.0)
    _run(out, "raw", "train", _noisy(rng, 1.0), raw_ok)
    _run(out, "torch-jpeg", "train", tj, jpeg_ok, code="B")
    _run(out, "dali", "train", _noisy(rng, 1.0), raw_ok)
    _run(out, "inr", "train", [list(reversed(t)) for t in reversed(tj)], raw_ok)
    _run(out, "nvjpeg", "train", _noisy(rng, 0.8), raw_ok)
    _run(out, "raw", "replay", _noisy(rng, 1.0))  # raw at its ceiling: train as fast as replay
    _run(out, "torch-jpeg", "replay", _noisy(rng, 1.5))
    _run(out, "dali", "replay", _noisy(rng, 1.3))
    for p, t in (("raw", 0.01), ("torch-jpeg", 0.05), ("dali", 0.02), ("inr", 0.03)):
        _run(out, p, "loader", _noisy(rng, t))
    rep = base / "report"
    build_report(out, rep)
    return out, rep, (rep / "README.md").read_text()


def _cell_interval(text: str) -> tuple[float, float]:
    lo, hi = text.split("[")[1].rstrip("]").split("-")
    return float(lo), float(hi)


def test_speedups_carry_intervals_and_no_difference(folder):
    out, _, text = folder
    rows = R.read_results(out)
    sp = parse_tables(text)["syn — speedup"][0].set_index("pipeline")
    # loader: raw 0.01 s vs torch-jpeg 0.05 s -> 5x, with the same interval bench.stats gives
    # (the 3 repeats of each as units)
    units = [T.unit_samples(rows, N_EPOCH, "syn", p, "loader") for p in ("torch-jpeg", "raw")]
    assert [len(u) for u in units] == [3, 3] and all(len(a) == 4 for u in units for a in u)
    iv = S.unit_ratio_ci(*units)
    assert sp.loc["raw", "vs torch-jpeg (loader)"] == f"{iv.value:.2f}x [{iv.lo:.2f}-{iv.hi:.2f}]"
    assert 4.5 < iv.lo < 5 < iv.hi < 5.5
    # train: raw is 2x torch-jpeg, the baseline against itself is the baseline
    lo, hi = _cell_interval(sp.loc["raw", "vs torch-jpeg (train)"])
    assert sp.loc["raw", "vs torch-jpeg (train)"].startswith("2.0") and 1.8 < lo < 2.0 < hi < 2.2
    assert sp.loc["torch-jpeg", "vs torch-jpeg (train)"] == "1.00x (baseline)"
    # inr vs torch-jpeg in train: the same epoch times -> the interval holds 1.0: no speedup shown
    cell = sp.loc["inr", "vs torch-jpeg (train)"]
    assert cell.startswith("no difference detected [")
    lo, hi = _cell_interval(cell)
    assert lo < 1.0 < hi
    h = parse_tables(text)["syn — headline"][0].set_index("pipeline")
    assert h.loc["inr", "train speedup vs torch-jpeg"] == cell


def test_sanity_flags_replace_impossible_speedups(folder):
    out, rep, text = folder
    rows = R.read_results(out)
    checks = T.sanity_checks(rows).set_index(["pipeline", "check"])
    nv = checks.loc[("nvjpeg", "faster than raw end to end (raw train / train)")]
    assert nv["flagged"] and nv["lo"] > 1.0 and nv["ratio"] == pytest.approx(1.25, rel=0.05)
    dali = checks.loc[("dali", "train faster than replay (replay / train)")]
    assert dali["flagged"] and dali["ratio"] == pytest.approx(1.3, rel=0.05)
    for p in ("raw", "torch-jpeg"):
        assert not checks.loc[(p, "train faster than replay (replay / train)")]["flagged"]
    assert not checks.loc[("inr", "faster than raw end to end (raw train / train)")]["flagged"]
    assert not checks.loc[("dali", "faster than raw end to end (raw train / train)")]["flagged"]
    assert T.flagged_train(rows) == {("syn", "nvjpeg"), ("syn", "dali")}

    tables = parse_tables(text)
    sanity = tables["Sanity checks"][0]
    assert (sanity["result"] == "FLAGGED: measurement problem").sum() == 2
    assert "**2 measurement problems flagged.**" in text
    # flagged pipelines (and speedups against a flagged baseline) are not shown as results
    sp = tables["syn — speedup"][0].set_index("pipeline")
    assert sp.loc["nvjpeg", "vs torch-jpeg (train)"] == T.MEASUREMENT_PROBLEM
    assert (sp["vs dali (train)"] == T.MEASUREMENT_PROBLEM).all()  # the baseline itself is flagged
    assert sp.loc["raw", "vs torch-jpeg (train)"].startswith("2.0")  # unflagged pairs still shown
    h = tables["syn — headline"][0].set_index("pipeline")
    assert h.loc["nvjpeg", "train speedup vs torch-jpeg"] == T.MEASUREMENT_PROBLEM
    assert h.loc["dali", "train speedup vs torch-jpeg"] == T.MEASUREMENT_PROBLEM
    assert not T.speedups(rows).query("mode == 'loader'")["flagged"].any()  # only train speedups


def test_accuracy_wilson_and_mcnemar(folder):
    _, _, text = folder
    tables = parse_tables(text)
    acc = tables["Accuracy (test split, original pixels, evaluation transform)"][0].set_index("pipeline")
    # raw: 36 of 40 in each of 3 repeats (the same test images, the same seed): 36/40 with its
    # Wilson interval, not 108/120, which would count every image three times
    iv = S.wilson(36, 40)
    assert acc.loc["raw", "correct"] == "36/40"
    assert acc.loc["raw", "test accuracy % [95% CI]"] == f"90.0 [{100 * iv.lo:.1f}-{100 * iv.hi:.1f}]"
    assert iv.hi - iv.lo > 1.6 * (S.wilson(108, 120).hi - S.wilson(108, 120).lo)
    # torch-jpeg vs raw: 12 discordant images, all for raw, in the first repeat: p = 2 / 2**12
    # (paired over all 3 repeats it would read 36 vs 0, p = 2 / 2**36)
    assert acc.loc["torch-jpeg", "vs raw"] == f"worse (p={2 / 2**12:.2g})"
    assert acc.loc["raw", "vs torch-jpeg"] == f"better (p={2 / 2**12:.2g})"
    assert acc.loc["dali", "vs raw"] == "no difference detected (p=1)"  # the same predictions
    h = tables["syn — headline"][0].set_index("pipeline")
    assert h.loc["raw", "test acc % [95% CI]"] == acc.loc["raw", "test accuracy % [95% CI]"]
    assert h.loc["torch-jpeg", "train img/CPU-s"] == "110"  # the CPU headline column


def test_mcnemar_needs_the_same_test_images(folder):
    out, _, _ = folder
    x = load(out)
    inr, raw = "run-inr-train-0", "run-raw-train-0"
    assert T.mcnemar_runs(x.predictions, inr, raw).p_value == 1.0
    bad = x.predictions.copy()
    bad.loc[bad["pipeline"] == "inr", "label"] += 1  # another test set
    assert T.mcnemar_runs(bad, inr, raw) is None
    assert T.mcnemar_runs(x.predictions, inr, "nope") is None


def test_code_versions_shown_and_mixed_versions_warned(folder):
    _, _, text = folder
    env = parse_tables(text)["Environment"]
    versions = env[1]
    assert set(versions["runs"].astype(int)) == {33, 3}  # 36 runs, torch-jpeg train's 3 under code B
    assert any("commit-B (clean)" in v for v in versions["code version; libraries"])
    assert any("run-torch-jpeg-train-0" in ids for ids in versions["ids"].tolist())
    assert "**Warning: these results come from 2 different code/library versions.**" in text


def test_speedup_figure_draws_intervals_not_flagged_bars(folder):
    out, rep, _ = folder
    from bench.report import figures as F

    sp = T.speedups(R.read_results(out))
    fig = F.speedup_figure(sp, "syn")
    bars = [p for ax in fig.axes for p in ax.patches]
    # loader: 4 pipelines x 2 baselines; train vs torch-jpeg: raw, torch-jpeg, inr (nvjpeg and dali
    # flagged); train vs dali: nothing (the baseline is flagged)
    assert len(bars) == 8 + 3
    faded = [b for b in bars if b.get_hatch() == "//"]
    # not detected: the baselines against themselves (loader x 2, train x 1) and inr vs torch-jpeg
    assert len(faded) == 2 + 1 + 1
    assert (rep / "speedup_syn.png").is_file()
    import matplotlib.pyplot as plt

    plt.close(fig)


def test_report_without_predictions_or_test_images(tmp_path):
    """Results from before these columns: accuracy without an interval, no McNemar, no crash."""
    rows = R.RunRows("old-raw", "raw", "syn", "train", {"device": "cpu"})
    rows.add("epoch_s", 1.0, "s", repeat=0, epoch=1)
    rows.add("epoch_s", 1.1, "s", repeat=0, epoch=2)
    rows.add("test_acc", 0.75, "1", repeat=0, epoch=2)
    res = tmp_path / "results"
    R.write_env(R.write_run(res, rows), {"schema_version": 1})  # an env.json without a code identity
    acc = T.accuracy(R.read_results(res))
    assert acc.iloc[0]["acc"] == 0.75 and np.isnan(acc.iloc[0]["lo"])
    assert T.fmt_accuracy(acc.iloc[0]) == "75.0"
    build_report(res, tmp_path / "rep")
    text = (tmp_path / "rep" / "README.md").read_text()
    t = parse_tables(text)["Accuracy (test split, original pixels, evaluation transform)"][0]
    assert t.iloc[0]["test accuracy % [95% CI]"] == "75.0" and t.iloc[0]["correct"] == "—"
    assert "1 runs do not record the code version" in text
    assert isinstance(load(res).predictions, pd.DataFrame)


def test_predictions_found_in_nested_cell_results(folder, tmp_path):
    """A sweep cell may keep its bench results one folder down (cells/<id>/results/runs/...)."""
    import shutil

    from bench.report.load import _predictions

    out, _, _ = folder
    cell = tmp_path / "cell"
    shutil.copytree(out / "runs", cell / "results" / "runs")
    p = _predictions([cell], R.read_results(out))
    assert len(p) == 5 * 3 * N_TEST and set(p["pipeline"]) == {"raw", "torch-jpeg", "dali", "inr", "nvjpeg"}


def test_raw_is_no_ceiling_where_it_trains_slower_than_its_replay(tmp_path):
    """On a CPU raw augments in the training thread: raw train 1.25 s vs its replay 1.0 s. A
    pipeline whose loader works on another core then trains faster than raw for real (dali 1.05 s):
    the raw check reads 'not applicable', nothing is flagged, and the speedup is a result."""
    rng = np.random.default_rng(1)
    out = tmp_path / "results"
    _run(out, "raw", "train", _noisy(rng, 1.25))
    _run(out, "raw", "replay", _noisy(rng, 1.0))
    _run(out, "dali", "train", _noisy(rng, 1.05))
    _run(out, "dali", "replay", _noisy(rng, 1.0))
    _run(out, "torch-jpeg", "train", _noisy(rng, 1.3))
    checks = T.sanity_checks(R.read_results(out)).set_index(["pipeline", "check"])
    row = checks.loc[("dali", "faster than raw end to end (raw train / train)")]
    assert row["lo"] > 1.0 and not row["flagged"] and row["note"].startswith("not applicable: raw trains slower")
    assert not checks["flagged"].any()
    build_report(out, tmp_path / "rep")
    text = (tmp_path / "rep" / "README.md").read_text()
    sp = parse_tables(text)["syn — speedup"][0].set_index("pipeline")
    assert sp.loc["dali", "vs torch-jpeg (train)"].startswith("1.2")
    # with raw at its ceiling (train as fast as replay) the same dali numbers are flagged
    out2 = tmp_path / "results2"
    _run(out2, "raw", "train", _noisy(rng, 1.25))
    _run(out2, "raw", "replay", _noisy(rng, 1.25))
    _run(out2, "dali", "train", _noisy(rng, 1.05))
    assert T.flagged_train(R.read_results(out2)) == {("syn", "dali")}


def test_raw_check_needs_raw_shown_at_its_ceiling(tmp_path):
    """Raw neither shown slower than its replay nor shown within 5% of it (a wide interval, as on
    a loaded CPU): no evidence that raw is a ceiling, so a pipeline beating it is not flagged.
    With raw shown near its replay, the bound is 1 / (the interval's low end): beating raw by less
    than raw's own slack is not flagged, beating it by 25% is."""
    rng = np.random.default_rng(3)
    out = tmp_path / "wide"
    _run(out, "raw", "train", _noisy(rng, 1.0, sd=0.12))
    _run(out, "raw", "replay", _noisy(rng, 0.92, sd=0.12))
    _run(out, "dali", "train", _noisy(rng, 0.74))
    checks = T.sanity_checks(R.read_results(out)).set_index(["pipeline", "check"])
    own = checks.loc[("raw", "train faster than replay (replay / train)")]
    assert own["lo"] < 0.95 and own["hi"] > 1.0 and not own["flagged"]  # inconclusive either way
    row = checks.loc[("dali", "faster than raw end to end (raw train / train)")]
    assert row["lo"] > 1.2 and not row["flagged"]
    assert row["note"].startswith("not applicable: raw is not shown to train within 5% of its replay")

    out = tmp_path / "near"
    _run(out, "raw", "train", [[1.0] * 4] * 6)
    _run(out, "raw", "replay", [[v] * 4 for v in (1.01, 0.99, 1.0, 1.005, 0.995, 1.0)])
    _run(out, "dali", "train", _noisy(rng, 0.8))
    # 0.5% faster than raw, within raw's slack (a little spread: equal epochs on both sides give no interval)
    _run(out, "inr", "train", [[v / 1.005] * 4 for v in (1.0002, 0.9998, 1.0, 1.0001, 0.9999, 1.0)])
    rows = R.read_results(out)
    checks = T.sanity_checks(rows).set_index(["pipeline", "check"])
    own = T.epoch_ratio(rows, "syn", ("raw", "replay"), ("raw", "train"))
    assert 0.95 <= own.lo < 1.0 < own.hi
    inr = checks.loc[("inr", "faster than raw end to end (raw train / train)")]
    assert 1.0 < inr["lo"] < 1.0 / own.lo and not inr["flagged"] and inr["note"] == ""
    assert T.flagged_train(rows) == {("syn", "dali")}


def test_raw_check_without_a_raw_replay_does_not_apply(tmp_path):
    rng = np.random.default_rng(4)
    out = tmp_path / "results"
    _run(out, "raw", "train", _noisy(rng, 1.0))
    _run(out, "dali", "train", _noisy(rng, 0.8))
    row = T.sanity_checks(R.read_results(out)).set_index(["pipeline", "check"]).loc[
        ("dali", "faster than raw end to end (raw train / train)")]
    assert row["lo"] > 1.0 and not row["flagged"] and row["note"].startswith("not applicable: no raw replay run")


def test_raw_measured_precisely_just_below_its_replay_is_still_a_ceiling(tmp_path):
    """raw trains 1% slower than its replay, measured tightly ([0.98-0.995]): within 5%, so it is a
    ceiling; a pipeline twice as fast as raw end to end is flagged."""
    out = tmp_path / "results"
    _run(out, "raw", "train", [[1.0] * 4, [1.002] * 4, [0.998] * 4, [1.0] * 4])
    _run(out, "raw", "replay", [[0.99] * 4, [0.992] * 4, [0.988] * 4, [0.99] * 4])
    _run(out, "dali", "train", [[0.5] * 4, [0.51] * 4, [0.49] * 4])
    rows = R.read_results(out)
    own = T.epoch_ratio(rows, "syn", ("raw", "replay"), ("raw", "train"))
    assert 0.95 <= own.lo and own.hi < 1.0  # measurably slower, but within the margin
    assert T.flagged_train(rows) == {("syn", "dali")}


def test_replay_and_train_at_different_settings_are_not_compared(tmp_path):
    """Replay at batch 1 is slower per epoch than train at batch 8 for no fault of the pipeline:
    the replay check says it does not apply instead of flagging a measurement problem."""
    out = tmp_path / "results"
    for mode, center, batch in (("replay", 3.0, 1), ("train", 1.0, 8)):
        for r in range(3):  # three processes a side: the ratio has an interval
            rows = R.RunRows(f"run-raw-{mode}-{r}", "raw", "syn", mode,
                             {"pipe": {"device": "cpu", "batch_size": batch}})
            for e, t in enumerate([center, center * 1.01, center * 0.99]):
                rows.add("epoch_s", t * (1 + 0.01 * r), "s", repeat=0, epoch=e + 1)
            R.write_run(out, rows)
    checks = T.sanity_checks(R.read_results(out)).set_index(["pipeline", "check"])
    row = checks.loc[("raw", "train faster than replay (replay / train)")]
    assert row["lo"] > 2.5 and not row["flagged"]
    assert row["note"] == "not applicable: replay and train ran at different settings (batch_size)"


def test_repeats_of_one_process_are_one_unit(tmp_path):
    """Three repeats in one process give a ratio and no interval: they share the process's state,
    so they are not independent units. A second process a side gives the interval, over the two
    processes' median epochs (each over all its repeats), not over the six repeats."""
    rng = np.random.default_rng(3)
    out = tmp_path / "results"
    for p, t in (("raw", 0.01), ("torch-jpeg", 0.05)):
        _run(out, p, "loader", _noisy(rng, t), processes=False)
    rows = R.read_results(out)
    assert [len(T.unit_samples(rows, N_EPOCH, "syn", p, "loader")) for p in ("raw", "torch-jpeg")] == [1, 1]
    iv = T.epoch_ratio(rows, "syn", ("torch-jpeg", "loader"), ("raw", "loader"))
    assert 4.5 < iv.value < 5.5 and not iv.ok
    row = T.speedups(rows).query("pipeline == 'raw' and baseline == 'torch-jpeg'").iloc[0]
    assert T.fmt_speedup(row) == f"{iv.value:.2f}x (one process: no interval, not a result)"

    for p, t in (("raw", 0.011), ("torch-jpeg", 0.05)):  # a second process each, run later
        rows_p = _noisy(rng, t)
        _one_run(out, f"run-{p}-loader-again", p, "loader", rows_p, None, "A")
    rows = R.read_results(out)
    units = [T.unit_samples(rows, N_EPOCH, "syn", p, "loader") for p in ("torch-jpeg", "raw")]
    assert [len(u) for u in units] == [2, 2] and all(len(a) == 12 for u in units for a in u)
    iv = T.epoch_ratio(rows, "syn", ("torch-jpeg", "loader"), ("raw", "loader"))
    meds = [np.log([np.median(a) for a in u]) for u in units]
    assert iv.value == pytest.approx(float(np.exp(meds[0].mean() - meds[1].mean())))
    assert iv.ok and iv.n == 2 and iv.lo < iv.value < iv.hi


ACC_SECTION = "Accuracy (test split, original pixels, evaluation transform)"
# test accuracy per training seed 1, 2, 3 (in 40ths: N_TEST images): torch-jpeg a constant 10
# points below raw, inr equal to raw, dali different at every seed, torch-nvjpeg one seed only
SEED_ACC = {
    "raw": [0.9, 0.825, 0.75],
    "torch-jpeg": [0.8, 0.725, 0.65],
    "inr": [0.9, 0.825, 0.75],
    "dali": [0.875, 0.85, 0.7],
    "torch-nvjpeg": [0.8],
}


def _correct(acc: float) -> np.ndarray:
    k = round(acc * N_TEST)
    assert k == acc * N_TEST  # a share of the test images
    return np.arange(N_TEST) >= N_TEST - k


@pytest.fixture(scope="module")
def seed_folder(tmp_path_factory):
    """Train runs at seeds 1..3 (``SEED_ACC``), interleaved seed by seed as the sweeps run them,
    plus a second, later run of raw at seed 1 with another accuracy: the seed counts once."""
    rng = np.random.default_rng(5)
    base = tmp_path_factory.mktemp("seeds")
    out = base / "results"
    for i in range(3):
        for p, accs in SEED_ACC.items():
            if i < len(accs):
                _one_run(out, f"2024T00{i}-{p}-train", p, "train", _noisy(rng, 1.0)[:1], _correct(accs[i]),
                         "A", seed=i + 1)
    _one_run(out, "2024T009-raw-train", "raw", "train", _noisy(rng, 1.0)[:1], _correct(0.5), "A", seed=1)
    rep = base / "report"
    build_report(out, rep)
    return out, rep, (rep / "README.md").read_text()


def _pct(x: float) -> str:
    return f"{100 * x:.1f}"


def test_accuracy_over_seeds_matches_scipy(seed_folder):
    from scipy import stats

    out, _, text = seed_folder
    acc = parse_tables(text)[ACC_SECTION][0].set_index("pipeline")
    for p in ("raw", "torch-jpeg", "dali", "inr"):
        x = np.array(SEED_ACC[p])
        ci = stats.ttest_1samp(x, 0).confidence_interval()
        lo, hi = max(ci.low, 0.0), min(ci.high, 1.0)  # shown clipped to 0-100%
        assert acc.loc[p, "over seeds % [95% CI]"] == f"{_pct(x.mean())} [{_pct(lo)}-{_pct(hi)}]"
        assert (hi < ci.high) == (p in ("raw", "inr", "dali"))  # these fixtures' t intervals pass 100%
        assert int(acc.loc[p, "seeds"]) == 3
    # raw's second run at seed 1 (50%) counts once: seed 1 is its first run (90%)
    per_seed = T.seed_accuracy(R.read_results(out))
    raw = per_seed[per_seed["pipeline"] == "raw"]
    assert raw["seed"].tolist() == [1, 2, 3] and raw["acc"].tolist() == pytest.approx(SEED_ACC["raw"])
    assert raw["run_id"].iloc[0] == "2024T000-raw-train"
    # dali vs raw and vs torch-jpeg: the paired t interval on the per-seed differences
    for ref in ("raw", "torch-jpeg"):
        x, y = np.array(SEED_ACC["dali"]), np.array(SEED_ACC[ref])
        ci = stats.ttest_rel(x, y).confidence_interval()
        iv = T.seed_diff(per_seed, "syn", "dali", ref)
        assert iv.value == pytest.approx((x - y).mean()) and (iv.lo, iv.hi) == pytest.approx((ci.low, ci.high))
        span = f"[{math.floor(1000 * ci.low) / 10:.1f}, {math.ceil(1000 * ci.high) / 10:.1f}]"  # rounded outward
        want = (f"{100 * (x - y).mean():+.1f} points {span}" if ci.low > 0 or ci.high < 0
                else f"{S.NO_DIFFERENCE} {span}")
        assert acc.loc["dali", f"vs {ref} (seeds)"] == want


def test_seed_differences_detected_or_not(seed_folder):
    _, _, text = seed_folder
    acc = parse_tables(text)[ACC_SECTION][0].set_index("pipeline")
    # a constant 10 points at every seed: three alike are no proof of zero spread: said, no result
    assert acc.loc["torch-jpeg", "vs raw (seeds)"] == "-10.0 points, the same in all 3 (no spread: no interval, not a result)"
    assert acc.loc["raw", "vs torch-jpeg (seeds)"] == "+10.0 points, the same in all 3 (no spread: no interval, not a result)"
    # the same accuracy at every seed: the same, said so, no interval
    assert acc.loc["inr", "vs raw (seeds)"] == "+0.0 points, the same in all 3 (no spread: no interval, not a result)"
    # a difference that varies by seed is detected where its interval excludes 0
    assert acc.loc["dali", "vs raw (seeds)"].startswith(S.NO_DIFFERENCE)
    assert acc.loc["raw", "vs raw (seeds)"] == "—"
    # one seed: no mean over seeds, no paired comparison; the per-model columns stay
    assert acc.loc["torch-nvjpeg", "over seeds % [95% CI]"] == "—"
    assert acc.loc["torch-nvjpeg", "vs raw (seeds)"] == "—" and int(acc.loc["torch-nvjpeg", "seeds"]) == 1
    assert acc.loc["torch-nvjpeg", "correct"] == "32/40"
    assert "fewer than 2 (common) seeds" in text


def test_per_model_columns_are_one_seeds_models(seed_folder):
    """Wilson and McNemar speak of one model per pipeline: the first run of the lowest seed every
    pipeline has (1), not a pool: raw's two seed-1 runs (90%, then 50%): its first, 36/40."""
    _, _, text = seed_folder
    acc = parse_tables(text)[ACC_SECTION][0].set_index("pipeline")
    assert set(acc["seed"].astype(int)) == {1}
    assert acc.loc["torch-jpeg", "correct"] == "32/40" and int(acc.loc["torch-jpeg", "repeats"]) == 1
    assert acc.loc["raw", "correct"] == "36/40" and int(acc.loc["raw", "repeats"]) == 1
    # McNemar of seed 1's first runs: raw 36/40 vs torch-jpeg 32/40, 4 images only raw gets right
    assert acc.loc["torch-jpeg", "vs raw"] == f"{S.NO_DIFFERENCE} (p={2 / 2**4:.2g})"


def test_seeds_split_no_timing(seed_folder):
    """Runs at different seeds are processes of one setting: the train speedups count all 3 (4 for
    raw) runs, not one per seed."""
    out, _, _ = seed_folder
    rows = load(out).rows
    assert len(T.unit_samples(rows, N_EPOCH, "syn", "torch-jpeg", "train")) == 3
    assert len(T.unit_samples(rows, N_EPOCH, "syn", "raw", "train")) == 4
    assert T.epoch_ratio(rows, "syn", ("raw", "train"), ("torch-jpeg", "train")).ok
    assert set(rows["dataset"]) == {"syn"}


def test_accuracy_of_one_seed_shows_no_seed_columns(folder):
    """Runs without a recorded seed (older results) are seed 0: one seed each, so the table keeps
    its per-model columns only and says why there is no interval over seeds."""
    out, _, text = folder
    acc = parse_tables(text)[ACC_SECTION][0]
    assert not any("seeds" in c for c in acc.columns) and "seed" not in acc.columns
    assert "trained from one seed" in text
    per_seed = T.seed_accuracy(R.read_results(out))
    assert set(per_seed["seed"]) == {0} and per_seed.groupby("pipeline").size().eq(1).all()
    assert not T.seed_diff(per_seed, "syn", "inr", "raw").ok


def test_mcnemar_compares_the_models_the_row_shows(tmp_path):
    """inr failed at seed 1, so the per-model columns show seed 2 for every pipeline; McNemar must
    compare those seed-2 models (alike: no difference), not the seed-1 ones raw and torch-jpeg
    share (40/40 against 20/40, which would read 'worse')."""
    rng = np.random.default_rng(5)
    out = tmp_path / "results"
    acc = {("raw", 1): 1.0, ("torch-jpeg", 1): 0.5, ("raw", 2): 0.9, ("torch-jpeg", 2): 0.9, ("inr", 2): 0.9}
    for (p, seed), a in acc.items():
        _one_run(out, f"2024T00{seed}-{p}-train", p, "train", _noisy(rng, 1.0)[:1], _correct(a), "A", seed=seed)
    build_report(out, tmp_path / "rep")
    t = parse_tables((tmp_path / "rep" / "README.md").read_text())[ACC_SECTION][0].set_index("pipeline")
    assert set(t["seed"].astype(int)) == {2}
    assert t.loc["torch-jpeg", "correct"] == "36/40" and t.loc["torch-jpeg", "vs raw"] == f"{S.NO_DIFFERENCE} (p=1)"


def test_models_of_another_schedule_stay_out_of_the_accuracy_table(tmp_path):
    """raw trained once for 1+2 epochs (seed 1) and at seeds 1-2 for 1+29: the short run is no sample
    of the 30-epoch accuracy; it is left out, and the section says so."""
    rng = np.random.default_rng(6)
    out = tmp_path / "results"
    _one_run(out, "2024T000-raw-train", "raw", "train", _noisy(rng, 1.0)[:1], _correct(0.5), "A", seed=1,
             schedule=(1, 2))
    for seed, a in ((1, 0.9), (2, 0.875)):
        for p in ("raw", "torch-jpeg"):
            _one_run(out, f"2024T00{seed}-{p}-long", p, "train", _noisy(rng, 1.0)[:1], _correct(a), "A",
                     seed=seed, schedule=(1, 29))
    build_report(out, tmp_path / "rep")
    text = (tmp_path / "rep" / "README.md").read_text()
    t = parse_tables(text)[ACC_SECTION][0].set_index("pipeline")
    assert t.loc["raw", "correct"] == "36/40" and t.loc["raw", "vs torch-jpeg"] == f"{S.NO_DIFFERENCE} (p=1)"
    assert t.loc["raw", "over seeds % [95% CI]"].startswith("88.8 [")  # (90 + 87.5) / 2, the short run out
    assert "train runs of another schedule are left out of this table (1 run of 1+2 epochs)" in text


def test_a_speedup_without_spread_says_so_not_one_process(tmp_path):
    """Two processes a side whose medians are all equal: no zero-width interval, and the text gives that reason
    (it printed the one-process note, or before that "1.10x [1.10-1.10]" as a result)."""
    out = tmp_path / "flat"
    _run(out, "torch-jpeg", "loader", [[1.1] * 3] * 2)
    _run(out, "inr", "loader", [[1.0] * 3] * 2)
    sp = T.speedups(R.read_results(out))
    row = sp[(sp["pipeline"] == "inr") & (sp["baseline"] == "torch-jpeg")].iloc[0]
    assert row["why"] == S.NO_SPREAD and not row["detected"]
    assert T.fmt_speedup(row) == "1.10x (no spread: no interval, not a result)"
