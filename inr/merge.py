"""Merge shard stores into one store, streamed: bounded memory, byte-identical to ``inr.store.save`` of the
concatenated layers. Every shard is verified at open; arrays are streamed in file order (code bit streams appended
at the running bit offset, ``_BitCursor``) twice: once for the CRCs the header holds, once to write the file.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bench.atomic import atomic_open
from bench.errors import InputError
from inr import store
from inr.quantize import FLOAT_BITS
from inr.siren import SirenArch

CHUNK_BYTES = store.CHUNK_BYTES


@dataclass(frozen=True)
class ArraySpec:
    """One array of a streamed store: ``pieces()`` yields its bytes (uint8 arrays) in order, the
    same bytes on every call; ``dtype`` a numpy dtype string, ``shape`` its shape."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    pieces: Callable[[], Iterable[np.ndarray]]

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize


def _checked(spec: ArraySpec) -> Iterator[np.ndarray]:
    """``spec.pieces()`` with its total length checked against ``spec.nbytes``."""
    got = 0
    for p in spec.pieces():
        got += len(p)
        yield p
    if got != spec.nbytes:
        raise RuntimeError(f"array {spec.name!r}: {got} bytes streamed, {spec.nbytes} expected")


def write_streamed(path: str | Path, header: dict[str, Any], specs: Sequence[ArraySpec]) -> Path:
    """Write a store of ``specs`` atomically in bounded memory: pass 1 computes the CRCs, pass 2 streams
    prefix and data through a temp file (fsynced, renamed), checking every array streamed the same bytes."""
    path = Path(path)
    table, off, data_crc = [], 0, 0
    for spec in specs:
        crc = 0
        for p in _checked(spec):
            crc = zlib.crc32(p, crc)
            data_crc = zlib.crc32(p, data_crc)
        pad = store.aligned(spec.nbytes) - spec.nbytes
        data_crc = zlib.crc32(bytes(pad), data_crc)
        table.append(store.array_entry(spec.name, spec.dtype, spec.shape, off, spec.nbytes, crc))
        off += spec.nbytes + pad
    header = {**header, "arrays": table}
    prefix = store.file_prefix(header, off, data_crc)
    with atomic_open(path) as f:
        f.write(prefix)
        for spec, entry in zip(specs, table, strict=True):
            crc = 0
            for p in _checked(spec):
                crc = zlib.crc32(p, crc)
                f.write(memoryview(np.ascontiguousarray(p)))
            if crc != entry["crc32"]:
                raise InputError(f"array {spec.name!r} streamed other bytes on the second pass "
                                 "(an input changed while merging); rerun", path)
            f.write(bytes(store.aligned(spec.nbytes) - spec.nbytes))
    return path


class _BitCursor:
    """The partial last byte of a bit stream being appended to: ``carry`` holds ``nbits`` (0..7) bits."""

    def __init__(self) -> None:
        self.carry = 0
        self.nbits = 0

    def append(self, pieces: Iterable[np.ndarray], nbits: int) -> Iterator[np.ndarray]:
        """Append the first ``nbits`` bits of the LSB-first stream ``pieces`` (uint8; bytes past
        them, a shard's padding, are read and dropped); yield the output bytes completed."""
        need = -(-nbits // 8)
        rem = nbits - 8 * (need - 1)  # valid bits of the last byte, 1..8
        got = 0
        for p in pieces:
            if got >= need:
                continue  # the padding (read to the end, so the piece stream checks its CRC)
            p = p[: need - got]
            got += len(p)
            last = got == need
            if last:
                p = p.copy()
                p[-1] &= (1 << rem) - 1  # bits past the stream's end are not part of it
            yield from self._push(p, rem if last else 8)
        if got != need:
            raise RuntimeError(f"bit stream of {nbits} bits ended after {got} bytes")

    def _push(self, p: np.ndarray, rem: int) -> Iterator[np.ndarray]:
        """``p``'s bytes at the cursor; only ``rem`` bits of ``p[-1]`` are valid (8: all)."""
        if not len(p):
            return
        r = self.nbits
        if r == 0:
            out, high = p, 0
        else:
            v = p.astype(np.uint16) << r
            out = (v & 0xFF).astype(np.uint8)
            out[0] |= self.carry
            out[1:] |= (v[:-1] >> 8).astype(np.uint8)
            high = int(v[-1] >> 8)
        total = r + rem  # valid bits in out[-1] (and high, past 8)
        if total >= 8:
            self.carry, self.nbits = high, total - 8
            yield out
        else:
            self.carry, self.nbits = int(out[-1]), total
            yield out[:-1]

    def finish(self) -> Iterator[np.ndarray]:
        """The last partial byte (if any) and the stream's zero padding."""
        tail = [self.carry] if self.nbits else []
        self.carry = self.nbits = 0
        yield np.array(tail + [0] * store.PAD_BYTES, np.uint8)


def _codes(shards: Sequence[store.StoreStream], li: int, bits: int) -> Iterator[np.ndarray]:
    cursor = _BitCursor()
    for sh in shards:
        yield from cursor.append(sh.iter_array(f"codes{li}"), sh.counts[li] * bits)
    yield from cursor.finish()


def _masks(shards: Sequence[store.StoreStream], li: int, in_out: int) -> Iterator[np.ndarray]:
    row_bytes = -(-in_out // 8)
    ones = np.packbits(np.ones((1, in_out), np.uint8), axis=1, bitorder="little")[0]
    for sh in shards:
        if sh.pruned[li]:
            m = sh.read_array(f"mask{li}").reshape(-1, row_bytes)  # one shard's masks of one layer
            m[:, -1] &= ones[-1]  # bits past in*out are not mask bits
            yield m.reshape(-1)
        else:
            yield np.tile(ones, sh.num_images)


def _concat(shards: Sequence[store.StoreStream], name: str) -> Iterator[np.ndarray]:
    for sh in shards:
        yield from sh.iter_array(name)


def merge_stores(
    out: str | Path,
    shards: Sequence[str | Path],
    arch: SirenArch,
    image_size: tuple[int, int],
    bits: Sequence[int],
    per_channel: bool = False,
    meta: dict[str, Any] | None = None,
    labels=None,
    chunk: int = CHUNK_BYTES,
) -> Path:
    """Write the store ``out`` holding the shard stores' images in order, byte-identical to ``inr.store.save``
    of them; shards must agree on bits, arch, size (else ``InputError``). Memory: docs/inr-codec.md."""
    bits = tuple(int(b) for b in bits)
    if len(bits) != arch.num_linear:
        raise ValueError(f"{len(bits)} bit widths for {arch.num_linear} layers")
    readers = [store.StoreStream(p, chunk) for p in shards]
    for sh in readers:
        _check_shard(sh, arch, image_size, bits, per_channel)
    n = sum(sh.num_images for sh in readers)
    own = np.concatenate([sh.labels for sh in readers]) if readers else np.zeros(0, np.int64)
    labels = own if labels is None else np.asarray(labels, dtype=np.int64).reshape(-1)
    if labels.shape[0] != n:
        raise InputError(f"{labels.shape[0]} labels for the {n} images of {len(readers)} shards", out)
    with_psnr = {sh.psnr is not None for sh in readers}
    if len(with_psnr) > 1:
        raise InputError("some shards record PSNRs and some do not; re-encode the shards without them", out)
    labels = labels.astype(store._label_dtype(labels))
    specs = [ArraySpec("labels", labels.dtype.str, labels.shape, lambda: [labels.view(np.uint8)])]
    if with_psnr != {False}:
        psnr = np.concatenate([sh.psnr for sh in readers]) if readers else np.zeros(0, np.float16)
        specs.append(ArraySpec("psnr", psnr.dtype.str, psnr.shape, lambda: [psnr.view(np.uint8)]))
    layers = []
    for li, ((i, o), b) in enumerate(zip(arch.shapes, bits, strict=True)):
        count = sum(sh.counts[li] for sh in readers)
        specs.append(ArraySpec(f"codes{li}", "|u1", ((count * b + 7) // 8 + store.PAD_BYTES,),
                               lambda li=li, b=b: _codes(readers, li, b)))
        if b != FLOAT_BITS:
            c = o if per_channel else 1
            specs.append(ArraySpec(f"scales{li}", "<f2", (n, 2, c), lambda li=li: _concat(readers, f"scales{li}")))
        pruned = any(sh.pruned[li] for sh in readers)
        if pruned:
            specs.append(ArraySpec(f"mask{li}", "|u1", (n, -(-(i * o) // 8)),
                                   lambda li=li, io=i * o: _masks(readers, li, io)))
        layers.append((b, pruned))
    header = store.make_header(arch, image_size, n, layers, per_channel, [], meta)
    return write_streamed(out, header, specs)


def _check_shard(sh: store.StoreStream, arch: SirenArch, image_size, bits: tuple[int, ...], per_channel: bool) -> None:
    """A shard of this encode: same architecture, image size, bit widths and scale granularity."""
    if sh.arch != arch or sh.image_size != tuple(image_size) or sh.bits != bits:
        raise InputError(f"is not a shard of this encode: {sh.arch} {list(sh.image_size)} bits {list(sh.bits)}, "
                         f"expected {arch} {list(image_size)} bits {list(bits)}", sh.path)
    for li, ((_, o), b) in enumerate(zip(arch.shapes, bits, strict=True)):
        e = sh.entry(f"scales{li}")
        if b != FLOAT_BITS and e is not None and e["shape"][2] != (o if per_channel else 1):
            raise InputError(f"is not a shard of this encode: layer {li} has {e['shape'][2]} scales per image, "
                             f"expected {'per-channel' if per_channel else 'per-layer'} scales", sh.path)
