"""``inrbench report`` on fixture result files (tests/fixtures/results/sweep, real schema)."""

from __future__ import annotations

import glob
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from bench.cli import main as cli_main
from bench.errors import InputError
from bench.report.build import build_report
from tests.report_tables import _quick_reports, parse_tables, sweep_report  # noqa: F401

FIX = Path(__file__).resolve().parent / "fixtures" / "results" / "sweep"


def _fixture_rows() -> pd.DataFrame:
    """The fixture's bench rows read straight from the files (independently of the report code),
    only from cells that have a completion marker."""
    frames = []
    for f in sorted(glob.glob(str(FIX / "cells" / "*" / "runs" / "*" / "rows.csv"))):
        cell = Path(f).parents[2]
        if (cell / "cell.json").exists():
            frames.append(pd.read_csv(f))
    return pd.concat(frames, ignore_index=True)


def _median_iqr(rows: pd.DataFrame, pipeline: str, mode: str, metric: str) -> tuple[float, float]:
    v = rows[(rows.pipeline == pipeline) & (rows["mode"] == mode) & (rows.metric == metric)
             & (rows.status == "ok") & rows.epoch.notna()]["value"]
    return v.median(), v.quantile(0.75) - v.quantile(0.25)


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = sweep_report(tmp_path_factory)
    return out, (out / "README.md").read_text()


def _table(tables, heading_prefix: str, i: int = 0) -> pd.DataFrame:
    keys = [k for k in tables if k.startswith(heading_prefix)]
    assert keys, f"no table under a heading starting {heading_prefix!r}; have {list(tables)}"
    return tables[keys[0]][i].set_index(tables[keys[0]][i].columns[0])


def test_throughput_table_holds_medians_and_statuses(report):
    _, text = report
    rows = _fixture_rows()
    t = _table(parse_tables(text), "photos32 — images/s")
    assert list(t.columns) == ["loader", "replay", "train"]
    assert list(t.index) == ["raw", "torch-jpeg", "dali", "inr"]
    for p in ("raw", "torch-jpeg", "inr"):
        med, iqr = _median_iqr(rows, p, "loader", "images_per_s")
        cell = t.loc[p, "loader"]
        shown_med = float(cell.split(" (IQR ")[0].replace(",", ""))
        shown_iqr = float(cell.split(" (IQR ")[1].rstrip(")").replace(",", ""))
        assert shown_med == pytest.approx(med, rel=1e-3, abs=0.5)
        assert shown_iqr == pytest.approx(iqr, rel=1e-2, abs=0.5)
    # a skipped and a failed cell are visible with their reasons, never a number
    assert t.loc["dali", "train"] == "skip: DALI mixed decode needs a GPU"
    assert t.loc["inr", "replay"] == "error: exit -9: Killed (out of memory)"
    # the killed cell (no marker) contributed nothing: its run id is absent from the merged rows
    assert "fixture-killed" not in set(rows.run_id)


def _process_log_medians(rows: pd.DataFrame, pipeline: str, mode: str) -> np.ndarray:
    """Log of each run's (process's) median epoch: the unit a speedup counts once."""
    v = rows[(rows.pipeline == pipeline) & (rows["mode"] == mode) & (rows.metric == "epoch_s")
             & (rows.status == "ok") & rows.epoch.notna()]
    return np.log(v.groupby("run_id")["value"].median().to_numpy())


def test_speedup_is_the_ratio_of_process_median_epoch_times(report):
    """Each process (run) counts once (its median epoch): ratio of geometric means, Welch's t interval."""
    from scipy import stats

    _, text = report
    rows = _fixture_rows()
    tables = parse_tables(text)
    sp = tables["photos32 — speedup"][0].set_index("pipeline")
    base, inr = _process_log_medians(rows, "torch-jpeg", "train"), _process_log_medians(rows, "inr", "train")
    assert len(base) >= 2 and len(inr) >= 2
    ratio = float(np.exp(base.mean() - inr.mean()))
    ci = stats.ttest_ind(base, inr, equal_var=False).confidence_interval(0.95)
    shown = sp.loc["inr", "vs torch-jpeg (train)"]
    assert float(shown.split("x")[0]) == pytest.approx(ratio, abs=0.006)
    lo, hi = (float(v) for v in shown.split("[")[1].rstrip("]").split("-"))
    assert (lo, hi) == pytest.approx((math.floor(100 * np.exp(ci.low)) / 100, math.ceil(100 * np.exp(ci.high)) / 100))
    assert sp.loc["torch-jpeg", "vs torch-jpeg (train)"].startswith("1.00x")
    # a skipped baseline is named, not turned into a number
    assert sp.loc["inr", "vs dali (train)"] == "n/a: dali skip: DALI mixed decode needs a GPU"


def test_compression_accuracy_cells_environment(report):
    _, text = report
    tables = parse_tables(text)
    comp = tables["photos32 — PSNR and bytes (compare)"][0]
    unreachable = comp[(comp["variant"] == "pruned-8bit") & (comp["match"] == "file")]
    assert unreachable["status"].item() == "unreachable (smallest JPEG 760 B)"
    assert comp[(comp["method"] == "inr") & (comp["variant"] == "fp32")]["PSNR dB"].item() == "31.20"

    acc = tables["Accuracy (test split, original pixels, evaluation transform)"][0].set_index("pipeline")
    rows = _fixture_rows()
    v = rows[(rows.pipeline == "inr") & (rows.metric == "test_acc")]["value"]
    # the fixture predates test_images: the median accuracy, without an interval
    assert float(acc.loc["inr", "test accuracy % [95% CI]"]) == pytest.approx(100 * v.median(), abs=0.05)
    assert acc.loc["raw", "bytes/image"] == "3,072" and acc.loc["torch-jpeg", "bytes/image"] == "900"
    assert acc.loc["inr", "bytes/image"] == "700"  # the store file's bytes / train images
    assert acc.loc["dali", "test accuracy % [95% CI]"].startswith("skip: ")

    cells = tables["Sweep cells"][0].set_index("cell")
    assert cells.loc["bench-killed", "status"] == "not finished"
    assert cells.loc["bench-inr-replay", "status"] == "error"
    env = tables["Environment"][0].set_index("")
    assert env.loc["CPU", "value"].startswith("Fixture CPU @ 2.0GHz, 2 logical cores")
    assert env.loc["GPU", "value"].startswith("none (NVML init failed")
    assert env.loc["torch-nvjpeg decoder", "value"] == "not recorded"  # the fixture's env.json predates it
    assert "No GPU in these runs: NVML init failed (no driver): fixture." in text

    ds = tables["INR design space (PSNR vs encoder parameters)"][0]
    assert set(zip(ds["param"], ds["value"], ds["PSNR dB"], strict=True)) == {
        ("layers", "3", "27.50"), ("layers", "5", "30.10"), ("hidden", "13", "30.10"),
        ("hidden", "8", "25.90"), ("hidden", "24", "34.80")}


def test_figures_are_written_and_linked(report):
    out, text = report
    expected = ["psnr_vs_bytes_compare.png", "speedup_photos32.png", "epoch_split_photos32.png",
                "cpu_busy_photos32.png", "accuracy_vs_bytes.png", "design_space.png", "compare_weights_fp32.png"]
    for name in expected:
        assert f"]({name})" in text, name
        with Image.open(out / name) as im:
            assert im.format == "PNG" and im.width >= 100 and im.height >= 50
    assert not list(out.glob("gpu_memory*.png"))  # no GPU samples: a note instead of a figure


def test_cli_report_and_bad_input(report, tmp_path, capsys):
    out, _ = report  # ``inrbench report FIX --out ...`` exited 0 (``sweep_report``)
    assert (out / "README.md").is_file()
    assert cli_main(["report", str(tmp_path / "missing"), "--out", str(tmp_path / "r2")]) == 2
    err = capsys.readouterr().err
    assert "missing: no such results folder" in err and "Traceback" not in err
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="no results"):
        build_report(tmp_path / "empty", tmp_path / "r3")  # a folder with neither sweep.json nor runs/


def test_headline_table(report):
    _, text = report
    rows = _fixture_rows()
    h = parse_tables(text)["photos32 — headline"][0].set_index("pipeline")
    base, inr = _process_log_medians(rows, "torch-jpeg", "train"), _process_log_medians(rows, "inr", "train")
    ratio = float(np.exp(base.mean() - inr.mean()))
    shown = h.loc["inr", "train speedup vs torch-jpeg"]  # 1.39x [lo-hi]: the interval excludes 1.0
    assert shown.startswith(f"{ratio:.2f}x [")
    lo, hi = (float(v) for v in shown.split("[")[1].rstrip("]").split("-"))
    assert 1.0 < lo <= ratio <= hi
    assert h.loc["inr", "bytes/image"] == "700"
    assert h.loc["dali", "train img/s"] == "skip: DALI mixed decode needs a GPU"
    # the baseline was skipped: no number, and why, as the speedup table says it
    assert h.loc["raw", "train speedup vs dali"] == "n/a: dali skip: DALI mixed decode needs a GPU"
    assert h.loc["dali", "train speedup vs dali"] == "—"  # its own train cell says why


def test_no_per_rank_section_without_rank_rows(report):
    """The fixture has single-process runs only: no per-rank heading, not even an empty one."""
    _, text = report
    assert "Data-parallel runs" not in text and "epoch time per rank" not in text


def test_environment_names_the_torch_nvjpeg_decoder():
    from bench.report.build import _nvjpeg_decoder

    assert _nvjpeg_decoder({"library": "torchcodec", "version": "0.17.0+cu130", "fallback_reason": None}) == \
        "torchcodec 0.17.0+cu130"
    assert _nvjpeg_decoder({"library": "torchvision", "version": "0.29.1", "fallback_reason": "ImportError: x"}) == \
        "torchvision 0.29.1 (TorchCodec not used: ImportError: x)"
    assert _nvjpeg_decoder({"available": False, "library": None, "reason": "neither imports"}) == "none (neither imports)"


def test_time_to_first_batch_includes_the_build(tmp_path):
    """An adapter that decodes while it is built (DALI) has a tiny ``ttfb_s`` and a large
    ``build_s``: the table shows ``time_to_first_batch_s`` = build + first batch, per repeat."""
    from bench import results as R

    out = tmp_path / "results"
    for pipeline, build, ttfb in (("dali", [0.26, 0.011, 0.012], 0.0001), ("raw", [0.01, 0.01, 0.01], 0.05)):
        run = R.RunRows(f"r-{pipeline}", pipeline, "syn", "loader", {"pipe": {"device": "cpu"}})
        for r, b in enumerate(build):
            run.add("build_s", b, "s", repeat=r)
            run.add("ttfb_s", ttfb, "s", repeat=r)
            run.add("time_to_first_batch_s", b + ttfb, "s", repeat=r)
            run.add("epoch_s", 1.0, "s", repeat=r, epoch=1)
            run.add("images_per_s", 100.0, "img/s", repeat=r, epoch=1)
        R.write_run(out, run)
    build_report(out, tmp_path / "rep")
    text = (tmp_path / "rep" / "README.md").read_text()
    t = _table(parse_tables(text), "syn — time to first batch (s)")
    dali = t.loc["dali", "loader"]
    assert float(dali.split(" (IQR ")[0]) == pytest.approx(0.0121, abs=1e-4)  # median of 0.2601, 0.0111, 0.0121
    iqr = float(dali.split(" (IQR ")[1].rstrip(")"))
    assert iqr == pytest.approx((0.0121 + 0.2601) / 2 - (0.0111 + 0.0121) / 2, rel=0.02)  # the cold build shows
    assert float(t.loc["raw", "loader"].split(" (IQR ")[0]) == pytest.approx(0.06, abs=1e-4)
    assert "`build_s` + `ttfb_s`" in text


def test_environment_names_the_dali_cuda_and_warns_on_a_mismatch(tmp_path):
    """DALI built for CUDA 12 beside a CUDA 13 torch: the Environment says so (also for env records
    written before env.json had ``warnings``); the matching pair gets no warning row."""
    import json

    from bench import envinfo
    from bench import results as R

    rows = R.RunRows("r", "raw", "syn", "loader", {"pipe": {"device": "cpu"}})
    rows.add("epoch_s", 1.0, "s", repeat=0, epoch=1)
    out = tmp_path / "results"
    run_dir = R.write_run(out, rows)
    env = json.loads((FIX / "env.json").read_text())
    for torch_cuda, dali_cuda, warned in (("13.0", "12.9.86", True), ("12.8", "12.9.86", False)):
        env["versions"] = {**env["versions"], "cuda_runtime": torch_cuda, "dali_cuda": dali_cuda}
        env["pil"] = {**env["pil"], "libjpeg": "6.2", "libjpeg_turbo_version": "3.1.2"}
        R.write_env(run_dir, env)
        build_report(out, tmp_path / f"rep{torch_cuda}")
        t = parse_tables((tmp_path / f"rep{torch_cuda}" / "README.md").read_text())["Environment"][0].set_index("")
        assert t.loc["NVIDIA DALI", "value"] == "2.4.0 (CUDA 12.9.86)"
        assert t.loc["PIL", "value"] == "Pillow 11.0.0, libjpeg-turbo 3.1.2 (libjpeg API 6.2)"
        assert ("warning" in t.index) is warned
        if warned:
            assert t.loc["warning", "value"] == envinfo.cuda_mismatch(env["versions"])
            assert "DALI is built for CUDA 12.9.86, torch for CUDA 13.0" in t.loc["warning", "value"]
    assert envinfo.cuda_mismatch({"cuda_runtime": None, "dali_cuda": "12.9"}) is None  # a CPU torch


def test_other_load_on_the_machine_is_warned(tmp_path):
    """Repeats during which other processes kept cores busy are listed, with the median and the
    largest value; a folder where no repeat crossed the threshold gets no section."""
    from bench import results as R
    from bench.report import tables as T

    out = tmp_path / "results"
    for pipeline, other in (("raw", [0.01, 0.02, 0.01]), ("dali", [0.9, 1.1, 0.05])):
        run = R.RunRows(f"r-{pipeline}", pipeline, "syn", "loader", {"pipe": {"device": "cpu"}})
        for r, o in enumerate(other):
            run.add("epoch_s", 1.0, "s", repeat=r, epoch=1)
            run.add("other_cores_busy", o, "cores", repeat=r)
        R.write_run(out, run)
    build_report(out, tmp_path / "rep")
    text = (tmp_path / "rep" / "README.md").read_text()
    assert "**Other processes were busy on the machine during some runs" in text
    t = parse_tables(text)["Other load on the machine"][0]
    assert t[["pipeline", "other cores busy (median)", "largest", "repeats over"]].values.tolist() == [
        ["dali", "0.90", "1.10", "2 of 3"]]
    assert T.other_load(R.read_results(out)).shape[0] == 1
    quiet = tmp_path / "quiet"
    run = R.RunRows("q", "raw", "syn", "loader", {"pipe": {"device": "cpu"}})
    run.add("epoch_s", 1.0, "s", repeat=0, epoch=1)
    run.add("other_cores_busy", 0.1, "cores", repeat=0)
    R.write_run(quiet, run)
    build_report(quiet, tmp_path / "rep2")
    assert "Other load" not in (tmp_path / "rep2" / "README.md").read_text()


def test_number_formats_never_print_exponents_or_an_iqr_of_one_sample():
    from bench.report import tables as T

    assert T.fmt_bytes(1010 * 1024) == "1,010 KiB" and T.fmt_bytes(535 * 2**20) == "535 MiB"
    assert T.fmt_median_iqr(3.0, 0.0, n=1) == "3 (one sample)"
    assert T.fmt_median_iqr(3.0, 0.25, n=3) == "3 (IQR 0.25)"
    assert T.fmt_num(999.7) == "1,000" and T.fmt_num(999.4) == "999"
    assert T.fmt_num(8.85e-05) == "0.0000885" and T.fmt_num(0.0123) == "0.0123" and T.fmt_num(0.0) == "0"


@pytest.mark.parametrize(("names", "warned"), [
    (["nvidia-dali-cuda130", "nvidia-nvimgcodec-cu13", "nvidia-libnvcomp-cu13"], None),
    (["nvidia-dali-cuda120", "nvidia_nvimgcodec_cu12", "nvidia-libnvcomp-cu12", "nvidia-nvjpeg-cu12"], None),
    (["torch", "numpy"], None),  # no DALI: nothing to say
    (["nvidia-dali-cuda130", "nvidia-nvimgcodec-cu12", "nvidia-libnvcomp-cu12"],
     "nvidia-dali-cuda130, nvidia-libnvcomp-cu12, nvidia-nvimgcodec-cu12"),  # this project's own venv once
    (["nvidia-dali-cuda120", "nvidia-dali-cuda130", "nvidia-nvimgcodec-cu12", "nvidia-nvimgcodec-cu13"],
     "nvidia-dali-cuda120, nvidia-dali-cuda130"),  # the old cuda12 extra: both stacks
])
def test_a_mixed_dali_cuda_stack_is_a_warning(names, warned):
    from bench import envinfo

    got = envinfo.dali_stack_mismatch(names)
    if warned is None:
        assert got is None
    else:
        assert got is not None and f"DALI's CUDA builds are mixed ({warned}" in got and "docs/gpu-machines.md" in got


def test_a_registered_adapter_s_bytes_reach_the_report_without_a_report_edit(tmp_path, monkeypatch):
    """A new adapter states what it reads per image (``Pipeline.dataset_bytes_per_image``); ``bench``
    records it and the report's bytes/image shows it, in the headline and the accuracy table, with no
    name of it anywhere in ``bench/report``. Its libraries reach env.json and the environment table."""
    from fixtures_datasets import write_tiny_prepared

    import pipelines.base as base
    from bench.harness.runner import EXIT_OK, BenchConfig, run_bench
    from pipelines import Augment, PipelineConfig
    from pipelines.raw import RawPipeline

    class Stated(RawPipeline):
        def dataset_bytes_per_image(self) -> float:
            return 1234.5

        @classmethod
        def libraries(cls) -> dict[str, str | None]:
            return {"libtestcodec": "9.8.7"}

    monkeypatch.setitem(base._REGISTRY, "test-stated", Stated)
    data = write_tiny_prepared(tmp_path / "tiny", 16, 8)
    pipe = PipelineConfig(batch_size=8, augment=Augment(crop="random-pad", size=8, pad=2), workers=0)
    for mode in ("loader", "train"):
        cfg = BenchConfig(pipeline="test-stated", data=str(data), mode=mode, epochs=1, warmup=0, repeats=1,
                          pipe=pipe, backbone="small-cnn", monitor_period_s=0.05)
        assert run_bench(cfg, tmp_path / "res").exit_code == EXIT_OK
    build_report(tmp_path / "res", tmp_path / "rep")
    text = (tmp_path / "rep" / "README.md").read_text()
    tables = parse_tables(text)
    assert parse_tables(text)["tiny — headline"][0].set_index("pipeline").loc["test-stated", "bytes/image"] == "1,234"
    acc = tables["Accuracy (test split, original pixels, evaluation transform)"][0].set_index("pipeline")
    assert acc.loc["test-stated", "bytes/image"] == "1,234"
    assert "bytes/image \"—\"" not in text
    env = tables["Environment"][0].set_index("")
    assert "test-stated: libtestcodec 9.8.7" in env.loc["pipeline libraries", "value"]
    src = "".join(p.read_text() for p in Path(build_report.__code__.co_filename).parent.glob("*.py"))
    assert "test-stated" not in src


def _bytes_rows(out: Path, pipeline: str, metric_rows: list[tuple[str, float, str]]) -> None:
    """One run of ``pipeline`` on ``syn``: an epoch, plus ``(status, value, reason)`` rows of
    ``dataset_bytes_per_image``."""
    from bench import results as R

    run = R.RunRows(f"r-{pipeline}", pipeline, "syn", "loader", {"pipe": {"device": "cpu"}})
    run.add("epoch_s", 1.0, "s", repeat=0, epoch=1)
    run.add("images_per_s", 100.0, "img/s", repeat=0, epoch=1)
    for r, (status, value, reason) in enumerate(metric_rows):
        if status == "ok":
            run.add("dataset_bytes_per_image", value, "bytes", repeat=r)
        else:
            run.unavailable("dataset_bytes_per_image", "bytes", reason, repeat=r)
    R.write_run(out, run)


def test_bytes_per_image_comes_from_the_rows_alone(tmp_path):
    """bytes/image is the rows' ``dataset_bytes_per_image`` (median of the repeats); a skip row's reason, or
    "not recorded", is the note under the table."""
    out = tmp_path / "results"
    _bytes_rows(out, "raw", [("ok", 111.0, ""), ("ok", 113.0, "")])  # the median of the repeats
    _bytes_rows(out, "mystery", [])
    _bytes_rows(out, "silent", [("skip", float("nan"), "the pipeline does not state its bytes per image")])
    build_report(out, tmp_path / "rep")
    text = (tmp_path / "rep" / "README.md").read_text()
    h = parse_tables(text)["syn — headline"][0].set_index("pipeline")
    assert h.loc["raw", "bytes/image"] == "112"
    assert h.loc["mystery", "bytes/image"] == "—" and h.loc["silent", "bytes/image"] == "—"
    assert "syn, mystery: not recorded" in text
    assert "syn, silent: the pipeline does not state its bytes per image" in text
