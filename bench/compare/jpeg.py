"""JPEG header-free bytes (the entropy-coded scan data) and the byte-target quality search of every codec.
Size is not strictly monotone in quality, so ``search_quality`` adds a window scan (docs/compare.md)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

_STANDALONE = {0x01, *range(0xD0, 0xD8), 0xD8, 0xD9}  # markers without a length field: TEM, RSTn, SOI, EOI
_SOS, _EOI, _SOI = 0xDA, 0xD9, 0xD8


class JpegParseError(ValueError):
    """The bytes are not a well-formed JPEG stream (what is wrong and at which offset)."""


@dataclass(frozen=True)
class JpegLayout:
    """file_bytes: total length; payload_bytes: entropy-coded data; scans: ``(start, end)`` of each scan's data."""

    file_bytes: int
    payload_bytes: int
    scans: tuple[tuple[int, int], ...]

    @property
    def header_bytes(self) -> int:
        return self.file_bytes - self.payload_bytes


def _scan_end(data: bytes, pos: int) -> int:
    """Offset of the first marker after entropy-coded data starting at ``pos``."""
    while True:
        i = data.find(b"\xff", pos)
        if i < 0 or i + 1 >= len(data):
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
    pos, scans, n = 2, [], len(data)
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


def search_quality(size: Callable[[int], int], target: float, window: int = 5) -> int | None:
    """Highest quality in 1..100 whose ``size(q) <= target``, or ``None``: a binary search, then
    the ``window`` qualities above the answer are tried, moving up while one fits (0: no repair)."""
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
    fits = [q for q in range(1, 101) if size(q) <= target]
    return fits[-1] if fits else None
