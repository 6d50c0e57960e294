"""Atomic writes and the one PSNR convention."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from bench.atomic import atomic_dir, atomic_write_bytes
from bench.errors import InputError
from bench.metrics import PSNR_CAP_DB, mean_psnr, psnr_per_image, to_uint8


def test_atomic_write_replaces_whole_file(tmp_path):
    p = tmp_path / "f.bin"
    atomic_write_bytes(p, b"old")
    atomic_write_bytes(p, b"new contents")
    assert p.read_bytes() == b"new contents"
    assert [x.name for x in tmp_path.iterdir()] == ["f.bin"]


def test_atomic_dir_interrupted_leaves_nothing(tmp_path):
    final = tmp_path / "out"
    with pytest.raises(RuntimeError):
        with atomic_dir(final) as tmp:
            (tmp / "half.npy").write_bytes(b"x")
            raise RuntimeError("killed")
    assert not final.exists()
    assert list(tmp_path.iterdir()) == []


def test_atomic_dir_refuses_to_clobber_unless_asked(tmp_path):
    final = tmp_path / "out"
    final.mkdir()
    (final / "keep").write_text("1")
    with pytest.raises(FileExistsError):
        with atomic_dir(final) as tmp:
            (tmp / "new").write_text("2")
    assert (final / "keep").exists()
    # a folder this project did not write is never replaced, even when asked
    with pytest.raises(InputError, match="refusing to replace"):
        with atomic_dir(final, kind="compare", overwrite=True) as tmp:
            (tmp / "new").write_text("2")
    assert sorted(x.name for x in final.iterdir()) == ["keep"]
    assert sorted(x.name for x in tmp_path.iterdir()) == ["out"]  # no temp folder left
    # its own output of the same kind is replaced whole, marker included
    (final / "keep").unlink()
    with atomic_dir(final, kind="compare", overwrite=True) as tmp:
        (tmp / "old").write_text("1")
    with atomic_dir(final, kind="compare", overwrite=True) as tmp:
        (tmp / "new").write_text("2")
    assert sorted(x.name for x in final.iterdir()) == [".inrbench.json", "new"]


def test_psnr_hand_computed():
    ref = np.zeros((1, 2, 2, 3), np.uint8)
    dec = ref.copy()
    dec[0, 0, 0, 0] = 10  # one of 12 values off by 10 -> MSE = 100/12
    expected = 10 * math.log10(255**2 / (100 / 12))
    assert psnr_per_image(dec, ref).item() == pytest.approx(expected, abs=1e-9)


def test_psnr_clamps_and_rounds_float_input():
    ref = torch.tensor([[0, 255, 128, 64]], dtype=torch.uint8)
    # out-of-range values clamp; 128.4/255 rounds to 128, 63.6/255 rounds to 64
    dec = torch.tensor([[-0.5, 1.7, 128.4 / 255, 63.6 / 255]])
    assert to_uint8(dec).tolist() == [[0, 255, 128, 64]]
    assert math.isinf(psnr_per_image(dec, ref).item())
    assert mean_psnr(torch.tensor([float("inf"), 30.0])) == pytest.approx((PSNR_CAP_DB + 30) / 2)
