"""Subsampled fit steps (``FitConfig.pixel_fraction``, ``inrbench encode --pixel-fraction``, ``inr.subsample``):
which pixels a step sees, the maths on per-row pixels, and the fit that uses them."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from inr import subsample
from inr.fit import FitConfig, fit, preset
from inr.loop import STOP_CHECK_EVERY, Loop, _step
from inr.siren import (
    SirenArch,
    coord_grid,
    fast_sin,
    first_layer_input,
    fold_theta,
    init_weights,
    net,
    to_theta,
)
from tests.cli_helpers import assert_one_line_error, run_cli

pytestmark = pytest.mark.usefixtures("one_torch_thread")

ITERS = 300


def _windows(order, its, per_step, seed=0):
    a, b = (torch.from_numpy(x) for x in subsample.cycle_maps(order.shape[1], seed))
    return subsample.window(torch.from_numpy(order), torch.as_tensor(its, dtype=torch.float64), per_step, a, b)


@pytest.mark.parametrize("P,per_step", [(1024, 128), (1024, 300), (50, 7)])
def test_each_cycle_sees_every_pixel_in_a_new_order(P, per_step):
    order = subsample.image_orders(np.array([3]), P, seed=0)
    steps = -(-P // per_step)
    cycles = []
    for c in range(3):
        w = torch.cat([_windows(order, [c * steps + k], per_step)[0] for k in range(steps)])
        assert len(w) == steps * per_step
        assert set(w.tolist()) == set(range(P))  # every pixel once (a few twice where the last window wraps)
        assert len(w) - len(set(w.tolist())) == steps * per_step - P
        cycles.append(w)
    first = [set(cycles[c][:per_step].tolist()) for c in range(3)]
    assert first[0] != first[1] and first[1] != first[2]  # each cycle partitions the pixels anew


def test_a_rows_pixels_depend_only_on_its_image_and_iteration():
    P, per_step = 1024, 128
    orders = subsample.image_orders(np.array([5, 9, 5]), P, seed=0)
    assert np.array_equal(orders[0], orders[2]) and not np.array_equal(orders[0], orders[1])
    assert not np.array_equal(orders[0], subsample.image_orders(np.array([5]), P, seed=1)[0])
    together = _windows(orders, [3, 40, 40], per_step)
    for r, it in enumerate([3, 40, 40]):
        assert torch.equal(together[r], _windows(orders[r:r + 1], [it], per_step)[0])
    assert not torch.equal(together[1], together[2])  # same iteration, other image


def test_pixels_per_step():
    assert subsample.pixels_per_step(1024, 1 / 8) == 128 and subsample.pixels_per_step(1024, 1.0) == 1024
    assert subsample.pixels_per_step(50, 0.1) == 5 and subsample.pixels_per_step(10, 1e-6) == 1
    with pytest.raises(ValueError, match="pixel fraction"):
        subsample.pixels_per_step(10, 0.0)


def test_compiled_cpu_chunks_grow_as_steps_see_fewer_pixels():
    """The compiled step's CPU chunk cap bounds its working set (rows x pixels per step): 8 rows of every pixel,
    16 of half, 32 (``cpu_batch_cap``) of an eighth; the eager step keeps its own cap."""
    from inr.fit import auto_batch

    cpu = torch.device("cpu")
    for f, want in ((1.0, 8), (0.5, 16), (0.25, 32), (0.125, 32)):
        assert auto_batch(preset("cifar10", step="compiled", pixel_fraction=f), 1000, 1024, cpu) == want
    assert auto_batch(preset("cifar10", pixel_fraction=0.125), 1000, 1024, cpu) == 32


@pytest.mark.parametrize("sin", [torch.sin, fast_sin])
def test_the_step_on_per_row_pixels_equals_autograd(sin):
    """Each row its own pixels (``gather``: ``a0 [B, 3, Ps]``): the step (exact or polynomial sine) gives autograd's
    gradients of the per-row mean squared error on those pixels."""
    arch = SirenArch(3, 7, w0=20.0, w0_first=30.0)
    B, h, w, Ps = 3, 6, 8, 11
    thetas = to_theta(init_weights(arch, B, seed=5))
    coords = coord_grid(h, w)
    target = torch.rand(B, h * w, 3)
    order = subsample.image_orders(np.arange(B), h * w, seed=2)
    idx = _windows(order, [0, 3, 7], Ps)
    a0s, t01s = subsample.gather(first_layer_input(coords), target.transpose(1, 2).contiguous(), idx)
    assert a0s.shape == (B, 3, Ps) and t01s.shape == (B, 3, Ps)
    assert torch.equal(a0s[1, :2].t(), coords[idx[1]]) and torch.equal(t01s[2].t(), target[2, idx[2]])
    leaf = [T.clone().requires_grad_() for T in thetas]
    rows_coords = torch.stack([coords[idx[r]] for r in range(B)]).transpose(1, 2)  # [B, 2, Ps]
    rows_target = torch.stack([target[r, idx[r]] for r in range(B)]).transpose(1, 2)
    (net(fold_theta(leaf, arch.scales), rows_coords, sin)[0] - rows_target).pow(2).mean(dim=(1, 2)).sum().backward()
    grads, _ = _step(thetas, a0s, t01s, arch.scales, sin)
    tol = 1e-6 if sin is torch.sin else 1e-4  # the polynomial's cosine is fast_sin(z + pi/2), not its derivative
    for g, T in zip(grads, leaf, strict=True):
        assert torch.allclose(g, T.grad, atol=tol, rtol=1e-4)


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    from tests.fixtures_datasets import photos32_train

    return photos32_train(tmp_path_factory.mktemp("sub"))


@pytest.fixture(scope="module")
def fits(photos):
    """The cifar10 preset's 5x13 at lr 3e-3 for 300 iterations on 8 images: all pixels, 1/2 and 1/8 per step."""
    _, imgs = photos
    cfg = preset("cifar10", iterations=ITERS, lr=3e-3, batch=8, cpu_workers=1)
    return cfg, imgs, {f: fit(imgs, replace(cfg, pixel_fraction=f)) for f in (1.0, 0.5, 0.125)}


def test_a_subsampled_fit_runs_on_its_pixels_and_keeps_the_best_on_all(fits, monkeypatch):
    cfg, imgs, res = fits
    full, half, eighth = res[1.0].psnr, res[0.5].psnr, res[0.125].psnr
    # measured (1 thread): all pixels 32.4 dB mean, 1/2 31.9, 1/8 28.7 after 300 steps; 1/8 of the pixels gives
    # a noisier gradient, so fewer dB per step, but each step costs about 1/8 of the matmul work
    assert full.mean() - 1.5 < half.mean() < full.mean() + 0.5, (full.mean(), half.mean())
    assert 25.0 < eighth.mean() < half.mean(), (eighth.mean(), half.mean())
    for f in (0.5, 0.125):
        assert np.array_equal(res[f].extra["iterations_run"], np.full(8, ITERS))  # no target: every step runs
    # the reported PSNR is the decoded one (bench.metrics) of the kept weights
    from inr.fit import decode_psnr

    assert np.allclose(decode_psnr(res[0.125].weights, imgs, cfg.arch), eighth, atol=1e-9)
    # each step sees 128 of the 1,024 pixels; the all-pixel check all of them: the start weights, then once per
    # STOP_CHECK_EVERY steps
    from inr import loop

    seen: list[int] = []
    step, check = loop._step, loop._check

    def counting_step(thetas, a0, *a):
        seen.append(a0.shape[-1])
        return step(thetas, a0, *a)

    def counting_check(thetas, best, best_p, a0, *a):
        seen.append(-a0.shape[-1])
        return check(thetas, best, best_p, a0, *a)

    monkeypatch.setattr(loop, "_step", counting_step)
    monkeypatch.setattr(loop, "_check", counting_check)
    fit(imgs[:2], replace(cfg, pixel_fraction=0.125, iterations=50))
    assert seen.count(128) == 50 and seen.count(-1024) == 1 + 50 // STOP_CHECK_EVERY and len(seen) == 53, seen


def test_a_subsampled_fit_does_not_depend_on_its_chunk_or_worker(fits):
    """The pixels of every step depend on the image and its own iteration only: chunks of 3 on two workers
    give the one-chunk fit bit for bit (eager), and the first image of a later shard (``first_index``) is fitted
    as it is inside the whole."""
    cfg, imgs, res = fits
    ref = res[0.125]
    other = fit(imgs, replace(cfg, pixel_fraction=0.125, batch=3, cpu_workers=2))
    assert np.array_equal(other.psnr, ref.psnr)
    for (W1, b1), (W2, b2) in zip(other.weights, ref.weights, strict=True):
        assert torch.equal(W1, W2) and torch.equal(b1, b2)
    tail = fit(imgs[5:], replace(cfg, pixel_fraction=0.125), first_index=5)
    assert np.array_equal(tail.psnr, ref.psnr[5:])
    shifted = fit(imgs[5:], replace(cfg, pixel_fraction=0.125))  # other indices: other pixels, another fit
    assert not np.array_equal(shifted.psnr, ref.psnr[5:])


def test_a_subsampled_fit_stops_at_its_target(fits):
    cfg, imgs, res = fits
    target = np.full(8, float(np.median(res[0.125].psnr)))
    target[0] = res[1.0].psnr[0] + 5.0  # out of reach
    es = fit(imgs, replace(cfg, pixel_fraction=0.125), stop_at=target)
    ran = es.extra["iterations_run"]
    stopped = ran < ITERS
    assert 2 <= stopped.sum() <= 7 and not stopped[0], ran
    assert (ran[stopped] % STOP_CHECK_EVERY == 0).all()
    assert (es.psnr[stopped] >= target[stopped] - 1e-3).all(), (es.psnr, target)


def test_compiled_subsampled_fit_agrees_with_eager_and_is_compiled_once(photos, traced_graphs):
    """The compiled subsampled step (gather, polynomial sine, Adam in one graph) and the eager one (exact sine):
    the same pixels each step, so over 60 steps at the preset's lr the fits agree to hundredths of a dB. Warm-up
    compiles the subsampled step and the all-pixel check for every drain size; a second fit with another lr,
    schedule, images and targets compiles nothing more (the schedule and the rows' iterations are tensors)."""
    from torch._dynamo.utils import counters

    _, imgs = photos
    cfg = preset("cifar10", iterations=60, lr=1e-3, batch=4, cpu_workers=1, pixel_fraction=0.125)
    eager = fit(imgs[:4], cfg)
    compiled = fit(imgs[:4], replace(cfg, step="compiled"))
    assert np.abs(eager.psnr - compiled.psnr).max() < 0.05, (eager.psnr, compiled.psnr)
    assert eager.psnr.mean() > 15.0
    graphs = counters["stats"]["unique_graphs"]
    res = fit(imgs, replace(cfg, step="compiled", iterations=75, lr=3e-3), stop_at=np.full(8, 20.0))
    assert counters["stats"]["unique_graphs"] == graphs
    assert (res.extra["iterations_run"] < 75).any()  # images stopped, rows refilled and drained


def test_config_and_cli(photos, tmp_path, capsys):
    arch = preset("cifar10").arch
    for bad in (0.0, 1.5, -0.1):
        with pytest.raises(ValueError, match="pixel_fraction"):
            FitConfig(arch=arch, pixel_fraction=bad)
    with pytest.raises(ValueError, match="fp32"):
        FitConfig(arch=arch, pixel_fraction=0.5, autocast="bf16")
    d = FitConfig(arch=arch, pixel_fraction=0.125).to_dict()
    assert d["pixel_fraction"] == 0.125 and FitConfig.from_dict(d).pixel_fraction == 0.125

    prepared, _ = photos
    out = tmp_path / "s.inr"
    rc, _, err = run_cli(capsys, "encode", str(prepared), "--preset", "demo", "--limit", "4", "--iterations", "60",
                         "--pixel-fraction", "1/8", "--no-progress", "--out", str(out))
    assert rc == 0, err
    from inr import store

    assert store.read_header(out)["meta"]["fit"]["pixel_fraction"] == 0.125
    rc, text, _ = run_cli(capsys, "inspect", str(out))
    assert rc == 0 and "each step on 0.125 of the pixels" in text, text
    for bad in ("0", "3/2", "1/0", "x"):
        rc, _, err = run_cli(capsys, "encode", str(prepared), "--pixel-fraction", bad, "--out", str(tmp_path / "u.inr"))
        assert_one_line_error(rc, err, "--pixel-fraction")


def test_a_subsampled_fine_tune_never_returns_worse_than_its_start(photos):
    """The start weights are the first keep-best candidate, measured on every pixel, as in the all-pixel loops:
    a fine-tune whose subsampled steps diverge (lr 0.1) returns its start, not the 10 dB its steps reach."""
    from inr.fit import images_to_targets, optimize

    _, imgs = photos
    arch = preset("cifar10").arch
    tg, coords = images_to_targets(imgs[:2]), coord_grid(32, 32)
    start, p0, _ = optimize(init_weights(arch, 2, seed=0), tg, coords, arch, Loop(200, 3e-3, workers=1))
    for per_step in (0, 256):
        _, p, _ = optimize(start, tg, coords, arch, Loop(50, 0.1, workers=1, per_step=per_step))
        assert (p.numpy() >= p0.numpy() - 1e-6).all(), (per_step, p, p0)


def test_where_a_subsampled_image_stops_does_not_depend_on_its_chunk(photos):
    """With refills at other phases (an image leaves at its first check, the next takes its row) and a schedule
    that is not a multiple of the check interval (60), every image keeps the same weights and stops at the same
    iteration with chunks of 1, 2 or 3 on one or two workers (which measurements make that so: next test)."""
    _, imgs = photos
    cfg = preset("cifar10", iterations=60, lr=3e-3, cpu_workers=1, pixel_fraction=0.125)
    first = fit(imgs, replace(cfg, batch=8))
    target = np.full(8, np.inf)
    target[[0, 3, 5]] = -np.inf  # these leave at their first check (25): the queue refills their rows
    target[6] = float(first.psnr[6]) - 0.3  # reached at a later check
    ref = fit(imgs, replace(cfg, batch=1), stop_at=target)
    ran = ref.extra["iterations_run"]
    assert list(ran[[0, 3, 5]]) == [25, 25, 25] and ran[1] == 60 and 25 <= ran[6] <= 60, ran
    for batch, workers in ((2, 1), (3, 2)):
        res = fit(imgs, replace(cfg, batch=batch, cpu_workers=workers), stop_at=target)
        assert np.array_equal(res.extra["iterations_run"], ran), (batch, workers, res.extra["iterations_run"])
        for (W1, b1), (W2, b2) in zip(res.weights, ref.weights, strict=True):
            assert torch.equal(W1, W2) and torch.equal(b1, b2), (batch, workers)


def test_a_fraction_that_rounds_up_to_every_pixel_is_the_all_pixel_fit(photos, monkeypatch, traced_graphs):
    """0.99 of 64 pixels is every pixel: the all-pixel loop runs (the same weights as without a fraction), and the
    compiled graphs warmed before the workers start are the all-pixel loop's, not the subsampled ones."""
    from inr import loop

    warmed: list[int] = []
    warm = loop._warm

    def spy(arch, B, P, dev, threads, per_step, seed):
        warmed.append(per_step)
        return warm(arch, B, P, dev, threads, per_step, seed)

    monkeypatch.setattr(loop, "_warm", spy)
    _, imgs = photos
    small = np.ascontiguousarray(imgs[:2, :8, :8])
    cfg = preset("cifar10", iterations=30, lr=3e-3, cpu_workers=1)
    assert subsample.pixels_per_step(64, 0.99) == 64
    a, b = fit(small, replace(cfg, pixel_fraction=0.99)), fit(small, cfg)
    assert np.array_equal(a.psnr, b.psnr) and all(torch.equal(x[0], y[0]) for x, y in zip(a.weights, b.weights, strict=True))
    fit(small, replace(cfg, iterations=3, step="compiled", pixel_fraction=0.99))
    fit(small, replace(cfg, iterations=3, step="compiled", pixel_fraction=0.5))
    assert warmed == [0, 32, 32], warmed  # the subsampled loop: every drain size (2, 1)


def test_a_row_that_ends_its_schedule_between_checks_is_measured_alone(photos, monkeypatch):
    """Chunk of 2, 60 iterations: image 0 leaves at its first check (25) and image 2 takes its row; image 1 ends
    its schedule 10 passes after the check at 50, when image 2 is at its iteration 35. That measurement keeps
    image 1's weights only (measuring image 2 there too would give it a candidate it has in no other chunking).
    Off the check schedule there are exactly two partial measurements: image 2's start weights and image 1's end."""
    from inr import loop

    _, imgs = photos
    masks: list[list[bool] | None] = []
    keep_best = loop._keep_best

    def spy(thetas, best, best_p, psnr, rows=None):
        masks.append(None if rows is None else rows.tolist())
        return keep_best(thetas, best, best_p, psnr, rows)

    monkeypatch.setattr(loop, "_keep_best", spy)
    cfg = preset("cifar10", iterations=60, lr=3e-3, cpu_workers=1, batch=2, pixel_fraction=0.125)
    res = fit(imgs[:3], cfg, stop_at=np.array([-np.inf, np.inf, np.inf]))
    assert list(res.extra["iterations_run"]) == [25, 60, 60]
    partial = [m for m in masks if m is not None and not all(m)]
    assert partial == [[True, False], [False, True]], masks  # row 0 refilled (image 2); row 1 (image 1) ends
