"""The at-rest (packed, entropy-coded) store of ``inr.atrest``: bit-exact to the store's resident
arrays, refused when corrupted, disk and resident bytes reported apart."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from bench.errors import InputError
from inr import atrest, store
from inr.quantize import QuantConfig, quantize
from inr.siren import SirenArch
from tests.cli_helpers import assert_one_line_error, run_cli


@pytest.fixture()
def stores(tmp_path):
    arch = SirenArch(layers=3, hidden=8)
    g = torch.Generator().manual_seed(0)
    weights = [(torch.randn(5, i, o, generator=g) * 0.1, torch.randn(5, 1, o, generator=g) * 0.1) for i, o in arch.shapes]
    masks = [None, torch.rand(5, 8, 8, generator=g) > 0.3, None, None]
    layers = quantize(weights, QuantConfig((8, 6, 8, 16)), masks)
    plain = store.save(tmp_path / "s.inr", arch, (6, 10), np.arange(5), layers, psnr=np.ones(5))
    packed = tmp_path / "s.inrz"
    packed.write_bytes(atrest.pack(plain.read_bytes()))
    return plain, packed


def test_packed_store_loads_bit_exactly(stores):
    plain, packed = stores
    a, b = store.load(plain), store.load(packed)
    assert b.at_rest["codec"] == "lzma" and a.at_rest is None
    assert b.bytes_on_disk == packed.stat().st_size and b.store_bytes == plain.stat().st_size == a.bytes_on_disk
    assert b.resident_bytes() == a.resident_bytes()
    for qa, qb in zip(a.quantized_layers(), b.quantized_layers(), strict=True):
        assert qa.bits == qb.bits and torch.equal(qa.codes, qb.codes)
        for x, y in ((qa.lo, qb.lo), (qa.step, qb.step), (qa.mask, qb.mask)):
            assert (x is None and y is None) or torch.equal(x, y)
    idx = torch.arange(5)
    assert torch.equal(a.decode(idx), b.decode(idx))
    with pytest.raises(ValueError, match="store file"):
        atrest.pack(packed.read_bytes())


@pytest.mark.parametrize("where", ["blob", "header", "truncate", "trailing"])
def test_corrupted_packed_store_is_refused(stores, where):
    _, packed = stores
    data = bytearray(packed.read_bytes())
    if where == "blob":
        data[-20] ^= 0x04
    elif where == "header":
        data[atrest.PREFIX.size + 3] ^= 0x01
    elif where == "truncate":
        data = data[:-10]
    else:
        data += b"\0"
    packed.write_bytes(bytes(data))
    with pytest.raises(InputError, match="packed INR store"):
        store.load(packed)


def test_encode_at_rest_and_inspect(tmp_path, capsys):
    from bench.datasets.prepare import prepare_dataset

    root = prepare_dataset("photos", tmp_path / "p16", size=16, per_class=2)
    out = tmp_path / "s.inr"
    rc, text, err = run_cli(capsys, "encode", str(root), "--preset", "demo", "--iterations", "20", "--bits", "8",
                            "--at-rest", "lzma", "--no-progress", "--out", str(out))
    assert rc == 0, err
    assert atrest.is_packed(out.read_bytes()) and "packed on disk (lzma)" in text
    rc, text, _ = run_cli(capsys, "inspect", str(out))
    assert rc == 0 and "at rest        packed (lzma): disk" in text and "resident" in text
    from bench.compare.config import CompareConfig
    from bench.compare.run import run_compare

    res = run_compare(root, [out], CompareConfig(qualities=(50,), match="file"), tmp_path / "cmp", env=False)
    md = (res.out / "summary.md").read_text()
    assert "| inr-s | packed (lzma) |" in md
    st = store.load(out)
    row = res.summary[res.summary.method == "inr"].iloc[0]
    assert row.file_bytes == pytest.approx(st.bytes_per_image) and np.isnan(row.header_free_bytes)
    # the packed file replaces itself only with --overwrite (it is recognized as a store)
    rc, _, err = run_cli(capsys, "encode", str(root), "--preset", "demo", "--iterations", "20", "--bits", "8",
                         "--no-progress", "--overwrite", "--out", str(out))
    assert rc == 0, err
    assert not atrest.is_packed(out.read_bytes())


def _packed_file(store_bytes: bytes, recorded_length: int) -> bytes:
    """A packed file of ``store_bytes`` whose header records ``recorded_length`` (checksums right)."""
    import hashlib
    import json
    import lzma
    import zlib

    blob = lzma.compress(store_bytes, preset=0)
    h = json.dumps({"codec": "lzma", "preset": "0", "store_length": recorded_length,
                    "store_sha256": hashlib.sha256(store_bytes).hexdigest(), "packed_length": len(blob),
                    "packed_crc32": zlib.crc32(blob) & 0xFFFFFFFF}).encode()
    return atrest.PREFIX.pack(atrest.MAGIC, atrest.PACK_VERSION, len(h), zlib.crc32(h) & 0xFFFFFFFF) + h + blob


def test_a_packed_file_that_inflates_past_its_recorded_length_is_refused_in_bounded_memory(tmp_path, capsys):
    """64 MB of zeros pack to ~10 KB; a header recording 4 KB: refused after decompressing at most 4 KB + 1
    (an unbounded ``lzma.decompress`` held all 64 MB: a 469 KB file drove ``inspect`` to 3.2 GB)."""
    import tracemalloc

    data = _packed_file(b"INRSTORE" + bytes(64 << 20), 4096)
    assert len(data) < 100_000
    tracemalloc.start()
    try:
        with pytest.raises(InputError, match="does not match its recorded length"):
            atrest.unpack(data, "bomb.inrz")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 << 20, f"peak {peak / 2**20:.1f} MiB while unpacking"
    (tmp_path / "bomb.inr").write_bytes(data)
    rc, _, err = run_cli(capsys, "inspect", str(tmp_path / "bomb.inr"))
    assert_one_line_error(rc, err, "bomb.inr: packed INR store: the decompressed store does not match")


def test_encode_at_rest_killed_while_packing_leaves_nothing_at_out_and_resumes(tmp_path, capsys, monkeypatch):
    """Ctrl-C while the store is being packed: nothing at ``--out`` (was the unpacked store, and the rerun
    refused it as "already exists"); the shards stay in the work folder and the rerun completes, packed."""
    from bench.datasets.prepare import prepare_dataset

    root = prepare_dataset("photos", tmp_path / "p16", size=16, per_class=2)
    out = tmp_path / "s.inr"
    argv = ["encode", str(root), "--preset", "demo", "--iterations", "5", "--bits", "8", "--at-rest", "lzma",
            "--no-progress", "--out", str(out)]
    real = atrest.pack

    def killed(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(atrest, "pack", killed)
    rc, _, err = run_cli(capsys, *argv)
    assert rc == 130, err
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == [".s.inr.inrbench-encode.work", "p16"]
    monkeypatch.setattr(atrest, "pack", real)
    rc, text, err = run_cli(capsys, *argv)
    assert rc == 0, err
    assert "resuming, 1 of 1 shards already fitted" in text
    assert atrest.is_packed(out.read_bytes()) and store.load(out).num_images == 8
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p16", "s.inr"]
