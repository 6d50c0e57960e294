"""What a JPEG file's bytes claim, checked without decoding: a frame of the split's size and markers that
walk to an end-of-image at its end; all three JPEG adapters refuse the same files (DALI 2.4 crashes)."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import TYPE_CHECKING

from bench.errors import InputError

if TYPE_CHECKING:
    from bench.datasets.prepared import PreparedDataset

# Start-of-frame markers (baseline, extended, progressive, lossless; Huffman and arithmetic).
_SOF = {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}
_NO_LENGTH = {0x01, *range(0xD0, 0xD9)}  # TEM, RSTn, SOI, EOI: markers without a length field
_SOS, _DRI, _EOI = 0xDA, 0xDD, 0xD9
_APP2, _MPF = 0xE2, b"MPF\0"  # an APP2 segment starting "MPF\0": a multi-picture file (CIPA DC-007)
# Markers with a segment a decoder reads: frames, DHT, DAC, SOS, DQT, DNL, DRI, APPn, COM.
_SEGMENT = _SOF | {0xC4, 0xCC, _SOS, 0xDB, 0xDC, _DRI, 0xFE, *range(0xE0, 0xF0)}
# In entropy-coded data 0xFF is followed by 0x00 (a stuffed byte); anything else is a marker (or fill
# before one). A literal prefix keeps the regex engine's fast search.
_SCAN_MARKER = re.compile(rb"\xff[^\x00]")

NO_FRAME = "no JPEG frame header (truncated, or not a JPEG)"
NO_EOI = "truncated JPEG (no end-of-image marker)"
HEADERS = "damaged JPEG headers: "
SCAN = "damaged JPEG scan data: "


def multi_picture(at: int) -> str:
    """The message for a multi-picture JPEG (MPO), its MPF segment at byte ``at``."""
    return f"a multi-picture JPEG (MPO: MPF segment at byte {at:,}); a prepared split holds single-image JPEGs"


def size_mismatch(got: tuple[int, int], want: tuple[int, int]) -> str:
    """The message for a file of ``got`` = ``(height, width)`` in a split of ``want``."""
    return f"JPEG is {got[0]}x{got[1]}, the prepared split is {want[0]}x{want[1]}"


def jpeg_size(data: bytes | memoryview) -> tuple[int, int] | None:
    """``(height, width)`` from a JPEG's first start-of-frame header, or None when there is none (no JPEG,
    malformed markers before one, or the data ends first)."""
    n = len(data)
    if n < 2 or data[0] != 0xFF or data[1] != 0xD8:
        return None
    i = 2
    while i + 3 < n:
        if data[i] != 0xFF:
            return None
        marker = data[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        if marker in _NO_LENGTH:
            i += 2
            continue
        length = (data[i + 2] << 8) | data[i + 3]
        if marker in _SOF:
            if i + 8 >= n:
                return None
            return (data[i + 5] << 8) | data[i + 6], (data[i + 7] << 8) | data[i + 8]
        if marker == _SOS or length < 2:  # scan data before any frame header: malformed
            return None
        i += 2 + length
    return None


def _scan_end(data: bytes, i: int, restart: int) -> int | str:
    """The offset of the marker ending the scan whose data starts at ``i``, or what is wrong: a restart
    marker out of sequence or without a restart interval (``restart``, in MCUs; 0: none), no end marker."""
    n, expect = len(data), 0
    while (m := _SCAN_MARKER.search(data, i)) is not None:
        at = j = m.start()
        while j + 2 < n and data[j + 1] == 0xFF:  # fill bytes before a marker
            j += 1
        code, i = data[j + 1], j + 2
        if code == 0x00:  # 0xFF 0xFF .. 0x00: a stuffed data byte after fill, as libjpeg reads it
            continue
        if not 0xD0 <= code <= 0xD7:
            return at
        if not restart:
            return f"{SCAN}restart marker RST{code - 0xD0} at byte {at:,}, the file sets no restart interval"
        if code != 0xD0 + expect:
            return f"{SCAN}restart marker RST{code - 0xD0} at byte {at:,}, RST{expect} expected"
        expect = (expect + 1) % 8
    return NO_EOI


def layout_problem(data: bytes) -> str | None:
    """What is wrong with the markers of ``data`` (starting with the start-of-image marker); None: nothing."""
    n, i, frame, restart, scans = len(data), 2, False, 0, 0
    while True:
        where = SCAN if scans else HEADERS
        if i + 1 >= n:
            return NO_EOI if scans else f"{HEADERS}no scan before the end of the file"
        if data[i] != 0xFF:
            return f"{where}no marker at byte {i:,}"
        marker = data[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        if marker == _EOI and scans:
            extra = len(data[i + 2:].rstrip(b"\0"))
            return None if not extra else f"damaged JPEG: {extra:,} bytes after its end-of-image marker (at byte {i:,})"
        if marker not in _SEGMENT or (scans and marker in _SOF):
            return f"{where}marker 0xFF{marker:02X} at byte {i:,}" + ("" if scans else ", before the scan")
        if i + 3 >= n:
            return NO_EOI if scans else f"{HEADERS}no scan before the end of the file"
        length = (data[i + 2] << 8) | data[i + 3]
        if length < 2:
            return f"{where}segment length {length} at byte {i:,}"
        if marker == _APP2 and data[i + 4:i + 8] == _MPF:
            return multi_picture(i)
        if marker in _SOF and i + 9 < n:
            components = data[i + 9]
            if components not in (1, 3, 4):
                return f"{HEADERS}a frame of {components} colour components, 1, 3 or 4 expected"
            if length < 8 + 3 * components:
                return f"{HEADERS}a frame header of {length} bytes for {components} components"
            frame = True
        if marker == _DRI and i + 5 < n:
            restart = (data[i + 4] << 8) | data[i + 5]
        i += 2 + length
        if marker == _SOS:
            if not frame:
                return f"{HEADERS}a scan before the frame header"
            if i > n:
                return NO_EOI
            end = _scan_end(data, i, restart)
            if isinstance(end, str):
                return end
            i, scans = end, scans + 1


def check_jpeg_bytes(raw: bytes, size: tuple[int, int], path: Path) -> None:
    """Raise ``InputError`` naming ``path`` unless ``raw`` is a JPEG of ``size`` = ``(height, width)`` whose
    markers walk (``layout_problem``); the frame header first, then its size, then the walk."""
    got = jpeg_size(raw)
    if got is None:
        problem = NO_FRAME
    elif got != tuple(size):
        problem = size_mismatch(got, size)
    else:
        problem = layout_problem(raw)
    if problem is not None:
        raise InputError(problem, path)


def max_jpeg_bytes(size: tuple[int, int]) -> int:
    """More bytes than any JPEG of ``size`` can hold (a baseline Huffman code spends at most ~3.3 bytes a
    sample; plus 1 MiB of headers): a longer file is refused before it is read."""
    return 4 * 3 * int(size[0]) * int(size[1]) + 2**20


def too_long(n_bytes: int, size: tuple[int, int]) -> str | None:
    """The problem of a file of ``n_bytes`` in a split of ``size`` (``max_jpeg_bytes``), or None."""
    limit = max_jpeg_bytes(size)
    if n_bytes <= limit:
        return None
    return f"{n_bytes:,} bytes, more than a {size[0]}x{size[1]} JPEG can hold ({limit:,}): not a prepared JPEG"


def read_file(path: Path, size: tuple[int, int]) -> bytes:
    """The bytes of ``path``, a JPEG of a split of ``size``; ``InputError`` naming it when it cannot be read or
    is ``too_long``. Opened non-blocking: a FIFO named .jpg fails, never hangs."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as e:
        raise InputError(f"cannot read JPEG ({e.strerror or e})", path) from None
    try:
        n = os.fstat(fd).st_size
        if (problem := too_long(n, size)) is not None:
            raise InputError(problem, path)
        return os.pread(fd, n, 0)
    except OSError as e:
        raise InputError(f"cannot read JPEG ({e.strerror or e})", path) from None
    finally:
        os.close(fd)


def check_jpeg_files(paths: tuple[Path, ...] | list[Path], size: tuple[int, int]) -> None:
    """``check_jpeg_bytes`` on every file, each read whole; the first bad one is raised."""
    for p in paths:
        check_jpeg_bytes(read_file(p, size), size, p)


def jpeg_bytes_per_image(data: PreparedDataset, split: str) -> float | None:
    """Mean bytes of split ``split``'s JPEG files (the manifest's ``jpeg_bytes`` / ``count``; None for an
    empty split): what the JPEG adapters state as ``dataset_bytes_per_image``."""
    info = data.manifest["splits"][split]
    return float(info["jpeg_bytes"]) / int(info["count"]) if int(info["count"]) else None
