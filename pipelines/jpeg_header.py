"""What a JPEG file's bytes claim and how they are laid out, checked without decoding them: its
frame size, its marker segments, its scans' entropy-coded data and its end-of-image marker.

Every image of a prepared split has ``split.image_size``; a file whose start-of-frame header says
otherwise, that has none (not a JPEG, or cut inside its headers), whose markers do not walk from the
start-of-image through every scan to an end-of-image marker at its end (trailing zero padding
allowed), is damaged or replaced. The walk refuses a header segment of length under 2 or past the
end of the file, a marker no decoder knows (or a second frame), a frame of 0, 2 or more than 4
components, a marker inside a scan's data other than a restart marker in sequence (``RST0``,
``RST1``, ... where a restart interval is set), a file cut inside a scan, data after the
end-of-image marker, and a multi-picture file (MPO, CIPA DC-007: an APP2 segment starting with
``MPF`` and a zero byte, as cameras and Ultra HDR gain maps write, the further images appended
after the first's end-of-image marker). PIL names an MPO ``"MPO"`` and decodes its first image, as
TorchCodec and DALI's CPU decoder do (the same pixels; nvJPEG not checked), but ``prepare`` writes
single-image JPEGs: one in a split is a replaced file, and its appended images would be read every
epoch, and counted in the split's bytes per image, without being decoded. All three adapters refuse
it (``multi_picture``), as ``torch-jpeg``'s format check does (``pipelines.torch_jpeg.JPEG_FORMATS``).
The decoders disagree on the other files: DALI 2.4 crashes the whole process
(SIGSEGV) on headers nvImageCodec's parser refuses, and decodes a scan broken by a stray marker
that PIL and TorchCodec refuse; PIL decodes some files TorchCodec refuses (a cut scan followed by
zeros); all of them decode a stray restart marker, or an end-of-image marker inside a scan, with
grey or garbled blocks. So the three JPEG adapters run this one check at build and refuse the same
files: ``dali`` and ``torch-nvjpeg`` at build, ``torch-jpeg`` when an epoch reaches the file.

What no walk sees: damage that leaves the markers in place (flipped bits or bytes inside a scan, a
scan cut and an end-of-image marker appended). libjpeg decodes such a file with a warning, grey or
garbled blocks where the data broke; PIL, TorchCodec and DALI's CPU decoder give the same pixels for
it, bit for bit. JPEG has no checksum. The warning ("Corrupt JPEG data: 101 extraneous bytes before
marker 0xd9", "Corrupt JPEG data: premature end of data segment") goes to stderr from TorchCodec
(``torch-nvjpeg`` on the CPU) and DALI's CPU decoder, every time the file is decoded (every epoch),
naming no file; PIL (``torch-jpeg``) prints and reports none (Pillow's ``JpegDecode.c`` sets
libjpeg's ``output_message`` to a no-op and does not read its warning count). No walk can name such a
file at build: libjpeg counts the bytes it skips before the scan's closing marker once it has
Huffman-decoded every MCU of the scan (where the last MCU's bits end is known only by decoding
them), and a premature end is the decoder running out of bits before the last MCU: both take a
Huffman decode of every scan, which none of these libraries offers apart from a full decode (PIL's,
silent), where the walk reads markers only (~11-21 us a file).

``jpeg_bytes_per_image`` is what the three state as ``Pipeline.dataset_bytes_per_image``: the mean
size of the split's files.

``check_jpeg_bytes`` checks a file in memory (``torch-nvjpeg`` reads every file at build);
``check_jpeg_file`` reads one from disk (``dali``). Both raise ``bench.errors.InputError`` naming
the file. ``torch-jpeg`` walks every file at build too (``layout_problem``) and reports a file's
problem when an epoch reaches it (``pipelines.torch_jpeg``).
"""

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
# In entropy-coded data every 0xFF byte is followed by 0x00 (a stuffed data byte); anything else is
# a marker (or fill bytes before one), the one that ends the scan unless it is a restart marker.
# (A pattern starting ``\xff+`` costs ~15x: the regex engine's fast search needs a literal prefix.)
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
    """``(height, width)`` from a JPEG's first start-of-frame header, or None when there is none
    (no JPEG, malformed markers before one, or the data ends first).

    Walks the marker segments only (no decoding): a few dozen bytes per file.
    """
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
    """The offset of the marker that ends the scan whose entropy-coded data starts at ``i``, or what
    is wrong with the data: a restart marker out of sequence or without a restart interval (``restart``,
    in MCUs; 0: none), or no marker before the end of the file."""
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
    """What is wrong with the markers of ``data`` (a JPEG: it starts with the start-of-image marker)
    from its start to its end (module docstring); None when nothing is."""
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
    """Raise ``InputError`` naming ``path`` unless the file's bytes ``raw`` are a JPEG of ``size`` =
    ``(height, width)`` whose markers walk from its start to an end-of-image marker at its end
    (``layout_problem``). The frame header is checked first, then its size, then the walk."""
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
    """More bytes than any JPEG of ``size`` = ``(height, width)`` that ``prepare`` writes can hold: 4 bytes per
    sample (a baseline Huffman code spends at most about 26 bits on a coefficient, 3.3 bytes a sample)
    plus 1 MiB of header segments. A longer file is refused before it is read (a video or a disk image
    named .jpg would otherwise be read whole, or not fit in memory)."""
    return 4 * 3 * int(size[0]) * int(size[1]) + 2**20


def too_long(n_bytes: int, size: tuple[int, int]) -> str | None:
    """The problem of a file of ``n_bytes`` in a split of ``size`` (``max_jpeg_bytes``), or None."""
    limit = max_jpeg_bytes(size)
    if n_bytes <= limit:
        return None
    return f"{n_bytes:,} bytes, more than a {size[0]}x{size[1]} JPEG can hold ({limit:,}): not a prepared JPEG"


def read_file(path: Path, size: tuple[int, int]) -> bytes:
    """The bytes of the file at ``path``, a JPEG of a split of ``size`` = ``(height, width)``; ``InputError``
    naming it when it cannot be read or is longer than such a JPEG can be (``too_long``: refused before it is
    read). A FIFO named .jpg fails, never hangs: it is opened non-blocking."""
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


def check_jpeg_file(path: Path, size: tuple[int, int]) -> None:
    """``check_jpeg_bytes`` for a file on disk, read whole (the walk crosses every scan) unless it is longer
    than a JPEG of ``size`` can be. Raises ``InputError`` naming ``path``, also when it cannot be read."""
    check_jpeg_bytes(read_file(path, size), size, path)


def check_jpeg_files(paths: tuple[Path, ...] | list[Path], size: tuple[int, int]) -> None:
    """``check_jpeg_file`` on every path, in order: the first bad one is raised."""
    for p in paths:
        check_jpeg_file(p, size)


def jpeg_bytes_per_image(data: PreparedDataset, split: str) -> float | None:
    """Mean bytes of split ``split``'s JPEG files (whole files, headers included), as ``prepare`` wrote
    them: its manifest's ``jpeg_bytes`` / ``count``, so nothing is read or ``stat``-ed (the build checks
    every file's header, not its length); a manifest without ``jpeg_bytes`` sums the files' ``stat``
    sizes. None for an empty split."""
    info = data.manifest["splits"][split]
    n = int(info["count"])
    if n == 0:
        return None
    total = info.get("jpeg_bytes")
    if total is None:
        total = sum(os.stat(p).st_size for p in data.split(split, verify=False).jpeg_paths)
    return float(total) / float(n)
