"""JPEGs whose headers are sound but whose scan data is damaged: the marker walk
(``pipelines.jpeg_header.layout_problem``) refuses what it can see in every JPEG adapter, with one
line naming the file; what it cannot see (damage that leaves the markers in place) decodes to the
same pixels in every CPU decoder, so no adapter trains on other pixels than the others.

Before the walk, DALI's CPU decoder trained on a scan holding a stray marker that PIL and TorchCodec
refuse, and ``torch-jpeg`` trained on files the other two refused (data after the end-of-image
marker, a cut scan followed by zeros); all three trained on a stray restart marker."""

from __future__ import annotations

import io
import shutil
from pathlib import Path

import numpy as np
import pytest

import pipelines
from bench.datasets.prepared import open_prepared
from bench.errors import InputError
from pipelines import Augment, PipelineConfig
from pipelines import jpeg_header as jh


def _jpeg(side: int = 32, **kw) -> bytes:
    """A crop of skimage's astronaut as JPEG bytes (quality 90, 4:2:0; ``kw`` to PIL)."""
    from PIL import Image
    from skimage import data

    buf = io.BytesIO()
    Image.fromarray(data.astronaut()[100:100 + side, 150:150 + side].copy()).save(buf, "JPEG", quality=90, **kw)
    return buf.getvalue()


def _scan(raw: bytes) -> tuple[int, int]:
    """``(start, end)`` of the (first) scan's entropy-coded data."""
    i = raw.index(b"\xff\xda")
    return i + 2 + ((raw[i + 2] << 8) | raw[i + 3]), len(raw) - 2


def _mid(raw: bytes) -> int:
    """An offset in the middle of the scan data that is not a 0xFF byte nor right after one."""
    s, e = _scan(raw)
    m = (s + e) // 2
    while 0xFF in (raw[m - 1], raw[m], raw[m + 1]):
        m += 1
    return m


def _put(raw: bytes, at: int, value: bytes) -> bytes:
    return raw[:at] + value + raw[at + len(value):]


OK = _jpeg()
M = _mid(OK)
RST = _jpeg(restart_marker_blocks=1)  # a restart interval of 1 MCU: RST0, RST1, ... in the scan
RST_AT = RST.index(b"\xff\xd1")  # the second restart marker

REFUSED = {  # name: (bytes, the message both checks give)
    "stray-marker": (_put(OK, M, b"\xff\x13"), f"{jh.SCAN}marker 0xFF13 at byte {M:,}"),
    "restart-marker-without-interval": (OK[:M] + b"\xff\xd3" + OK[M:],
                                        f"{jh.SCAN}restart marker RST3 at byte {M:,}, the file sets no restart interval"),
    "restart-marker-out-of-order": (_put(RST, RST_AT, b"\xff\xd5"),
                                    f"{jh.SCAN}restart marker RST5 at byte {RST_AT:,}, RST1 expected"),
    "end-of-image-inside-the-scan": (OK[:M] + b"\xff\xd9" + OK[M:],
                                     f"damaged JPEG: {len(OK) - M:,} bytes after its end-of-image marker (at byte {M:,})"),
    "data-after-end-of-image": (OK + b"junk", f"damaged JPEG: 4 bytes after its end-of-image marker (at byte {len(OK) - 2:,})"),
    "cut-scan-padded-with-zeros": (OK[:M] + bytes(64), jh.NO_EOI),
    "cut-scan": (OK[:M], jh.NO_EOI),
}
ACCEPTED = {  # sound files the walk must pass
    "baseline": OK,
    "progressive": _jpeg(progressive=True),
    "restart-interval": RST,
    "restart-interval-224px": _jpeg(224, restart_marker_blocks=3),
    "fill-bytes-before-end-of-image": OK[:-2] + b"\xff\xff\xff\xd9",
    "zero-padded": OK + bytes(100),
}
# Damage the walk cannot see (no marker moves): libjpeg decodes it with a warning, grey or garbled blocks
UNSEEN = {
    "bytes-replaced": _put(OK, M, b"\x12\x34\x56\x78\x9a\xbc\xde\xf0"),
    "bit-flipped": _put(OK, M, bytes([OK[M] ^ 0x10])),
    "cut-scan-with-end-of-image-appended": OK[:M] + b"\xff\xd9",
}


@pytest.mark.parametrize("name", list(REFUSED))
def test_scan_damage_is_refused_naming_the_file(name, tmp_path):
    raw, message = REFUSED[name]
    p = tmp_path / "x.jpg"
    p.write_bytes(raw)
    for check in (lambda: jh.check_jpeg_bytes(raw, (32, 32), p), lambda: jh.check_jpeg_files([p], (32, 32))):
        with pytest.raises(InputError) as e:
            check()
        assert str(e.value) == f"{p}: {message}" and e.value.path == p


@pytest.mark.parametrize("name", list(ACCEPTED))
def test_sound_files_pass_the_walk(name):
    assert jh.layout_problem(ACCEPTED[name]) is None


@pytest.mark.parametrize("name", list(UNSEEN))
def test_damage_the_walk_cannot_see_decodes_alike_everywhere(name, tmp_path):
    """It passes the check, and PIL (torch-jpeg), torch-nvjpeg's decoder and DALI's CPU decoder give
    the same wrong pixels, bit for bit: every adapter trains on the same image."""
    from PIL import Image

    from pipelines.torch_nvjpeg import jpeg_decoder

    raw = UNSEEN[name]
    jh.check_jpeg_bytes(raw, (32, 32), tmp_path / "x.jpg")
    with Image.open(io.BytesIO(raw)) as im:
        pil = np.asarray(im.convert("RGB"))
    with Image.open(io.BytesIO(OK)) as im:
        assert not np.array_equal(pil, np.asarray(im.convert("RGB")))  # the damage shows
    import torch

    nv = jpeg_decoder().decode(torch.frombuffer(bytearray(raw), dtype=torch.uint8), mode="RGB")
    assert np.array_equal(nv.permute(1, 2, 0).numpy(), pil)
    pytest.importorskip("nvidia.dali", reason="DALI is not installed")
    from nvidia.dali import fn, pipeline_def, types

    (tmp_path / "x.jpg").write_bytes(raw)
    (tmp_path / "list.txt").write_text("x.jpg 0\n")

    @pipeline_def(batch_size=1, num_threads=1, device_id=None)
    def decode():
        jpegs, _ = fn.readers.file(file_root=str(tmp_path), file_list=str(tmp_path / "list.txt"))
        return fn.decoders.image(jpegs, device="cpu", output_type=types.RGB)

    pipe = decode()
    pipe.build()
    assert np.array_equal(np.asarray(pipe.run()[0][0]), pil)


# ----------------------------------------------------------------------------- the adapters

ADAPTERS = ["torch-jpeg", "torch-jpeg-worker", "torch-nvjpeg", "dali"]
# PIL refuses a stray marker itself, when it decodes; the walk speaks for the rest
PIL_STRAY = "cannot decode JPEG (OSError: broken data stream when reading image file)"


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    from bench.datasets.prepare import prepare_dataset

    return prepare_dataset("photos", tmp_path_factory.mktemp("cs") / "photos32", size=32, limit=24, jpeg_quality=90)


def _damaged(photos: Path, tmp_path: Path, damage: str) -> tuple[Path, Path, str]:
    """A copy of the set whose train 000005.jpg has ``damage`` done to it: (root, file, message)."""
    root = Path(shutil.copytree(photos, tmp_path / "copy"))
    f = root / "train" / "jpeg" / "000005.jpg"
    raw = f.read_bytes()
    m = _mid(raw)
    raw, message = {
        "stray-marker": (_put(raw, m, b"\xff\x13"), f"{jh.SCAN}marker 0xFF13 at byte {m:,}"),
        "restart-marker": (raw[:m] + b"\xff\xd3" + raw[m:],
                           f"{jh.SCAN}restart marker RST3 at byte {m:,}, the file sets no restart interval"),
        "data-after-end-of-image": (raw + b"junk",
                                    f"damaged JPEG: 4 bytes after its end-of-image marker (at byte {len(raw) - 2:,})"),
        "cut-scan-then-zeros": (raw[:-10] + bytes(5000), jh.NO_EOI),  # PIL decodes it, TorchCodec does not
    }[damage]
    f.write_bytes(raw)
    return root, f, message


def _run(adapter: str, root: Path) -> None:
    """Build ``adapter`` on ``root`` and run one epoch."""
    if adapter == "dali":
        pytest.importorskip("nvidia.dali", reason="DALI is not installed")
    name, workers = ("torch-jpeg", 1) if adapter == "torch-jpeg-worker" else (adapter, 0 if adapter != "dali" else 1)
    cfg = PipelineConfig(workers=workers, batch_size=8, shuffle=False, augment=Augment(crop="center"))
    p = pipelines.create(name, open_prepared(root), cfg)
    try:
        for _ in p:
            pass
    finally:
        p.close()


@pytest.mark.parametrize("adapter", ADAPTERS)
@pytest.mark.parametrize("damage", ["stray-marker", "restart-marker", "data-after-end-of-image", "cut-scan-then-zeros"])
def test_every_adapter_refuses_a_damaged_scan(damage, adapter, photos, tmp_path):
    """One line naming the file, in every adapter (``dali`` and ``torch-nvjpeg`` at build)."""
    root, f, message = _damaged(photos, tmp_path, damage)
    if adapter.startswith("torch-jpeg") and damage == "stray-marker":
        message = PIL_STRAY
    with pytest.raises(InputError) as e:
        _run(adapter, root)
    assert str(e.value) == f"{f}: {message}"


def test_torch_jpeg_walks_at_build_not_per_sample(photos, monkeypatch):
    """``torch-jpeg`` walks each file once at build; an epoch only looks the verdicts up."""
    import pipelines.torch_jpeg as tj

    calls = []
    real = tj.layout_problem
    monkeypatch.setattr(tj, "layout_problem", lambda raw: calls.append(1) or real(raw))
    data = open_prepared(photos)
    p = pipelines.create("torch-jpeg", data, PipelineConfig(workers=0, batch_size=8, shuffle=False,
                                                            augment=Augment(crop="center")))
    assert len(calls) == len(data.split("train"))
    try:
        for _ in p:
            pass
    finally:
        p.close()
    assert len(calls) == len(data.split("train"))


BENCH_ADAPTERS = ["torch-jpeg", "torch-nvjpeg", "dali"]


@pytest.fixture(scope="module")
def bench_runs(photos, tmp_path_factory) -> tuple[Path, str, dict]:
    """``inrbench bench`` of each of ``BENCH_ADAPTERS`` (DALI where installed) on one copy of the set
    with a restart marker in a scan, in one child Python (``child_cli.run_children``): (the damaged
    file, its message, adapter -> (exit code, stdout, stderr) or why the child died)."""
    from child_cli import run_children

    tmp = tmp_path_factory.mktemp("bench-scan")
    root, f, message = _damaged(photos, tmp, "restart-marker")
    adapters = [a for a in BENCH_ADAPTERS if a != "dali" or _has_dali()]
    argvs = [["bench", "--pipeline", a, "--data", str(root), "--device", "cpu", "--repeats", "1", "--warmup", "0",
              "--batch-size", "8", "--workers", "1", "--backbone", "small-cnn", "--out", str(tmp / f"results-{a}")]
             for a in adapters]
    return f, message, dict(zip(adapters, run_children(argvs, tmp), strict=True))


def _has_dali() -> bool:
    import importlib.util

    return importlib.util.find_spec("nvidia") is not None and importlib.util.find_spec("nvidia.dali") is not None


@pytest.mark.parametrize("adapter", BENCH_ADAPTERS)
def test_bench_refuses_a_damaged_scan_in_one_line(adapter, bench_runs):
    """The CLI: exit 2 and one ``inrbench: error:`` line naming the file (a child process: were the
    check to let the file through, a crash in DALI fails the test, not pytest)."""
    if adapter == "dali":
        pytest.importorskip("nvidia.dali", reason="DALI is not installed")
    f, message, runs = bench_runs
    if isinstance(runs[adapter], str):
        pytest.fail(runs[adapter])
    code, _, err = runs[adapter]
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1, err[-2000:]
    assert lines[0] == f"inrbench: error: {f}: {message}"


def test_a_file_too_long_for_a_prepared_jpeg_is_refused_unread_by_every_jpeg_adapter(tmp_path):
    """A huge file named .jpg (here a sparse 1 TiB one, nothing on disk) in the prepared tree: each JPEG adapter's
    build refuses it in one line naming it, from its size, before reading it. Before: the whole file was read (or
    a buffer of its size allocated) and the build died of ``MemoryError``, the line naming no file."""
    from tests.fixtures_datasets import write_tiny_prepared

    data = write_tiny_prepared(tmp_path / "d", 8, 2)
    ds = open_prepared(data)
    victim = ds.split("train").jpeg_paths[3]
    with open(victim, "r+b") as f:
        f.truncate(2**40)
    assert jh.max_jpeg_bytes((8, 8)) < 2 * 2**20  # the bound is about a 8x8 JPEG, not about this machine
    cfg = PipelineConfig(workers=0, batch_size=4, shuffle=False, augment=Augment(crop="center"))
    tested = []
    for name in ("torch-jpeg", "torch-nvjpeg", "dali"):
        try:
            with pytest.raises(InputError, match=r"1,099,511,627,776 bytes, more than a 8x8 JPEG can hold") as e:
                p = pipelines.create(name, ds, cfg)
                try:
                    for _ in p:  # torch-jpeg says it when the epoch reaches the file
                        pass
                finally:
                    p.close()
        except pipelines.Unavailable:
            continue
        assert e.value.path == victim, name
        tested.append(name)
    assert "torch-jpeg" in tested and "torch-nvjpeg" in tested  # both run on any machine; dali where installed
