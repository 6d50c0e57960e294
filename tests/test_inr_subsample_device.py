"""Pixel orders of a subsampled fit drawn on the device (``inr.subsample.orders``, ``device_orders``): the CPU
keeps ``image_orders``' permutations bit for bit; the device's are permutations of ``(seed, id)`` alone, the
same on every device (``tests/test_inr_gpu.py`` compares CUDA's with these)."""

from __future__ import annotations

import numpy as np
import scipy.stats as st
import torch

from inr import subsample


def test_the_cpu_orders_are_image_orders_bit_for_bit():
    ids = np.array([0, 7, 123456, 7])
    for P, seed in ((1024, 0), (50176, 3), (1, 0)):
        got = subsample.orders(ids, P, seed, "cpu")
        assert got.dtype == torch.int64 and got.device.type == "cpu"
        assert np.array_equal(got.numpy(), subsample.image_orders(ids, P, seed))


def test_device_orders_are_permutations_of_each_image_alone():
    P = 1024
    o = subsample.device_orders(np.array([5, 9, 5, 2**40 + 5]), P, 0, "cpu")
    assert o.shape == (4, P) and o.dtype == torch.int64
    assert all(torch.equal(torch.sort(row).values, torch.arange(P)) for row in o)
    assert torch.equal(o[0], o[2]) and not torch.equal(o[0], o[1])
    assert torch.equal(o[1], subsample.device_orders(np.array([9]), P, 0, "cpu")[0])  # not its batch's
    assert not torch.equal(o[0], subsample.device_orders(np.array([5]), P, 1, "cpu")[0])  # the seed counts
    assert not torch.equal(o[0], torch.arange(P))


def test_device_orders_look_uniform():
    """Where pixel 0 lands, over 4,000 images: uniform over 16 bins of the positions (chi-square p >= 0.001),
    and a step's first eighth of the order spreads over the whole image (every 8x8 tile of 32x32 hit)."""
    P = 1024
    o = subsample.device_orders(np.arange(4000), P, 0, "cpu")
    where = (o == 0).nonzero()[:, 1].numpy()
    assert st.chisquare(np.bincount(where * 16 // P, minlength=16)).pvalue >= 1e-3
    first = o[:, : P // 8]
    tiles = (first // 32 // 8) * 4 + (first % 32) // 8  # which of the 16 8x8 tiles
    assert all(len(set(t.tolist())) == 16 for t in tiles[:100])
