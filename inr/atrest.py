"""The at-rest form of an INR store: the whole store LZMA-coded (``INRPACKZ``, a CRC'd JSON header, the
data) for disk and transfer; ``inr.store.load`` checks and unpacks it."""

from __future__ import annotations

import hashlib
import json
import lzma
import struct
import zlib
from pathlib import Path

from bench.errors import InputError

MAGIC = b"INRPACKZ"
PACK_VERSION = 1
PREFIX = struct.Struct("<8sIII")
CODECS = ("lzma",)
LZMA_PRESET = 9 | lzma.PRESET_EXTREME


def is_packed(data: bytes) -> bool:
    return data[: len(MAGIC)] == MAGIC


def pack(store_bytes: bytes, codec: str = "lzma") -> bytes:
    """A store file's bytes -> its packed (at-rest) file's bytes."""
    if codec not in CODECS:
        raise ValueError(f"unknown at-rest codec {codec!r} (known: {', '.join(CODECS)})")
    if is_packed(store_bytes) or store_bytes[:8] != b"INRSTORE":
        raise ValueError("pack takes the bytes of an INR store file")
    blob = lzma.compress(store_bytes, preset=LZMA_PRESET)
    header = {
        "codec": codec, "preset": "9e", "store_length": len(store_bytes),
        "store_sha256": hashlib.sha256(store_bytes).hexdigest(),
        "packed_length": len(blob), "packed_crc32": zlib.crc32(blob) & 0xFFFFFFFF,
    }
    h = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
    return PREFIX.pack(MAGIC, PACK_VERSION, len(h), zlib.crc32(h) & 0xFFFFFFFF) + h + blob


def unpack(data: bytes, path: str | Path = "") -> tuple[bytes, dict]:
    """A packed file's bytes -> (the store file's bytes, the pack header); any defect is an ``InputError``."""
    path = Path(path)
    if len(data) < PREFIX.size or not is_packed(data):
        raise InputError("not a packed INR store", path)
    _, version, hlen, hcrc = PREFIX.unpack_from(data, 0)
    if version != PACK_VERSION:
        raise InputError(f"packed INR store version {version}, this inrbench reads version {PACK_VERSION}", path)
    h = data[PREFIX.size : PREFIX.size + hlen]
    if len(h) != hlen or zlib.crc32(h) & 0xFFFFFFFF != hcrc:
        raise InputError("packed INR store: header truncated or checksum mismatch: file is corrupt", path)
    try:
        header = json.loads(h)
        blob = data[PREFIX.size + hlen :]
        want_len, want_crc = int(header["packed_length"]), int(header["packed_crc32"])
        if header["codec"] not in CODECS:
            raise InputError(f"packed INR store: unknown codec {header['codec']!r}", path)
    except (ValueError, KeyError, TypeError) as e:
        raise InputError(f"packed INR store header is inconsistent ({type(e).__name__}: {e})", path) from None
    if len(blob) != want_len:
        what = "truncated" if len(blob) < want_len else "has trailing bytes"
        raise InputError(f"packed INR store {what}: expected {want_len} compressed bytes, file has {len(blob)}", path)
    if zlib.crc32(blob) & 0xFFFFFFFF != want_crc:
        raise InputError("packed INR store: checksum mismatch in the compressed data: file is corrupt", path)
    want = header.get("store_length")
    if type(want) is not int or want < 0:
        raise InputError(f"packed INR store header is inconsistent (store_length {want!r})", path)
    try:  # at most one byte past the recorded length: a file that inflates further is refused in bounded memory
        dec = lzma.LZMADecompressor()
        store_bytes = dec.decompress(blob, max_length=want + 1)
    except lzma.LZMAError as e:
        raise InputError(f"packed INR store: cannot decompress ({e}): file is corrupt", path) from None
    if len(store_bytes) != want or not dec.eof or hashlib.sha256(store_bytes).hexdigest() != header.get("store_sha256"):
        raise InputError("packed INR store: the decompressed store does not match its recorded length / sha256", path)
    return store_bytes, header
