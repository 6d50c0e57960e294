"""The learned-init study (``perf_init.py``, formerly ``inrbench perf init``): its counts, its tables, its
realized encodes and its figure. Run with ``pytest studies/encoding-cost``; not part of the default suite."""

from __future__ import annotations

import json

import numpy as np
import perf_init
import pytest
import torch
from perf_init import CANDIDATES, SETS, settings

from bench import cli, outputs
from inr.fit import preset
from tests.cli_helpers import assert_one_line_error, snapshot

COUNTS = ("--iterations-32", "--iterations-224", "--test-images", "--outer-steps", "--candidates", "--threads")


def run(capsys, *argv) -> tuple[int, str, str]:
    rc = perf_init.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    from tests.fixtures_datasets import photos32_train

    return photos32_train(tmp_path_factory.mktemp("es"))


@pytest.fixture
def world(tmp_path):
    w = tmp_path / "w"
    (w / "thesis").mkdir(parents=True)
    (w / "thesis" / "chapter1.tex").write_text("\\chapter{One}\n")
    (w / "notes.txt").write_text("my notes\n")
    return w


@pytest.mark.parametrize("flag", COUNTS)
@pytest.mark.parametrize("value", ["0", "-5"])
def test_a_count_of_zero_or_less_is_refused_naming_the_option(capsys, monkeypatch, flag, value):
    monkeypatch.setattr(perf_init, "measure_set", lambda *a: pytest.fail("perf init started with " + flag))
    rc, _, err = run(capsys, "--sets", "32", flag, value)
    assert_one_line_error(rc, err, f"argument {flag}: must be >= 1, got {value}")


def _parser():
    p = cli.OneLineParser(prog="perf_init.py")
    perf_init.add_arguments(p)
    return p


def _args(*argv: str):
    return _parser().parse_args(list(argv))


def test_counts_left_out_take_each_sets_documented_default():
    args = _args()
    assert args.iterations_32 is args.iterations_224 is args.test_images is args.outer_steps is None
    assert args.candidates is args.threads is None
    for name in SETS:
        _, _, iters, n_test, meta = SETS[name]
        assert settings(name, args) == (iters, n_test, {**meta, "candidates": CANDIDATES[name]})
    assert settings("32", args)[:2] == (5000, 8) and settings("224", args)[:2] == (300, 1)
    assert settings("32", args)[2]["outer_steps"] == 300 and settings("224", args)[2]["outer_steps"] == 80


def test_counts_given_are_used_as_given():
    args = _args("--iterations-32", "7", "--iterations-224", "9", "--test-images", "3", "--outer-steps", "2",
                 "--candidates", "1")
    it32, n32, m32 = settings("32", args)
    it224, n224, m224 = settings("224", args)
    assert (it32, n32, it224, n224) == (7, 3, 9, 3)
    assert m32["outer_steps"] == m224["outer_steps"] == 2 and m32["candidates"] == m224["candidates"] == 1


def test_help_says_every_default():
    text = " ".join(_parser().format_help().split())
    for want in ("fit iterations at 32x32 (default 5000", "fit iterations at 224x224 (default 300",
                 "held-out images per set (default 8 at 32, 1 at 224)",
                 "Reptile outer steps (default 300 at 32, 80 at 224)", "default 4 at 32, 1 at 224)",
                 "torch CPU threads (default: torch's default"):
        assert want in text, want


def test_perf_init_refuses_a_device_this_machine_lacks(capsys):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the refusal of a missing device cannot be shown here")

    assert perf_init.main(["--device", "cuda", "--sets", "32"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--device cuda" in err[0] and "no CUDA device" in err[0]


def test_perf_init_runs_end_to_end_on_the_cpu(capsys):
    """`perf init` on the CPU, short: meta-training, both fit curves, the per-image savings (learned, and
    random against itself), the encoder's end points and the realized encodes, with consistent counts."""
    from perf_init import EARLY_STOP, REALIZED

    assert perf_init.main(["--sets", "32", "--iterations-32", "30", "--test-images", "2", "--outer-steps", "3",
                 "--no-prune", "--repeats", "1", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    r = doc["sets"][0]
    assert doc["device"] == "cpu" and r["held_out_images"] == 2 and r["meta"]["split"] == "train"
    assert r["random_psnr_at_full"] > r["random_psnr_at_0"] and len(r["per_image"]["savings"]) == 2
    pr = r["per_image_random"]  # random init against itself: never below 1x, every image gets there
    assert pr["never"] == 0 and all(x >= 1.0 for x in pr["savings"]) and len(pr["savings"]) == 2
    v = r["realized"]["variants"]
    assert set(v) == set(REALIZED) and v["random, full schedule"]["image_iterations"] == 32 * 30
    assert all(0 < v[k]["image_iterations"] <= 32 * 30 and len(v[k]["seconds"]) == 1 for k in v)
    assert all(("vs_random_early_stop" in v[k]) == (k in EARLY_STOP and k != "random, early stop") for k in v)


def test_perf_init_per_image_saving_reads_no_difference_when_its_interval_holds_one():
    from perf_init import _fmt_saving

    assert _fmt_saving({"geomean": 2.7, "lo": 1.6, "hi": 12.9, "n": 8, "never": 1}) == "2.70x [1.60-12.90], 1 never"
    assert _fmt_saving({"geomean": 1.3, "lo": 0.8, "hi": 2.1, "n": 8, "never": 0}).startswith("no difference detected")
    assert (_fmt_saving({"geomean": 2.3, "lo": float("nan"), "hi": float("nan"), "n": 1, "never": 0})
            == "2.3x (n=1: one image, no interval, not a result)")
    assert (_fmt_saving({"geomean": 1.0, "lo": float("nan"), "hi": float("nan"), "n": 8, "never": 0})  # no spread
            == "1.0x (n=8: the same on every image, no spread, no interval, not a result)")


def test_perf_init_realized_ratio_text_goes_through_fmt_ratio():
    """The realized-saving ratios print as bench.stats.fmt_ratio does: an interval that holds 1.0 reads "no difference
    detected" (it printed "(1.01x [0.97-1.06])"), one round (one worker process) is no result."""
    from perf_init import _fmt_round_ratio, _round_ratio

    from bench.stats import unit_ratio_ci

    assert _fmt_round_ratio({"value": 1.01, "lo": 0.97, "hi": 1.06, "n": 3}) == "no difference detected [0.97-1.06]"
    assert _fmt_round_ratio({"value": 2.0, "lo": 1.5, "hi": 2.5, "n": 3}) == "2.00x [1.50-2.50]"
    one = _round_ratio(unit_ratio_ci, [2.0], [1.0])
    assert one == {"value": 2.0, "lo": None, "hi": None, "n": 1, "why": "one sample"}
    assert _fmt_round_ratio(one) == "2.00x (one round (worker process): no interval, not a result)"


def test_perf_init_prints_every_rounds_seconds(capsys):
    """Beside the medians and the ratios, the table prints each round's seconds per variant, in round order: a
    reader can see a slow first round or a drifting machine (the JSON has them as ``seconds``)."""
    from perf_init import REALIZED, print_table

    variants = {name: {"images": 4, "image_iterations": 100, "iterations_saving": 1.0, "median_seconds": 2.0 + k,
                       "seconds": [2.0 + k, 2.5 + k, 1.5 + k], "mean_psnr": 30.0, "reached": 4, "max_shortfall_db": 0.0,
                       "time_saving": {"value": 1.0, "lo": 0.9, "hi": 1.1, "n": 3}}
                for k, name in enumerate(REALIZED)}
    for name in REALIZED[3:]:
        variants[name]["vs_random_early_stop"] = {"iterations": 1.0, "value": 1.0, "lo": 0.9, "hi": 1.1, "n": 3}
    ends = {"iterations": 30, "fp32": 30.0, "8bit": 29.5}
    doc = {"threads": 2, "device": "cpu", "seconds": 10.0, "figure": None, "sets": [{
        "set": "photos 32x32", "arch": "5x13", "iterations": 30, "random_psnr_at_full": 30.0,
        "learned_psnr_at_full": 31.0, "learned_psnr_at_0": 12.0, "iterations_to_reach": 10, "saving_factor": 3.0,
        "break_even_images": None, "meta": {"num_images": 8, "seconds": 1.0, "image_iterations": 100},
        "end_points": {"random": ends, "learned": ends},
        "realized": {"repeats": 3, "processes": 3, "chunk": 8, "variants": variants}}]}
    print_table(doc)
    out = capsys.readouterr().out
    lines = out.splitlines()
    head = next(i for i, line in enumerate(lines) if "wall seconds by round" in line)
    rows = lines[head + 1:head + 1 + len(REALIZED)]
    for k, (name, row) in enumerate(zip(REALIZED, rows, strict=True)):
        assert name in row and row.split()[-3:] == [f"{2.0 + k:.2f}", f"{2.5 + k:.2f}", f"{1.5 + k:.2f}"]

def test_perf_init_realized_saving(photos, tmp_path, capsys):
    """``perf init``'s realized saving: real encodes, timed and interleaved, with consistent counts."""
    from perf_init import REALIZED, SUBSAMPLE, _realized, print_table
    from scipy import stats

    from inr.meta import MetaConfig, meta_train, save_init

    _, imgs = photos
    cfg = preset("cifar10", lr=3e-3)
    w, info = meta_train(imgs[4:], cfg.arch, cfg.lr, MetaConfig(outer_steps=20, inner_steps=4, meta_batch=4))
    path = tmp_path / "init.pt"
    sha = save_init(path, cfg.arch, w, info)
    rz = _realized(imgs[:4], cfg, 150, (str(path), sha), repeats=2, device="cpu")
    assert rz["repeats"] == 2 and rz["processes"] == 2 and list(rz["variants"]) and set(rz["variants"]) == set(REALIZED)
    ref = rz["variants"][REALIZED[0]]
    assert ref["image_iterations"] == 4 * 150 and ref["reached"] == 4 and ref["max_shortfall_db"] == 0.0
    for name in REALIZED:
        d = rz["variants"][name]
        assert len(d["seconds"]) == 2 and all(t > 0 for t in d["seconds"])
        assert 0 < d["image_iterations"] <= 4 * 150 and 0 <= d["reached"] <= 4
        assert d["iterations_saving"] == pytest.approx(600 / d["image_iterations"])
        # the subsampled variant's steps see 1/8 of the pixels, and its all-pixel measurements (start, every 25
        # steps) count 1/3 each: in all-pixel iterations it costs between 1/8 and 1/8 + 2/75 of its steps
        assert d["pixel_fraction"] == (SUBSAMPLE if name.endswith("1/8 px") else 1.0)
        cost = 600 / d["pixel_iterations_saving"]
        if d["pixel_fraction"] < 1:
            assert d["image_iterations"] / 8 < cost <= d["image_iterations"] * (1 / 8 + 2 / 75) + 4 / 3, cost
        else:
            assert cost == d["image_iterations"]
        # one value per round (each round a worker process): ratio of geometric means, Welch's t on the logs
        gm = np.exp(np.mean(np.log(ref["seconds"])) - np.mean(np.log(d["seconds"])))
        assert d["time_saving"]["value"] == pytest.approx(gm) and d["time_saving"]["n"] == 2
        if name != REALIZED[0]:
            lo, hi = d["time_saving"]["lo"], d["time_saving"]["hi"]
            ci = stats.ttest_ind(np.log(ref["seconds"]), np.log(d["seconds"]), equal_var=False).confidence_interval()
            assert (lo, hi) == pytest.approx((np.exp(ci.low), np.exp(ci.high)))
    # early stop alone (random init, each image at its own full-schedule PSNR; over 150 iterations at this lr the
    # best PSNR still rises at the end, so few or no images stop early) ends where the reference ends; the learned
    # variants are also measured against it
    es = rz["variants"]["random, early stop"]
    assert es["image_iterations"] <= 4 * 150 and es["mean_psnr"] == pytest.approx(ref["mean_psnr"], abs=0.1)
    assert "vs_random_early_stop" not in es and "vs_random_early_stop" not in ref
    for name in REALIZED[3:]:
        vs = rz["variants"][name]["vs_random_early_stop"]
        assert vs["iterations"] == pytest.approx(es["image_iterations"] / rz["variants"][name]["image_iterations"])
        gm = np.exp(np.mean(np.log(es["seconds"])) - np.mean(np.log(rz["variants"][name]["seconds"])))
        assert vs["time"] == pytest.approx(gm) and vs["value"] == vs["time"]
    doc = {"sets": [{"set": "photos 32x32", "arch": "5x13", "iterations": 150, "random_psnr_at_full": 30.0,
                     "learned_psnr_at_full": 31.0, "learned_psnr_at_0": 12.0, "iterations_to_reach": 50,
                     "saving_factor": 3.0, "per_image": None, "meta": {"seconds": 1.0, "image_iterations": 320,
                                                                       "num_images": 4},
                     "break_even_images": None, "realized": rz,
                     "end_points": {"random": {"iterations": 150, "fp32": 30.0, "8bit": 29.9},
                                    "learned": {"iterations": 50, "fp32": 29.0, "8bit": 28.9}}}],
           "figure": None, "threads": 1, "seconds": 3.0}
    print_table(doc)
    text = capsys.readouterr().out
    assert all(name in text for name in REALIZED) and f"{ref['image_iterations']:>8} img-it (1.00x)" in text
    assert text.count(" of 0.125 px = ") == 1  # the subsampled variant's steps, in all-pixel units too
    assert text.count("vs random early stop:") == len(REALIZED) - 3 and "2 rounds, each in its own worker process" in text
    assert "no difference detected [" in text or "x [" in text  # intervals, through bench.stats.fmt_ratio

@pytest.mark.gpu
def test_perf_init_runs_on_cuda(capsys):
    """`perf init --device cuda`: meta-training, both fit curves and the encoder's end points on the GPU."""
    import json


    assert perf_init.main(["--device", "cuda", "--sets", "32", "--iterations-32", "30", "--test-images", "2",
                 "--outer-steps", "3", "--no-prune", "--repeats", "1", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    r = doc["sets"][0]
    assert doc["device"] == "cuda" and r["held_out_images"] == 2 and len(r["per_image"]["savings"]) == 2
    assert r["random_psnr_at_full"] > r["random_psnr_at_0"]
    # the realized saving: real encodes on the GPU, eager and compiled, with early stop
    v = r["realized"]["variants"]
    assert v["random, full schedule"]["image_iterations"] == 2 * 30
    assert all(0 < v[k]["image_iterations"] <= 60 and len(v[k]["seconds"]) == 1 for k in v)

def test_perf_init_text_reads_a_null_bound_as_no_interval():
    from perf_init import _fmt_saving

    text = _fmt_saving({"geomean": 4.2, "lo": None, "hi": None, "n": 8, "never": 0})
    assert "no interval, not a result" in text and "4.2x" in text

def _fake_set(name, args, workdir) -> dict:
    """What ``perf_init.measure_set`` returns, as far as ``figure`` and ``--json`` read it."""
    end = {"iterations": 4, "fp32": 20.0, "8bit": 19.0}
    return {"set": name, "arch": "2x4", "held_out_images": 1, "random_psnr_at_full": 20.0,
            "curve": {"iterations": [0, 1, 4], "random": [10.0, 15.0, 20.0], "learned": [12.0, 18.0, 21.0]},
            "end_points": {"random": end, "learned": end}}


def test_perf_init_figure_is_claimed_before_the_work_and_written_atomically(world, capsys, monkeypatch):
    """Audit: ``perf init --figure`` overwrote a user's file after all the work, and given a folder wrote
    ``<folder>.png`` while printing the folder's name."""
    P = perf_init

    ran = []
    monkeypatch.setattr(P, "measure_set", lambda *a: ran.append(a[0]) or _fake_set(*a))
    argv = ["--sets", "32", "--json", "--figure"]
    (world / "fig_user.png").write_bytes(b"\x89PNG\r\n\x1a\nmine")
    before = snapshot(world, dirs=True)
    for target, fragment in (("fig_user.png", "file that inr-bench did not write"),
                             ("thesis", "is a folder, not a perf init figure file"),
                             ("notes.txt/x.png", "notes.txt is a file, not a folder")):
        rc, _, err = run(capsys, *argv, world / target)
        assert_one_line_error(rc, err, f"--figure {world / target}", fragment)
    assert ran == [] and snapshot(world, dirs=True) == before  # refused before any work, nothing touched
    for _ in range(2):  # a figure of an earlier perf init is replaced
        rc, out, err = run(capsys, *argv, world / "curves")
        assert rc == 0, err
        assert json.loads(out)["figure"] == str(world / "curves")  # the path written, exactly
    assert outputs.is_own(world / "curves", "perf-figure") and not (world / "curves.png").exists()
    assert not [p for p in world.iterdir() if "inrbench" in p.name]  # no temp or lock file left
