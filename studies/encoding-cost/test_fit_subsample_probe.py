"""studies/encoding-cost/fit-subsample-probe: with every pixel its fit is ``inr.meta.fit_curve`` bit for bit; its cost
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

PATH = Path(__file__).resolve().parent / "fit-subsample-probe"


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


def test_samplers_option(probe):
    assert probe.parse_samplers(None) == probe.DEFAULT_RUNS
    got = probe.parse_samplers("all, uniform 1/8,ramp 1/8 to all,all")
    assert got == {"random": ["all", "uniform 1/8", "ramp 1/8 to all"],
                   "learned": ["all", "uniform 1/8", "ramp 1/8 to all"]}
    with pytest.raises(SystemExit):
        probe.parse_samplers("uniform 1/8")  # no 'all': no target, no paired reference
    with pytest.raises(SystemExit):
        probe.parse_samplers("all,uniform 1/3")


def test_init_names(probe):
    assert probe.init_names([0]) == [("learned", "init.pt", 0)]  # the first probe's folder layout
    assert probe.init_names([1, 2]) == [("learned s1", "init-s1.pt", 1), ("learned s2", "init-s2.pt", 2)]


def test_rerun_must_repeat_the_settings(probe, tmp_path):
    probe.check_run(tmp_path, {"test_set": "next-crops", "meta_seeds": [1, 2]})
    probe.check_run(tmp_path, {"test_set": "next-crops", "meta_seeds": [1, 2]})  # the same: resumes
    with pytest.raises(SystemExit):
        probe.check_run(tmp_path, {"test_set": "probe", "meta_seeds": [1, 2]})


def test_next_crops_are_fresh(probe, tmp_path):
    imgs, ids = probe.test_images(tmp_path, "next-crops", 10)
    base = np.concatenate([np.asarray(probe_data(tmp_path).split(s).images) for s in ("train", "test")])
    assert imgs.shape == (10, 32, 32, 3) and len(ids) == 10
    classes = probe_data(tmp_path).manifest["classes"]
    assert ids[:len(classes)] == [f"{c}:20" for c in classes] and ids[len(classes)] == f"{classes[0]}:21"
    assert not any((base == im).all(axis=(1, 2, 3)).any() for im in imgs)  # never in the train or test split
    first, fids = probe.test_images(tmp_path, "probe", 5)
    np.testing.assert_array_equal(first, np.asarray(probe_data(tmp_path).split("test").images)[:5])
    assert len(fids) == 5


def probe_data(out):
    from meta_photos32 import data

    return data(out)


def test_forward_fn_is_the_engines_psnr(probe):
    import torch

    from inr.engine import SirenEngine, first_layer_input, to_theta
    from inr.siren import psnr_from_rgb
    from inr.siren import coord_grid, init_weights

    arch, imgs = SirenArch(3, 8), _images(4, 8)
    coords = coord_grid(8, 8)
    thetas = list(to_theta(init_weights(arch, 4, seed=1)))
    t255 = torch.from_numpy(imgs.reshape(4, 64, 3)).permute(0, 2, 1).float().contiguous()
    ref = psnr_from_rgb(SirenEngine(arch, coords, 4, backward=False).forward(thetas, need_grad=False), t255)
    got = probe.forward_fn(arch)(thetas, first_layer_input(coords), t255)
    np.testing.assert_allclose(got.double().numpy(), ref.double().numpy(), atol=0.05)  # fast sine: 8-bit rounding


def test_time_unit_eager_runs(probe):
    u = probe.time_unit("eager", 8, SirenArch(2, 6), _images(8, 8), iters=3, repeats=2, fwd_iters=2)
    assert u["pixels"] == 8 and len(u["step_s"]) == 2 and min(u["step_s"] + u["forward_s"]) > 0


def test_unit_plan_interleaves(probe):
    plan = probe.unit_plan(3, 64)
    assert len(plan) == 12
    for r in range(3):
        got = [(k, s) for i, k, s in plan if i == r]
        assert sorted(got) == sorted([("eager", 64), ("eager", 8), ("compiled", 64), ("compiled", 8)])
    assert len({plan[4 * r][1:] for r in range(3)}) == 3  # a different configuration first each round


def test_unit_ratios_and_modeled_time(probe):
    P = 64
    units = [{"kind": k, "pixels": s, "step_s": [t * (1 + 0.01 * i)], "forward_s": [0.4 * (1 + 0.01 * i)]}
             for i in range(3) for k in probe.STEP_KINDS for s, t in ((P, 1.0), (P // 8, 0.25))]
    r = probe.unit_ratios(units, P)
    assert r["eager"]["sub"]["value"] == pytest.approx(0.25) and r["eager"]["fwd"]["value"] == pytest.approx(0.4)
    assert r["eager"]["sub"]["lo"] < 0.25 < r["eager"]["sub"]["hi"]
    # with the pixel counts' own prices (a step on Ps pixels costs Ps / P, a check 1/3) the model is the pixel count
    rng = np.random.default_rng(0)
    n = 100
    curves = {("random", "all"): np.cumsum(rng.uniform(0, 0.2, (n + 1, 5)), axis=0),
              ("random", "uniform 1/8"): np.cumsum(rng.uniform(0, 0.3, (n + 1, 5)), axis=0)}
    target = np.maximum.accumulate(curves[("random", "all")], axis=0)[-1] - 1.0
    timing = {"step_s": {str(P): 1.0, str(P // 8): 1 / 8}, "forward_s": 1 / 3}
    rows = {(x["init"], x["sampler"]): x for x in probe.analyse(curves, target, n, P, timing)}
    for key, psnr in curves.items():
        m = probe.modeled_time(psnr, target, probe.VARIANTS[key[1]], n, P, 1 / 8, 1 / 3)
        p = rows[key]["pixel"]
        assert m["mean_curve"] == pytest.approx(p["mean_curve_saving"])
        assert m["encode"] == pytest.approx(p["encode_ratio"])
    ratios = {k: {"sub": {"value": 0.125, "lo": 0.1, "hi": 0.2}, "fwd": {"value": 1 / 3, "lo": 0.3, "hi": 0.4}}
              for k in probe.STEP_KINDS}
    tr = probe.time_rows(curves, target, n, P, ratios)
    d = next(x for x in tr if x["sampler"] == "uniform 1/8")["compiled"]["mean_curve"]
    assert d["lo"] < d["value"] < d["hi"]  # cheaper subset steps and checks: a larger saving
    assert "| random | uniform 1/8 |" in probe.time_table(tr, {**ratios, "eager": {**ratios["eager"], "ms": {
        str(P): [1.0], str(P // 8): [0.1]}, "fwd_ms": [0.3]}, "compiled": {**ratios["compiled"], "ms": {
            str(P): [1.0], str(P // 8): [0.1]}, "fwd_ms": [0.3]}}, P)
