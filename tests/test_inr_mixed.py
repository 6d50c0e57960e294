"""The encoder on CUDA, tested on the CPU where it can be (issue 11, section 4).

* ``auto_batch`` counts torch's cached-free blocks as free (faked ``torch.cuda`` numbers), and budgets the
  step used; the compiled pass is compiled once per chunk shape;
* bf16: the first layer (the coordinates) stays fp32, forward and gradient; the rest is close to fp32;
* keep-best runs every ``eval_every`` iterations (counted), auto = 10 under bf16, 1 in fp32;
* fp16 is refused (no loss scaling); ``perf encode`` reports TFLOP/s against the same run's peak.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import inr.fit as F
from inr.fit import FitConfig, auto_batch, fit, fit_bytes_per_image, images_to_targets, optimize
from inr.loop import AUTOCAST, Loop, _step
from inr.siren import (
    SirenArch,
    coord_grid,
    first_layer_input,
    fold_theta,
    init_weights,
    net,
    to_theta,
)

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _smooth(n: int, side: int) -> np.ndarray:
    y, x = np.mgrid[0:side, 0:side] / side
    imgs = [np.stack([np.sin(3 * x + k), np.cos(2 * y - k), x * y], -1) for k in range(n)]
    return ((np.stack(imgs) * 0.5 + 0.5) * 255).round().clip(0, 255).astype(np.uint8)


def test_auto_batch_counts_torch_cached_free_blocks(monkeypatch):
    GiB = 2**30
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda d=None: (2 * GiB, 80 * GiB))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda d=None: 10 * GiB)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda d=None: 4 * GiB)
    arch = SirenArch(5, 13)
    cfg = FitConfig(arch=arch)
    per = fit_bytes_per_image(arch, 32 * 32)
    dev = torch.device("cuda:0")
    assert F.cuda_free_bytes(dev) == 8 * GiB  # 2 driver-free + (10 reserved - 4 allocated)
    assert auto_batch(cfg, 10**9, 32 * 32, dev) == int(int(0.6 * 8 * GiB) // per)
    # a later chunk, after torch cached the first chunk's blocks: same budget, not a smaller one
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda d=None: (0, 80 * GiB))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda d=None: 12 * GiB)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda d=None: 4 * GiB)
    assert auto_batch(cfg, 10**9, 32 * 32, dev) == int(int(0.6 * 8 * GiB) // per)
    # never negative, whatever the allocator reports
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda d=None: 0)
    assert F.cuda_free_bytes(dev) == 0 and auto_batch(cfg, 5, 32 * 32, dev) == 1


def test_auto_batch_budgets_the_compiled_step(monkeypatch):
    """The compiled step's budget (its graph's activations and cosines of every layer, and temporaries) is never
    below the eager engine's: the encoder reuses the fit's chunk for its eager stages (prune, QAT)."""
    GiB = 2**30
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda d=None: (40 * GiB, 80 * GiB))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda d=None: 0)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda d=None: 0)
    dev = torch.device("cuda:0")
    for arch in (F.PRESETS["cifar10"].arch, F.PRESETS["flowers102"].arch, F.PRESETS["mini-imagenet"].arch,
                 SirenArch(2, 8), SirenArch(10, 4), SirenArch(1, 64)):
        for pixels in (32 * 32, 224 * 224):
            eager, compiled = (fit_bytes_per_image(arch, pixels, s) for s in ("eager", "compiled"))
            assert compiled >= eager >= fit_bytes_per_image(arch, pixels) == eager, (arch, pixels)
            # the sines and cosines every layer keeps for the backward, at least
            assert compiled >= pixels * 4 * 2 * arch.layers * arch.hidden
            n = {s: auto_batch(FitConfig(arch=arch, step=s), 10**9, pixels, dev) for s in ("eager", "compiled")}
            assert n["compiled"] <= n["eager"] and n["compiled"] * compiled <= int(0.6 * 40 * GiB), (arch, pixels, n)
    with pytest.raises(ValueError, match="step"):
        fit_bytes_per_image(SirenArch(2, 8), 64, "fused")


def test_the_compiled_pass_is_compiled_once_per_chunk_shape():
    """The compiled and the eager fit agree (random 8x8 images, 60 steps: within 0.05 dB); the per-row iterations
    and the schedule are tensors: another lr and schedule run the same graph."""
    from torch._dynamo.utils import counters

    arch = SirenArch(2, 8)
    imgs = np.random.default_rng(0).integers(0, 256, (4, 8, 8, 3), dtype=np.uint8)
    tg, coords, w0 = images_to_targets(imgs), coord_grid(8, 8), init_weights(arch, 4, seed=0)
    res = {s: optimize(w0, tg, coords, arch, Loop(60, 3e-3, step=s, chunk=4, workers=1))[1]
           for s in ("eager", "compiled")}
    assert torch.all((res["eager"] - res["compiled"]).abs() < 0.05), res
    graphs = counters["stats"]["unique_graphs"]
    tg = images_to_targets(_smooth(4, 8))
    _, p, _ = optimize(w0, tg, coords, arch, Loop(12, 1e-2, 0.1, step="compiled", chunk=4, workers=1))
    assert counters["stats"]["unique_graphs"] == graphs and torch.all(torch.isfinite(p))


def _engine_pass(arch, thetas, coords, mm, t01):
    layers = fold_theta(thetas, arch.scales)
    a0 = first_layer_input(coords)
    rgb, acts, _ = net(layers, a0, keep=True, mm=mm)
    z0 = torch.asin(acts[0].clamp(-1, 1))  # sin(z0): the first layer's output
    return rgb, z0, _step(thetas, a0, t01, arch.scales, mm=mm)[0]


def test_bf16_keeps_the_first_layer_in_fp32():
    arch = SirenArch(3, 16)
    side = 224  # the case that matters: bf16 steps near 1.0 are ~1 pixel here
    coords = coord_grid(side, side)
    thetas = to_theta(init_weights(arch, 2, seed=3))
    t01 = torch.rand(2, 3, side * side, generator=torch.Generator().manual_seed(0))
    rgb32, z32, g32 = _engine_pass(arch, thetas, coords, None, t01)
    rgb16, z16, g16 = _engine_pass(arch, thetas, coords, AUTOCAST["bf16"], t01)
    assert torch.equal(z16, z32)  # first layer: identical to fp32, to the bit
    # the first layer's gradient is an fp32 product (close to fp32 up to the bf16 upstream error)
    rel = [((a - b).norm() / b.norm()).item() for a, b in zip(g16, g32, strict=True)]
    assert max(rel) < 0.05, rel
    assert (rgb16 - rgb32).abs().max() < 0.02
    # the old path (coordinates rounded to bf16 before w0_first = 30) is measurably worse
    c16 = coords.to(torch.bfloat16).float()
    _, z_old, _ = _engine_pass(arch, thetas, c16, None, t01)
    assert (z_old - z32).abs().max() > 10 * (z16 - z32).abs().max() + 1e-3


@pytest.mark.parametrize(("autocast", "eval_every", "iters", "in_loop"), [
    ("none", 5, 20, 4), ("none", 0, 7, 7), ("bf16", 0, 25, 3), ("bf16", 4, 8, 2),
])
def test_keep_best_runs_every_n_iterations(autocast, eval_every, iters, in_loop, monkeypatch):
    """Keep-best at iterations 0, n, 2n, ... and after the last step; under bf16 each is an extra fp32 forward."""
    from inr import loop

    calls = {"keep": 0, "check": 0}
    keep, check = loop._keep_best, loop._check

    def counting_keep(*a, **k):
        calls["keep"] += 1
        return keep(*a, **k)

    def counting_check(*a, **k):
        calls["check"] += 1
        return check(*a, **k)

    monkeypatch.setattr(loop, "_keep_best", counting_keep)
    monkeypatch.setattr(loop, "_check", counting_check)
    arch = SirenArch(2, 8)
    optimize(init_weights(arch, 2), images_to_targets(_smooth(2, 8)), coord_grid(8, 8), arch,
             Loop(iters, 1e-3, eval_every=eval_every, autocast=autocast, chunk=2, workers=1))
    assert calls["keep"] == in_loop + 1
    assert calls["check"] == (in_loop + 1 if autocast == "bf16" else 0)
    if autocast == "bf16" and eval_every == 0:
        assert in_loop == -(-iters // 10)


def test_bf16_fit_matches_fp32_fit_within_tolerance():
    imgs = _smooth(2, 16)
    cfg = FitConfig(arch=SirenArch(3, 16), iterations=60, lr=3e-3)
    a = fit(imgs, cfg)
    b = fit(imgs, FitConfig(arch=cfg.arch, iterations=60, lr=3e-3, autocast="bf16"))
    assert np.all(np.abs(a.psnr - b.psnr) < 1.5), (a.psnr, b.psnr)
    assert FitConfig(arch=cfg.arch).eval_interval == 1
    assert FitConfig(arch=cfg.arch, autocast="bf16").eval_interval == 10
    assert FitConfig(arch=cfg.arch, autocast="bf16", eval_every=3).eval_interval == 3


def test_fp16_is_refused_with_the_reason():
    with pytest.raises(ValueError, match="loss scaling"):
        FitConfig(arch=SirenArch(2, 8), autocast="fp16")
    from bench.cli import main

    assert main(["encode", "--autocast", "fp16"]) == 2  # a usage error, one line


def test_perf_encode_reports_tflops_against_the_same_runs_peak(tmp_path, capsys):
    """The batched worker's figures under bf16 (the worker runs in this process here: ``perf encode``'s own
    processes, and a step's peak as the best of its workers', are tested in test_inr_perf)."""
    from bench.cli import main

    imgs = tmp_path / "batched.npy"
    np.save(imgs, np.random.default_rng(0).integers(0, 256, (2, 8, 8, 3), dtype=np.uint8))
    rc = main(["perf", "encode", "--_worker", "batched", "--_images", str(imgs), "--iterations", "3",
               "--layers", "2", "--hidden", "8", "--size", "8", "--threads", "1", "--autocast", "bf16"])
    assert rc == 0
    b = json.loads(capsys.readouterr().out)
    assert b["method"] == "batched" and b["images"] == 2 and b["iterations"] == 3
    assert b["autocast"] == "bf16" and b["peak_dtype"] == "bfloat16" and b["peak_tflops"] > 0
    assert b["flops_per_image_iteration"] == 6 * 64 * (2 * 8 + 8 * 8 + 8 * 3)
    assert b["achieved_tflops"] == pytest.approx(b["image_iterations_per_s"] * b["flops_per_image_iteration"] / 1e12)
    assert b["pct_of_peak"] == pytest.approx(100 * b["achieved_tflops"] / b["peak_tflops"])
