"""Each codec of ``inrbench compare`` encodes with the settings docs/codecs.md documents (what reaches
``PIL.Image.save``, JPEG 2000's colour transform among them), and the JPEG 2000 sweep on the built-in
photos gains from that colour transform."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from bench.compare import codecs
from bench.compare.config import CompareConfig
from bench.compare.core import compare_images
from bench.compare.table import summarize

DOC = Path(__file__).resolve().parents[1] / "docs" / "codecs.md"


def _doc_options() -> dict[str, str]:
    """codec name -> the "Pillow save options" cell of the settings table in docs/codecs.md."""
    rows = {}
    for line in DOC.read_text(encoding="utf-8").splitlines():
        m = re.match(r"\| `([a-z0-9-]+)` \|.*\| `([^`]*)` \|", line)
        if m:
            rows[m.group(1)] = m.group(2)
    return rows


@pytest.fixture
def saved(monkeypatch):
    """Every ``PIL.Image.Image.save`` call's (format, keyword arguments), the save still done."""
    calls = []
    real = Image.Image.save

    def spy(self, fp, format=None, **kw):
        calls.append((format, dict(kw)))
        return real(self, fp, format=format, **kw)

    monkeypatch.setattr(Image.Image, "save", spy)
    return calls


@pytest.mark.parametrize("name", codecs.names())
def test_each_codec_encodes_with_its_documented_settings(name, saved):
    codec = codecs.create(name, "4:2:0")
    if codec.unavailable() is not None:
        pytest.skip(codec.unavailable())
    img = (np.random.default_rng(0).random((64, 96, 3)) * 255).astype(np.uint8)
    codec.encode(img, 40)
    assert len(saved) == 1
    fmt, kw = saved[0]
    assert fmt == {"jpeg": "JPEG", "webp": "WEBP", "avif": "AVIF", "jxl": "JXL", "jp2": "JPEG2000"}[name.split("-")[0]]
    assert {k: kw[k] for k in codec.options} == codec.options  # every documented option reached the encoder
    assert set(kw) - set(codec.options) <= {"quality", "quality_layers", "num_resolutions"}
    assert codec.describe()["settings"].items() >= codec.options.items()  # and config.json records them
    doc = _doc_options()
    assert name in doc, f"docs/codecs.md has no settings row for {name}"
    assert doc[name] == ", ".join(f"{k}={v!r}" for k, v in codec.options.items())


def test_jpeg2000_takes_openjpeg_defaults_with_the_colour_transform(saved):
    codec = codecs.create("jp2")
    if codec.unavailable() is not None:
        pytest.skip(codec.unavailable())
    codec.encode(np.zeros((64, 96, 3), np.uint8), 50)
    codec.encode(np.zeros((8, 96, 3), np.uint8), 50)
    (_, kw), (_, small) = saved
    assert kw["mct"] == 1 and kw["irreversible"] is False and kw["codeblock_size"] == (64, 64)  # 5/3, as published
    assert kw["progression"] == "LRCP" and kw["quality_mode"] == "rates"
    assert kw["num_resolutions"] == 6 and small["num_resolutions"] == 4  # 2**(levels-1) <= short side
    assert kw["quality_layers"] == [pytest.approx(codecs.jp2_ratio(50))]


def test_jpeg_is_the_prepared_jpeg_tree_encoder_and_jpeg_opt_only_smaller():
    from bench.datasets.prepared import encode_jpeg

    img = np.ascontiguousarray(_photos(1, 64)[0])
    base, opt = codecs.create("jpeg"), codecs.create("jpeg-opt")
    assert base.encode(img, 75) == encode_jpeg(img, 75, "4:2:0")  # the bytes the torch-jpeg loader reads
    a, b = base.encode(img, 75), opt.encode(img, 75)
    assert len(b) < len(a) and np.array_equal(base.decode(a), opt.decode(b))  # same pixels, fewer bytes


def _photos(n: int, side: int) -> list[np.ndarray]:
    """The first ``n`` photographs of the built-in ``photos`` set, centre ``side`` x ``side`` crops."""
    from bench.datasets.photos import photo_list

    out = []
    for ph in photo_list()[:n]:
        a = np.ascontiguousarray(ph.loader()[..., :3])
        y, x = (a.shape[0] - side) // 2, (a.shape[1] - side) // 2
        out.append(np.ascontiguousarray(a[y : y + side, x : x + side]))
    return out


def test_jpeg2000_sweep_on_the_photos_gains_from_the_colour_transform():
    jp2 = codecs.create("jp2")
    if jp2.unavailable() is not None:
        pytest.skip(jp2.unavailable())
    off = dataclasses.replace(jp2, options={**jp2.options, "mct": 0})
    images = np.stack(_photos(4, 128))
    cfg = CompareConfig(qualities=(30, 45, 60, 75), codecs=("jp2",))
    on_s, off_s = (summarize(compare_images(images, [], cfg, codecs=[c])) for c in (jp2, off))
    # at the bytes of each of the colour transform's sweep points, the plain-RGB sweep's PSNR
    gains = []
    off_sw = off_s[off_s.method == "jp2-sweep"].sort_values("file_bytes")
    for _, r in on_s[on_s.method == "jp2-sweep"].iterrows():
        p = np.interp(np.log(r["file_bytes"]), np.log(off_sw.file_bytes), off_sw.psnr, left=np.nan, right=np.nan)
        if np.isfinite(p):
            gains.append(float(r["psnr"]) - p)
    assert len(gains) >= 2
    assert min(gains) > 1.0, gains  # mct=0 (Pillow's default) costs more than 1 dB at every rate here
