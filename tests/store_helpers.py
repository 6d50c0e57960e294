"""Small helpers for other components' tests: a quickly fitted store for a prepared split."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from bench.datasets.identity import source_record
from inr.fit import decode_psnr, fit, preset
from inr.quantize import QuantConfig, dequantize, quantize
from inr.store import save

# Small and fast on a 2-core CPU; smooth synthetic images reach > 35 dB with it.
TEST_ITERATIONS = 300
TEST_LR = 5e-3


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """One torch intra-op thread inside, the count restored after: tiny fits run faster so on shared cores,
    and an image fitted alone in its chunk gets the same bits as in a larger one (docs/measurement.md)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def fit_store_for_tests(data, out: str | Path, split: str = "train", iterations: int = TEST_ITERATIONS, bits: int = 16) -> Path:
    """Fit ``data.split(split)`` with the ``demo`` architecture and save a ``bits``-bit store at ``out``.

    ``data``: a ``bench.datasets.prepared.PreparedDataset``. Returns the store path; the per-image
    PSNR is in the store (``load(out).psnr``).
    """
    s = data.split(split)
    cfg = preset("demo", iterations=iterations, lr=TEST_LR)
    with one_thread():
        res = fit(s.images, cfg)
    layers = quantize(res.weights, QuantConfig((bits,) * cfg.arch.num_linear))
    psnr = decode_psnr(dequantize(layers), s.images, cfg.arch)

    # the source ties the store to the split, as `inrbench encode` does
    meta = {"fit": cfg.to_dict(), "bits": [bits] * cfg.arch.num_linear, "source": source_record(data, split)}
    return save(out, cfg.arch, s.image_size, s.labels, layers, psnr=psnr, meta=meta)
