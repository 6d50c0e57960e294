"""What a JPEG file claims, checked without decoding it: its frame size, its end-of-image marker
and (for DALI) the marker segments up to its scan.

Every image of a prepared split has ``split.image_size``; a file whose start-of-frame header says
otherwise, that has none (not a JPEG, or cut inside its headers) or that does not end in an
end-of-image marker (cut inside its scan: libjpeg would pad the rest with grey, silently) is damaged
or replaced. ``check_jpeg_bytes`` checks a file already in memory (``torch-nvjpeg`` reads every
file at build); ``check_jpeg_file`` checks one on disk reading only what that needs (``dali``: a
few KB from the start, a few bytes from the end). Both raise ``bench.errors.InputError`` naming the
file, with the same messages.

``check_jpeg_file(..., segments=True)`` also walks every marker segment from the start-of-image to
the start-of-scan as nvImageCodec's JPEG parser does (DALI's decoders parse each file with it
first): a marker that is not one, a segment length under 2 or past the end of the file, a frame of
0, 2 or more than 4 components. DALI 2.4 crashes the whole process (SIGSEGV) on a file its parser
refuses, where ``torch-nvjpeg``'s decoders raise an error the adapter reports; so ``dali`` refuses
such files before its pipeline sees them.
"""

from __future__ import annotations

import os
from pathlib import Path

from bench.errors import InputError

# Start-of-frame markers (baseline, extended, progressive, lossless; Huffman and arithmetic).
_SOF = {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}
_NO_LENGTH = {0x01, *range(0xD0, 0xD9)}  # TEM, RSTn, SOI, EOI: markers without a length field
_SOS = 0xDA
_EOI = b"\xff\xd9"
HEAD_BYTES = 4096  # first read of a file on disk: a prepared JPEG's headers (no EXIF) are ~600 bytes
TAIL_BYTES = 64  # last read: the end-of-image marker, with room for a little zero padding

NO_FRAME = "no JPEG frame header (truncated, or not a JPEG)"
NO_EOI = "truncated JPEG (no end-of-image marker)"


def size_mismatch(got: tuple[int, int], want: tuple[int, int]) -> str:
    """The message for a file of ``got`` = ``(height, width)`` in a split of ``want``."""
    return f"JPEG is {got[0]}x{got[1]}, the prepared split is {want[0]}x{want[1]}"


def _frame(data: bytes | memoryview) -> tuple[int, int] | int | None:
    """``(height, width)`` from the first start-of-frame header; None when the data is no JPEG or
    its markers are malformed before one; an int when ``data`` ends first: the length the data
    must have (at least) for the walk to go on."""
    n = len(data)
    if n < 2:
        return 4
    if data[0] != 0xFF or data[1] != 0xD8:
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
                return i + 9
            return (data[i + 5] << 8) | data[i + 6], (data[i + 7] << 8) | data[i + 8]
        if marker == _SOS or length < 2:  # scan data before any frame header: malformed
            return None
        i += 2 + length
    return i + 4


def jpeg_size(data: bytes | memoryview) -> tuple[int, int] | None:
    """``(height, width)`` from a JPEG's start-of-frame header, or None when there is none.

    Walks the marker segments only (no decoding): a few dozen bytes per file.
    """
    got = _frame(data)
    return got if isinstance(got, tuple) else None


def _segments(data: bytes | memoryview) -> str | int | None:
    """What is wrong with the marker segments from the start-of-image to the start-of-scan, as
    nvImageCodec's parser reads them (module docstring); None when nothing is; an int when ``data``
    ends first: the length it must have (at least) for the walk to go on. ``data`` starts with the
    start-of-image marker (``_frame`` has checked)."""
    n, i, frame = len(data), 2, False
    while True:
        if i + 1 >= n:
            return i + 2
        if data[i] != 0xFF:
            return f"no marker at byte {i}"
        if data[i + 1] == 0xFF:  # fill byte
            i += 1
            continue
        marker = data[i + 1]
        if marker == _SOS:
            return None if frame else "a scan before the frame header"
        if marker == 0x00 or marker in _NO_LENGTH:
            return f"marker 0xFF{marker:02X} at byte {i}, before the scan"
        if i + 3 >= n:
            return i + 4
        length = (data[i + 2] << 8) | data[i + 3]
        if length < 2:
            return f"segment length {length} at byte {i}"
        if marker in _SOF:
            if i + 9 >= n:
                return i + 10
            components = data[i + 9]
            if components not in (1, 3, 4):
                return f"a frame of {components} colour components, 1, 3 or 4 expected"
            if length < 8 + 3 * components:
                return f"a frame header of {length} bytes for {components} components"
            frame = True
        i += 2 + length


def _verdict(got: tuple[int, int] | None, size: tuple[int, int], eoi: bool) -> str | None:
    """The problem with a file of frame size ``got`` (None: no frame header) and end-of-image
    marker ``eoi``, in the order ``torch-nvjpeg`` has always reported them; None when it is fine."""
    if got is None:
        return NO_FRAME
    if got != tuple(size):
        return size_mismatch(got, size)
    return None if eoi else NO_EOI


def check_jpeg_bytes(raw: bytes, size: tuple[int, int], path: Path) -> None:
    """Raise ``InputError`` naming ``path`` unless the file's bytes ``raw`` are a JPEG of ``size`` =
    ``(height, width)`` ending in an end-of-image marker (trailing zero padding allowed)."""
    problem = _verdict(jpeg_size(raw), size, raw.rstrip(b"\0")[-2:] == _EOI)
    if problem is not None:
        raise InputError(problem, path)


def _ends_with_eoi(fd: int, end: int) -> bool:
    """Whether the file's last non-zero bytes are the end-of-image marker, reading back from ``end``
    (its size) in growing blocks only while they hold nothing but zero padding."""
    block, rest = TAIL_BYTES, b""
    while end > 0:
        start = max(0, end - block)
        tail = (os.pread(fd, end - start, start) + rest).rstrip(b"\0")
        if len(tail) >= 2 or start == 0:
            return tail[-2:] == _EOI
        rest, end, block = tail, start, block * 4
    return False


def check_jpeg_file(path: Path, size: tuple[int, int], segments: bool = False) -> None:
    """``check_jpeg_bytes`` for a file on disk, and with ``segments`` its marker segments up to the
    scan (module docstring). Reads only what the checks need: the first ``HEAD_BYTES`` (more only
    where the headers go on past them, an EXIF or ICC segment: up to ``HEAD_BYTES`` past the next
    segment each time) and the last few bytes. Raises ``InputError`` naming ``path``."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # non-blocking: a FIFO named .jpg fails, never hangs
    except OSError as e:
        raise InputError(f"cannot read JPEG ({e.strerror or e})", path) from None
    try:
        end = os.fstat(fd).st_size
        head = os.pread(fd, min(HEAD_BYTES, end), 0)
        got = _frame(head)
        walk = _segments(head) if segments and got is not None else None
        while (isinstance(got, int) or isinstance(walk, int)) and len(head) < end:
            want = max(got if isinstance(got, int) else 0, walk if isinstance(walk, int) else 0)
            more = os.pread(fd, min(want + HEAD_BYTES, end) - len(head), len(head))  # past a long segment
            if not more:  # shorter than its size said (cut while we read): what we have is the file
                end = len(head)
                break
            head += more
            got = _frame(head)
            walk = _segments(head) if segments and got is not None else None
        if not isinstance(got, tuple):
            eoi = False  # the verdict is "no frame header" whatever the end holds
        elif len(head) >= end:  # the whole file is in memory already
            eoi = head.rstrip(b"\0")[-2:] == _EOI
        else:
            eoi = _ends_with_eoi(fd, end)
    except OSError as e:
        raise InputError(f"cannot read JPEG ({e.strerror or e})", path) from None
    finally:
        os.close(fd)
    problem = _verdict(got if isinstance(got, tuple) else None, size, eoi)
    if problem is None and segments and walk is not None:
        problem = f"damaged JPEG headers: {'no scan before the end of the file' if isinstance(walk, int) else walk}"
    if problem is not None:
        raise InputError(problem, path)


def check_jpeg_files(paths: tuple[Path, ...] | list[Path], size: tuple[int, int], segments: bool = False) -> None:
    """``check_jpeg_file`` on every path, in order: the first bad one is raised."""
    for p in paths:
        check_jpeg_file(p, size, segments)
