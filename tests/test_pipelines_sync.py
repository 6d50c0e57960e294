"""No hidden host round trip in an epoch's steady state (issue 11, section 1).

On the CPU a device sync cannot be observed directly, so the test catches what causes one: during
a steady-state epoch of ``raw`` and ``inr`` (the second epoch: the first built the cached
constants) every host read of a tensor (``item``, ``tolist``, ``cpu``, ``numpy``, ``bool``/``int``/
``float`` conversion) and every ``torch.tensor(..., device=...)`` / ``torch.as_tensor(...,
device=...)`` (a pageable host->device copy on CUDA: the old per-batch normalization constants)
raises. The CPU->CUDA copies themselves go through ``crops.to_device`` (pinned, non-blocking),
whose call shape is checked with fakes; the real thing runs under
``torch.cuda.set_sync_debug_mode("error")`` in ``scripts/gpu-check``.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import pipelines
from bench.datasets.prepared import PreparedDataset, open_prepared
from pipelines import Augment, PipelineConfig, Unavailable
from pipelines.crops import norm_constants, normalize_, to_device

HOST_READS = ("item", "tolist", "cpu", "numpy", "__bool__", "__int__", "__float__")


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> PreparedDataset:
    from bench.datasets.prepare import prepare_dataset

    out = tmp_path_factory.mktemp("sync") / "synthetic16"
    return open_prepared(prepare_dataset("synthetic", out, size=16, per_class=2, num_classes=4, jpeg_quality=90))


@pytest.fixture(scope="module")
def store(data, tmp_path_factory):
    try:
        from bench.datasets.identity import source_record
        from inr.fit import FitConfig, fit
        from inr.quantize import QuantConfig, quantize
        from inr.siren import SirenArch
        from inr.store import save
    except ImportError as e:
        pytest.skip(f"the INR codec is not importable here ({e})")
    split = data.split("train")
    cfg = FitConfig(arch=SirenArch(2, 8), iterations=3, lr=1e-3)
    layers = quantize(fit(np.array(split.images), cfg).weights, QuantConfig((16,) * cfg.arch.num_linear))
    return save(tmp_path_factory.mktemp("sync") / "s.inr", cfg.arch, split.image_size, split.labels, layers,
                meta={"source": source_record(data, "train")})


class HostRead(AssertionError):
    pass


def _forbid_host_reads(monkeypatch) -> list[str]:
    seen: list[str] = []

    def deny(name):
        def f(*a, **k):
            seen.append(name)
            raise HostRead(f"host read Tensor.{name} in the steady state of an epoch")
        return f

    for name in HOST_READS:
        monkeypatch.setattr(torch.Tensor, name, deny(name), raising=False)
    for mod, fn in ((torch, "tensor"), (torch, "as_tensor")):
        orig = getattr(mod, fn)

        def guarded(*a, _orig=orig, _fn=fn, **k):
            if k.get("device") is not None and not (isinstance(a[0], torch.Tensor) and a[0].device == torch.device(k["device"])):
                seen.append(_fn)
                raise HostRead(f"torch.{_fn}(..., device=...) per batch: a host->device copy")
            return _orig(*a, **k)

        monkeypatch.setattr(mod, fn, guarded)
    return seen


@pytest.mark.parametrize("crop", ["random-resized", "random-pad", "center"])
@pytest.mark.parametrize("name", ["raw", "inr"])
def test_steady_state_epoch_has_no_host_round_trip(name, crop, data, store, monkeypatch):
    cfg = PipelineConfig(batch_size=3, augment=Augment(crop=crop, size=12, pad=2, flip=crop != "center"), workers=0, seed=1)
    try:
        p = pipelines.create(name, data, cfg, store=store if pipelines.needs_store(name) else None)
    except Unavailable as e:
        pytest.skip(f"{name} unavailable here: {e}")
    with p:
        first = [b.images.clone() for b in p]  # epoch 0: builds the cached constants
        with monkeypatch.context() as m:
            seen = _forbid_host_reads(m)
            second = [b.images for b in p]
        assert not seen
        assert len(second) == len(first) == len(p)
        if crop == "center":  # no randomness: the same pixels both epochs (order aside)
            assert torch.allclose(torch.cat(first).sum(0), torch.cat(second).sum(0), atol=1e-4)


def test_the_guard_catches_the_old_per_batch_constants(monkeypatch):
    """The guard can fail: the pre-fix ``normalize_`` (constants built per batch) trips it."""
    aug = Augment()

    def old_normalize_(images):
        std = torch.tensor(aug.std, dtype=images.dtype, device=images.device).view(1, 3, 1, 1)
        return images.div_(std)

    x = torch.rand(2, 3, 4, 4)
    normalize_(x.clone(), aug)  # the first batch builds the cached constants
    seen = _forbid_host_reads(monkeypatch)
    with pytest.raises(HostRead):
        old_normalize_(x)
    with pytest.raises(HostRead):
        torch.zeros(1).item()
    assert seen == ["tensor", "item"]
    normalize_(x, aug)  # the current normalize_: cached constants, passes the guard
    assert seen == ["tensor", "item"]


def test_normalization_constants_are_built_once_per_device_and_dtype():
    aug = Augment(mean=(0.1, 0.2, 0.3), std=(0.5, 0.25, 0.125))
    a = norm_constants(aug, torch.device("cpu"), torch.float32, 255.0)
    assert norm_constants(aug, torch.device("cpu"), torch.float32, 255.0) is a
    assert norm_constants(aug, torch.device("cpu"), torch.float64, 255.0) is not a
    assert norm_constants(aug, torch.device("cpu"), torch.float32, 1.0) is not a
    x = torch.rand(2, 3, 4, 4, dtype=torch.float64) * 255
    want = (x / 255.0 - torch.tensor(aug.mean, dtype=torch.float64).view(1, 3, 1, 1)) / torch.tensor(
        aug.std, dtype=torch.float64).view(1, 3, 1, 1)
    assert torch.allclose(normalize_(x.clone(), aug), want, atol=1e-12)


def test_to_device_pins_and_copies_non_blocking_to_cuda(monkeypatch):
    """CPU -> CUDA: ``pin_memory()`` then ``.to(cuda, non_blocking=True)`` (faked: no GPU needed)."""
    calls: list[tuple] = []
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda self: calls.append(("pin",)) or self)
    real_to = torch.Tensor.to

    def fake_to(self, *a, **k):
        calls.append(("to", str(a[0]) if a else None, k.get("non_blocking")))
        return real_to(self, "cpu")

    monkeypatch.setattr(torch.Tensor, "to", fake_to)
    to_device(torch.zeros(3), torch.device("cuda:0"))
    assert calls == [("pin",), ("to", "cuda:0", True)]
    calls.clear()
    t = torch.zeros(3)
    assert to_device(t, "cpu") is t and calls == []  # same device: no copy at all
