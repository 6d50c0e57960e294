"""CUDA checks of the codec (skipped, with the reason, on machines without a GPU)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from inr import store
from inr.fit import fit, preset
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
