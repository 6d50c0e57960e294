"""CUDA checks of the codec (skipped, with the reason, on machines without a GPU)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from inr import store
from inr.fit import fit, preset
from inr.loop import Loop
from inr.quantize import QuantConfig, dequantize, quantize
from tests.test_inr_codec import smooth_images

pytestmark = pytest.mark.gpu


def test_cuda_fit_matches_cpu_fit_and_store_decodes_on_device(tmp_path):
    imgs = smooth_images(6, 16, 16)
    cfg = preset("demo", iterations=100)
    cpu = fit(imgs, cfg, device="cpu")
    gpu = fit(imgs, cfg, device="cuda")
    assert np.allclose(cpu.psnr, gpu.psnr, atol=0.5), (cpu.psnr, gpu.psnr)
    bf16 = fit(imgs, preset("demo", iterations=100, autocast="bf16"), device="cuda")
    assert bf16.psnr.mean() > cpu.psnr.mean() - 3.0
    layers = quantize(gpu.weights, QuantConfig((16, 8, 8, 8, 8, 16)))
    path = store.save(tmp_path / "g.inr", cfg.arch, (16, 16), np.arange(6), layers)
    st = store.load(path, "cuda")
    idx = torch.tensor([5, 0, 2], device="cuda")
    for (W, b), (Wr, br) in zip(st.weights(idx), dequantize(layers), strict=True):
        # lo + q * step: the GPU may fuse the multiply-add, so equal to the last ulp only
        assert W.is_cuda and torch.allclose(W.cpu(), Wr[idx.cpu()], rtol=1e-6, atol=1e-7)
        assert torch.allclose(b.cpu(), br[idx.cpu()], rtol=1e-6, atol=1e-7)
    assert st.decode(idx).shape == (3, 3, 16, 16)
    assert st.resident_bytes() == sum(
        t.numel() * t.element_size() for dl in st._layers for t in (dl.codes, dl.scales, dl.mask, dl.offsets) if t is not None
    )


DEVICES = ["cuda"]  # collected everywhere; the gpu marker skips them, with the reason, without CUDA


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("stage", ["prune", "prune+8bit+qat", "dynamic-prune"])
def test_encode_prune_qat_on_device_matches_cpu(device, stage):
    """The whole encoder (fit, prune, quantize, QAT) on the device: exact prune counts, zeros kept,
    mean PSNR within 0.5 dB of the same encode on the CPU."""
    from inr.encode import EncodeConfig, encode_images
    from inr.prune import PruneConfig

    imgs = smooth_images(6, 16, 16)
    fit_cfg = preset("demo", iterations=150)
    prune = (PruneConfig(budget_db=1.0, step=0.1, max_ratio=0.4, finetune_iterations=30) if stage == "dynamic-prune"
             else PruneConfig(ratio=0.2, rounds=1, finetune_iterations=40))
    bits = (16, 8, 8, 8, 8, 16) if "8bit" in stage else (32,) * fit_cfg.arch.num_linear
    cfg = EncodeConfig(fit=fit_cfg, quant=QuantConfig(bits), prune=prune, qat_iterations=40 if "qat" in stage else 0)
    cpu, dev = encode_images(imgs, cfg, "cpu"), encode_images(imgs, cfg, device)
    assert abs(float(dev.psnr.mean()) - float(cpu.psnr.mean())) <= 0.5, (dev.stages, cpu.stages)
    for ql, (i, o) in zip(dev.layers, fit_cfg.arch.shapes, strict=True):
        assert ql.codes.device.type == "cpu" and ql.mask is not None  # stored from the CPU, whatever the device
        if stage != "dynamic-prune":
            assert torch.all((~ql.mask).reshape(6, -1).sum(1) == round(0.2 * i * o))
    for (W, _), ql in zip(dequantize(dev.layers), dev.layers, strict=True):
        assert torch.all(W[~ql.mask] == 0)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("per_channel", [False, True])
@pytest.mark.parametrize("prune", [0.0, 0.3])
def test_per_channel_and_pruned_stores_decode_on_device(tmp_path, device, per_channel, prune):
    """A store loaded on the device gives the CPU's weights (to the last ulp: fused multiply-add) and
    the CPU's decoded pixels; pruned weights stay exactly zero there."""
    from inr.prune import magnitude_masks

    imgs = smooth_images(5, 12, 12)
    cfg = preset("demo", iterations=60)
    ws = fit(imgs, cfg, device="cpu").weights
    masks = magnitude_masks(ws, prune) if prune else None
    if masks is not None:
        ws = [(W * m, b) for (W, b), m in zip(ws, masks, strict=True)]
    layers = quantize(ws, QuantConfig((16, 8, 8, 8, 8, 16), per_channel), masks)
    path = store.save(tmp_path / "s.inr", cfg.arch, (12, 12), np.arange(5), layers, per_channel=per_channel)
    cpu, dev = store.load(path, "cpu"), store.load(path, device)
    idx = torch.tensor([4, 1, 1, 0])
    for (W, b), (Wc, bc) in zip(dev.weights(idx.to(device)), cpu.weights(idx), strict=True):
        assert W.device.type == "cuda"
        assert torch.allclose(W.cpu(), Wc, rtol=1e-6, atol=1e-7) and torch.allclose(b.cpu(), bc, rtol=1e-6, atol=1e-7)
        assert torch.equal(W.cpu() == 0, Wc == 0)  # pruned (and zero-coded) weights are zero on both
    x_dev, x_cpu = dev.decode(idx.to(device)), cpu.decode(idx)
    assert x_dev.device.type == "cuda" and x_dev.shape == x_cpu.shape == (4, 3, 12, 12)
    assert float((x_dev.float().cpu() - x_cpu.float()).abs().max()) < 2e-3


def test_compiled_fit_step_on_cuda_matches_eager():
    """The compiled iteration (Triton on CUDA; the CPU build uses inductor's C++ wrapper) fits like the eager engine."""
    from inr.fit import images_to_targets, optimize
    from inr.siren import SirenArch, coord_grid, init_weights

    arch = SirenArch(3, 8)
    imgs = smooth_images(6, 12, 12)
    tg = images_to_targets(imgs, "cuda")
    coords = coord_grid(12, 12, device="cuda")
    res = {s: optimize(init_weights(arch, 6, seed=0, device="cuda"), tg, coords, arch, Loop(60, 1e-2, step=s))[1].cpu()
           for s in ("eager", "compiled")}
    assert torch.all((res["eager"] - res["compiled"]).abs() < 0.05), res


@pytest.mark.parametrize("step", ["eager", "compiled"])
def test_early_stop_on_cuda(step):
    """Early stop with continuous batching on the GPU (per-row Adam factors computed on the device): 12
    images in chunks of 4 (rows refill), stops at checks, images that never stop end like the full fit."""
    imgs = smooth_images(12, 16)
    cfg = preset("demo", iterations=200, batch=4, step=step)
    ref = fit(imgs, cfg, device="cuda")
    target = ref.psnr - 1.0
    target[0] = ref.psnr[0] + 10.0  # never
    res = fit(imgs, cfg, device="cuda", stop_at=target)
    ran = res.extra["iterations_run"]
    assert ran[0] == 200 and abs(res.psnr[0] - ref.psnr[0]) < 0.2
    stopped = ran < 200
    assert stopped.sum() >= 8 and (ran[stopped] % 25 == 0).all()
    assert (res.psnr[stopped] >= target[stopped] - 0.05).all()
    if step == "eager":  # the CPU's eager fit stops at the same checks, give or take one (rounding differs)
        cpu = fit(imgs, cfg, stop_at=target)
        assert np.abs(cpu.extra["iterations_run"] - ran).mean() <= 25, (cpu.extra["iterations_run"], ran)


def _sync_sites(fn) -> list[tuple[str, int]]:
    """Runs ``fn()`` with CUDA's sync debug mode warning; returns ``(file, line)`` of each synchronizing call
    (the Python line that made it: pageable host-to-device copies, device-to-host reads, ``.item()``...)."""
    import warnings

    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return [(w.filename, w.lineno) for w in caught if "synchroniz" in str(w.message)]


def test_the_sync_detector_sees_the_syncs_it_is_asked_about():
    """Positive control for the two tests below: a pageable host-to-device copy and an ``.item()`` are
    each reported, on their own lines; device-only work is not (else "no sync found" would prove nothing)."""
    x = torch.ones(4, device="cuda")
    assert _sync_sites(lambda: x.mul_(2)) == []
    sites = _sync_sites(lambda: (torch.tensor(1.0, device="cuda"), x.sum().item()))
    assert len(sites) >= 2 and all(f == __file__ for f, _ in sites), sites


@pytest.mark.parametrize("path", ["compiled", "eager+qat"])
def test_fit_iterations_do_not_sync_with_the_host(path):
    """No host sync per iteration (``torch.tensor(x, device=cuda)`` or ``bool(t.any())`` would be one): the
    syncs a fit makes do not grow with its iterations. The compiled fit makes none at all; the QAT fit (fake
    quantization every iteration, CPU masks as the encoder passes them) a fixed number."""
    from inr.fit import images_to_targets, optimize
    from inr.prune import magnitude_masks
    from inr.quantize import fake_quantize
    from inr.siren import SirenArch, coord_grid, init_weights

    arch = SirenArch(3, 8)
    imgs = smooth_images(4, 12, 12)
    tg, coords = images_to_targets(imgs, "cuda"), coord_grid(12, 12, device="cuda")
    w0 = init_weights(arch, 4, seed=0, device="cuda")
    kw = {}
    if "qat" in path:
        kw["masks"] = magnitude_masks([(W.cpu(), b.cpu()) for W, b in w0], 0.25)
        kw["transform"] = lambda w, m: fake_quantize(w, QuantConfig((16, 8, 8, 16)), m)

    def loop(its: int) -> Loop:
        return Loop(its, 1e-2, chunk=4, step=path.split("+")[0])

    optimize(w0, tg, coords, arch, loop(2), **kw)  # compiles (compiled paths) and warms up
    few = _sync_sites(lambda: optimize(w0, tg, coords, arch, loop(3), **kw))
    many = _sync_sites(lambda: optimize(w0, tg, coords, arch, loop(12), **kw))
    assert len(many) == len(few), (few, many)
    if path == "compiled":
        assert many == [], many


@pytest.mark.parametrize("fraction", [1.0, 0.25])
@pytest.mark.parametrize("step", ["eager", "compiled"])
def test_early_stop_syncs_only_at_its_checks(step, fraction):
    """Early stop reads the host only at its checks (every 25 passes, one read of who reached the target): the
    rows it records and refills go to the device without waiting (pinned, non-blocking copies). Subsampled steps
    (``pixel_fraction``) too: each row's pixels are chosen on the device, its order copied at refills."""
    import linecache

    from inr.fit import images_to_targets, optimize
    from inr.siren import SirenArch, coord_grid, init_weights

    arch = SirenArch(3, 8)
    imgs = smooth_images(10, 12, 12)
    tg, coords = images_to_targets(imgs, "cuda"), coord_grid(12, 12, device="cuda")
    w0 = init_weights(arch, 10, seed=0, device="cuda")
    stop = torch.full((10,), 24.0, dtype=torch.float64, device="cuda")
    stop[0] = float("inf")  # one image runs the whole schedule: rows finish between checks too

    def run():
        per_step = int(144 * fraction) % 144
        return {"iterations_run": optimize(w0, tg, coords, arch, Loop(110, 1e-2, chunk=4, step=step, per_step=per_step),
                                           stop)[2]}

    run()  # compiles (compiled step) and warms up
    rep = {}
    sites = _sync_sites(lambda: rep.update(run()))
    assert (rep["iterations_run"] < 110).any() and rep["iterations_run"][0] == 110  # refills and drains happened
    lines = {linecache.getline(f, n).strip() for f, n in sites}
    assert lines and all("the one host sync of a check" in x for x in lines), lines  # the checks are seen


def test_pixel_orders_drawn_on_cuda_are_the_cpus_and_stay_there():
    """``inr.subsample.orders`` on CUDA: drawn on the device (no host permutation at a refill), the same
    permutations as ``device_orders`` computes on the CPU (integer hashing, a stable sort)."""
    from inr import subsample

    ids = np.array([3, 0, 777, 3])
    for P in (1024, 224 * 224):
        got = subsample.orders(ids, P, 5, "cuda")
        assert got.is_cuda and got.dtype == torch.int64
        assert torch.equal(got.cpu(), subsample.device_orders(ids, P, 5, "cpu"))
