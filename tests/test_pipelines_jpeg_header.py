"""The JPEG checks the adapters share (``pipelines.jpeg_header``): the file check that ``dali`` runs at
build says what ``torch-nvjpeg``'s in-memory check says, and refuses the header damage that crashes
DALI; ``torch-jpeg`` refuses a replaced file in its workers. Damaged scans:
``tests/test_jpeg_corrupt_scan.py``.

DALI itself is never handed a damaged file here (it may crash the process): the CLI cases in
``tests/test_hostile_stores.py`` do that, in a child process."""

from __future__ import annotations

import io
import os
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest

import pipelines
from bench.datasets.prepared import open_prepared
from bench.errors import InputError
from pipelines import Augment, PipelineConfig
from pipelines import jpeg_header as jh


def _jpeg(side: int = 32, noise: bool = False, **kw) -> bytes:
    from PIL import Image

    rng = np.random.default_rng(side)
    arr = rng.integers(0, 256, (side, side, 3), np.uint8) if noise else np.full((side, side, 3), 120, np.uint8)
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, "JPEG", quality=90, **kw)
    return buf.getvalue()


def _with_app_segments(raw: bytes, count: int, nbytes: int = 60_000) -> bytes:
    """``raw`` with ``count`` APP1 segments of ``nbytes`` right after its SOI: the frame header moves
    past the first read (as a camera's EXIF or an ICC profile would move it)."""
    seg = b"\xff\xe1" + struct.pack(">H", nbytes + 2) + bytes(nbytes)
    return raw[:2] + seg * count + raw[2:]


def _at(raw: bytes, marker: bytes) -> int:
    return raw.index(marker)


def _set(raw: bytes, at: int, value: bytes) -> bytes:
    return raw[:at] + value + raw[at + len(value):]


OK = _jpeg()
DAMAGE = {  # name: (bytes, the message of both checks, or None when both accept the file)
    "ok": (OK, None),
    "progressive": (_jpeg(progressive=True), None),
    "zero-padded": (OK + bytes(10), None),
    "long-zero-padding": (OK + bytes(10_000), None),
    "big-app-segments": (_with_app_segments(OK, 3), None),  # SOF ~180 KB in
    "big-app-wrong-size": (_with_app_segments(_jpeg(40), 3), "JPEG is 40x40, the prepared split is 32x32"),
    "garbage": (b"garbage\n", jh.NO_FRAME),
    "empty": (b"", jh.NO_FRAME),
    "one-byte": (b"\xff", jh.NO_FRAME),
    "a-png": (None, jh.NO_FRAME),
    "cut-in-tables": (OK[:100], jh.NO_FRAME),
    "cut-in-scan": (OK[:-10], jh.NO_EOI),
    "only-zeros-after-cut": (OK[:-10] + bytes(5000), jh.NO_EOI),
    "wrong-size": (_jpeg(64), "JPEG is 64x64, the prepared split is 32x32"),
    "big-wrong-size": (_jpeg(224, noise=True), "JPEG is 224x224, the prepared split is 32x32"),
}


def _png() -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (32, 32)).save(buf, "PNG")
    return buf.getvalue()


@pytest.mark.parametrize("name", list(DAMAGE))
def test_file_check_says_what_the_in_memory_check_says(name, tmp_path):
    """``check_jpeg_files`` (dali, from disk) and ``check_jpeg_bytes`` (torch-nvjpeg, in memory) give
    the same verdict and message."""
    raw, message = DAMAGE[name]
    raw = _png() if raw is None else raw
    p = tmp_path / "x.jpg"
    p.write_bytes(raw)
    for check in (lambda: jh.check_jpeg_bytes(raw, (32, 32), p), lambda: jh.check_jpeg_files([p], (32, 32))):
        if message is None:
            check()
        else:
            with pytest.raises(InputError) as e:
                check()
            assert str(e.value) == f"{p}: {message}" and e.value.path == p


@pytest.mark.parametrize(("damage", "message"), [
    # a segment length of 0 (as zeroed bytes give): nvImageCodec's parser reads "00 00" as a marker
    (lambda r: _set(r, _at(r, b"\xff\xc4") + 2, b"\x00\x00"), "damaged JPEG headers: segment length 0 at byte"),
    # cut inside a Huffman table with an end-of-image marker appended: frame size and end marker are right
    (lambda r: r[: _at(r, b"\xff\xc4") + 20] + b"\xff\xd9", "damaged JPEG headers: no scan before the end of the file"),
    (lambda r: _set(r, _at(r, b"\xff\xc0") + 9, b"\x00"),
     "damaged JPEG headers: a frame of 0 colour components, 1, 3 or 4 expected"),
    (lambda r: _set(r, _at(r, b"\xff\xc4"), b"\xfe"), "damaged JPEG headers: no marker at byte"),
    (lambda r: _set(r, _at(r, b"\xff\xc4") + 1, b"\xd0"), "damaged JPEG headers: marker 0xFFD0 at byte"),
], ids=["zero-length", "cut-in-headers-with-eoi", "no-components", "no-marker", "restart-marker"])
def test_segment_walk_refuses_what_crashes_dali(damage, message, tmp_path):
    """Headers of the prepared size, ending in an end-of-image marker, that nvImageCodec's parser
    refuses (DALI 2.4 then dies of SIGSEGV): refused by both checks, so all three adapters refuse them
    (PIL decodes some of them, a restart marker or a stray byte among the headers)."""
    raw = damage(OK)
    p = tmp_path / "x.jpg"
    p.write_bytes(raw)
    for check in (lambda: jh.check_jpeg_bytes(raw, (32, 32), p), lambda: jh.check_jpeg_files([p], (32, 32))):
        with pytest.raises(InputError, match=f"^{p}: {message}"):
            check()


def test_unreadable_paths_are_named(tmp_path):
    (tmp_path / "dir.jpg").mkdir()
    os.mkfifo(tmp_path / "fifo.jpg")  # never blocks the check
    for name, why in (("missing.jpg", "No such file"), ("dir.jpg", "Is a directory"), ("fifo.jpg", "Illegal seek")):
        with pytest.raises(InputError, match=f"{name}: cannot read JPEG \\({why}"):
            jh.check_jpeg_files([tmp_path / name], (32, 32))


def test_check_files_names_the_first_bad_one(tmp_path):
    paths = []
    for i, raw in enumerate((OK, OK, b"garbage", _jpeg(8))):
        paths.append(tmp_path / f"{i}.jpg")
        paths[-1].write_bytes(raw)
    jh.check_jpeg_files(paths[:2], (32, 32))
    with pytest.raises(InputError, match=r"2\.jpg: no JPEG frame header"):
        jh.check_jpeg_files(paths, (32, 32))


# ----------------------------------------------------------------------------- the adapters


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    from bench.datasets.prepare import prepare_dataset

    return prepare_dataset("photos", tmp_path_factory.mktemp("jh") / "photos32", size=32, limit=24, jpeg_quality=90)


def _replaced(photos: Path, tmp_path: Path, raw: bytes, index: int = 5) -> Path:
    root = Path(shutil.copytree(photos, tmp_path / "copy"))
    (root / "train" / "jpeg" / f"{index:06d}.jpg").write_bytes(raw)
    return root


def test_dali_lists_the_files_its_reader_reads(tmp_path):
    from pipelines.dali import listed_files

    lst = tmp_path / "file_list.txt"
    lst.write_text("jpeg/000000.jpg 3\n\n  jpeg/a b.jpg\t12  \njpeg/000002.jpg 0")
    assert listed_files(tmp_path, lst) == (tmp_path / "jpeg/000000.jpg", tmp_path / "jpeg/a b.jpg",
                                           tmp_path / "jpeg/000002.jpg")
    with pytest.raises(InputError, match=r"nothing\.txt: cannot read DALI's file list"):
        listed_files(tmp_path, tmp_path / "nothing.txt")


@pytest.mark.parametrize("cfg", [
    {}, {"rank": 1, "world_size": 2}, {"rank": 1, "world_size": 2, "resident": "shard"},
], ids=["one-rank", "rank-1-of-2", "fixed-shard"])
def test_dali_refuses_a_replaced_file_at_build(cfg, photos, tmp_path):
    """A file of another size (which DALI decodes without complaint) is refused by the build-time
    check on every rank, whichever shard the file falls in (DALI picks a rank's files)."""
    pytest.importorskip("nvidia.dali", reason="DALI is not installed")
    root = _replaced(photos, tmp_path, _jpeg(64), index=0)
    with pytest.raises(InputError, match=r"train/jpeg/000000\.jpg: JPEG is 64x64, the prepared split is 32x32$"):
        pipelines.create("dali", open_prepared(root), PipelineConfig(workers=1, batch_size=8, **cfg))


def test_dali_checks_before_building(photos, tmp_path, monkeypatch):
    """The check runs before any DALI pipeline exists (DALI would crash on the file, not report it)."""
    pytest.importorskip("nvidia.dali", reason="DALI is not installed")
    import nvidia.dali

    root = _replaced(photos, tmp_path, b"garbage\n")
    monkeypatch.setattr(nvidia.dali, "pipeline_def", lambda *a, **k: pytest.fail("DALI saw the file"))
    with pytest.raises(InputError, match=r"000005\.jpg: no JPEG frame header"):
        pipelines.create("dali", open_prepared(root), PipelineConfig(workers=1))


@pytest.mark.parametrize("workers", [0, 1])
@pytest.mark.parametrize(("raw", "message"), [
    (_jpeg(64), r"000005\.jpg: JPEG is 64x64, the prepared split is 32x32$"),
    (None, r"000005\.jpg: not a JPEG \(a PNG file\)$"),
], ids=["wrong-size", "png"])
def test_torch_jpeg_refuses_a_replaced_file(raw, message, workers, photos, tmp_path):
    """Checked in the worker after ``Image.open`` (no build-time scan): the epoch stops with one line
    naming the file, also from a DataLoader worker process."""
    root = _replaced(photos, tmp_path, _png() if raw is None else raw)
    p = pipelines.create("torch-jpeg", open_prepared(root),
                         PipelineConfig(workers=workers, batch_size=8, shuffle=False, augment=Augment(crop="center")))
    try:
        with pytest.raises(InputError, match=message):
            for _ in p:
                pass
    finally:
        p.close()
