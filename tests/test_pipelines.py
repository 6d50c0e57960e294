"""Contract tests for every registered pipeline (parametrized over ``pipelines.names()``).

Two tiny prepared datasets, built once per session:

* ``labels``: the ``synthetic`` source (class = flat colour, read back with
  ``synthetic.recover_labels``), 10 classes x 1 train image, 32x32.
* ``coords``: 32 images whose pixels encode their own position and identity:
  ``R = 8x + 4``, ``G = 8y + 4`` (pixel centres on a ramp), ``B = 8k + 4`` for image ``k``,
  label ``k % 10``. From any adapter's output the crop box, the flip and the source image
  are read back by a least-squares fit of the ramps, so crop statistics are measured
  black-box and compared across adapters.

An adapter that cannot run here raises ``Unavailable`` and its tests skip with that reason.
The ``inr`` adapter gets a store fitted for each dataset (tiny SIREN, few iterations) when
the codec is importable; otherwise it skips saying why.
"""

from __future__ import annotations

import gc
import math
import os

import numpy as np
import psutil
import pytest
import scipy.stats as st
import torch

import pipelines
from bench.datasets.prepared import PreparedDataset, SplitData, open_prepared, write_prepared
from pipelines import Augment, PipelineConfig, Unavailable
from pipelines.crops import Crops, sample_crops, warp

ADAPTERS = pipelines.names()
COORD_N, SIDE = 32, 32
P_MIN = 1e-3  # statistical tests: fail only when p < 0.001 (the draws are seeded, so this is stable)


# ----------------------------------------------------------------------------------- data


def _coord_images(n: int, side: int) -> np.ndarray:
    ramp = (np.arange(side) * (256 // side) + (128 // side)).astype(np.uint8)
    img = np.zeros((n, side, side, 3), np.uint8)
    img[..., 0] = ramp[None, None, :]
    img[..., 1] = ramp[None, :, None]
    img[..., 2] = (np.arange(n) * (256 // n) + (128 // n)).astype(np.uint8)[:, None, None]
    return img


@pytest.fixture(scope="session")
def labels_data(tmp_path_factory) -> PreparedDataset:
    from bench.datasets.prepare import prepare_dataset

    out = tmp_path_factory.mktemp("pipelines") / "synthetic32"
    return open_prepared(prepare_dataset("synthetic", out, size=32, per_class=2, num_classes=10, jpeg_quality=90))


@pytest.fixture(scope="session")
def coords_data(tmp_path_factory) -> PreparedDataset:
    out = tmp_path_factory.mktemp("pipelines") / "coords32"
    k = np.arange(COORD_N)
    split = SplitData(_coord_images(COORD_N, SIDE), (k % 10).astype(np.int64))
    meta = {"source": "test-coords", "classes": [str(i) for i in range(10)]}
    return open_prepared(write_prepared(out, {"train": split}, meta, jpeg_quality=95))


FIT_ARCH = (3, 16)  # layers x hidden: small and quick on a 2-core CPU


def _fit_store(data: PreparedDataset, out, iterations: int, replicate: bool) -> tuple[object, str]:
    """``(store path or None, reason)``: a quickly fitted 16-bit INR store for ``data``.

    ``replicate``: fit image 0 only and derive the others by shifting the output layer's blue
    bias to their (flat) blue level — exact for the ``coords`` set, whose images differ only there.
    """
    try:
        from inr.fit import FitConfig, decode_psnr, fit
        from inr.quantize import QuantConfig, dequantize, quantize
        from inr.siren import SirenArch
        from inr.store import save
    except ImportError as e:
        return None, f"the INR codec is not importable here ({e})"
    split = data.split("train")
    images = np.array(split.images)
    cfg = FitConfig(arch=SirenArch(*FIT_ARCH), iterations=iterations, lr=5e-3, eval_every=25, cpu_batch_cap=64)
    if replicate:
        res = fit(images[:1], cfg)
        n = images.shape[0]
        weights = [(W.expand(n, -1, -1).clone(), b.expand(n, -1, -1).clone()) for W, b in res.weights]
        blue = torch.from_numpy(images[:, 0, 0, 2].astype(np.float32))
        weights[-1][1][:, 0, 2] += 2.0 * (blue - blue[0]) / 255.0  # rgb = 0.5 * out + 0.5
    else:
        weights = fit(images, cfg).weights
    layers = quantize(weights, QuantConfig((16,) * cfg.arch.num_linear))
    psnr = decode_psnr(dequantize(layers), images, cfg.arch)
    from bench.datasets.identity import source_record

    return save(out, cfg.arch, split.image_size, split.labels, layers, psnr=psnr,
                meta={"source": source_record(data, "train")}), ""


@pytest.fixture(scope="session")
def stores(labels_data, coords_data, tmp_path_factory) -> dict:
    d = tmp_path_factory.mktemp("stores")
    return {
        "labels": _fit_store(labels_data, d / "labels.inr", iterations=150, replicate=False),
        "coords": _fit_store(coords_data, d / "coords.inr", iterations=400, replicate=True),
    }


def not_installed(e: BaseException) -> bool:
    """Whether an adapter's ``Unavailable`` is a library that is not installed (a ``ModuleNotFoundError``
    behind it), not one that is installed and broken (a native library that fails to load, a decoder
    that cannot run on the device)."""
    return isinstance(e.__cause__ or e.__context__, ModuleNotFoundError)


def unavailable(name: str, e: BaseException | str, device: str) -> None:
    """An adapter that cannot run: on the CPU a skip with the reason; on an accelerator, where every
    adapter must run, a skip saying *not installed* for a missing library and a failure for anything else
    (a skip there must never read as a pass)."""
    if torch.device(device).type == "cpu":
        pytest.skip(f"{name} unavailable here: {e}")
    if isinstance(e, str) or not_installed(e):
        pytest.skip(f"{name} not installed here: {e}")
    pytest.fail(f"{name} cannot run on {device}: {type(e).__name__}: {e}", pytrace=False)


def make(name: str, data: PreparedDataset, store=None, **kw) -> pipelines.Pipeline:
    kw.setdefault("workers", 0)
    cfg = PipelineConfig(**kw)
    try:
        return pipelines.create(name, data, cfg, store=store[0] if store else None)
    except Unavailable as e:  # a store's reason: the INR codec cannot be imported here (``_fit_store``)
        unavailable(name, store[1] if store and store[1] else e, cfg.device)


def epoch(p: pipelines.Pipeline) -> tuple[torch.Tensor, torch.Tensor]:
    batches = list(p)
    return torch.cat([b.images for b in batches]), torch.cat([b.labels for b in batches])


def unnormalize(images: torch.Tensor, aug: Augment) -> torch.Tensor:
    """float ``[B,3,s,s]`` normalized -> float64 in 0..255."""
    mean = torch.tensor(aug.mean, dtype=torch.float64).view(1, 3, 1, 1)
    std = torch.tensor(aug.std, dtype=torch.float64).view(1, 3, 1, 1)
    return (images.detach().cpu().double() * std + mean) * 255.0


# ------------------------------------------------------------------ reading crops back


def _ramp_fit(values: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per image least squares ``values ~ a + b * pos`` over ``mask``: returns ``(a [B], b [B])``."""
    m = mask.double()
    s0, su, suu = m.sum((1, 2)), (m * pos).sum((1, 2)), (m * pos * pos).sum((1, 2))
    sv, suv = (m * values).sum((1, 2)), (m * pos * values).sum((1, 2))
    b = (s0 * suv - su * sv) / (s0 * suu - su * su)
    return (sv - b * su) / s0, b


def read_crops(images: torch.Tensor, aug: Augment) -> dict[str, np.ndarray]:
    """Crop box (input pixels), flip and source image index of each output of the ``coords`` set."""
    x = unnormalize(images, aug)
    s = x.shape[-1]
    step = 256 // SIDE
    u = (torch.arange(s, dtype=torch.float64) + 0.5).view(1, 1, s).expand(x.shape[0], s, s)
    v = u.transpose(1, 2)
    r, g = x[:, 0], x[:, 1]
    lo, hi = step / 2 + 1.5, 256 - step / 2 - 1.5  # drop edge-clamped and zero-padded pixels
    ok = (r > lo) & (r < hi) & (g > lo) & (g < hi)
    ax, bx = _ramp_fit(r, u, ok)
    ay, by = _ramp_fit(g, v, ok)
    w, h = (bx.abs() * s / step), (by * s / step)
    flip = bx < 0
    left = torch.where(flip, ax / step - w, ax / step)
    top = ay / step
    blue = torch.stack([x[i, 2][ok[i]].median() for i in range(x.shape[0])])
    index = torch.round((blue - 128 // COORD_N) / (256 // COORD_N)).long()
    return {
        "w": w.numpy(), "h": h.numpy(), "left": left.numpy(), "top": top.numpy(),
        "flip": flip.numpy(), "index": index.numpy(),
    }


def torchvision_reference(aug: Augment, n: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Crop sizes drawn by torchvision's own ``RandomResizedCrop`` (the reference distribution)."""
    import torchvision.transforms.v2 as T
    from PIL import Image

    t = T.RandomResizedCrop(aug.size, scale=aug.scale, ratio=aug.ratio)
    im = Image.new("RGB", (SIDE, SIDE))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        ps = [t.make_params([im]) for _ in range(n)]
    return {"w": np.array([p["width"] for p in ps], float), "h": np.array([p["height"] for p in ps], float)}


# ---------------------------------------------------------------------------- tests


def test_registry_lists_builtins_and_rejects_unknown(labels_data):
    """Every ``@register("name")`` in ``pipelines/*.py`` is registered by ``import pipelines`` (a
    module missing from ``pipelines/__init__.py`` would silently escape every test here)."""
    import re
    from pathlib import Path

    root = Path(pipelines.__file__).parent
    declared = {m for f in root.glob("*.py") for m in re.findall(r'^@register\("([^"]+)"\)', f.read_text(), re.M)}
    assert {"raw", "torch-jpeg", "dali", "inr", "torch-nvjpeg"} <= declared
    assert declared <= set(ADAPTERS), f"not imported in pipelines/__init__.py: {sorted(declared - set(ADAPTERS))}"
    with pytest.raises(KeyError, match="known: .*raw"):
        pipelines.create("no-such-pipeline", labels_data, PipelineConfig())


def test_inr_without_store_is_unavailable(labels_data):
    with pytest.raises(Unavailable, match="--store"):
        pipelines.create("inr", labels_data, PipelineConfig(), store=None)
    # and so the CLI refuses `bench --pipeline inr` without --store before any work (tests/test_hostile_numbers.py)
    assert pipelines.needs_store("inr") and not pipelines.needs_store("raw") and not pipelines.needs_store("nope")


def test_dali_missing_is_unavailable(labels_data, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "nvidia.dali", None)  # makes `import nvidia.dali` fail
    with pytest.raises(Unavailable, match="nvidia.dali"):
        pipelines.create("dali", labels_data, PipelineConfig(workers=1))


@pytest.mark.parametrize("name", ADAPTERS)
def test_batch_contract_and_normalization(name, labels_data, stores):
    """Shapes, dtypes, device; unshuffled centre-crop epoch reproduces the dataset (PSNR >= 20 dB)."""
    from bench.metrics import mean_psnr, psnr_per_image

    aug = Augment(crop="center", flip=False)
    p = make(name, labels_data, stores["labels"], batch_size=4, augment=aug, shuffle=False)
    split = labels_data.split("train")
    batches = list(p)
    p.close()
    assert len(batches) == len(p) == math.ceil(len(split) / 4)
    for b in batches:
        assert b.images.dtype == torch.float32 and b.labels.dtype == torch.int64
        assert b.images.device.type == "cpu" and b.labels.device.type == "cpu"
        assert b.images.shape[1:] == (3, 32, 32) and b.images.shape[0] == b.labels.shape[0]
    images = torch.cat([b.images for b in batches])
    labels = torch.cat([b.labels for b in batches])
    assert torch.equal(labels, torch.from_numpy(split.labels))
    rgb = unnormalize(images, aug).permute(0, 2, 3, 1) / 255.0
    psnr = mean_psnr(psnr_per_image(rgb, torch.from_numpy(np.array(split.images))))
    assert psnr >= 20.0, f"{name}: decoded epoch is {psnr:.1f} dB from the dataset (normalization or order wrong?)"


@pytest.mark.parametrize("name", ADAPTERS)
def test_labels_match_pixels(name, labels_data, stores):
    from bench.datasets.synthetic import recover_labels

    aug = Augment(crop="random-resized", scale=(0.25, 1.0))
    p = make(name, labels_data, stores["labels"], batch_size=4, augment=aug, seed=1)
    images, labels = epoch(p)
    p.close()
    rgb = unnormalize(images, aug).clamp(0, 255).round().to(torch.uint8).permute(0, 2, 3, 1).numpy()
    seen = recover_labels(rgb, labels_data.num_classes)
    assert (seen == labels.cpu().numpy()).mean() == 1.0


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("name", ADAPTERS)
def test_epoch_visits_every_sample_once(name, drop_last, coords_data, stores):
    aug = Augment(crop="center", flip=False)
    p = make(name, coords_data, stores["coords"], batch_size=12, augment=aug, drop_last=drop_last)
    for _ in range(2):  # two epochs: the second must be a full, different permutation
        batches = list(p)
        assert len(batches) == len(p) == (COORD_N // 12 if drop_last else math.ceil(COORD_N / 12))
        images = torch.cat([b.images for b in batches])
        labels = torch.cat([b.labels for b in batches]).cpu().numpy()
        idx = read_crops(images, aug)["index"]
        assert np.array_equal(labels, idx % 10), "label does not belong to the image it came with"
        if drop_last:
            assert len(set(idx.tolist())) == len(idx) == (COORD_N // 12) * 12
        else:
            assert sorted(idx.tolist()) == list(range(COORD_N))
    p.close()


@pytest.mark.parametrize("name", ADAPTERS)
def test_crops_are_per_image_and_seeded(name, coords_data, stores):
    aug = Augment(crop="random-resized")
    kw = dict(batch_size=COORD_N, augment=aug, seed=7)
    p = make(name, coords_data, stores["coords"], **kw)
    a1, a2 = epoch(p)[0], epoch(p)[0]
    p.close()
    q = make(name, coords_data, stores["coords"], **kw)
    b1 = epoch(q)[0]
    q.close()
    r = make(name, coords_data, stores["coords"], **{**kw, "seed": 8})
    c1 = epoch(r)[0]
    r.close()
    assert torch.equal(a1, b1), "same seed, same epoch: outputs differ"
    assert not torch.equal(a1, a2), "epoch 2 repeats epoch 1"
    assert not torch.equal(a1, c1), "seed has no effect"
    m = read_crops(a1, aug)
    boxes = {(round(float(t)), round(float(x)), round(float(h)), round(float(w)))
             for t, x, h, w in zip(m["top"], m["left"], m["h"], m["w"], strict=True)}
    assert len(boxes) >= COORD_N // 2, f"only {len(boxes)} distinct crops in a batch of {COORD_N}"
    assert 0 < m["flip"].sum() < COORD_N, "flip is not drawn per image"


@pytest.mark.parametrize("name", ADAPTERS)
def test_epochs_do_not_depend_on_the_worker_count(name, coords_data, stores):
    """Epoch ``e`` is drawn from ``(seed, e, rank)`` only (``Pipeline``): 0 workers (the calling thread)
    and 2 (worker processes, decoder threads) give the same two epochs, sample for sample. The other
    tests run with 0, where a DataLoader's per-worker RNG streams never come into play."""
    kw = dict(batch_size=4, augment=Augment(crop="random-resized"), seed=5)
    runs = []
    for workers in (0, 2):
        p = make(name, coords_data, stores["coords"], workers=workers, **kw)
        try:
            runs.append([epoch(p) for _ in range(2)])
        finally:
            p.close()
    for e, ((xa, ya), (xb, yb)) in enumerate(zip(*runs, strict=True)):
        assert torch.equal(ya, yb), f"epoch {e}: another sample order with 2 workers than with 0"
        assert torch.equal(xa, xb), f"epoch {e}: other crops or pixels with 2 workers than with 0"


@pytest.fixture(scope="module")
def measured(coords_data, stores) -> dict:
    """Per adapter: crops read back from 8 epochs (256 samples) of random-resized and random-pad, or why it
    cannot run (``Unavailable``, or the store's reason); ``"device"``: where they ran."""
    out: dict = {"device": "cpu"}
    for name in ADAPTERS:
        out[name] = {}
        for crop in ("random-resized", "random-pad"):
            aug = Augment(crop=crop)
            try:
                p = pipelines.create(name, coords_data, PipelineConfig(batch_size=COORD_N, augment=aug, workers=0, seed=3),
                                     store=stores["coords"][0])
            except Unavailable as e:
                out[name] = stores["coords"][1] or e
                break
            ms = [read_crops(b.images, aug) for _ in range(8) for b in p]
            p.close()
            out[name][crop] = {k: np.concatenate([m[k] for m in ms]) for k in ms[0]}
    return out


def measured_or_skip(name: str, measured: dict) -> dict:
    """``measured[name]``, or the skip (or on an accelerator the failure) of an adapter that cannot run."""
    if not isinstance(measured[name], dict):
        unavailable(name, measured[name], measured["device"])
    return measured[name]


@pytest.mark.parametrize("name", ADAPTERS)
def test_random_resized_crop_distribution_matches_torchvision(name, measured):
    """Area fraction and aspect ratio vs torchvision's sampler: two-sample KS, p >= 0.001; flips: binomial."""
    m = measured_or_skip(name, measured)["random-resized"]
    ref = torchvision_reference(Augment(), 4000)
    w, h = np.round(m["w"]), np.round(m["h"])  # every adapter crops whole pixels at 32x32
    off = np.abs(np.concatenate([m["w"] - w, m["h"] - h]))
    assert np.median(off) < 0.15 and off.max() < 0.5, f"crop sizes not read back cleanly (median {np.median(off):.2f})"
    area = st.ks_2samp(w * h / SIDE**2, ref["w"] * ref["h"] / SIDE**2)
    ratio = st.ks_2samp(np.log(w / h), np.log(ref["w"] / ref["h"]))
    flips = st.binomtest(int(m["flip"].sum()), m["flip"].size, 0.5)
    assert area.pvalue >= P_MIN, f"area fraction differs from torchvision: {area}"
    assert ratio.pvalue >= P_MIN, f"aspect ratio differs from torchvision: {ratio}"
    assert flips.pvalue >= P_MIN, f"flip rate {m['flip'].mean():.3f} is not 0.5: {flips}"
    # position: the crop lies inside the image and its centre is spread over it
    assert m["left"].min() > -0.35 and (m["left"] + m["w"]).max() < SIDE + 0.35


@pytest.mark.parametrize("name", ADAPTERS)
def test_random_pad_offsets_uniform(name, measured):
    """RandomCrop(size, padding=4): both offsets uniform on -4..4 (chi-square p >= 0.001)."""
    m = measured_or_skip(name, measured)["random-pad"]
    pad = Augment().pad
    for key in ("left", "top"):
        off = np.round(m[key]).astype(int)
        assert np.abs(m[key] - off).max() < 0.35, f"{key} offsets are not whole pixels"
        counts = np.array([(off == k).sum() for k in range(-pad, pad + 1)])
        assert counts.sum() == off.size, f"{key} offsets outside -{pad}..{pad}"
        chi = st.chisquare(counts)
        assert chi.pvalue >= P_MIN, f"{key} offsets not uniform: {counts.tolist()} {chi}"
    assert np.allclose(m["w"], SIDE, atol=0.35) and np.allclose(m["h"], SIDE, atol=0.35)


def test_crop_statistics_agree_across_adapters(measured):
    """Pairwise two-sample KS on the area fraction between every two available adapters."""
    avail = [n for n in ADAPTERS if isinstance(measured[n], dict)]
    if len(avail) < 2:
        pytest.skip(f"fewer than two adapters available here: {avail}")
    for i, a in enumerate(avail):
        for b in avail[i + 1:]:
            ma, mb = measured[a]["random-resized"], measured[b]["random-resized"]
            ks = st.ks_2samp(np.round(ma["w"]) * np.round(ma["h"]), np.round(mb["w"]) * np.round(mb["h"]))
            assert ks.pvalue >= P_MIN, f"{a} vs {b}: crop areas differ {ks}"


@pytest.mark.parametrize("name", ADAPTERS)
def test_close_releases_everything(name, coords_data, stores):
    me = psutil.Process()
    before = {c.pid for c in me.children(recursive=True)}
    p = make(name, coords_data, stores["coords"], batch_size=8, workers=1)
    it = iter(p)
    next(it)
    held = p.resident_bytes()
    assert set(held) == {"device", "host"} and all(v >= 0 for v in held.values())
    del it
    p.close()
    p.close()  # idempotent
    gc.collect()
    assert p.resident_bytes() == {"device": 0, "host": 0}
    with pytest.raises(RuntimeError, match="closed"):
        next(iter(p))
    alive = {c.pid for c in me.children(recursive=True) if c.is_running() and c.status() != psutil.STATUS_ZOMBIE}
    assert alive <= before, f"{name}: child processes left running after close(): {alive - before}"


def _mean_file_bytes(paths) -> float:
    return sum(os.stat(f).st_size for f in paths) / len(paths)


# What each built-in reads the dataset from, per image, measured here independently of the adapter
# (the JPEG files' sizes from the disk, not from the manifest the adapters read).
EXPECTED_BYTES_PER_IMAGE = {
    "raw": lambda data, store: float(np.prod(data.split("train").image_size) * 3),
    "torch-jpeg": lambda data, store: _mean_file_bytes(data.split("train").jpeg_paths),
    "torch-nvjpeg": lambda data, store: _mean_file_bytes(data.split("train").jpeg_paths),
    "dali": lambda data, store: _mean_file_bytes(data.split("train").jpeg_paths),
    "inr": lambda data, store: os.stat(store).st_size / len(data.split("train")),
}


@pytest.mark.parametrize("name", ADAPTERS)
def test_dataset_bytes_per_image_is_what_it_reads(name, labels_data, stores):
    """``dataset_bytes_per_image``: a positive finite number (the report's bytes/image; ``inrbench bench``
    records it), the same after ``close()`` and with ``resident="shard"``; for a built-in, what it
    reads per image (raw pixels, JPEG file sizes, the store file / images)."""
    p = make(name, labels_data, stores["labels"], batch_size=4)
    got = p.dataset_bytes_per_image()
    p.close()
    assert isinstance(got, float) and math.isfinite(got) and got > 0, f"{name}: {got!r}"
    assert p.dataset_bytes_per_image() == got
    shard = make(name, labels_data, stores["labels"], batch_size=4, rank=1, world_size=2, resident="shard")
    assert shard.dataset_bytes_per_image() == got, "a rank's figure is the split's, the same on every rank"
    shard.close()
    if name in EXPECTED_BYTES_PER_IMAGE:
        assert got == pytest.approx(EXPECTED_BYTES_PER_IMAGE[name](labels_data, stores["labels"][0]), rel=1e-12)


@pytest.mark.parametrize("name", ADAPTERS)
def test_libraries_are_named_with_versions(name):
    """``Pipeline.libraries()``: ``{library: version or None}``, recorded in env.json and the code identity."""
    from bench import envinfo

    libs = pipelines.pipeline_class(name).libraries()
    assert isinstance(libs, dict) and all(isinstance(k, str) and k for k in libs)
    assert all(v is None or isinstance(v, str) for v in libs.values()), libs
    assert envinfo.pipeline_libraries()[name] == libs
    versions = envinfo.library_versions()
    assert all(lib in versions for lib in libs), f"{name}: {sorted(set(libs) - set(versions))} not in the code identity"


def _jpeg_bytes(side: int) -> bytes:
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(np.full((side, side, 3), 90, np.uint8)).save(buf, "JPEG", quality=90)
    return buf.getvalue()


DAMAGED = {  # what replaces one JPEG of the split
    "garbage": lambda: b"garbage\n",  # `echo garbage > 000005.jpg`
    "wrong-size": lambda: _jpeg_bytes(SIDE // 2),  # a valid JPEG of another size
}


@pytest.mark.parametrize("damage", sorted(DAMAGED))
@pytest.mark.parametrize("name", ADAPTERS)
def test_a_damaged_jpeg_is_one_input_error_naming_it(name, damage, coords_data, stores, tmp_path):
    """One JPEG of the split damaged or replaced: an adapter that reads the JPEG tree says so as one
    ``bench.errors.InputError`` line naming the file, at build or mid-epoch, also from a worker process
    (a worker's exception reaches the main process as its whole traceback); one that never reads the
    files gives a whole epoch. ``tests/test_hostile_stores.py`` runs such cases through the CLI."""
    import shutil

    from bench.errors import InputError

    root = tmp_path / "damaged"
    shutil.copytree(coords_data.root, root)
    data = open_prepared(root)
    bad = data.split("train").jpeg_paths[5]
    bad.write_bytes(DAMAGED[damage]())
    aug = Augment(crop="center", flip=False)
    error = None
    try:
        p = make(name, data, stores["coords"], batch_size=8, workers=1, augment=aug)
        try:
            images, _ = epoch(p)
        finally:
            p.close()
    except InputError as e:
        error = str(e)
    if error is not None:
        assert "\n" not in error, f"{name}: not one line: {error[:300]!r}"
        assert str(bad) in error, f"{name}: the message does not name {bad}: {error}"
        return
    seen = sorted(read_crops(images, aug)["index"].tolist())
    assert seen == list(range(COORD_N)), f"{name}: trained on the damaged file ({damage}) as an image"


def test_raw_warp_geometry_is_exact():
    """grid_sample geometry: identity, flip and zero-padded shifts are exact on whole pixels."""
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, (3, 3, 8, 8), generator=g).float()
    aug = Augment(crop="random-pad", size=8, pad=2)
    boxes = torch.tensor([[0.0, 0.0, 8, 8], [0.0, 0.0, 8, 8], [-2.0, 1.0, 8, 8]])
    out = warp(x, Crops(boxes, torch.tensor([False, True, False])), aug)
    assert torch.allclose(out[0], x[0], atol=1e-4)
    assert torch.allclose(out[1], x[1].flip(-1), atol=1e-4)
    shifted = torch.nn.functional.pad(x[2], (2, 2, 2, 2))[:, 0:8, 3:11]
    assert torch.allclose(out[2], shifted, atol=1e-4)


@pytest.mark.parametrize(("crop", "min_db"), [("center", 50.0), ("random-pad", 50.0), ("random-resized", 38.0)])
def test_inr_crop_decode_matches_decode_then_crop(crop, min_db, labels_data, stores):
    """Decoding at the crop coordinates == decode the full image, then crop/flip/resize (``warp``).

    Whole-pixel crops (centre, random-pad) sample the same pixel centres: equal up to float
    rounding (>= 50 dB). Random-resized crops are upsampled: the direct decode evaluates the
    network between pixel centres where the reference interpolates bilinearly, so they agree
    only as well as the image is smooth: >= 38 dB on the ``synthetic`` images (measured ~47 dB).
    """
    from bench.metrics import mean_psnr, psnr_per_image, to_uint8

    aug = Augment(crop=crop)
    p = make("inr", labels_data, stores["labels"], augment=aug)
    n = len(labels_data.split("train"))
    idx = torch.arange(n)
    crops = sample_crops(aug, n, *labels_data.image_size, torch.Generator().manual_seed(0))
    direct = p.decode(idx, crops)
    full = p.stored.decode(idx)
    reference = warp(full, crops, aug)
    p.close()
    psnr = mean_psnr(psnr_per_image(direct, to_uint8(reference)))
    assert psnr >= min_db, f"{crop}: crop-decode vs decode-then-crop {psnr:.1f} dB < {min_db}"


def test_inr_store_of_another_dataset_is_refused(labels_data, stores):
    from bench.errors import InputError

    if stores["coords"][0] is None:
        pytest.skip(f"inr unavailable here: {stores['coords'][1]}")
    with pytest.raises(InputError, match=r"coords\.inr.*store holds 32 images"):
        pipelines.create("inr", labels_data, PipelineConfig(workers=0), store=stores["coords"][0])


# ------------------------------------------- the device tests' own plumbing, checked on the CPU


class _DeviceTensor(torch.Tensor):
    """Stands for a tensor on an accelerator: ``.numpy()`` refuses it, as torch does a CUDA tensor's, until
    ``.cpu()`` brings it to the host."""

    def numpy(self, *args, **kwargs):
        raise TypeError("can't convert cuda:0 device type tensor to numpy. Use Tensor.cpu() to copy the tensor "
                        "to host memory first.")

    def cpu(self, *args, **kwargs):
        return self.as_subclass(torch.Tensor)


class _DeviceLabels:
    """A pipeline whose batches carry their labels as ``_DeviceTensor``s (what a CUDA pipeline yields)."""

    def __init__(self, p: pipelines.Pipeline):
        self.p = p

    def __len__(self) -> int:
        return len(self.p)

    def __iter__(self):
        import dataclasses

        for b in self.p:
            yield dataclasses.replace(b, labels=b.labels.as_subclass(_DeviceTensor))

    def close(self) -> None:
        self.p.close()


def test_the_shared_test_bodies_read_labels_from_a_device(labels_data, coords_data, stores, monkeypatch):
    """``tests/test_pipelines_gpu.py`` runs these bodies on CUDA: labels on the device must be copied to the
    host before ``.numpy()`` (a bare ``.numpy()`` crashed every pipeline's GPU contract test)."""
    import sys

    real = make
    monkeypatch.setattr(sys.modules[__name__], "make", lambda *a, **kw: _DeviceLabels(real(*a, **kw)))
    with pytest.raises(TypeError, match="cuda:0 device type"):  # the stand-in refuses as CUDA does
        torch.arange(3).as_subclass(_DeviceTensor).numpy()
    test_labels_match_pixels("raw", labels_data, stores)
    test_epoch_visits_every_sample_once("raw", False, coords_data, stores)


def test_an_adapter_that_cannot_run_on_a_device_is_not_installed_or_fails(labels_data, monkeypatch):
    """On the CPU an ``Unavailable`` adapter skips; on CUDA a missing library is a skip saying *not installed*
    and anything else (an installed library that fails) a test failure, never a skip read as a pass."""
    import sys

    monkeypatch.setitem(sys.modules, "nvidia.dali", None)  # `import nvidia.dali`: ModuleNotFoundError
    with pytest.raises(Unavailable) as missing:
        pipelines.create("dali", labels_data, PipelineConfig(workers=1))
    try:
        raise RuntimeError("libnvimgcodec.so.0: cannot open shared object file")
    except RuntimeError:
        broken = Unavailable("nvidia.dali cannot be imported: RuntimeError: libnvimgcodec.so.0")
    assert not_installed(missing.value) and not not_installed(broken)
    with pytest.raises(pytest.skip.Exception, match="^dali unavailable here: nvidia.dali cannot be imported"):
        unavailable("dali", broken, "cpu")
    with pytest.raises(pytest.skip.Exception, match="^dali not installed here: nvidia.dali cannot be imported"):
        unavailable("dali", missing.value, "cuda:1")
    with pytest.raises(pytest.fail.Exception, match="^dali cannot run on cuda: Unavailable: .*libnvimgcodec"):
        unavailable("dali", broken, "cuda")
    with pytest.raises(pytest.skip.Exception, match="^inr not installed here: the INR codec"):  # a store's reason
        unavailable("inr", "the INR codec is not importable here (No module named 'inr')", "cuda")
