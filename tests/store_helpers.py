"""Small helpers for other components' tests: a quickly fitted store for a prepared split."""

from __future__ import annotations

from pathlib import Path

from bench.datasets.identity import source_record
from inr.fit import decode_psnr, fit, preset
from inr.quantize import QuantConfig, dequantize, quantize
from inr.store import save

# Small and fast on a 2-core CPU; smooth synthetic images reach > 35 dB with it.
TEST_ITERATIONS = 300
TEST_LR = 5e-3


def fit_store_for_tests(data, out: str | Path, split: str = "train", iterations: int = TEST_ITERATIONS, bits: int = 16) -> Path:
    """Fit ``data.split(split)`` with the ``demo`` architecture and save a ``bits``-bit store at ``out``.

    ``data``: a ``bench.datasets.prepared.PreparedDataset``. Returns the store path; the per-image
    PSNR is in the store (``load(out).psnr``).
    """
    import torch

    s = data.split(split)
    cfg = preset("demo", iterations=iterations, lr=TEST_LR)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a tiny fit: one thread is faster on shared cores, and leaves the other free
    try:
        res = fit(s.images, cfg)
    finally:
        torch.set_num_threads(threads)
    layers = quantize(res.weights, QuantConfig((bits,) * cfg.arch.num_linear))
    psnr = decode_psnr(dequantize(layers), s.images, cfg.arch)

    # the source ties the store to the split, as `inrbench encode` does
    meta = {"fit": cfg.to_dict(), "bits": [bits] * cfg.arch.num_linear, "source": source_record(data, split)}
    return save(out, cfg.arch, s.image_size, s.labels, layers, psnr=psnr, meta=meta)
