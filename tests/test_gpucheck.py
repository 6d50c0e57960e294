"""``scripts/gpu-check``: the no-GPU path (exit 2, one line), refusals, the figures it reports and the
``perf-decode`` step on the CPU (``--cpu``). The run of the other steps that can run here:
``test_gpucheck_image.py``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from devtools import gpucheck

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "scripts" / "gpu-check"


def _script(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHON": sys.executable}
    return subprocess.run([str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout, env=env, cwd=REPO)


def _doc(out: Path) -> dict:
    return json.loads((out / "gpu-check.json").read_text())


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA: the no-GPU path cannot be seen here")
def test_without_cuda_exits_2_with_one_line_and_writes_nothing(tmp_path):
    r = _script(str(tmp_path / "gc"))
    assert r.returncode == 2, r.stderr
    assert r.stdout == "" and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith("inrbench: error: gpu-check: no CUDA device here"), r.stderr
    assert not (tmp_path / "gc").exists()


def _in_process(monkeypatch, capsys, *args: str) -> tuple[int, str]:
    """gpu-check's parent through ``gpucheck.main`` (its steps are still processes) -> (exit code, stdout);
    the environment it sets for compiled kernels is restored afterwards."""
    for var in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"):
        monkeypatch.setenv(var, os.environ.get(var, ""))
        monkeypatch.delenv(var)
    rc = gpucheck.main(list(args))
    out, err = capsys.readouterr()
    return rc, out + err


@pytest.mark.parametrize("setup", ["file", "foreign-folder"])
def test_refuses_an_out_dir_it_did_not_write(tmp_path, capsys, setup):
    out = tmp_path / "gc"
    if setup == "file":
        out.write_text("mine")
    else:
        out.mkdir()
        (out / "notes.txt").write_text("mine")
    assert gpucheck.main([str(out), "--cpu", "--steps", "setup"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("inrbench: error: OUT_DIR ") and err.count("\n") == 1, err
    assert (out.read_text() if setup == "file" else (out / "notes.txt").read_text()) == "mine"


def test_usage_errors_are_one_line(capsys):
    assert gpucheck.main(["x", "--cpu", "--steps", "no-such-step"]) == 2
    assert gpucheck.main(["x", "--cpu", "--pipelines", "no-such-pipeline"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and "unknown step no-such-step" in err[0] and "unknown pipeline" in err[1], err
    assert not Path("x").exists()


def test_mini_sweep_covers_every_cell_kind_and_every_pipeline(tmp_path):
    import pipelines
    from bench.sweep.cells import KINDS
    from bench.sweep.spec import parse_sweep

    names = pipelines.names()
    cfg = parse_sweep(gpucheck.mini_sweep("cuda", names), tmp_path / "mini.yaml")
    assert {c.kind for c in cfg.cells} == set(KINDS)
    sizes = {c.id: c.size for c in cfg.cells if c.kind == "prepare"}
    assert sorted(sizes.values()) == [32, 224]
    bench = [c for c in cfg.cells if c.kind == "bench"]
    assert {(c.pipeline, c.mode, c.data) for c in bench} == {
        (n, m, d) for n in names for m in ("loader", "train") for d in sizes}
    assert all(c.device == "cuda" for c in bench)


def test_key_figures():
    figs = gpucheck._numbers({"config": {}, "batched": {"image_iterations_per_s": 10.12345, "threads": 2,
                                                        "pct_peak": 3.0, "tflops": 1.5}, "speedup": 4})
    assert figs == {"batched.image_iterations_per_s": 10.123, "batched.pct_peak": 3.0, "batched.tflops": 1.5,
                    "speedup": 4.0}


def _decode_doc(device: str, dali: dict) -> dict:
    rate = lambda m: {"median": m, "best": m}  # noqa: E731
    own = gpucheck.adapter_variant(224, device)
    rows = [{"size": 224, "method": "PIL 12.0 decode", "variant": "Image.open+convert('RGB')", "rate": rate(500.0)},
            {"size": 224, "method": "decode_jpeg (torch-nvjpeg)", "variant": f"{device}, batch of 256 per call",
             "rate": rate(2000.0)},
            {"size": 224, "method": "DALI decoders.image", "variant": "mixed, device_id=0", **dali},
            {"size": 224, "method": "INR decode SIREN 10x32", "variant": "reference", "rate": rate(3000.0),
             "pct_peak": 10.0, "gflops": 1.0},
            {"size": 224, "method": "INR decode SIREN 10x32", "variant": own, "rate": rate(4000.0),
             "pct_peak": 2.0, "gflops": 1.0},
            {"size": 224, "method": "INR decode SIREN 10x32", "variant": "channels-first, whole batch, bf16",
             "rate": rate(5000.0), "pct_peak": 1.234, "gflops": 2.0}]
    return {"device": device, "threads": 1, "matmul_peak_gflops": {"fp32": 50000.04, "bf16": 700000.0},
            "inr_batch": {"224": 256}, "rows": rows}


def test_perf_decode_headline_is_the_inr_adapters_own_decoder_against_nvjpeg_and_pil():
    """The headline INR figure is the fp32 eager decoder the ``inr`` adapter runs, not the fastest variant
    (bf16 here), which is reported apart."""
    fig = gpucheck.decode_figures(_decode_doc("cuda", {"rate": {"median": 4000.0, "best": 4000.0}}), "cuda")
    own = gpucheck.adapter_variant(224, "cuda")
    assert own == "channels-first [B,h,P], whole batch"
    assert fig == {"device": "cuda", "matmul_peak_gflops.fp32": 50000.0, "matmul_peak_gflops.bf16": 700000.0,
                   "224px.inr_batch": 256, "224px.inr_img_per_s": 4000.0, "224px.inr_pct_peak": 2.0,
                   "224px.inr_variant": own, "224px.inr_fastest_img_per_s": 5000.0,
                   "224px.inr_fastest_variant": "channels-first, whole batch, bf16", "224px.pil_img_per_s": 500.0,
                   "224px.nvjpeg_img_per_s": 2000.0, "224px.dali_img_per_s": 4000.0, "224px.inr_over_nvjpeg": 2.0,
                   "224px.inr_over_pil": 8.0, "ratio_note": fig["ratio_note"]}
    assert "not a result" in fig["ratio_note"]


def test_perf_decode_dali_not_installed_is_reported_and_a_broken_decoder_fails_on_cuda_only():
    missing = {"skipped": "nvidia.dali cannot be imported: No module named 'nvidia.dali'"}
    fig = gpucheck.decode_figures(_decode_doc("cuda", missing), "cuda")
    assert fig["not_installed"] == ["224px DALI decoders.image: nvidia.dali cannot be imported: No module named "
                                    "'nvidia.dali'"] and "skipped" not in fig and fig["224px.inr_over_nvjpeg"] == 2.0
    broken = {"skipped": "DALI mixed decode cannot run on cuda: RuntimeError: nvImageCodec"}
    with pytest.raises(gpucheck.StepFailed, match="a JPEG decoder could not run on cuda: 224px DALI") as e:
        gpucheck.decode_figures(_decode_doc("cuda", broken), "cuda")
    assert e.value.figures["224px.inr_img_per_s"] == 4000.0 and len(e.value.figures["skipped"]) == 1
    assert gpucheck.decode_figures(_decode_doc("cpu", broken), "cpu")["skipped"] == [
        "224px DALI decoders.image: DALI mixed decode cannot run on cuda: RuntimeError: nvImageCodec"]
    with pytest.raises(AssertionError, match="measured on 'cpu', not 'cuda'"):
        gpucheck.decode_figures(_decode_doc("cpu", broken), "cuda")
    no_inr = _decode_doc("cuda", {"rate": {"median": 1.0, "best": 1.0}})
    no_inr["rows"] = [r for r in no_inr["rows"] if r["variant"] != gpucheck.adapter_variant(224, "cuda")]
    with pytest.raises(gpucheck.StepFailed, match="no row of the inr adapter's own decoder"):
        gpucheck.decode_figures(no_inr, "cuda")


def test_cpu_plumbing_perf_decode_passes_the_device_and_reports_the_figures(tmp_path, monkeypatch, capsys):
    out = tmp_path / "gc"
    rc, log = _in_process(monkeypatch, capsys, str(out), "--cpu", "--steps", "perf-decode")
    assert rc == 0, log[-4000:]
    step = {s["name"]: s for s in _doc(out)["steps"]}["perf-decode"]
    fig = step["figures"]
    assert step["status"] == "ok" and fig["device"] == "cpu", step
    # on the CPU one size, and no GPU decoder rows (nvJPEG, DALI mixed: CUDA only)
    assert fig["32px.inr_batch"] == 256 and fig["32px.inr_img_per_s"] > 0 and "224px.inr_batch" not in fig
    assert fig["32px.pil_img_per_s"] > 0 and fig["32px.inr_over_pil"] > 0 and fig["32px.torchvision_cpu_img_per_s"] > 0
    assert 0 < fig["32px.inr_pct_peak"] and fig["32px.inr_variant"] == gpucheck.adapter_variant(32, "cpu")
