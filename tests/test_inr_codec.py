"""Pruning, quantization and the store file: exact ratios, bounded error, bit-exact round trip, refusal of bad files."""

from __future__ import annotations

import struct

import numpy as np
import pytest
import torch

from bench.errors import InputError
from inr import store
from inr.fit import images_to_targets, optimize
from inr.prune import PruneConfig, magnitude_masks, prune_dynamic, prune_iterative
from inr.quantize import QuantConfig, dequantize, keep_matrix, layer_matrix, parse_bits, quantize
from inr.siren import SirenArch, coord_grid, init_weights

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def smooth_images(n: int, h: int = 16, w: int = 16) -> np.ndarray:
    """Deterministic smooth colour images (gradients + a blob) that a tiny SIREN fits well."""
    y, x = np.mgrid[0:h, 0:w] / np.array([h, w]).reshape(2, 1, 1)
    out = []
    for k in range(n):
        r = 0.5 + 0.4 * np.sin(3 * x + k)
        g = 0.5 + 0.4 * np.cos(2 * y - k)
        b = np.exp(-((x - 0.3 - 0.1 * k) ** 2 + (y - 0.6) ** 2) * 8)
        out.append(np.stack([r, g, b], -1))
    return np.round(np.clip(np.stack(out), 0, 1) * 255).astype(np.uint8)


# ----------------------------------------------------------------------------- pruning

def test_magnitude_masks_prune_an_exact_count_per_image_and_layer():
    arch = SirenArch(3, 10)
    ws = init_weights(arch, 5)
    ws[1][0][2] = 0.0  # ties everywhere in one image's layer: the count must still be exact
    for ratio in (0.0, 0.15, 0.5, 0.93):
        for m, (i, o) in zip(magnitude_masks(ws, ratio), arch.shapes, strict=True):
            assert m.shape == (5, i, o)
            assert torch.all((~m).reshape(5, -1).sum(1) == round(ratio * i * o))
    m = magnitude_masks(ws, 0.5)[1]
    W = ws[1][0]
    for k in range(5):  # per image: every pruned weight is no larger than every kept one (image 2: all ties at 0)
        assert W[k][~m[k]].abs().max() <= W[k][m[k]].abs().min(), f"image {k}"
    per_image = magnitude_masks(ws, torch.tensor([0.0, 0.1, 0.2, 0.3, 0.4], dtype=torch.float64))[2]
    assert (~per_image).reshape(5, -1).sum(1).tolist() == [round(r * 100) for r in (0.0, 0.1, 0.2, 0.3, 0.4)]


def test_masked_weights_stay_zero_through_finetuning():
    arch = SirenArch(3, 12)
    imgs = smooth_images(3)
    ws = init_weights(arch, 3)
    masks = magnitude_masks(ws, 0.4)
    out, _ = optimize(ws, images_to_targets(imgs), coord_grid(16, 16), arch, 25, 1e-2, masks=[m.float() for m in masks])
    for (W, _), m in zip(out, masks, strict=True):
        assert torch.all(W[~m] == 0)
        assert torch.count_nonzero(W[m]) == int(m.sum())  # the kept ones were trained, not zeroed


def test_iterative_and_dynamic_pruning():
    arch = SirenArch(3, 12)
    imgs = smooth_images(4)
    base, p0 = optimize(init_weights(arch, 4), images_to_targets(imgs), coord_grid(16, 16), arch, 200, 5e-3)
    cfg = PruneConfig(ratio=0.3, rounds=2, finetune_iterations=40, lr=1e-3)
    w, masks, p = prune_iterative(base, imgs, arch, cfg)
    for (W, _), m, (i, o) in zip(w, masks, arch.shapes, strict=True):
        assert torch.all((~m).reshape(4, -1).sum(1) == round(0.3 * i * o))
        assert torch.all(W[~m] == 0)
    assert torch.all(p > 15)
    dyn = PruneConfig(budget_db=1.0, step=0.1, max_ratio=0.5, finetune_iterations=20, lr=1e-3)
    w, masks, p, ratio = prune_dynamic(base, imgs, arch, dyn, p0)
    assert torch.all(p >= p0 - 1.0 - 1e-9)  # within the budget, image by image
    for (W, _), m, (i, o) in zip(w, masks, arch.shapes, strict=True):
        assert torch.all((~m).reshape(4, -1).sum(1) == torch.round(ratio * i * o).long())
        assert torch.all(W[~m] == 0)


# ----------------------------------------------------------------------------- quantization

@pytest.mark.parametrize("per_channel", [False, True])
@pytest.mark.parametrize("bits", [4, 5, 8, 11, 16])
def test_quantization_error_is_at_most_half_a_step(bits, per_channel):
    arch = SirenArch(4, 16)
    ws = init_weights(arch, 6, seed=bits)
    ws = [(W * (1 + 5 * li), b + 0.3 * li) for li, (W, b) in enumerate(ws)]  # wide, non-centred layers
    masks = [None] + magnitude_masks(ws[1:], 0.3)
    layers = quantize(ws, QuantConfig((bits,) * arch.num_linear, per_channel), masks)
    for (W, b), ql, m in zip(ws, layers, masks, strict=True):
        assert int(ql.codes.max()) <= 2**bits - 1 and int(ql.codes.min()) >= 0
        M = layer_matrix(W, b)
        keep = keep_matrix(m, tuple(M.shape))
        Wd, bd = ql.dequantize()
        D = layer_matrix(Wd, bd)
        step = ql.step.float().unsqueeze(1).expand_as(M)
        err = (M - D).abs()
        assert torch.all(err[keep] <= step[keep] / 2 * (1 + 1e-4) + 1e-7), float((err - step / 2)[keep].max())
        assert torch.all(D[~keep] == 0)


def test_parse_bits():
    assert parse_bits("8", 6) == (8,) * 6
    assert parse_bits("16:8:16", 6) == (16, 8, 8, 8, 8, 16)
    assert parse_bits("16,8,8,8,8,12", 6) == (16, 8, 8, 8, 8, 12)
    assert parse_bits("fp32", 3) == (32, 32, 32)
    for bad in ("3", "8,8", "x", "17"):
        with pytest.raises(InputError):
            parse_bits(bad, 6)


# ----------------------------------------------------------------------------- store

def _layers(n=7, bits=(16, 8, 8, 5, 32), per_channel=False, prune="variable"):
    arch = SirenArch(4, 9)
    ws = init_weights(arch, n, seed=11)
    if prune == "variable":
        masks = magnitude_masks(ws, torch.linspace(0.0, 0.6, n, dtype=torch.float64))
    elif prune == "fixed":
        masks = magnitude_masks(ws, 0.25)
    else:
        masks = None
    return arch, ws, quantize(ws, QuantConfig(bits, per_channel), masks)


@pytest.mark.parametrize("prune", ["none", "fixed", "variable"])
@pytest.mark.parametrize("per_channel", [False, True])
def test_store_round_trip_is_bit_exact(tmp_path, prune, per_channel):
    arch, _, layers = _layers(per_channel=per_channel, prune=prune)
    labels = np.array([3, 0, 9, 1, 1, 7, 2])
    psnr = np.linspace(20, 40, 7)
    path = store.save(tmp_path / "s.inr", arch, (6, 10), labels, layers, psnr=psnr, meta={"k": 1}, per_channel=per_channel)
    st = store.load(path, "cpu")
    assert st.arch == arch and st.image_size == (6, 10) and st.num_images == 7
    assert st.labels.dtype == torch.int64 and st.labels.tolist() == labels.tolist()
    assert np.allclose(st.psnr, psnr, atol=0.02) and st.meta == {"k": 1}
    assert st.bytes_on_disk == path.stat().st_size and st.bytes_per_image == path.stat().st_size / 7
    assert 0 < st.resident_bytes() < st.bytes_on_disk
    ref = dequantize(layers)
    idx = torch.tensor([6, 0, 3, 3])
    for (W, b), (Wr, br) in zip(st.weights(idx), ref, strict=True):
        assert torch.equal(W, Wr[idx]) and torch.equal(b, br[idx])
    for a, c in zip(layers, st.quantized_layers(chunk=3), strict=True):
        assert torch.equal(a.codes, c.codes)
        assert (a.mask is None) == (c.mask is None) and (a.mask is None or torch.equal(a.mask, c.mask))
    x = st.decode(idx)
    assert x.shape == (4, 3, 6, 10) and float(x.min()) >= 0 and float(x.max()) <= 1
    # the same input writes the same bytes
    again = store.save(tmp_path / "t.inr", arch, (6, 10), labels, layers, psnr=psnr, meta={"k": 1}, per_channel=per_channel)
    assert again.read_bytes() == path.read_bytes()


def test_pruning_and_quantization_shrink_the_file(tmp_path):
    sizes = {}
    for name, bits, prune in (("fp32", (32,) * 5, "none"), ("8bit", (8,) * 5, "none"), ("8bit-pruned", (8,) * 5, "fixed")):
        arch, _, layers = _layers(n=50, bits=bits, prune=prune)
        sizes[name] = store.load(store.save(tmp_path / f"{name}.inr", arch, (8, 8), np.zeros(50, int), layers)).bytes_per_image
    assert sizes["fp32"] > 3 * sizes["8bit"] and sizes["8bit"] > sizes["8bit-pruned"]


@pytest.fixture
def good_store(tmp_path):
    arch, _, layers = _layers()
    return store.save(tmp_path / "good.inr", arch, (6, 10), np.arange(7), layers, psnr=np.ones(7))


def test_flipped_byte_in_data_is_a_checksum_error(good_store):
    data = bytearray(good_store.read_bytes())
    data[-200] ^= 0x10
    good_store.write_bytes(bytes(data))
    with pytest.raises(InputError, match=r"checksum mismatch in array '\w+' \(stored crc32 [0-9a-f]{8}, computed [0-9a-f]{8}\)"):
        store.load(good_store)


def test_flipped_byte_in_header_is_a_checksum_error(good_store):
    data = bytearray(good_store.read_bytes())
    data[40] ^= 0x01
    good_store.write_bytes(bytes(data))
    with pytest.raises(InputError, match="header checksum mismatch"):
        store.load(good_store)


def test_truncated_file_says_expected_and_actual_length(good_store):
    data = good_store.read_bytes()
    good_store.write_bytes(data[:-100])
    with pytest.raises(InputError, match=rf"truncated: expected {len(data)} bytes, file has {len(data) - 100}"):
        store.load(good_store)
    good_store.write_bytes(data[:10])
    with pytest.raises(InputError, match="shorter than"):
        store.load(good_store)


def test_other_format_version_is_refused_by_number(good_store):
    data = bytearray(good_store.read_bytes())
    unknown = max(store.READ_VERSIONS) + 1
    struct.pack_into("<I", data, 8, unknown)
    good_store.write_bytes(bytes(data))
    with pytest.raises(InputError, match=rf"format version {unknown}, this inrbench reads versions \[1, 2\]"):
        store.load(good_store)
    # a version-1 file whose prefix claims the native-size version 2 is refused too
    struct.pack_into("<I", data, 8, store.NATIVE_FORMAT_VERSION)
    good_store.write_bytes(bytes(data))
    with pytest.raises(InputError, match="'format_version' 1 != the file's version 2"):
        store.load(good_store)


def test_not_a_store(tmp_path):
    p = tmp_path / "x.inr"
    p.write_bytes(b"hello world, this is not a store at all")
    with pytest.raises(InputError, match="not an INR store"):
        store.load(p)
    with pytest.raises(InputError, match="no such"):
        store.load(tmp_path / "missing.inr")


def test_every_single_byte_flip_is_detected(good_store):
    """Flip one bit in every byte position (a sample of them) — every one is refused."""
    data = good_store.read_bytes()
    for pos in list(range(0, 40)) + list(range(40, len(data), max(1, len(data) // 300))):
        bad = bytearray(data)
        bad[pos] ^= 0x04
        good_store.write_bytes(bytes(bad))
        with pytest.raises(InputError):
            store.load(good_store)
