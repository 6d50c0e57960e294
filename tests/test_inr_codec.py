"""Pruning, quantization and the store file: exact ratios, bounded error, bit-exact round trip, refusal of bad files."""

from __future__ import annotations

import struct

import numpy as np
import pytest
import torch

from bench.errors import InputError
from inr import store
from inr.fit import images_to_targets, optimize
from inr.loop import Loop
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
    out, _, _ = optimize(ws, images_to_targets(imgs), coord_grid(16, 16), arch, Loop(25, 1e-2), masks=masks)
    for (W, _), m in zip(out, masks, strict=True):
        assert torch.all(W[~m] == 0)
        assert torch.count_nonzero(W[m]) == int(m.sum())  # the kept ones were trained, not zeroed


def test_iterative_and_dynamic_pruning():
    arch = SirenArch(3, 12)
    imgs = smooth_images(4)
    base, p0, _ = optimize(init_weights(arch, 4), images_to_targets(imgs), coord_grid(16, 16), arch, Loop(200, 5e-3))
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


def _old_next_half(x: torch.Tensor, up: bool) -> torch.Tensor:
    """``inr.quantize._next_half`` before its host copy was removed (the reference for the test below)."""
    i = x.contiguous().view(torch.int16)
    away = (x > 0) if up else (x < 0)
    step = torch.where(away, i + 1, i - 1)
    tiny = torch.tensor(0x0001 if up else -0x7FFF, dtype=torch.int16, device=x.device)
    return torch.where(x == 0, tiny, step).view(torch.float16)


def _old_scales(M, keep, bits, per_channel):
    """``inr.quantize.scales`` before its host syncs were removed (``torch.tensor`` in ``_next_half``, and
    ``bool(short.any())`` to stop widening early): the reference for the test below."""
    big = torch.finfo(torch.float32).max
    lo = torch.where(keep, M, torch.full_like(M, big))
    hi = torch.where(keep, M, torch.full_like(M, -big))
    if per_channel:
        lo, hi = lo.amin(dim=1), hi.amax(dim=1)
    else:
        lo, hi = lo.flatten(1).amin(dim=1, keepdim=True), hi.flatten(1).amax(dim=1, keepdim=True)
    lo = torch.where(lo > hi, torch.zeros_like(lo), lo)
    hi = torch.maximum(hi, lo)
    levels = float(2**bits - 1)
    lo16 = lo.half()
    lo16 = torch.where(lo16.float() > lo, _old_next_half(lo16, up=False), lo16)
    step16 = ((hi - lo16.float()) / levels).half()
    return lo16, _old_widen(lo16, step16, hi, levels)


def _old_widen(lo16, step16, hi, levels):
    for _ in range(4):
        short = lo16.float() + step16.float() * levels < hi
        if not bool(short.any()):
            break
        step16 = torch.where(short, _old_next_half(step16, up=True), step16)
    return step16


def _hard_matrices():
    """``(M [N, R, C], keep)`` pairs: random at magnitudes from float16 subnormals to past its range, one sign
    only, ranges narrow against their offset, zeros, constant columns, columns with nothing kept, a single
    kept entry."""
    g = torch.Generator().manual_seed(0)
    out = []
    for scale in (1e-7, 3e-5, 1e-2, 1.0, 30.0, 3e4, 7e4):
        M = torch.randn(5, 9, 6, generator=g) * scale
        out += [(M, torch.ones(M.shape, dtype=torch.bool)), (M, torch.rand(M.shape, generator=g) > 0.4),
                (M.abs(), torch.ones(M.shape, dtype=torch.bool)), (-M.abs() - scale, torch.ones(M.shape, dtype=torch.bool))]
        narrow = scale * (1.0 + 1e-4 * torch.rand(64, 9, 6, generator=g)) * torch.randn(64, 1, 6, generator=g).sign()
        out.append((narrow, torch.ones(narrow.shape, dtype=torch.bool)))
    zeros = torch.zeros(3, 4, 5)
    const = torch.full((3, 4, 5), 0.3).mul_(torch.tensor([1.0, -2.0, 0.0, 1e-6, 5e4]))
    none = torch.zeros(3, 4, 5, dtype=torch.bool)
    one = none.clone()
    one[:, 2, 1] = True
    full = ~none
    out += [(zeros, full), (const, full), (torch.randn(3, 4, 5, generator=g), none), (torch.randn(3, 4, 5, generator=g), one)]
    return out


def test_next_half_needs_no_host_copy_and_is_unchanged_for_every_half():
    from inr.quantize import _next_half

    x = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16).view(torch.float16)  # all 65,536
    for up in (True, False):
        assert torch.equal(_next_half(x, up).view(torch.int16), _old_next_half(x, up).view(torch.int16)), up


@pytest.mark.parametrize("per_channel", [False, True])
@pytest.mark.parametrize("bits", [4, 8, 12, 16])
def test_scales_without_host_syncs_are_the_old_ones_bit_for_bit(bits, per_channel, monkeypatch):
    """No ``bool(short.any())`` on a GPU: all four widening passes run there. Both ways (the CPU's early stop,
    and the GPU's four passes, forced here) give the old float16 scales bit for bit."""
    import inr.quantize as Q

    widen, passes = Q._widen, []

    def four_passes(lo16, step16, hi, levels, stop_early):
        s, n = step16, 0  # count the passes where some entry is short
        for _ in range(4):
            short = lo16.float() + s.float() * levels < hi
            n += bool(short.any())
            s = torch.where(short, Q._next_half(s, up=True), s)
        passes.append(n)
        return widen(lo16, step16, hi, levels, stop_early=False)

    for M, keep in _hard_matrices():
        ref = _old_scales(M, keep, bits, per_channel)
        got = Q.scales(M, keep, bits, per_channel)  # on the CPU: stops early
        with monkeypatch.context() as m:
            m.setattr(Q, "_widen", four_passes)
            forced = Q.scales(M, keep, bits, per_channel)
        for r, a, b in zip(ref, got, forced, strict=True):
            assert torch.equal(r.view(torch.int16), a.view(torch.int16)) and torch.equal(r.view(torch.int16), b.view(torch.int16))
    assert max(passes) >= 1  # the widening did change steps (one pass is all that real ranges need)


def test_widening_passes_beyond_the_first_are_unchanged():
    """Steps made 0-6 float16 ulps too small (real ranges need at most one): each of the four passes, and the
    cap, on the CPU's early stop and on the GPU's four passes alike, as the old loop."""
    from inr.quantize import _widen

    g = torch.Generator().manual_seed(1)
    for bits in (4, 8, 16):
        levels = float(2**bits - 1)
        lo16 = (torch.randn(400, 3, generator=g) * 10.0 ** torch.randint(-6, 4, (400, 1), generator=g)).half()
        hi = lo16.float() + torch.rand(400, 3, generator=g) * 10.0 ** torch.randint(-7, 4, (400, 1), generator=g)
        exact = ((hi - lo16.float()) / levels).half().view(torch.int16)
        step16 = (exact - torch.randint(0, 7, exact.shape, generator=g, dtype=torch.int16)).clamp_(min=0).view(torch.float16)
        ref = _old_widen(lo16, step16, hi, levels)
        for stop_early in (True, False):
            assert torch.equal(_widen(lo16, step16, hi, levels, stop_early).view(torch.int16), ref.view(torch.int16))
        short_after = lo16.float() + ref.float() * levels < hi
        assert short_after.any() and (ref != step16).any()  # the cap was reached somewhere, and passes ran


def test_fake_quantize_is_unchanged_by_the_sync_removal(monkeypatch):
    import inr.quantize as Q

    arch = SirenArch(3, 9)
    ws = [(W * (1 + 4 * li), b - 0.2 * li) for li, (W, b) in enumerate(init_weights(arch, 5, seed=4))]
    ws[1] = (ws[1][0] * (torch.arange(9) % 3 != 0), ws[1][1])  # exact zeros
    masks = [None] + magnitude_masks(ws[1:], 0.4)
    cfg = QuantConfig((16, 6, 8, 12), per_channel=True)
    got = Q.fake_quantize(ws, cfg, masks)
    monkeypatch.setattr(Q, "scales", _old_scales)
    ref = Q.fake_quantize(ws, cfg, masks)
    for (W, b), (Wr, br) in zip(got, ref, strict=True):
        assert torch.equal(W, Wr) and torch.equal(b, br)


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
    unknown = store.FORMAT_VERSION + 1
    struct.pack_into("<I", data, 8, unknown)
    good_store.write_bytes(bytes(data))
    with pytest.raises(InputError, match=rf"format version {unknown}, this inrbench reads version {unknown - 1}"):
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
