"""JPEG side of the comparison: marker parsing, a per-image quality ladder, byte-target search.

Encoder: PIL baseline JPEG, 4:2:0 chroma subsampling, no Huffman optimization — the same
``bench.datasets.prepared.encode_jpeg`` that writes the JPEG trees the pipelines read.

Two byte counts per JPEG:

* **file bytes** — ``len(file)``: what a loader reads from disk.
* **header-free bytes** — the entropy-coded scan data only: for every SOS segment, the
  bytes after the SOS header (marker, length and component/table fields) up to the next
  marker that is neither a stuffed ``FF00`` nor a restart marker ``RSTn``. SOI, APPn,
  DQT, DHT, SOF, SOS headers and EOI are overhead. Progressive files (several scans)
  sum the data of all scans.

Byte-target search: the highest quality ``q`` in 1..100 with ``size(q) <= target``.
PIL/libjpeg file size is *almost* monotone in quality but not strictly (on 32x32
images a step down of a few bytes between neighbouring qualities happens at low q, where
quantization tables saturate). ``search_quality`` therefore does a binary search under
the monotone assumption, then a *repair* scan: it tries the ``window`` qualities above
the answer and moves up whenever one fits, until ``window`` consecutive higher qualities
do not fit. That recovers every local dip narrower than ``window``. Measured on the
``photos`` set (320 images at 32x32, every distinct size as a target, file and header-free:
59,314 targets): plain binary search disagrees with the exhaustive scan on 448 (0.4%), the
repair with window 3 on 12, window 5 (the default) on none; at 224x224 non-monotone
steps are rarer (4 in 40 images). ``exhaustive_quality`` is the definition
(scan all 100) and is what the tests compare against; ``inrbench compare --exhaustive-jpeg``
uses it.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from bench.datasets.prepared import encode_jpeg

QUALITIES = range(1, 101)

# Markers without a length field: TEM, RST0-7, SOI, EOI.
_STANDALONE = {0x01, *range(0xD0, 0xD8), 0xD8, 0xD9}
_SOS, _EOI, _SOI = 0xDA, 0xD9, 0xD8


class JpegParseError(ValueError):
    """The bytes are not a well-formed JPEG stream (what is wrong and at which offset)."""


@dataclass(frozen=True)
class JpegLayout:
    """Where the bytes of one JPEG file go.

    file_bytes: total length; payload_bytes: entropy-coded scan data (header-free bytes);
    header_bytes: everything else (``file_bytes - payload_bytes``);
    scans: ``(start, end)`` byte offsets of each scan's entropy-coded data (end exclusive).
    """

    file_bytes: int
    payload_bytes: int
    scans: tuple[tuple[int, int], ...]

    @property
    def header_bytes(self) -> int:
        return self.file_bytes - self.payload_bytes


def _scan_end(data: bytes, pos: int) -> int:
    """Offset of the first marker after entropy-coded data starting at ``pos``."""
    n = len(data)
    while True:
        i = data.find(b"\xff", pos)
        if i < 0 or i + 1 >= n:
            raise JpegParseError(f"entropy-coded data starting at {pos} has no terminating marker")
        nxt = data[i + 1]
        if nxt == 0x00 or 0xD0 <= nxt <= 0xD7:  # stuffed byte or restart marker: still data
            pos = i + 2
        elif nxt == 0xFF:  # fill byte before a marker
            pos = i + 1
        else:
            return i


def parse_layout(data: bytes) -> JpegLayout:
    """Walk the marker segments of a JPEG file and locate its entropy-coded data."""
    if len(data) < 4 or data[0] != 0xFF or data[1] != _SOI:
        raise JpegParseError("does not start with the SOI marker FFD8")
    pos, scans = 2, []
    n = len(data)
    while pos < n:
        if data[pos] != 0xFF:
            raise JpegParseError(f"expected a marker at offset {pos}, found byte {data[pos]:#04x}")
        while pos < n and data[pos] == 0xFF:  # fill bytes
            pos += 1
        if pos >= n:
            break
        marker = data[pos]
        pos += 1
        if marker == _EOI:
            return JpegLayout(file_bytes=n, payload_bytes=sum(e - s for s, e in scans), scans=tuple(scans))
        if marker in _STANDALONE:
            continue
        if pos + 2 > n:
            raise JpegParseError(f"segment length of marker FF{marker:02X} cut off at offset {pos}")
        seg_len = int.from_bytes(data[pos : pos + 2], "big")
        if seg_len < 2 or pos + seg_len > n:
            raise JpegParseError(f"marker FF{marker:02X} at offset {pos - 2} has bad length {seg_len}")
        pos += seg_len
        if marker == _SOS:
            end = _scan_end(data, pos)
            scans.append((pos, end))
            pos = end
    raise JpegParseError("no EOI marker FFD9")


def payload_bytes(data: bytes) -> int:
    """Header-free bytes of one JPEG file (entropy-coded scan data only)."""
    return parse_layout(data).payload_bytes


def decode_jpeg(data: bytes) -> np.ndarray:
    """JPEG bytes -> uint8 ``[H, W, 3]`` RGB (PIL)."""
    from PIL import Image

    with Image.open(io.BytesIO(data)) as im:
        return np.asarray(im.convert("RGB"))


@dataclass(frozen=True)
class JpegEncoded:
    quality: int
    data: bytes
    file_bytes: int
    payload_bytes: int


class JpegLadder:
    """All qualities of one image, encoded lazily and memoized (shared by every target).

    image: uint8 ``[H, W, 3]``.
    """

    def __init__(self, image: np.ndarray, subsampling: str = "4:2:0"):
        self.image = np.ascontiguousarray(image)
        self.subsampling = subsampling
        self._cache: dict[int, JpegEncoded] = {}

    def __call__(self, quality: int) -> JpegEncoded:
        q = int(quality)
        if q not in self._cache:
            data = encode_jpeg(self.image, q, self.subsampling)
            self._cache[q] = JpegEncoded(q, data, len(data), payload_bytes(data))
        return self._cache[q]

    def size(self, key: str) -> Callable[[int], int]:
        """``quality -> bytes`` for ``key`` in ``{"file", "header-free"}``."""
        if key == "file":
            return lambda q: self(q).file_bytes
        if key == "header-free":
            return lambda q: self(q).payload_bytes
        raise ValueError(f"unknown byte key {key!r} (file | header-free)")

    @property
    def encodes(self) -> int:
        """How many distinct qualities were encoded so far."""
        return len(self._cache)


def search_quality(size: Callable[[int], int], target: float, window: int = 5) -> int | None:
    """Highest quality in 1..100 whose ``size(q) <= target``, or ``None`` if none fits.

    Binary search assuming ``size`` is non-decreasing, then the repair scan described in
    the module docstring (``window`` qualities above the answer; 0 disables it).
    """
    lo, hi, best = 1, 100, None
    while lo <= hi:
        mid = (lo + hi) // 2
        if size(mid) <= target:
            best, lo = mid, mid + 1
        else:
            hi = mid - 1
    q = 0 if best is None else best
    while True:
        above = [c for c in range(q + 1, min(100, q + window) + 1) if size(c) <= target]
        if not above:
            return best
        q = best = above[-1]


def exhaustive_quality(size: Callable[[int], int], target: float) -> int | None:
    """The definition: the highest quality in 1..100 with ``size(q) <= target`` (all 100 tried)."""
    fits = [q for q in QUALITIES if size(q) <= target]
    return fits[-1] if fits else None
