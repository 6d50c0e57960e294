"""`inrbench perf encode --json`: both methods run, the ratio is their rates' ratio, same work done; every
step's % of peak is against one matmul peak; the defaults are the cifar10 preset's."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import subprocess
import sys

import numpy as np
import pytest

from bench.cli import build_parser, main


@pytest.mark.usefixtures("one_torch_thread")
def test_perf_encode_json(monkeypatch, capsys):
    """The batched worker runs in a process of its own, as ``perf encode`` starts it; the loop worker's command
    line (the same argv) runs in this process through ``bench.cli.main``: one torch start less."""
    from bench.perf import encode as pe

    real, ran = subprocess.run, []

    def run(cmd, **kw):
        if "--_worker" not in cmd or cmd[cmd.index("--_worker") + 1] != "loop":
            return real(cmd, **kw)
        assert cmd[:3] == [sys.executable, "-m", "bench.cli"] and kw.get("capture_output"), cmd
        ran.append(cmd)
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            code = main(cmd[3:])
        return subprocess.CompletedProcess(cmd, code, out.getvalue(), "")

    monkeypatch.setattr(pe.subprocess, "run", run)
    rc = main(["perf", "encode", "--json", "--synthetic", "--iterations", "5", "--batch", "6", "--loop-images", "2",
               "--layers", "2", "--hidden", "8", "--size", "8", "--threads", "1"])
    assert rc == 0 and len(ran) == 1
    r = json.loads(capsys.readouterr().out)
    loop, batched = r["loop"], r["batched"]
    assert loop["images"] == 2 and batched["images"] == 6 and loop["iterations"] == batched["iterations"] == 5
    for m in (loop, batched):
        assert m["image_iterations_per_s"] == m["images"] * 5 / m["seconds"] > 0
        assert m["peak_memory_bytes"] >= 0 and m["threads"] == 1
    assert abs(r["speedup"] - batched["image_iterations_per_s"] / loop["image_iterations_per_s"]) < 1e-9
    # the same fit: on the same first images both reach (nearly) the same PSNR
    assert abs(loop["mean_psnr_first"]["2"] - batched["mean_psnr_first"]["2"]) < 0.5


def test_perf_encode_repeats_interleave_steps_and_give_an_interval(monkeypatch, capsys):
    """--step both --repeats R: R worker processes per step in ABBA order; the median run's figures
    per step, compiled/eager = ratio of geometric means with Welch's t interval on the logs (processes as
    units, as batched/loop); the estimate repeats too."""
    from bench.perf import encode as pe

    calls = []
    rates = {"eager": iter([100.0, 110.0, 90.0, 2000.0, 2000.0, 2000.0]),
             "compiled": iter([250.0, 260.0, 240.0, 5000.0, 5000.0, 5000.0])}

    def fake_spawn(args, method, images, step="eager", **over):
        calls.append((method, step, over.get("iterations")))
        if method == "loop":
            return {"images": 2, "iterations": args.iterations, "image_iterations_per_s": 10.0, "seconds": 1.0,
                    "peak_memory_bytes": 0, "mean_psnr": 20.0, "mean_psnr_first": {"1": 20.0, "2": 20.0},
                    "memory_kind": "x", "threads": 1}
        r = next(rates[step])
        return {"images": 6, "iterations": 5, "image_iterations_per_s": r, "seconds": 30.0 / r, "chunk": 6,
                "workers": 1, "achieved_gflops": r / 100, "pct_of_peak": 1.0, "peak_tflops": 1.0, "peak_dtype": "float32",
                "mean_psnr": 20.0, "mean_psnr_first": {"1": 20.0, "2": 20.0}, "warmup_seconds": 0.0,
                "peak_memory_bytes": 0, "memory_kind": "x", "threads": 1}

    monkeypatch.setattr(pe, "_spawn", fake_spawn)
    rc = main(["perf", "encode", "--json", "--synthetic", "--iterations", "5", "--batch", "6", "--loop-images", "2",
               "--layers", "2", "--hidden", "8", "--size", "8", "--step", "both", "--repeats", "3",
               "--estimate", "cifar10", "--estimate-iterations", "7"])
    assert rc == 0
    r = json.loads(capsys.readouterr().out)
    batched = [(s, it) for m, s, it in calls if m == "batched"]
    assert [s for s, _ in batched[:6]] == ["eager", "compiled", "compiled", "eager", "eager", "compiled"]
    assert all(it == 7 for _, it in batched[6:]) and len(batched) == 12
    assert r["steps"]["eager"]["rates"] == [100.0, 110.0, 90.0]
    assert r["steps"]["eager"]["image_iterations_per_s"] == 100.0 and r["steps"]["compiled"]["image_iterations_per_s"] == 250.0
    ci = r["compiled_over_eager_ci"]
    geo = float(np.exp(np.mean(np.log([250.0, 260.0, 240.0])) - np.mean(np.log([100.0, 110.0, 90.0]))))
    assert abs(ci["value"] - geo) < 1e-12 and ci["lo"] <= geo <= ci["hi"] and ci["lo"] > 2.0 and ci["n"] == 3
    e = r["estimate"]
    assert e["measured_iterations"] == 7 and e["steps"]["eager"]["rates"] == [2000.0] * 3
    assert not e["reused_main_measurement"]
    assert abs(e["steps"]["eager"]["projected_seconds"] - 50_000 * 5000 / 2000.0) < 1e-6
    assert abs(e["compiled_over_eager_ci"]["value"] - 2.5) < 1e-12


def test_perf_encode_estimate_reuses_a_main_measurement_at_the_presets_settings(monkeypatch, capsys):
    """--estimate cifar10 with the preset's 5x13 / 32 px / lr 1e-3: the estimate is the main runs (no new workers)."""
    from bench.perf import encode as pe

    calls = []

    def fake_spawn(args, method, images, step="eager", **over):
        calls.append(method)
        return {"images": 4, "iterations": 5, "image_iterations_per_s": 1000.0, "seconds": 0.02, "chunk": 4,
                "workers": 1, "achieved_gflops": 1.0, "pct_of_peak": 1.0, "peak_tflops": 1.0, "peak_dtype": "float32",
                "mean_psnr": 20.0, "mean_psnr_first": {"1": 20.0, "2": 20.0}, "warmup_seconds": 0.0,
                "peak_memory_bytes": 0, "memory_kind": "x", "threads": 1}

    monkeypatch.setattr(pe, "_spawn", fake_spawn)
    assert main(["perf", "encode", "--synthetic", "--iterations", "5", "--batch", "4", "--loop-images", "2",
                 "--estimate", "cifar10"]) == 0
    out = capsys.readouterr().out
    assert calls == ["loop", "batched"]
    assert "the runs above" in out and "69 h 26 min" in out  # 50,000 x 5,000 / 1,000 img-it/s = 250,000 s


def test_perf_encode_defaults_are_the_cifar10_presets():
    from bench.perf.encode import _matching_preset

    args = build_parser().parse_args(["perf", "encode"])
    assert _matching_preset(args) == "cifar10"
    assert _matching_preset(argparse.Namespace(layers=5, hidden=13, lr=0.5)) is None


def test_perf_encode_steps_share_one_matmul_peak(monkeypatch, capsys):
    """Each worker measures the peak; every step's % of peak is against the run's best measurement."""
    from bench.perf import encode as pe

    peaks = {"eager": 0.2, "compiled": 0.1}  # TFLOP/s measured in each step's worker

    def fake_spawn(args, method, images, step="eager", **over):
        if method == "loop":
            return {"images": 2, "iterations": args.iterations, "image_iterations_per_s": 10.0, "seconds": 1.0,
                    "peak_memory_bytes": 0, "mean_psnr": 20.0, "mean_psnr_first": {"1": 20.0, "2": 20.0},
                    "memory_kind": "x", "threads": 1}
        gflops = {"eager": 10.0, "compiled": 25.0}[step]
        return {"images": 6, "iterations": 5, "image_iterations_per_s": gflops * 100, "seconds": 0.1, "chunk": 6,
                "workers": 1, "achieved_gflops": gflops, "peak_tflops": peaks[step],
                "pct_of_peak": 100 * gflops / (peaks[step] * 1e3), "peak_dtype": "float32", "mean_psnr": 20.0,
                "mean_psnr_first": {"1": 20.0, "2": 20.0}, "warmup_seconds": 0.0, "peak_memory_bytes": 0,
                "memory_kind": "x", "threads": 1}

    monkeypatch.setattr(pe, "_spawn", fake_spawn)
    argv = ["perf", "encode", "--synthetic", "--iterations", "5", "--batch", "6", "--loop-images", "2", "--size", "8",
            "--step", "both"]
    assert main([*argv, "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["matmul_peak"]["tflops"] == 0.2 and r["matmul_peak"]["measurements"] == 2
    e, c = r["steps"]["eager"], r["steps"]["compiled"]
    assert e["peak_tflops"] == c["peak_tflops"] == 0.2 and c["worker_peak_tflops"] == 0.1
    assert abs(e["pct_of_peak"] - 5.0) < 1e-9 and abs(c["pct_of_peak"] - 12.5) < 1e-9  # ratio 2.5 = the speed ratio
    assert r["config"]["preset"] == "cifar10"  # the default 5x13 and lr 1e-3
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "matmul peak: 200.0 GFLOP/s dense float32 torch.mm on cpu, the best of the 2 batched workers'" in out
    assert "5.0% of peak" in out and "12.5% of peak" in out
