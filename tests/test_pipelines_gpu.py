"""Every registered pipeline's contract on the device (``gpu``-marked: collected everywhere, skipped
with the reason without CUDA), parametrized over ``pipelines.names()`` and the device.

Reuses ``tests/test_pipelines.py``: its datasets and stores (session fixtures), its helpers and its
test bodies, with the pipelines built on the device (``on_device`` makes that module's ``make``
pass ``device=...``). Added here: the batch contract on the device, CPU vs device output of the
same epoch, and device memory given back by ``close()``.
"""

from __future__ import annotations

import gc
import math

import numpy as np
import pytest
import torch

import pipelines
from pipelines import Augment, PipelineConfig, Unavailable
from tests import test_pipelines as tp

# the session fixtures of tests/test_pipelines.py, visible to this module's tests by these names
labels_data, coords_data, stores = tp.labels_data, tp.coords_data, tp.stores

pytestmark = pytest.mark.gpu

ADAPTERS = pipelines.names()
DEVICES = ["cuda"]
AGREE_DB = 30.0  # CPU vs device epoch of one pipeline (JPEG decoders differ in their IDCT, floats in rounding)


@pytest.fixture(params=DEVICES)
def on_device(request, monkeypatch) -> str:
    """``tests.test_pipelines.make`` builds on this device for the test's duration."""
    real = tp.make
    monkeypatch.setattr(tp, "make", lambda name, data, store=None, **kw: real(name, data, store,
                                                                             **{"device": request.param, **kw}))
    return request.param


@pytest.mark.parametrize("name", ADAPTERS)
def test_batch_contract_on_device(name, on_device, labels_data, stores):
    """Shapes, dtypes, the device; the unshuffled centre-crop epoch reproduces the dataset (>= 20 dB)."""
    from bench.metrics import mean_psnr, psnr_per_image

    aug = Augment(crop="center", flip=False)
    p = tp.make(name, labels_data, stores["labels"], batch_size=4, augment=aug, shuffle=False)
    split = labels_data.split("train")
    batches = list(p)
    p.close()
    assert len(batches) == len(p) == math.ceil(len(split) / 4)
    for b in batches:
        assert b.images.dtype == torch.float32 and b.labels.dtype == torch.int64
        assert b.images.device.type == b.labels.device.type == torch.device(on_device).type
        assert b.images.shape[1:] == (3, 32, 32) and b.images.shape[0] == b.labels.shape[0]
    images = torch.cat([b.images for b in batches]).cpu()
    assert torch.equal(torch.cat([b.labels for b in batches]).cpu(), torch.from_numpy(split.labels))
    rgb = tp.unnormalize(images, aug).permute(0, 2, 3, 1) / 255.0
    psnr = mean_psnr(psnr_per_image(rgb, torch.from_numpy(np.array(split.images))))
    assert psnr >= 20.0, f"{name} on {on_device}: decoded epoch is {psnr:.1f} dB from the dataset"


@pytest.mark.parametrize("name", ADAPTERS)
def test_cpu_and_device_give_the_same_epoch(name, on_device, labels_data, stores):
    """Centre crop, no flip, no shuffle: the same labels and images within AGREE_DB of each other."""
    aug = Augment(crop="center", flip=False)
    kw = dict(batch_size=8, augment=aug, shuffle=False)
    p = tp.make(name, labels_data, stores["labels"], **kw)
    dev_images, dev_labels = tp.epoch(p)
    p.close()
    q = tp.make(name, labels_data, stores["labels"], **{**kw, "device": "cpu"})
    cpu_images, cpu_labels = tp.epoch(q)
    q.close()
    assert torch.equal(dev_labels.cpu(), cpu_labels)
    a, b = tp.unnormalize(dev_images, aug), tp.unnormalize(cpu_images, aug)
    mse = float(((a - b) ** 2).mean())
    psnr = math.inf if mse == 0 else 10 * math.log10(255.0**2 / mse)
    assert psnr >= AGREE_DB, f"{name}: {on_device} vs cpu {psnr:.1f} dB (max {float((a - b).abs().max()):.1f} levels)"


@pytest.mark.parametrize("name", ADAPTERS)
def test_labels_match_pixels_on_device(name, on_device, labels_data, stores):
    tp.test_labels_match_pixels(name, labels_data, stores)


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("name", ADAPTERS)
def test_epoch_visits_every_sample_once_on_device(name, drop_last, on_device, coords_data, stores):
    tp.test_epoch_visits_every_sample_once(name, drop_last, coords_data, stores)


@pytest.mark.parametrize("name", ADAPTERS)
def test_crops_are_per_image_and_seeded_on_device(name, on_device, coords_data, stores):
    tp.test_crops_are_per_image_and_seeded(name, coords_data, stores)


@pytest.mark.parametrize("name", ADAPTERS)
def test_close_releases_everything_on_device(name, on_device, coords_data, stores):
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    tp.test_close_releases_everything(name, coords_data, stores)
    gc.collect()
    torch.cuda.synchronize()
    left = torch.cuda.memory_allocated() - before
    assert left <= 1 << 20, f"{name}: {left} bytes of device tensors still allocated after close()"


@pytest.fixture(scope="module", params=DEVICES)
def measured(request, coords_data, stores) -> dict:
    """``tests.test_pipelines.measured`` on the device: crops read back from 8 epochs per crop kind."""
    out: dict = {"device": request.param}
    for name in ADAPTERS:
        out[name] = {}
        for crop in ("random-resized", "random-pad"):
            aug = Augment(crop=crop)
            cfg = PipelineConfig(batch_size=tp.COORD_N, augment=aug, workers=0, seed=3, device=request.param)
            try:
                p = pipelines.create(name, coords_data, cfg, store=stores["coords"][0])
            except Unavailable as e:
                out[name] = stores["coords"][1] or e
                break
            ms = [tp.read_crops(b.images, aug) for _ in range(8) for b in p]
            p.close()
            out[name][crop] = {k: np.concatenate([m[k] for m in ms]) for k in ms[0]}
    return out


@pytest.mark.parametrize("name", ADAPTERS)
def test_random_resized_crop_distribution_on_device(name, measured):
    tp.test_random_resized_crop_distribution_matches_torchvision(name, measured)


@pytest.mark.parametrize("name", ADAPTERS)
def test_random_pad_offsets_uniform_on_device(name, measured):
    tp.test_random_pad_offsets_uniform(name, measured)


def test_crop_statistics_agree_across_adapters_on_device(measured):
    tp.test_crop_statistics_agree_across_adapters(measured)
