"""The streamed merge of shard stores (inr.merge) writes the same bytes as the in-memory merge."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from bench.errors import InputError
from inr import store
from inr.encode import concat_layers
from inr.merge import _BitCursor, merge_stores
from inr.quantize import QuantConfig, quantize
from inr.siren import SirenArch
from inr.store import pack_bits

pytestmark = pytest.mark.usefixtures("one_torch_thread")

ARCH = SirenArch(3, 7)  # layers (2, 7) (7, 7) (7, 7) (7, 3): in*out 14, 49, 49, 21 (none a multiple of 8)


def write_shard(path, n: int, bits, per_channel: bool, pruned: set[int], seed: int, labels=None, arch=ARCH):
    """A shard store of ``n`` random images; layers in ``pruned`` get random masks. -> its QLayers."""
    g = torch.Generator().manual_seed(seed)
    weights = [(torch.randn(n, i, o, generator=g), torch.randn(n, 1, o, generator=g)) for i, o in arch.shapes]
    masks = [torch.rand(n, i, o, generator=g) > 0.4 if li in pruned else None for li, (i, o) in enumerate(arch.shapes)]
    layers = quantize(weights, QuantConfig(tuple(bits), per_channel), masks)
    labels = np.arange(seed, seed + n) % 300 if labels is None else labels  # > 255: int16 labels
    psnr = np.linspace(20, 40, n).astype(np.float32)
    store.save(path, arch, (8, 8), labels, layers, psnr=psnr, meta={"shard": seed}, per_channel=per_channel)
    return layers


def in_memory_merge(paths, bits, per_channel, meta, arch=ARCH) -> bytes:
    """The merge as inr.encode did it before streaming: every shard's int64 codes, concatenated."""
    sts = [store.load(p) for p in paths]
    labels = np.concatenate([st.labels.numpy() for st in sts])
    psnr = np.concatenate([st.psnr for st in sts])
    layers = concat_layers([st.quantized_layers() for st in sts])
    return store.encode_bytes(arch, (8, 8), labels, layers, psnr=psnr, meta=meta, per_channel=per_channel)


CASES = {
    # bits per layer, per_channel, pruned layers per shard (a layer pruned in one shard only gets masks everywhere)
    "mixed-bits-pruned-per-channel": ((5, 32, 11, 7), True, [{0, 2}, set(), {2, 3}, {0}]),
    "float32-all-pruned": ((32, 32, 32, 32), False, [{0, 1, 2, 3}] * 4),
    "odd-bits-unpruned": ((9, 13, 4, 16), False, [set()] * 4),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_streamed_merge_is_byte_identical_to_the_in_memory_merge(tmp_path, case):
    bits, per_channel, pruned = CASES[case]
    sizes = [5, 3, 1, 6]  # bit streams end mid-byte: every shard lands at another bit offset
    paths = [tmp_path / f"shard_{k}.inr" for k in range(len(sizes))]
    for k, (p, n) in enumerate(zip(paths, sizes, strict=True)):
        write_shard(p, n, bits, per_channel, pruned[k], seed=100 * k + 1)
    meta = {"encode": {"case": case}}
    want = in_memory_merge(paths, bits, per_channel, meta)
    # a tiny read piece so every array is re-packed across many pieces
    out = merge_stores(tmp_path / "merged.inr", paths, ARCH, (8, 8), bits, per_channel, meta, chunk=7)
    assert out.read_bytes() == want
    st = store.load(out)
    assert st.num_images == sum(sizes) and st.labels.tolist() == np.concatenate(
        [np.arange(100 * k + 1, 100 * k + 1 + n) % 300 for k, n in enumerate(sizes)]).tolist()
    # the merged store decodes every image as its shard did
    first = store.load(paths[3])
    torch.testing.assert_close(st.weights(torch.arange(9, 15))[1][0], first.weights(torch.arange(6))[1][0])


def test_bit_cursor_appends_streams_at_any_bit_offset():
    rng = np.random.default_rng(0)
    for bits in (4, 5, 13, 32):
        parts = [rng.integers(0, 2**bits, n, dtype=np.uint64) for n in (3, 1, 7, 2)]
        cur, got = _BitCursor(), []
        for v in parts:
            stream = pack_bits(v, bits)
            stream[-store.PAD_BYTES:] = 0xFF  # whatever follows the stream is not part of it
            pieces = [stream[i : i + 2] for i in range(0, len(stream), 2)]
            got += cur.append(pieces, len(v) * bits)
        got += cur.finish()
        assert np.concatenate(got).tobytes() == pack_bits(np.concatenate(parts), bits).tobytes(), bits


def test_merge_refuses_a_shard_of_another_encode_and_a_damaged_one(tmp_path):
    a, b = tmp_path / "a.inr", tmp_path / "b.inr"
    write_shard(a, 3, (8, 8, 8, 8), False, set(), 1)
    write_shard(b, 3, (8, 8, 8, 16), False, set(), 2)
    with pytest.raises(InputError, match=r"b\.inr: is not a shard of this encode: .*bits \[8, 8, 8, 16\]"):
        merge_stores(tmp_path / "m.inr", [a, b], ARCH, (8, 8), (8, 8, 8, 8))
    write_shard(b, 3, (8, 8, 8, 8), True, set(), 2)
    with pytest.raises(InputError, match="layer 0 has 7 scales per image, expected per-layer"):
        merge_stores(tmp_path / "m.inr", [a, b], ARCH, (8, 8), (8, 8, 8, 8))
    data = bytearray(a.read_bytes())
    data[-80] ^= 1
    a.write_bytes(bytes(data))
    with pytest.raises(InputError, match="a.inr: checksum mismatch"):
        merge_stores(tmp_path / "m.inr", [a], ARCH, (8, 8), (8, 8, 8, 8))
    assert not (tmp_path / "m.inr").exists() and not list(tmp_path.glob(".m.inr*"))


def test_merge_of_no_shards_is_the_empty_store(tmp_path):
    bits = (8, 32, 8, 8)
    layers = quantize([(torch.zeros(0, i, o), torch.zeros(0, 1, o)) for i, o in ARCH.shapes], QuantConfig(bits, True))
    want = store.encode_bytes(ARCH, (8, 8), np.zeros(0, np.int64), layers, psnr=np.zeros(0, np.float32),
                              meta={"m": 1}, per_channel=True)
    out = merge_stores(tmp_path / "empty.inr", [], ARCH, (8, 8), bits, True, {"m": 1}, labels=[])
    assert out.read_bytes() == want and store.load(out).num_images == 0
