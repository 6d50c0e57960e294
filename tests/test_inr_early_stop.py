"""Early stop (``FitConfig.target_psnr``, ``fit(stop_at=...)``, ``inr.loop``): an image leaves its row
once it reaches its target and keeps the weights it had then; the next image of the queue takes the row;
where an image stops does not depend on the chunk, the worker or the other images."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from inr.fit import FitConfig, fit, images_to_targets, optimize, preset
from inr.loop import STOP_CHECK_EVERY, Loop, bucket_sizes
from inr.siren import coord_grid, init_weights
from tests.cli_helpers import assert_one_line_error, run_cli
from tests.store_helpers import one_thread

pytestmark = pytest.mark.usefixtures("one_torch_thread")

ITERS = 300


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    from tests.fixtures_datasets import photos32_train

    return photos32_train(tmp_path_factory.mktemp("es"))


def queue_curves(imgs: np.ndarray, cfg: FitConfig) -> np.ndarray:
    """Per-image best-so-far PSNR ``[ITERS + 1, N]`` (dB) of the loop's own arithmetic, all images in one chunk to the
    end (``fit_curve``). An early-stopped image's trajectory is this one, bit for bit, whatever its chunk does."""
    from inr.meta import fit_curve

    return fit_curve(imgs, cfg.arch, cfg.iterations, cfg.lr, seed=cfg.seed, per_image=True)


# The decoded PSNR (``siren.forward``: other GEMM shapes, so other float32 roundings) of the weights the loop kept
# against the loop's own float32 PSNR of them: an 8-bit level of a pixel can flip (one level of one of 32x32x3 values
# moves a 25 dB PSNR by ~2e-4 dB; the bound allows about a hundred)
DECODE_TOL = 0.02


@pytest.fixture(scope="module")
def full(photos):
    """8 images, their eager fit over the whole 300-iteration schedule, and the early-stop loop's per-image
    best-so-far curves (``queue_curves``: ``[ITERS + 1, 8]`` dB)."""
    _, imgs = photos
    cfg = preset("cifar10", iterations=ITERS, lr=3e-3, batch=8)
    with one_thread():  # as the tests run (a module's fixtures are made before ``one_torch_thread``)
        return cfg, imgs, fit(imgs, cfg), queue_curves(imgs, cfg)


def test_bucket_sizes():
    assert bucket_sizes(8) == [8, 4, 2, 1]
    assert bucket_sizes(5) == [5, 3, 2, 1]
    assert bucket_sizes(1) == [1] and bucket_sizes(2) == [2, 1]
    assert bucket_sizes(8192) == [8192, 4096, 2048, 1024]  # a GPU chunk: four graphs, not fourteen


def test_config_validates_and_keeps_old_keys():
    arch = preset("cifar10").arch
    with pytest.raises(ValueError, match="target_psnr"):
        FitConfig(arch=arch, target_psnr=-1.0)
    with pytest.raises(ValueError, match="target_psnr"):
        FitConfig(arch=arch, target_psnr=float("inf"))
    with pytest.raises(ValueError, match="fp32"):
        FitConfig(arch=arch, target_psnr=30.0, autocast="bf16")
    d = FitConfig(arch=arch, target_psnr=31.5).to_dict()
    assert d["target_psnr"] == 31.5 and FitConfig.from_dict(d).target_psnr == 31.5


def _check_stops(res, cfg, curves, target: np.ndarray, tol: float = DECODE_TOL) -> np.ndarray:
    """Every image stopped at the first check where its best-so-far (``queue_curves``) reached its target, and
    kept the weights of that best; the others ran all iterations and kept the best of the whole curve. Returns
    which stopped."""
    ran = res.extra["iterations_run"]
    assert ran.shape == (len(target),) and ran.dtype == np.int64
    stopped = ran < ITERS
    for i in np.nonzero(stopped)[0]:
        k = int(ran[i])
        assert k % STOP_CHECK_EVERY == 0
        assert res.psnr[i] >= target[i] - 1e-3, (i, res.psnr[i], target[i])  # decoded exactly: at its target
        # it kept the best weights of the iterations it ran (its best-so-far at that point; see DECODE_TOL)
        assert abs(res.psnr[i] - curves[k - 1, i]) < tol, (i, k, res.psnr[i], curves[k - 1, i])
        assert curves[k - 1, i] >= target[i]  # the loop's own PSNR, exactly: it had reached the target
        if k > STOP_CHECK_EVERY:  # and the check before had not yet seen the target
            assert curves[k - 1 - STOP_CHECK_EVERY, i] < target[i]
    for i in np.nonzero(~stopped)[0]:
        assert ran[i] == ITERS and abs(res.psnr[i] - curves[-1, i]) < tol, (i, res.psnr[i], curves[-1, i])
    return stopped


@pytest.fixture(scope="module")
def stopping(full):
    """Targets between the PSNR at iteration 100 and the end (some images stop, image 3 never can) and the eager
    fit of the 8 images in one chunk that stops at them."""
    cfg, imgs, ref, curves = full
    target = (curves[100] + curves[-1]) / 2
    target[3] = ref.psnr[3] + 5.0
    with one_thread():
        return target, fit(imgs, cfg, stop_at=target)


def test_eager_stops_each_image_at_its_target(full, stopping):
    cfg, imgs, ref, curves = full
    assert np.array_equal(ref.extra["iterations_run"], np.full(8, ITERS))
    target, res = stopping
    stopped = _check_stops(res, cfg, curves, target)  # the images left fitting end where their curve ends
    assert stopped.sum() >= 5 and not stopped[3]
    assert res.extra["iterations_run"].sum() < 8 * ITERS


def test_infinite_targets_run_the_whole_fit(full):
    cfg, imgs, ref, _ = full
    res = fit(imgs, cfg, stop_at=np.full(8, np.inf))
    assert np.array_equal(res.extra["iterations_run"], np.full(8, ITERS))
    assert np.array_equal(res.psnr, ref.psnr)  # one loop: targets never reached change nothing


def test_no_pass_runs_once_every_row_has_finished(photos, monkeypatch):
    """When every row of a chunk has run the whole schedule, the check comes at once: the chunk refills (or
    ends) instead of idling to the next multiple of STOP_CHECK_EVERY. 4 images in chunks of 2, 30 iterations,
    never stopping: two rounds of 31 passes (iterations + 1 evaluations), not two of 50."""
    from inr import loop

    _, imgs = photos
    cfg = preset("cifar10", iterations=30, lr=3e-3, batch=2, cpu_workers=1)
    passes = []
    step = loop._step

    def counting(thetas, *a, **k):
        passes.append(thetas[0].shape[0])
        return step(thetas, *a, **k)

    monkeypatch.setattr(loop, "_step", counting)
    res = fit(imgs[:4], cfg, stop_at=np.full(4, np.inf))
    assert np.array_equal(res.extra["iterations_run"], np.full(4, 30))
    assert len(passes) == 2 * 31 and set(passes) == {2}, (len(passes), set(passes))


def test_where_an_image_stops_does_not_depend_on_its_chunk(full, stopping):
    """Continuous batching: with chunks of 2 or 3 rows the queue refills rows as images leave; every image
    still stops after the same number of its own iterations as in one chunk of 8 (or runs the whole schedule),
    with one or two workers, and keeps the same weights, bit for bit (the eager step computes each row on its
    own: no number depends on the rows beside it, so neither on which worker took an image when)."""
    cfg, imgs, _, curves = full
    target, one = stopping
    for batch, workers in ((2, 1), (3, 2)):
        res = fit(imgs, replace(cfg, batch=batch, cpu_workers=workers), stop_at=target)
        assert np.array_equal(res.extra["iterations_run"], one.extra["iterations_run"]), (batch, workers)
        assert np.array_equal(res.psnr, one.psnr), (batch, workers, res.psnr, one.psnr)
        for (W1, b1), (W2, b2) in zip(res.weights, one.weights, strict=True):
            assert torch.equal(W1, W2) and torch.equal(b1, b2), (batch, workers)
    _check_stops(one, cfg, curves, target)


def test_config_target_is_one_target_for_all(full):
    cfg, imgs, ref, curves = full
    t = float(np.median(curves[150]))
    res = fit(imgs, replace(cfg, target_psnr=t))
    stopped = _check_stops(res, cfg, curves, np.full(8, t))
    assert 0 < stopped.sum() < 8


def test_all_images_stop_and_the_loop_ends(full):
    cfg, imgs, _, curves = full
    target = curves[60] - 0.01  # every image is there by iteration 60: all leave at the check at 75
    res = fit(imgs, cfg, stop_at=target)
    assert np.array_equal(res.extra["iterations_run"], np.full(8, 75))
    assert (res.psnr >= target - 0.05).all()


def test_compiled_step_shrinks_through_buckets(full, traced_graphs):
    cfg, imgs, _, curves = full
    ccfg = replace(cfg, step="compiled")
    cref = fit(imgs, ccfg)
    target = (curves[100] + curves[-1]) / 2
    target[3] = cref.psnr[3] + 5.0
    res = fit(imgs, ccfg, stop_at=target)
    ran = res.extra["iterations_run"]
    stopped = ran < ITERS
    # 8 -> 4 -> 2 -> 1 rows as images leave (padding rows hold the compiled sizes); the trajectory of the
    # polynomial-sine step differs from the eager one's by tenths of a dB, so only its own fit is the reference
    assert stopped.sum() >= 5 and not stopped[3]
    assert (ran[stopped] % STOP_CHECK_EVERY == 0).all()
    assert (res.psnr[stopped] >= target[stopped] - 0.05).all(), (res.psnr, target)
    assert (res.psnr[stopped] <= cref.psnr[stopped] + 0.05).all()  # a prefix of the fit never beats the whole
    assert abs(res.psnr[3] - cref.psnr[3]) < 0.02, (res.psnr[3], cref.psnr[3])


def test_the_compiled_step_refuses_masks(photos):
    _, imgs = photos
    arch = preset("cifar10").arch
    w = init_weights(arch, 2)
    with pytest.raises(ValueError, match="compiled"):
        optimize(w, images_to_targets(imgs[:2]), coord_grid(32, 32), arch, Loop(10, 1e-3, step="compiled"),
                 masks=[torch.ones_like(W, dtype=torch.bool) for W, _ in w])


def test_encode_records_the_early_stop(photos, tmp_path, capsys):
    prepared, _ = photos
    out = tmp_path / "s.inr"
    cache = tmp_path / "cache"
    argv = ["encode", str(prepared), "--preset", "demo", "--split", "train", "--limit", "8", "--target-psnr", "26",
            "--no-progress", "--fit-cache", str(cache)]
    rc, _, err = run_cli(capsys, *argv, "--out", str(out))
    assert rc == 0, err
    from inr import store

    es = store.read_header(out)["meta"]["early_stop"]
    assert es["recorded"] and es["target_psnr"] == 26.0 and es["images"] == 8 and es["iterations"] == 300
    assert 0 < es["stopped_early"] <= 8 and es["fit_iterations_mean"] < 300
    rc, text, _ = run_cli(capsys, "inspect", str(out))
    assert rc == 0 and f"early stop     at 26 dB: {es['fit_iterations_mean']:.0f} iterations" in text
    # a second encode served from the fit cache reports the same iterations
    rc, _, err = run_cli(capsys, *argv, "--out", str(tmp_path / "t.inr"))
    assert rc == 0, err
    assert store.read_header(tmp_path / "t.inr")["meta"]["early_stop"] == es
    # chunks of 2 or 3 refilled from the queue, by one worker or two: the same bytes (where an image stops, and
    # what it keeps, depend on nothing but the image)
    for batch, threads in (("2", "1"), ("2", "2"), ("3", "2")):
        rc, _, err = run_cli(capsys, *argv[:-2], "--batch", batch, "--threads", threads, "--out",
                             str(tmp_path / f"w{batch}{threads}.inr"))
        assert rc == 0, err
    assert (tmp_path / "w21.inr").read_bytes() == (tmp_path / "w22.inr").read_bytes()
    # (the header records --batch: a chunk of 3 changes it and nothing else, the data bytes are the same)
    w21, w32 = ((tmp_path / f"w{x}.inr").read_bytes() for x in ("21", "32"))
    h21, h32 = store.read_header(tmp_path / "w21.inr"), store.read_header(tmp_path / "w32.inr")
    for h, batch in ((h21, 2), (h32, 3)):
        assert h["meta"]["fit"].pop("batch") == batch and h["meta"]["encode"]["fit"].pop("batch") == batch
    assert h21 == h32 and w21[_data_start(w21):] == w32[_data_start(w32):]
    first = out.read_bytes()  # and the first encode's: 8 rows in one chunk
    assert first[_data_start(first):] == w21[_data_start(w21):]
    rc, _, err = run_cli(capsys, "encode", str(prepared), "--preset", "demo", "--target-psnr", "nan",
                         "--out", str(tmp_path / "u.inr"))
    assert_one_line_error(rc, err, "--target-psnr")


def _data_start(b: bytes) -> int:
    """Where a store file's data begins (after its prefix and header: ``inr.store``)."""
    from inr import store

    return store.PREFIX.size + store.PREFIX.unpack_from(b, 0)[2]


def test_native_sizes_record_the_early_stop(photos, tmp_path):
    from inr import store
    from inr.encode import EncodeConfig
    from inr.native import encode_native
    from inr.quantize import QuantConfig

    _, imgs = photos
    ims = [imgs[0], imgs[1], imgs[2][:24], imgs[3][:24]]  # two sizes: 32x32 and 24x32
    fit_cfg = preset("demo", target_psnr=24.0)
    cfg = EncodeConfig(fit=fit_cfg, quant=QuantConfig((32,) * fit_cfg.arch.num_linear))
    out = encode_native(ims, np.zeros(4, np.int64), cfg, tmp_path / "n.inr")
    es = store.read_header(out)["meta"]["early_stop"]
    assert es["recorded"] and es["images"] == 4 and es["target_psnr"] == 24.0
    assert 0 < es["stopped_early"] <= 4 and es["fit_iterations_mean"] < fit_cfg.iterations
