"""The INR store: one self-describing file per split, loaded onto the device still quantized.

Layout (little-endian): b"INRSTORE", u32 format version, u32 header length, u32 header CRC-32, the JSON
header (arch, image_size, num_images, layers, array table with CRCs, file_length, data_crc32, meta), then
64-byte aligned arrays, layer-major: labels, psnr float16, per layer ``codes{l}`` (the kept entries of
``[W; b]`` packed LSB-first, ``bits`` wide), ``scales{l}`` float16 ``[N, 2, C]``, ``mask{l}`` (pruned
layers), and ``sizes`` uint16 ``[N, 2]`` where images differ in size. Every check failing is an ``InputError``.
"""

from __future__ import annotations

import json
import math
import os
import stat
import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bench.atomic import atomic_write_bytes
from bench.errors import InputError, older_artifact
from inr import atrest
from inr.quantize import FLOAT_BITS, VALID_BITS, QLayer, check_arch, float_from_codes, keep_matrix
from inr.siren import SirenArch, Weights, coord_grid, forward

MAGIC = b"INRSTORE"
FORMAT_VERSION = 3
PREFIX = struct.Struct("<8sIII")  # magic, version, header length, header crc32
ALIGN = 64
PAD_BYTES = 8  # zero bytes after each bit stream, so unpacking may read past the last value


# ----------------------------------------------------------------------------- bit packing

def pack_bits(values: np.ndarray, bits: int, chunk: int = 1 << 20) -> np.ndarray:
    """Non-negative integers ``[M]`` (< 2**bits) -> uint8 LSB-first bit stream (+ padding)."""
    values = np.asarray(values, dtype=np.uint64)
    n = values.shape[0]
    out = np.zeros((n * bits + 7) // 8 + PAD_BYTES, dtype=np.uint8)
    if n and int(values.max()) >> bits:
        raise ValueError(f"values do not fit in {bits} bits")
    touch = (bits + 7 + 7) // 8  # bytes one value can span
    for s in range(0, n, chunk):
        v = values[s : s + chunk]
        pos = (np.arange(s, s + v.shape[0], dtype=np.uint64)) * np.uint64(bits)
        byte = (pos >> np.uint64(3)).astype(np.int64)
        shifted = v << (pos & np.uint64(7))
        base = int(byte[0])
        length = int(byte[-1]) - base + touch
        acc = np.zeros(length, dtype=np.float64)
        for k in range(touch):
            part = ((shifted >> np.uint64(8 * k)) & np.uint64(0xFF)).astype(np.float64)
            acc += np.bincount(byte - base + k, weights=part, minlength=length)
        # contributions to a byte occupy disjoint bits, so their sum is their OR (<= 255)
        out[base : base + length] |= acc.astype(np.uint8)
    return out


def unpack_bits(stream: torch.Tensor, bitpos: torch.Tensor, bits: int) -> torch.Tensor:
    """uint8 bit stream + int64 bit positions (any shape) -> int64 values of that shape."""
    byte = bitpos >> 3
    shift = bitpos & 7
    touch = (bits + 7 + 7) // 8
    v = stream[byte].long()
    for k in range(1, touch):
        v |= stream[byte + k].long() << (8 * k)
    return (v >> shift) & ((1 << bits) - 1)


# ----------------------------------------------------------------------------- writing

def _crc(a: np.ndarray) -> int:
    return zlib.crc32(np.ascontiguousarray(a).view(np.uint8).reshape(-1)) & 0xFFFFFFFF


def _label_dtype(labels: np.ndarray) -> np.dtype:
    """Smallest integer dtype holding the labels (they are read back as int64)."""
    if labels.size == 0:
        return np.dtype(np.uint8)
    lo, hi = int(labels.min()), int(labels.max())
    for dt in (np.uint8, np.int16, np.int32):
        if np.iinfo(dt).min <= lo and hi <= np.iinfo(dt).max:
            return np.dtype(dt)
    return np.dtype(np.int64)


def _layer_arrays(li: int, ql: QLayer) -> dict[str, np.ndarray]:
    n, r, o = ql.codes.shape
    keep = keep_matrix(ql.mask, (n, r, o))
    kept = ql.codes[keep].cpu().numpy()  # image-major, row-major within an image
    arrs = {f"codes{li}": pack_bits(kept, ql.bits)}
    if ql.bits != FLOAT_BITS:
        arrs[f"scales{li}"] = torch.stack([ql.lo, ql.step], dim=1).to(torch.float16).cpu().numpy()
    if ql.mask is not None:
        bits = ql.mask.reshape(n, -1).cpu().numpy().astype(np.uint8)
        arrs[f"mask{li}"] = np.packbits(bits, axis=1, bitorder="little")
    return arrs


def encode_bytes(
    arch: SirenArch,
    image_size: tuple[int, int],
    labels,
    layers: Sequence[QLayer],
    psnr=None,
    meta: dict[str, Any] | None = None,
    per_channel: bool = False,
    image_sizes=None,
) -> bytes:
    """The store file's bytes; ``image_sizes`` ``[N, 2]`` (optional): each image's (H, W), kept as a ``sizes``
    array where they differ."""
    check_arch(layers, arch)
    labels = np.asarray(torch.as_tensor(labels).cpu(), dtype=np.int64).reshape(-1)
    n = labels.shape[0]
    if any(ql.codes.shape[0] != n for ql in layers):
        raise ValueError(f"{n} labels but layers hold {[ql.codes.shape[0] for ql in layers]} images")
    arrays: dict[str, np.ndarray] = {"labels": labels.astype(_label_dtype(labels))}
    if image_sizes is not None:
        sizes = np.asarray(image_sizes, dtype=np.int64).reshape(-1, 2)
        if sizes.shape[0] != n or (n and (sizes.min() < 1 or sizes.max() > 0xFFFF)):
            raise ValueError(f"image_sizes must be [{n}, 2] in 1..65535, got {sizes.shape}")
        if n and not (sizes == sizes[0]).all():
            arrays["sizes"] = sizes.astype("<u2")
        if n:
            image_size = (int(sizes[0, 0]), int(sizes[0, 1]))
    if psnr is not None:
        arrays["psnr"] = np.asarray(psnr, dtype=np.float16).reshape(n)
    for li, ql in enumerate(layers):
        arrays.update(_layer_arrays(li, ql))
    table = []
    off = 0
    for name, a in arrays.items():
        a = np.ascontiguousarray(a)
        arrays[name] = a
        table.append(array_entry(name, a.dtype.str, a.shape, off, a.nbytes, _crc(a)))
        off += aligned(a.nbytes)
    header = make_header(arch, image_size, n, [(ql.bits, ql.mask is not None) for ql in layers], per_channel,
                         table, meta)
    body = bytearray(off)  # the data region: arrays at their offsets, zero padding between
    for entry in table:
        a = arrays[entry["name"]]
        body[entry["offset"] : entry["offset"] + a.nbytes] = a.view(np.uint8).reshape(-1).data
    return pack_file(header, body)


def aligned(nbytes: int) -> int:
    """Bytes an array of ``nbytes`` takes in the data region (padded to ``ALIGN``)."""
    return -(-int(nbytes) // ALIGN) * ALIGN


def array_entry(name: str, dtype: str, shape: Sequence[int], offset: int, nbytes: int, crc32: int) -> dict[str, Any]:
    """One row of the header's array table."""
    return {"name": name, "dtype": dtype, "shape": [int(v) for v in shape], "offset": int(offset),
            "nbytes": int(nbytes), "crc32": int(crc32)}


def make_header(arch: SirenArch, image_size: Sequence[int], num_images: int, layers: Sequence[tuple[int, bool]],
                per_channel: bool, table: list[dict[str, Any]], meta: dict[str, Any] | None) -> dict[str, Any]:
    """The header (without ``data_crc32`` / ``file_length``, which ``file_prefix`` sets);
    ``layers``: ``(bits, pruned)`` per linear layer; ``table``: ``array_entry`` rows in data order."""
    return {
        "format_version": FORMAT_VERSION,
        "arch": arch.to_dict(),
        "image_size": [int(image_size[0]), int(image_size[1])],
        "num_images": int(num_images),
        "layers": [{"bits": int(b), "per_channel": bool(per_channel) if b != FLOAT_BITS else False, "pruned": bool(p)}
                   for b, p in layers],
        "arrays": table,
        "meta": meta or {},
    }


def file_prefix(header: dict[str, Any], data_len: int, data_crc32: int) -> bytes:
    """The bytes before the data region of a file whose data region is ``data_len`` bytes with CRC ``data_crc32``;
    sets ``data_crc32`` and ``file_length`` (serialized until the header's length is stable)."""
    header["data_crc32"] = int(data_crc32) & 0xFFFFFFFF  # covers the padding too
    file_length = 0
    for _ in range(4):
        header["file_length"] = file_length
        hbytes = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
        data_start = -(-(PREFIX.size + len(hbytes)) // ALIGN) * ALIGN
        new_len = data_start + data_len
        if new_len == file_length:
            break
        file_length = new_len
    buf = bytearray(data_start)
    PREFIX.pack_into(buf, 0, MAGIC, FORMAT_VERSION, len(hbytes),
                     zlib.crc32(hbytes) & 0xFFFFFFFF)
    buf[PREFIX.size : PREFIX.size + len(hbytes)] = hbytes
    return bytes(buf)


def pack_file(header: dict[str, Any], body: bytes | bytearray) -> bytes:
    """Header + data region -> the file's bytes (``file_prefix`` + ``body``). The arrays' own
    ``crc32`` entries are the caller's (``encode_bytes``)."""
    return file_prefix(header, len(body), zlib.crc32(body)) + bytes(body)


def save(
    path: str | Path,
    arch: SirenArch,
    image_size: tuple[int, int],
    labels,
    layers: Sequence[QLayer],
    psnr=None,
    meta: dict[str, Any] | None = None,
    per_channel: bool = False,
    image_sizes=None,
) -> Path:
    """Write a store atomically (temp file + rename). ``layers`` from ``inr.quantize.quantize``;
    ``image_sizes``: see ``encode_bytes``."""
    path = Path(path)
    atomic_write_bytes(path, encode_bytes(arch, image_size, labels, layers, psnr, meta, per_channel, image_sizes))
    return path


# ----------------------------------------------------------------------------- reading

HEADER_KEYS = {"format_version": int, "arch": dict, "image_size": list, "num_images": int, "layers": list,
               "arrays": list, "file_length": int, "data_crc32": int, "meta": dict}
ARRAY_KEYS = {"name": str, "dtype": str, "shape": list, "offset": int, "nbytes": int, "crc32": int}
LABEL_DTYPES = ("|u1", "<i2", "<i4", "<i8")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _typed(d: dict, keys: dict[str, type], where: str, path: Path) -> None:
    for key, typ in keys.items():
        if key not in d:
            raise InputError(f"INR store header is inconsistent: {where} has no key {key!r}", path)
        v = d[key]
        if not (_is_int(v) and v >= 0 if typ is int else isinstance(v, typ)):
            want = "a non-negative integer" if typ is int else f"a JSON {typ.__name__}"
            raise InputError(f"INR store header is inconsistent: {where} key {key!r} is {v!r}, expected {want}", path)


def check_header(header: Any, data_len: int, path: Path) -> None:
    """The header's keys and types and its array table against the data region's length (before any slicing)."""
    if not isinstance(header, dict):
        raise InputError(f"INR store header is inconsistent: a JSON {type(header).__name__}, expected an object", path)
    _typed(header, HEADER_KEYS, "header", path)
    size = header["image_size"]
    if len(size) != 2 or not all(_is_int(v) and v > 0 for v in size):
        raise InputError(f"INR store header is inconsistent: 'image_size' is {size!r}, expected [H, W] > 0", path)
    for li, layer in enumerate(header["layers"]):
        if not isinstance(layer, dict):
            raise InputError(f"INR store header is inconsistent: layers[{li}] is {layer!r}, expected an object", path)
        _typed(layer, {"bits": int, "per_channel": bool, "pruned": bool}, f"layers[{li}]", path)
        if layer["bits"] not in VALID_BITS:
            raise InputError(f"INR store header is inconsistent: layers[{li}] 'bits' is {layer['bits']}, expected 4..16 or 32", path)
    names: set[str] = set()
    for e in header["arrays"]:
        if not isinstance(e, dict):
            raise InputError(f"INR store header is inconsistent: an 'arrays' entry is {e!r}, expected an object", path)
        _typed(e, ARRAY_KEYS, f"array {e.get('name', '?')!r}", path)
        name = e["name"]
        if name in names:
            raise InputError(f"INR store header is inconsistent: array {name!r} is listed twice", path)
        names.add(name)
        try:
            dt = np.dtype(e["dtype"])
        except TypeError:
            raise InputError(f"INR store header is inconsistent: array {name!r} has dtype {e['dtype']!r}", path) from None
        if dt.kind not in "uif" or not all(_is_int(v) and v >= 0 for v in e["shape"]):
            raise InputError(f"INR store header is inconsistent: array {name!r} is {e['dtype']} {e['shape']}", path)
        want = math.prod(e["shape"]) * dt.itemsize  # Python ints: [2**32, 2**32] must not wrap to 0
        if e["nbytes"] != want:
            raise InputError(f"INR store header is inconsistent: array {name!r} is {e['dtype']} {e['shape']} "
                             f"({want} bytes), header says {e['nbytes']} bytes", path)
        if e["offset"] % ALIGN or e["offset"] + e["nbytes"] > data_len:
            raise InputError(f"INR store header is inconsistent: array {name!r} at offset {e['offset']} "
                             f"(+{e['nbytes']} bytes) is misaligned or past the {data_len}-byte data region", path)


def check_arrays(header: dict[str, Any], arrays: dict[str, np.ndarray], path: Path) -> SirenArch:
    """Every array's presence, dtype and shape against the header's architecture (nothing else) -> the arch."""
    def bad(msg: str) -> InputError:
        return InputError(f"INR store header is inconsistent: {msg}", path)

    try:
        arch = SirenArch.from_dict(header["arch"])
    except (KeyError, ValueError, TypeError) as e:
        raise bad(f"'arch' {header['arch']!r} is not an architecture ({type(e).__name__}: {e})") from None
    n = header["num_images"]
    layers = header["layers"]
    if len(layers) != arch.num_linear:
        raise bad(f"'layers' lists {len(layers)} layers, 'arch' {arch.layers}x{arch.hidden} has {arch.num_linear}")

    def want(name: str, dtypes: tuple[str, ...], shape: tuple[int, ...]) -> np.ndarray:
        if name not in arrays:
            raise bad(f"no array {name!r}")
        a = arrays[name]
        if a.dtype.str not in dtypes or a.shape != shape:
            raise bad(f"array {name!r} is {a.dtype.str} {list(a.shape)}, the header's arch and "
                      f"{n} images need {'|'.join(dtypes)} {list(shape)}")
        return a

    expected = {"labels"}
    want("labels", LABEL_DTYPES, (n,))
    if "psnr" in arrays:
        expected.add("psnr")
        want("psnr", ("<f2",), (n,))
    for li, ((i, o), info) in enumerate(zip(arch.shapes, layers, strict=True)):
        bits, count = info["bits"], n * (i + 1) * o
        if info["pruned"]:
            expected.add(f"mask{li}")
            m = want(f"mask{li}", ("|u1",), (n, -(-(i * o) // 8)))
            kept = np.unpackbits(m, axis=1, bitorder="little")[:, : i * o].sum(dtype=np.int64)
            count = int(kept) + n * o
        if bits != FLOAT_BITS:
            expected.add(f"scales{li}")
            want(f"scales{li}", ("<f2",), (n, 2, o if info["per_channel"] else 1))
        elif info["per_channel"]:
            raise bad(f"layers[{li}] is float32 but marked per_channel")
        expected.add(f"codes{li}")
        want(f"codes{li}", ("|u1",), ((count * bits + 7) // 8 + PAD_BYTES,))
    if "sizes" in arrays:
        expected.add("sizes")
        if not want("sizes", ("<u2",), (n, 2)).all():
            raise bad("array 'sizes' holds a zero height or width")
    extra = sorted(set(arrays) - expected)
    if extra:
        raise bad(f"arrays {extra} are not part of this architecture's layout")
    return arch


def _parse_header(head: bytes | memoryview, total: int, path: Path) -> tuple[dict[str, Any], int, int]:
    """``head`` (the prefix and header at least) of a ``total``-byte store -> (checked header, header end, data start)."""
    if total < PREFIX.size:
        raise InputError(f"not an INR store: file is {total} bytes, shorter than the {PREFIX.size}-byte prefix", path)
    magic, version, hlen, hcrc = PREFIX.unpack_from(head, 0)
    if magic != MAGIC:
        raise InputError(f"not an INR store (magic {magic!r}, expected {MAGIC!r})", path)
    if version < FORMAT_VERSION:
        raise older_artifact(path, version, "rerun `inrbench encode`")
    if version != FORMAT_VERSION:
        raise InputError(f"INR store format version {version}, this inrbench reads version {FORMAT_VERSION}", path)
    if PREFIX.size + hlen > total:
        raise InputError(f"truncated: header needs {PREFIX.size + hlen} bytes, file has {total}", path)
    hbytes = bytes(head[PREFIX.size : PREFIX.size + hlen])
    got = zlib.crc32(hbytes) & 0xFFFFFFFF
    if got != hcrc:
        raise InputError(f"header checksum mismatch (stored crc32 {hcrc:08x}, computed {got:08x}): file is corrupt", path)
    try:
        header = json.loads(hbytes)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise InputError(f"INR store header is not valid JSON ({e})", path) from None
    if not isinstance(header, dict):
        raise InputError(f"INR store header is inconsistent: a JSON {type(header).__name__}, expected an object", path)
    _typed(header, {"file_length": int}, "header", path)
    expected = header["file_length"]
    if total != expected:
        what = "truncated" if total < expected else "has trailing bytes"
        raise InputError(f"{what}: expected {expected} bytes, file has {total}", path)
    data_start = -(-(PREFIX.size + hlen) // ALIGN) * ALIGN
    check_header(header, max(0, total - data_start), path)
    if header["format_version"] != version:
        raise InputError(f"INR store header is inconsistent: 'format_version' {header['format_version']} != the "
                         f"file's version {version}", path)
    return header, PREFIX.size + hlen, data_start


_NOT_FILES = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a named pipe (FIFO)"), (stat.S_ISCHR, "a character device"),
              (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def check_store_path(path: Path) -> None:
    """``path`` is a regular file (symlinks followed), else an ``InputError`` saying what it is instead:
    missing, a symlink loop, a folder, a FIFO or a device (which a read would block on or never end)."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise InputError("no such INR store file", path) from None
    except OSError as e:  # a symlink loop (ELOOP), a component that is a file (ENOTDIR), no permission
        raise InputError(f"cannot open it as an INR store file: {e.strerror or e}", path) from None
    what = next((name for test, name in _NOT_FILES if test(mode)), None if stat.S_ISREG(mode) else "not a file")
    if what is not None:
        raise InputError(f"is {what}, not an INR store file", path)


def read_header(path: str | Path) -> dict[str, Any]:
    """The checked header of an unpacked store file (prefix and header only: the data is not read or verified)."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            total = os.fstat(f.fileno()).st_size
            head = f.read(PREFIX.size)
            if total >= PREFIX.size:
                head += f.read(PREFIX.unpack_from(head, 0)[2])
    except OSError as e:
        raise InputError(f"cannot read: {e.strerror or e}", path) from None
    return _parse_header(head, total, path)[0]


def read_verified(path: str | Path, info: dict | None = None) -> tuple[dict[str, Any], dict[str, np.ndarray], int]:
    """Read and verify a store file (a packed one unpacked first) -> (header, arrays, file bytes); ``info`` gets
    ``at_rest`` and ``store_bytes``."""
    path = Path(path)
    check_store_path(path)
    data = path.read_bytes()
    disk_bytes, pack_header = len(data), None

    if atrest.is_packed(data):
        data, pack_header = atrest.unpack(data, path)
    if info is not None:
        info.update(at_rest=pack_header, store_bytes=len(data))
    header, header_end, data_start = _parse_header(data, len(data), path)
    _verify(header, data[header_end:data_start], [memoryview(data)[data_start:]], path)
    arrays = {e["name"]: np.frombuffer(data, np.dtype(e["dtype"]), math.prod(e["shape"]), data_start + e["offset"])
              .reshape(e["shape"]).copy() for e in header["arrays"]}
    check_arrays(header, arrays, path)
    return header, arrays, disk_bytes


def _verify(header: dict[str, Any], gap: bytes, pieces, path: Path) -> None:
    """Each array's CRC, the data region's CRC (over the ``pieces`` of it, in order) and the zero gap before it."""
    entries = header["arrays"]
    crcs, data_crc, pos = [0] * len(entries), 0, 0
    for buf in pieces:
        data_crc = zlib.crc32(buf, data_crc)
        for k, e in enumerate(entries):  # each array's part of this piece
            a, b = max(e["offset"], pos), min(e["offset"] + e["nbytes"], pos + len(buf))
            if a < b:
                crcs[k] = zlib.crc32(memoryview(buf)[a - pos : b - pos], crcs[k])
        pos += len(buf)
    for e, got in zip(entries, crcs, strict=True):
        if got != e["crc32"]:
            raise InputError(f"checksum mismatch in array {e['name']!r} (stored crc32 {e['crc32']:08x}, computed "
                             f"{got:08x}): file is corrupt", path)
    if data_crc != header["data_crc32"]:
        raise InputError(f"checksum mismatch in the padding between arrays (stored crc32 {header['data_crc32']:08x}, "
                         f"computed {data_crc:08x}): file is corrupt", path)
    if any(gap):
        raise InputError("non-zero bytes between the header and the data: file is corrupt", path)


CHUNK_BYTES = 1 << 22  # streamed reads: bytes per read


class StoreStream:
    """A store file verified as ``read_verified`` does, in bounded memory: only the per-image arrays are held;
    the rest is read piece by piece with ``iter_array`` (``inr.merge``, shard checks). Packed files are refused."""

    def __init__(self, path: str | Path, chunk: int = CHUNK_BYTES):
        self.path = path = Path(path)
        self.chunk = int(chunk)
        check_store_path(path)

        with open(path, "rb") as f:
            total = os.fstat(f.fileno()).st_size
            head = f.read(PREFIX.size)
            if atrest.is_packed(head):
                raise InputError("is packed at rest (inr.atrest); a streamed read needs the unpacked store", path)
            if total >= PREFIX.size and PREFIX.size + PREFIX.unpack_from(head, 0)[2] <= total:
                head += f.read(PREFIX.unpack_from(head, 0)[2])
            header, header_end, data_start = _parse_header(head, total, path)
            entries = {e["name"]: e for e in header["arrays"]}
            data_len = total - data_start
            gap = f.read(data_start - header_end)

            def pieces():
                pos = 0
                while pos < data_len:
                    buf = f.read(min(self.chunk, data_len - pos))
                    if not buf:
                        raise InputError(f"truncated while reading: {pos} of {data_len} data bytes", path)
                    pos += len(buf)
                    yield buf

            _verify(header, gap, pieces(), path)
        self.header, self.data_start, self._entries = header, data_start, entries
        small = {n for n in entries if n in ("labels", "psnr", "sizes") or n.startswith("mask")}
        arrays = {n: self.read_array(n) if n in small else
                  np.broadcast_to(np.zeros((), np.dtype(e["dtype"])), tuple(e["shape"]))  # layout check only
                  for n, e in entries.items()}
        self.arch = check_arrays(header, arrays, path)
        self.num_images = int(header["num_images"])
        self.image_size = (int(header["image_size"][0]), int(header["image_size"][1]))
        self.bits = tuple(int(li["bits"]) for li in header["layers"])
        self.pruned = tuple(bool(li["pruned"]) for li in header["layers"])
        self.labels = arrays["labels"].astype(np.int64)
        self.psnr = arrays.get("psnr")
        self.counts = []  # kept codes per layer, all images
        for li, (i, o) in enumerate(self.arch.shapes):
            m = arrays.get(f"mask{li}")
            kept = self.num_images * (i + 1) * o if m is None else \
                int(np.unpackbits(m, axis=1, bitorder="little")[:, : i * o].sum(dtype=np.int64)) + self.num_images * o
            self.counts.append(kept)

    def entry(self, name: str) -> dict[str, Any] | None:
        """The array table row of ``name`` (None when the store has no such array)."""
        return self._entries.get(name)

    def iter_array(self, name: str, chunk: int | None = None):
        """The bytes of array ``name`` as uint8 pieces of at most ``chunk`` bytes, checked against its
        CRC at the end (an ``InputError`` when the file changed since it was opened)."""
        e = self._entries[name]
        step, left, crc = int(chunk or self.chunk), e["nbytes"], 0
        with open(self.path, "rb") as f:
            f.seek(self.data_start + e["offset"])
            while left:
                buf = f.read(min(step, left))
                if not buf:
                    break
                crc = zlib.crc32(buf, crc)
                left -= len(buf)
                yield np.frombuffer(buf, np.uint8)
        if left or crc != e["crc32"]:
            raise InputError(f"array {name!r} changed since the file was verified (crc32 {crc:08x}, "
                             f"stored {e['crc32']:08x})", self.path)

    def read_array(self, name: str) -> np.ndarray:
        """Array ``name`` whole, in its dtype and shape (for the small per-image arrays)."""
        e = self._entries[name]
        raw = b"".join(p.tobytes() for p in self.iter_array(name))
        return np.frombuffer(raw, np.dtype(e["dtype"])).reshape(e["shape"]).copy()


@dataclass
class _DeviceLayer:
    bits: int
    in_f: int
    out_f: int
    codes: torch.Tensor  # uint8 [S] bit stream
    scales: torch.Tensor | None  # float16 [N, 2, C]
    mask: torch.Tensor | None  # uint8 [N, mbytes]
    offsets: torch.Tensor | None  # int64 [N] start bit per image (variable counts only)
    count: int  # codes per image when fixed (0 when ``offsets`` is used)

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.codes, self.scales, self.mask, self.offsets) if t is not None)

    def keep(self, idx: torch.Tensor) -> torch.Tensor | None:
        """bool ``[B, (in+1)*out]``: the entries of ``[W; b]`` kept for images ``idx`` (None: unpruned)."""
        if self.mask is None:
            return None
        B, dev = idx.shape[0], idx.device
        bits = (self.mask[idx].unsqueeze(-1) >> torch.arange(8, device=dev, dtype=torch.uint8)) & 1
        ones = torch.ones(B, self.out_f, dtype=torch.bool, device=dev)
        return torch.cat([bits.reshape(B, -1)[:, : self.in_f * self.out_f].bool(), ones], dim=1)

    def unpack(self, idx: torch.Tensor, keep: torch.Tensor | None) -> torch.Tensor:
        """int64 ``[B, (in+1)*out]`` codes of images ``idx`` (meaningless where ``keep`` is False)."""
        start = self.offsets[idx] if self.offsets is not None else idx * (self.count * self.bits)
        pos = torch.arange((self.in_f + 1) * self.out_f, device=idx.device).unsqueeze(0) if keep is None \
            else keep.cumsum(1) - 1
        return unpack_bits(self.codes, start.unsqueeze(1) + pos * self.bits, self.bits)


@dataclass
class StoredINR:
    """A loaded store: codes, scales, masks and int64 labels on ``device``; psnr float32 ``[N]`` (or None)."""

    path: Path
    arch: SirenArch
    image_size: tuple[int, int]
    labels: torch.Tensor
    psnr: np.ndarray | None
    bits: tuple[int, ...]
    per_channel: bool
    meta: dict[str, Any]
    bytes_on_disk: int
    device: torch.device
    header: dict[str, Any] = field(repr=False)
    _layers: list[_DeviceLayer] = field(repr=False, default_factory=list)
    _coords: torch.Tensor | None = field(repr=False, default=None)
    image_sizes: np.ndarray | None = field(repr=False, default=None)  # int64 [N, 2] (native-size stores only)
    at_rest: dict[str, Any] | None = field(repr=False, default=None)  # inr.atrest pack header when packed on disk
    store_bytes: int | None = None  # the store file's bytes (== bytes_on_disk unless packed)

    @property
    def num_images(self) -> int:
        return int(self.labels.shape[0])

    def __len__(self) -> int:
        return self.num_images

    @property
    def pruned(self) -> bool:
        return any(dl.mask is not None for dl in self._layers)

    @property
    def bytes_per_image(self) -> float:
        """Whole file bytes (header amortized) / N."""
        return self.bytes_on_disk / max(1, self.num_images)

    @property
    def raw_bytes_per_image(self) -> float:
        if self.image_sizes is not None:  # native sizes: the mean
            return float((self.image_sizes[:, 0] * self.image_sizes[:, 1]).mean() * 3)
        return self.image_size[0] * self.image_size[1] * 3

    def size_of(self, idx) -> tuple[int, int]:
        """The (H, W) shared by images ``idx``; a ``ValueError`` when they differ (native-size stores)."""
        if self.image_sizes is None:
            return self.image_size
        s = self.image_sizes[np.asarray(torch.as_tensor(idx).cpu()).reshape(-1)]
        if len(s) == 0:
            return self.image_size
        if not (s == s[0]).all():
            raise ValueError("these images have different sizes: decode one size at a time (StoredINR.size_of)")
        return int(s[0, 0]), int(s[0, 1])

    def resident_bytes(self) -> int:
        """Device bytes of codes + scales + masks + offset tables (labels not included)."""
        return sum(dl.nbytes() for dl in self._layers)

    def coords(self) -> torch.Tensor:
        """The full pixel grid ``[H*W, 2]`` on the device (cached)."""
        if self._coords is None:
            self._coords = coord_grid(*self.image_size, device=self.device)
        return self._coords

    def weights(self, idx: torch.Tensor) -> Weights:
        """Dequantized float32 weights of images ``idx`` (int64 ``[B]``): ``[(W [B, in, out], b [B, 1, out])]``."""
        idx = torch.as_tensor(idx, dtype=torch.int64, device=self.device).reshape(-1)
        return [self._layer_weights(dl, idx) for dl in self._layers]

    def _layer_weights(self, dl: _DeviceLayer, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        B, i, o = idx.shape[0], dl.in_f, dl.out_f
        keep = dl.keep(idx)
        codes = dl.unpack(idx, keep)
        if dl.bits == FLOAT_BITS:
            M = float_from_codes(codes)
        else:
            sc = dl.scales[idx].float()  # [B, 2, C]
            lo, step = sc[:, 0], sc[:, 1]
            if lo.shape[1] > 1:
                ch = torch.arange((i + 1) * o, device=self.device) % o
                lo, step = lo[:, ch], step[:, ch]
            M = torch.addcmul(lo, codes.float(), step)
        if keep is not None:
            M = M * keep
        M = M.view(B, i + 1, o)
        return M[:, :i], M[:, i:]

    def decode(self, idx: torch.Tensor, coords: torch.Tensor | None = None) -> torch.Tensor:
        """Images ``idx`` -> float ``[B, 3, H, W]`` in [0, 1]; with ``coords`` ``[P, 2]`` or ``[B, P, 2]``: unclamped ``[B, P, 3]``."""
        ws = self.weights(idx)
        if coords is not None:
            return forward(ws, coords, self.arch)
        h, w = self.size_of(idx)
        grid = self.coords() if (h, w) == tuple(self.image_size) else coord_grid(h, w, device=self.device)
        out = forward(ws, grid, self.arch).clamp_(0.0, 1.0)
        return out.view(-1, h, w, 3).permute(0, 3, 1, 2).contiguous()

    def select(self, idx, device: torch.device | str | None = None, chunk: int = 4096) -> StoredINR:
        """The store holding only images ``idx`` (repeats allowed), in that order, on ``device``: each layer's bit stream
        repacked in chunks, so it holds only their codes; ``path``/``header``/``bytes_on_disk`` still describe the file."""
        idx = torch.as_tensor(idx, dtype=torch.int64, device=self.device).reshape(-1)
        dev = self.device if device is None else torch.device(device)
        m = int(idx.numel())
        layers = []
        for dl in self._layers:
            keep = dl.keep(idx)
            counts = torch.full((m,), (dl.in_f + 1) * dl.out_f, dtype=torch.int64, device=self.device) \
                if keep is None else keep.sum(1)
            start = dl.offsets[idx] if dl.offsets is not None else idx * (dl.count * dl.bits)
            total = int(counts.sum()) * dl.bits
            stream = np.zeros((total + 7) // 8 + PAD_BYTES, dtype=np.uint8)
            bitpos = 0
            for s in range(0, m, chunk):
                c, st = counts[s : s + chunk], start[s : s + chunk]
                pos = torch.arange(int(c.max()) if c.numel() else 0, device=self.device)
                valid = pos.unsqueeze(0) < c.unsqueeze(1)
                bit = st.unsqueeze(1) + torch.where(valid, pos.unsqueeze(0), 0) * dl.bits
                values = unpack_bits(dl.codes, bit, dl.bits)[valid].cpu().numpy()
                nbits = values.shape[0] * dl.bits
                packed = pack_bits(values, dl.bits)[: (nbits + 7) // 8].astype(np.uint16) << (bitpos & 7)
                b = bitpos >> 3
                stream[b : b + packed.shape[0]] |= (packed & 0xFF).astype(np.uint8)
                stream[b + 1 : b + 1 + packed.shape[0]] |= (packed >> 8).astype(np.uint8)
                bitpos += nbits
            fixed = m == 0 or bool((counts == counts[0]).all())
            offsets = None if fixed else (torch.cumsum(counts, 0) - counts) * dl.bits
            layers.append(_DeviceLayer(
                bits=dl.bits, in_f=dl.in_f, out_f=dl.out_f, codes=torch.from_numpy(stream).to(dev),
                scales=None if dl.scales is None else dl.scales[idx].to(dev),
                mask=None if dl.mask is None else dl.mask[idx].to(dev),
                offsets=None if offsets is None else offsets.to(dev),
                count=int(counts[0]) if fixed and m else (0 if not fixed else dl.count),
            ))
        rows = idx.cpu().numpy()
        return replace(
            self, labels=self.labels[idx].to(dev), psnr=None if self.psnr is None else self.psnr[rows],
            device=dev, _layers=layers, _coords=None,
            image_sizes=None if self.image_sizes is None else self.image_sizes[rows],
        )

    def quantized_layers(self, chunk: int = 4096) -> list[QLayer]:
        """Dense CPU ``QLayer``s of all images (for merging shards or re-packing)."""
        out = []
        for dl in self._layers:
            codes_parts, mask_parts = [], []
            for s in range(0, self.num_images, chunk):
                idx = torch.arange(s, min(self.num_images, s + chunk), device=self.device)
                B, i, o = idx.shape[0], dl.in_f, dl.out_f
                keep = dl.keep(idx)
                codes = dl.unpack(idx, keep)
                if keep is not None:
                    mask_parts.append(keep[:, : i * o].reshape(B, i, o).cpu())
                    codes = codes * keep
                codes_parts.append(codes.view(B, i + 1, o).cpu())
            codes = torch.cat(codes_parts) if codes_parts else torch.zeros(0, dl.in_f + 1, dl.out_f, dtype=torch.int64)
            mask = (torch.cat(mask_parts) if mask_parts else torch.zeros(0, dl.in_f, dl.out_f, dtype=torch.bool)) if dl.mask is not None else None
            lo = step = None
            if dl.scales is not None:
                lo, step = dl.scales[:, 0].cpu(), dl.scales[:, 1].cpu()
            out.append(QLayer(dl.bits, codes, lo, step, mask))
        return out


def load(path: str | Path, device: torch.device | str = "cpu") -> StoredINR:
    """Load and verify a store; codes, scales and masks go to ``device`` as they are on disk."""
    path = Path(path)
    info: dict[str, Any] = {}
    header, arrays, nbytes = read_verified(path, info)
    try:
        arch = SirenArch.from_dict(header["arch"])
        n = int(header["num_images"])
        dev = torch.device(device)
        layers = []
        for li, ((i, o), linfo) in enumerate(zip(arch.shapes, header["layers"], strict=True)):
            bits = int(linfo["bits"])
            mask_np = arrays.get(f"mask{li}")
            offsets = None
            count = (i + 1) * o
            if mask_np is not None:
                pc = np.unpackbits(mask_np, axis=1, bitorder="little")[:, : i * o].sum(axis=1).astype(np.int64) + o
                if n and np.all(pc == pc[0]):
                    count = int(pc[0])
                else:
                    count = 0
                    offsets = torch.from_numpy(np.concatenate([[0], np.cumsum(pc)[:-1]]) * bits).to(dev)
            sc = arrays.get(f"scales{li}")
            layers.append(
                _DeviceLayer(
                    bits=bits, in_f=i, out_f=o,
                    codes=torch.from_numpy(arrays[f"codes{li}"]).to(dev),
                    scales=None if sc is None else torch.from_numpy(sc).to(dev),
                    mask=None if mask_np is None else torch.from_numpy(mask_np).to(dev),
                    offsets=offsets, count=count,
                )
            )
    except (KeyError, ValueError, TypeError) as e:
        raise InputError(f"INR store header is inconsistent: {e}", path) from None
    psnr = arrays.get("psnr")
    psnr = None if psnr is None else psnr.astype(np.float32)
    return StoredINR(
        path=path,
        arch=arch,
        image_size=(int(header["image_size"][0]), int(header["image_size"][1])),
        labels=torch.from_numpy(arrays["labels"].astype(np.int64)).to(dev),
        psnr=psnr,
        bits=tuple(int(linfo["bits"]) for linfo in header["layers"]),
        per_channel=any(linfo.get("per_channel", False) for linfo in header["layers"]),
        meta=header.get("meta", {}),
        bytes_on_disk=nbytes,
        device=dev,
        header=header,
        _layers=layers,
        image_sizes=None if "sizes" not in arrays else arrays["sizes"].astype(np.int64),
        at_rest=info["at_rest"],
        store_bytes=info["store_bytes"],
    )

