"""Learned init (``inr.meta``, ``inrbench meta-init``, ``encode --init``): train split only, deterministic,
recorded in the store, refused when it does not fit the architecture (that the compiled and the eager fit
agree: tests/test_inr_mixed.py, on the shape whose compiled-once property it tests)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from bench.datasets.prepare import prepare_dataset
from bench.datasets.prepared import open_prepared
from inr.meta import MetaConfig, load_init, meta_init_dataset, meta_train
from inr.siren import SirenArch
from tests.cli_helpers import assert_one_line_error, run_cli

pytestmark = pytest.mark.usefixtures("one_torch_thread")

TINY = MetaConfig(outer_steps=4, inner_steps=2, meta_batch=3, images=6, pixels=40)
ARCH = SirenArch(2, 6)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return prepare_dataset("synthetic", tmp_path_factory.mktemp("d") / "syn", size=8, num_classes=2, per_class=5,
                           jpeg_quality=75)


class _Watch:
    """A prepared dataset that records which splits are read."""

    def __init__(self, ds):
        self.ds, self.read = ds, []
        self.root, self.manifest = ds.root, ds.manifest

    def split(self, name):
        self.read.append(name)
        return self.ds.split(name)


def test_meta_init_reads_only_the_train_split_and_records_it(data):
    ds = _Watch(open_prepared(data))
    weights, info = meta_init_dataset(ds, ARCH, 1e-3, TINY)
    assert set(ds.read) == {"train"}
    assert info["split"] == "train" and info["num_images"] == min(6, len(ds.ds.split("train")))
    assert [tuple(W.shape) for W, _ in weights] == [(1, i, o) for i, o in ARCH.shapes]
    with pytest.raises(AssertionError, match="train split only"):
        meta_init_dataset(ds, ARCH, 1e-3, TINY, split="test")
    assert "test" not in ds.read


def test_meta_train_is_deterministic_under_a_seed():
    imgs = np.random.default_rng(1).integers(0, 256, (5, 8, 8, 3), dtype=np.uint8)
    a, _ = meta_train(imgs, ARCH, 1e-3, TINY)
    b, _ = meta_train(imgs, ARCH, 1e-3, TINY)
    c, _ = meta_train(imgs, ARCH, 1e-3, MetaConfig(**{**TINY.__dict__, "seed": 1}))
    assert all(torch.equal(x, y) for (W1, b1), (W2, b2) in zip(a, b, strict=True) for x, y in ((W1, W2), (b1, b2)))
    assert not all(torch.equal(W1, W2) for (W1, _), (W2, _) in zip(a, c, strict=True))


def test_select_init_keeps_the_candidate_that_saves_most_on_validation_train_images(data):
    """--candidates: every candidate meta-trains without the validation images, the kept one is the seed with
    the best validation saving (bit-identical to training that seed alone), and only the train split is read."""
    from dataclasses import replace

    from inr.meta import fit_curve, per_image_saving, select_init

    ds = _Watch(open_prepared(data))
    cfg = replace(TINY, images=8, candidates=3, validation=3, seed=5)
    weights, info = meta_init_dataset(ds, ARCH, 1e-2, cfg, iterations=12)
    assert set(ds.read) == {"train"} and info["split"] == "train" and info["config"]["candidates"] == 3
    sel = info["selection"]
    assert [c["seed"] for c in sel["candidates"]] == [5, 6, 7] and sel["validation_images"] == 3
    assert sel["meta_train_images"] == info["num_images"] - 3 and sel["iterations"] == 12
    savings = [c["validation_saving"] for c in sel["candidates"]]
    assert sel["chosen_seed"] == 5 + int(np.argmax(savings)) and len(set(savings)) > 1  # the seeds differ
    # recompute by hand: the same subset, validation images and seeds
    train = np.asarray(ds.ds.split("train").images)
    idx = np.sort(np.random.default_rng(cfg.seed + 7919).choice(len(train), info["num_images"], replace=False))
    imgs = train[idx]
    w2, info2 = select_init(imgs, ARCH, 1e-2, cfg, 12)
    def drop_time(d):
        return {**d, "candidates": [{k: v for k, v in c.items() if k != "seconds"} for c in d["candidates"]]}

    assert drop_time(info2["selection"]) == drop_time(sel)
    val = np.sort(np.random.default_rng(cfg.seed + 104729).choice(len(imgs), 3, replace=False))
    rest = np.setdiff1d(np.arange(len(imgs)), val)
    kept, _ = meta_train(imgs[rest], ARCH, 1e-2, replace(cfg, seed=sel["chosen_seed"], candidates=1))
    assert all(torch.equal(x, y) for (W1, b1), (W2, b2) in zip(weights, kept, strict=True) for x, y in ((W1, W2), (b1, b2)))
    target = fit_curve(imgs[val], ARCH, 12, 1e-2, seed=cfg.seed, per_image=True)
    got = per_image_saving(target, fit_curve(imgs[val], ARCH, 12, 1e-2, start=kept, per_image=True))["geomean"]
    assert got == pytest.approx(max(savings))
    # cost and configuration errors
    with pytest.raises(ValueError, match="iterations"):
        meta_init_dataset(ds, ARCH, 1e-2, cfg)
    with pytest.raises(Exception, match="at least 2 train images"):
        select_init(imgs[:1], ARCH, 1e-2, cfg, 12)
    with pytest.raises(ValueError, match="candidates"):
        MetaConfig(candidates=0)


def test_meta_init_cli_candidates_prints_and_records_the_choice(data, tmp_path, capsys):
    init = tmp_path / "init.pt"
    rc, out, err = run_cli(capsys, "meta-init", data, "--out", init, "--layers", "2", "--hidden", "6", "--outer-steps",
                           "3", "--inner-steps", "2", "--meta-batch", "2", "--images", "6", "--candidates", "2",
                           "--validation", "2")
    assert rc == 0, err
    sel = load_init(init, ARCH).meta["selection"]
    assert len(sel["candidates"]) == 2 and sel["validation_images"] == 2
    assert out.count("candidate seed") == 2 and out.count("<- kept") == 1
    # what was meta-trained on and what was held out, as recorded (6 images: 4 meta-trained, 2 to choose)
    assert sel["meta_train_images"] == 4
    assert "meta-trained on 4 of 6 train images, 2 held out to choose the best of 2 seeds" in out
    # a store fitted from it records and shows the choice
    store = tmp_path / "s.inr"
    rc, _, err = run_cli(capsys, "encode", data, "--layers", "2", "--hidden", "6", "--iterations", "5", "--init", init,
                         "--out", store, "--no-progress", "--limit", "3")
    assert rc == 0, err
    rc, out, _ = run_cli(capsys, "inspect", store, "--json")
    rec = json.loads(out)["meta"]["init"]["selection"]
    best = max(sel["candidates"], key=lambda c: c["validation_saving"])
    assert rec == {"candidates": 2, "chosen_seed": best["seed"], "validation_images": 2,
                   "validation_saving": best["validation_saving"]}
    rc, out, _ = run_cli(capsys, "inspect", store)
    assert f"best of 2 seeds (kept seed {best['seed']}" in out
    assert "(reptile, meta-trained on 4 train images, 2 more held out to choose the seed)" in out
    rc, _, err = run_cli(capsys, "meta-init", data, "--out", tmp_path / "x.pt", "--candidates", "0")
    assert rc == 2 and "--candidates" in err and not (tmp_path / "x.pt").exists()


def test_init_round_trips_through_the_store_and_a_wrong_arch_is_refused(data, tmp_path, capsys):
    init = tmp_path / "init.pt"
    rc, out, err = run_cli(capsys, "meta-init", data, "--out", init, "--layers", "2", "--hidden", "6",
                           "--outer-steps", "3", "--inner-steps", "2", "--meta-batch", "2", "--images", "4")
    assert rc == 0, err
    sha = load_init(init).sha256
    assert sha in out and load_init(init, ARCH).meta["split"] == "train"
    store = tmp_path / "s.inr"
    rc, _, err = run_cli(capsys, "encode", data, "--layers", "2", "--hidden", "6", "--iterations", "5", "--init", init,
                         "--out", store, "--no-progress", "--limit", "3")
    assert rc == 0, err
    rc, out, _ = run_cli(capsys, "inspect", store, "--json")
    meta = json.loads(out)["meta"]
    assert meta["fit"]["init_sha256"] == sha and meta["init"]["sha256"] == sha and meta["init"]["split"] == "train"
    rc, out, _ = run_cli(capsys, "inspect", store)
    assert f"sha256 {sha}" in out
    # an init for another architecture: one line, exit 2, nothing written
    rc, _, err = run_cli(capsys, "encode", data, "--layers", "2", "--hidden", "7", "--init", init,
                         "--out", tmp_path / "t.inr", "--no-progress")
    assert_one_line_error(rc, err, "2x6", "2x7")
    assert not (tmp_path / "t.inr").exists()
    # not an init file at all
    rc, _, err = run_cli(capsys, "encode", data, "--init", store, "--out", tmp_path / "u.inr", "--no-progress")
    assert_one_line_error(rc, err, "not a learned initialization")


def test_identical_meta_init_runs_give_one_init_hash(data, tmp_path, capsys):
    """Two identical runs write files that differ only in the timings they record; the hash ``encode --init``
    records leaves those out, so it is the same (it was the file's sha256: a new hash every run)."""
    argv = ["--layers", "2", "--hidden", "6", "--outer-steps", "3", "--inner-steps", "2", "--meta-batch", "2",
            "--images", "4"]
    shas = []
    for name in ("a.pt", "b.pt"):
        rc, out, err = run_cli(capsys, "meta-init", data, "--out", tmp_path / name, *argv)
        assert rc == 0, err
        shas.append(out.rsplit("sha256 ", 1)[1].strip())
    a, b = load_init(tmp_path / "a.pt"), load_init(tmp_path / "b.pt")
    assert a.meta["seconds"] != b.meta["seconds"]  # the timings are kept in the file
    assert shas[0] == shas[1] == a.sha256 == b.sha256
    # what the hash covers still tells inits apart: another seed, other weights, another hash
    rc, out, err = run_cli(capsys, "meta-init", data, "--out", tmp_path / "c.pt", *argv, "--seed", "1")
    assert rc == 0, err
    assert load_init(tmp_path / "c.pt").sha256 != a.sha256


def test_the_init_hash_leaves_out_every_timing_and_nothing_else():
    from inr.meta import content_sha256

    def d(seconds: float, seed: int = 5, w: float = 0.0) -> dict:
        return {"format": "f", "arch": {"layers": 2}, "weights": [(torch.full((1, 2, 3), w), torch.zeros(1, 1, 3))],
                "meta": {"seconds": seconds, "selection": {"candidates": [{"seed": seed, "seconds": seconds,
                                                                           "validation_seconds": seconds}]}}}

    assert content_sha256(d(1.0)) == content_sha256(d(2.5))
    assert len({content_sha256(d(1.0)), content_sha256(d(1.0, seed=6)), content_sha256(d(1.0, w=1e-7))}) == 3


def test_fit_curve_per_image_and_per_image_saving():
    """fit_curve(per_image=True) is [iterations + 1, N] whose mean is the mean curve; per-image savings
    compare each image's learned curve with its own random-init PSNR at full length."""
    import numpy as np

    from inr.meta import fit_curve, per_image_saving

    arch = SirenArch(2, 8)
    imgs = np.random.default_rng(0).integers(0, 256, (3, 6, 6, 3), dtype=np.uint8)
    c = fit_curve(imgs, arch, 20, 1e-2, per_image=True)
    assert c.shape == (21, 3) and np.all(np.diff(c, axis=0) >= 0)  # best so far never drops
    assert np.allclose(c.mean(axis=1), fit_curve(imgs, arch, 20, 1e-2))
    random = np.array([[10.0, 10.0], [20.0, 12.0], [30.0, 14.0], [40.0, 16.0], [50.0, 18.0]])  # 4 iterations
    learned = np.array([[45.0, 10.0], [50.0, 11.0], [50.0, 12.0], [50.0, 13.0], [50.0, 17.0]])
    s = per_image_saving(random, learned)
    assert s["iterations"] == [1, 5] and s["never"] == 1  # image 0 at its 50 dB after 1; image 1 never at 18
    assert s["savings"] == [4.0, 0.8] and abs(s["geomean"] - (4.0 * 0.8) ** 0.5) < 1e-12
    # random init against itself: an image whose best-so-far stops rising early "saves" iterations with no
    # learned init at all (perf init prints this beside the learned init's saving)
    flat = np.array([[10.0, 10.0], [20.0, 12.0], [30.0, 14.0], [30.0, 16.0], [30.0, 18.0]])
    s = per_image_saving(flat, flat)
    assert s["iterations"] == [2, 4] and s["never"] == 0 and s["savings"] == [2.0, 1.0]
