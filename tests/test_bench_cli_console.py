"""``inrbench bench`` on the console: the summary prints spreads as the report does (``(IQR x)``, none
for one sample) and test accuracy with its Wilson interval; a skipped run says nothing was measured;
typos in ``--split``/``--eval-split``/``--store`` are refused before a run folder exists."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from bench import results as R
from bench import stats as S
from bench.cli import main
from bench.commands.bench import summary_table


def _rows(repeats: int, acc=(0.9, 0.9), n_test: int = 80) -> R.RunRows:
    rows = R.RunRows("r", "raw", "syn", "train", {"warmup": 0, "epochs": 1, "pipe": {"seed": 0}})
    for r in range(repeats):
        rows.add("epoch_s", 0.1 + 0.02 * r, "s", repeat=r, epoch=1)
        rows.add("images_per_s", 6029.0 + 1730.0 * r, "img/s", repeat=r, epoch=1)
        rows.add("cpu_cores_busy", 1.872, "cores", repeat=r)
        rows.add("test_acc", acc[r], "frac", repeat=r)
        rows.add("test_images", n_test, "images", repeat=r)
    return rows


def _line(text: str, label: str) -> str:
    return next(ln for ln in text.splitlines() if ln.strip().startswith(label))


def test_one_sample_shows_no_spread_and_brackets_are_intervals():
    text = summary_table(_rows(1))
    assert "[0]" not in text and "(IQR" not in text  # "90 [0] %" read as zero spread
    cores = _line(text, "cores")
    assert cores.split()[1] == "1.87" and cores.endswith("n=1")
    acc = _line(text, "test acc")
    iv = S.wilson(72, 80)
    assert f"90.0 % [{100 * iv.lo:.1f}-{100 * iv.hi:.1f}]" in acc  # the report's interval, not an IQR
    assert "72/80 test images of one model" in acc


def test_several_samples_show_the_iqr_as_the_report_does():
    text = summary_table(_rows(2, acc=(0.9, 0.95)))
    ips = _line(text, "img/s")
    assert "6,894 (IQR 865)" in ips and "e+" not in ips  # "6029 [1.73e+03]" before
    acc = _line(text, "test acc")
    iv = S.wilson(74, 80)  # the mean of 72 and 76 of 80
    assert f"92.5 % [{100 * iv.lo:.1f}-{100 * iv.hi:.1f}]" in acc and "mean of 2 repeats" in acc


def test_a_skipped_run_says_nothing_was_measured():
    rows = R.RunRows("r", "raw", "syn", "loader", {})
    rows.skip("unavailable: device cuda requested but torch.cuda.is_available() is False here")
    text = summary_table(rows)
    assert text.startswith("raw loader: SKIP: unavailable: device cuda requested")
    assert "Nothing was measured" in text


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    from bench.datasets.prepare import prepare_dataset

    return Path(prepare_dataset("synthetic", tmp_path_factory.mktemp("d") / "syn", size=8, per_class=4,
                                num_classes=2))


@pytest.mark.parametrize(("extra", "message"), [
    (["--pipeline", "raw", "--split", "nosuch"], "--split 'nosuch': "),
    (["--pipeline", "raw", "--mode", "train", "--eval-split", "nosuch"], "--eval-split 'nosuch': "),
    (["--pipeline", "inr", "--store", "missing.inr"], "missing.inr: no such INR store file"),
    (["--pipeline", "inr", "--store", "MANIFEST"], "not an INR store"),
])
def test_typos_are_refused_before_a_run_folder_exists(data, tmp_path, capsys, extra, message):
    extra = [str(data / "manifest.json") if a == "MANIFEST" else a for a in extra]
    for out in (tmp_path / "new", tmp_path / "old"):
        if out.name == "old":  # a results folder with a run already: nothing is added to it
            rows = R.RunRows("earlier", "raw", "syn", "loader", {})
            rows.add("epoch_s", 1.0, "s", repeat=0, epoch=1)
            R.write_run(out, rows)
        before = sorted(p.name for p in out.rglob("*")) if out.exists() else None
        rc = main(["bench", "--data", str(data), "--out", str(out), "--repeats", "1", *extra])
        err = capsys.readouterr().err
        assert rc == 2 and message in err and len(err.strip().splitlines()) == 1
        assert (sorted(p.name for p in out.rglob("*")) if out.exists() else None) == before


def test_the_eval_split_is_checked_in_train_mode_only(data):
    """A loader run on a set without a ``test`` split is not refused for the default --eval-split."""
    from bench.commands.bench import _check_names
    from bench.datasets.prepared import open_prepared
    from bench.errors import InputError

    ds = open_prepared(data)
    args = argparse.Namespace(split="train", eval_split="nosuch", mode="loader", store=None)
    _check_names(args, ds)
    with pytest.raises(InputError, match="has no such split"):
        _check_names(argparse.Namespace(**{**vars(args), "mode": "train"}), ds)


def test_absent_metrics_carry_their_reasons_grouped():
    """``absent here`` names each absent metric with the reason its rows record (before: the names alone),
    metrics sharing a reason on one line; a metric whose reason differs by repeat shows the first and a count."""
    rows = _rows(2)
    for r, secs in enumerate((0.22, 0.31)):
        rows.unavailable("other_cores_busy", "cores", f"measured region {secs} s, under 0.5 s: too short", repeat=r)
        rows.unavailable("gpu_mem_used_peak_bytes", "bytes", "no NVML here (CPU device)", repeat=r)
        rows.unavailable("torch_peak_allocated_bytes", "bytes", "no NVML here (CPU device)", repeat=r)
    text = summary_table(rows)
    lines = text.splitlines()
    at = lines.index("  absent here:")
    assert lines[at + 1:] == [
        "    gpu_mem_used_peak_bytes, torch_peak_allocated_bytes: no NVML here (CPU device)",
        "    other_cores_busy: measured region 0.22 s, under 0.5 s: too short (1 other reason on other repeats)",
    ]
