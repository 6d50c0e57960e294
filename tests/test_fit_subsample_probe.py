"""scripts/fit-subsample-probe: with every pixel its fit is ``inr.meta.fit_curve`` bit for bit; its cost
schedule charges a subsampled fit for each all-pixel check it sees; it refuses a folder it did not make."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

from inr.meta import fit_curve
from inr.siren import SirenArch

pytestmark = pytest.mark.usefixtures("one_torch_thread")

PATH = Path(__file__).resolve().parents[1] / "scripts" / "fit-subsample-probe"


@pytest.fixture(scope="module")
def probe():
    loader = importlib.machinery.SourceFileLoader("fit_subsample_probe", str(PATH))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[loader.name] = mod  # dataclasses look their module up there
    try:
        loader.exec_module(mod)
        yield mod
    finally:
        sys.modules.pop(loader.name, None)


def _images(n=3, side=6):
    return np.random.default_rng(0).integers(0, 256, (n, side, side, 3), dtype=np.uint8)


def test_all_pixels_is_fit_curve(probe):
    arch = SirenArch(2, 6)
    imgs = _images()
    raw = probe.fit_psnr(imgs, arch, 30, 1e-3, probe.VARIANTS["all"])
    ref = fit_curve(imgs, arch, 30, 1e-3, per_image=True)
    np.testing.assert_array_equal(np.maximum.accumulate(raw, axis=0), ref)


@pytest.mark.parametrize("name", ["uniform 1/4", "ramp 1/8 to all", "top-k 1/4", "importance 1/4"])
def test_samplers_run_and_learn(probe, name):
    arch = SirenArch(2, 6)
    raw = probe.fit_psnr(_images(), arch, 40, 3e-3, probe.VARIANTS[name])
    assert raw.shape == (41, 3) and np.isfinite(raw).all()
    assert (raw[-1] > raw[0]).all()


def test_schedule_costs(probe):
    P, n = 64, 100
    full_cum, full_seen = probe.schedule(probe.VARIANTS["all"], n, P, lambda s: s / P, 1 / 3)
    assert full_cum[n] == n and full_seen.all()  # k all-pixel steps cost k and see every iterate
    cum, seen = probe.schedule(probe.VARIANTS["uniform 1/4"], n, P, lambda s: s / P, 1 / 3)
    assert list(np.nonzero(seen)[0]) == [0, 25, 50, 75, 100]  # checks, and the end
    assert cum[50] == pytest.approx(50 / 4 + 3 / 3)  # 50 steps on a quarter, checks at 0, 25 and 50
    ramp, _ = probe.schedule(probe.VARIANTS["ramp 1/8 to all"], n, P, lambda s: s / P, 1 / 3)
    assert ramp[n] - ramp[n - 10] == pytest.approx(10)  # all pixels in the second half
    cost, best = probe.reach(np.array([1.0, 5.0, 9.0, 2.0, 3.0]), 8.0, np.arange(5.0),
                             np.array([True, False, False, True, True]))
    assert cost is None and best == 3.0  # the 9 dB iterate was never checked


def test_refuses_a_foreign_folder(probe, tmp_path):
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "mine.txt").write_text("not yours")
    with pytest.raises(SystemExit):
        probe.claim_out(tmp_path / "x")
    probe.claim_out(tmp_path / "new")
    (tmp_path / "new" / "curves").mkdir()
    probe.claim_out(tmp_path / "new")  # its own: a rerun resumes
