"""The Kodak self-check of ``compare --reference kodak`` (``bench.compare.kodak``): Kodak images are
recognised by their pixels (or asserted), each codec's sweep is held to its library's published curve,
and other images get a line saying the check needs Kodak."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from bench.compare import kodak, references
from bench.compare.config import CompareConfig
from bench.compare.run import run_compare
from bench.datasets.prepared import SplitData, write_prepared
from tests.cli_helpers import assert_one_line_error, run_cli


def _images(n: int) -> list[np.ndarray]:
    """``n`` distinct 48x64 crops of a photograph (JPEG's sweep on them spans the published bpp)."""
    import skimage.data

    a = skimage.data.astronaut()
    return [np.ascontiguousarray(a[100 + 40 * i : 148 + 40 * i, 150:214]) for i in range(n)]


@pytest.fixture
def known(monkeypatch):
    """Three stand-in images registered as Kodak images (their pixel hashes in ``PIXEL_SHA256``)."""
    ims = _images(3)
    monkeypatch.setattr(kodak, "PIXEL_SHA256", {f"kodim{i + 1:02d}": kodak.pixel_hash(im) for i, im in enumerate(ims)})
    return ims


def test_kodak_is_recognised_by_pixels_and_anything_else_is_not(known):
    assert kodak.identify(known)["kodak"] and "3 of the 24 Kodak images" in kodak.identify(known)["how"]
    altered = [im.copy() for im in known]
    altered[1][0, 0, 0] ^= 1  # one pixel of one image
    d = kodak.identify(altered)
    assert d == dict(kodak=False, how="2 of 3 images are Kodak images by their pixels", n=3, matched=2)
    assert not kodak.identify([known[0], known[0]])["kodak"]  # a duplicate is not two Kodak images
    a = kodak.identify(altered, asserted=True)
    assert a["kodak"] and a["how"].startswith("asserted by --assert-kodak (2 of 3")


def test_the_real_table_has_24_distinct_images_and_every_mapped_curve_exists():
    assert len(kodak.PIXEL_SHA256) == 24 and len(set(kodak.PIXEL_SHA256.values())) == 24
    published = {c.method for c in references.curves("kodak")}
    assert {m for ms in kodak.SAME_LIBRARY.values() for m in ms} <= published


def _sweep(codec: str, curve: str, offset: float, bpps) -> list[dict]:
    c = next(c for c in references.curves("kodak") if c.method == curve)
    return [dict(method=f"{codec}-sweep", status="ok", bpp=b, psnr=c.psnr_at(b) + offset if b <= c.bpp[-1] else 50.0)
            for b in bpps]


def test_gaps_flag_a_codec_more_than_half_a_db_off_its_published_run():
    s = pd.DataFrame(_sweep("jpeg", "JPEG", 0.1, [0.3, 0.6, 1.2, 9.0])  # 9 bpp: outside the curve, left out
                     + _sweep("jp2", "JPEG 2000", -1.9, [0.2, 0.4, 0.8]))
    g = {(r["codec"], r["curve"]): r for r in kodak.gaps(s)}
    j = g[("jpeg", "JPEG")]
    assert j["points"] == 3 and j["gap_db"] == pytest.approx(0.1) and j["verdict"] == "matches"
    assert (j["bpp_lo"], j["bpp_hi"]) == (0.3, 1.2)
    p = g[("jp2", "JPEG 2000")]
    assert p["gap_db"] == pytest.approx(-1.9) and p["verdict"] == "settings differ from the published run"
    assert ("webp", "WebP") not in g  # a codec not run has no line
    d = kodak.check([], s, ["jpeg", "jxl"], asserted=True)
    assert d["unchecked"] == ["jxl"] and len(d["gaps"]) == 3  # jp2 has two published OpenJPEG curves
    text = "\n".join(kodak.lines(d))
    assert "- jxl: no published Kodak curve of the same library found, unchecked" in text
    assert "- jp2 vs JPEG 2000 (JPEG 2000 (ffmpeg 3.4.6 / OpenJPEG), as run by CompressAI): -1.90 dB mean over 3 " in text


@pytest.fixture
def prepared(tmp_path, known):
    root = tmp_path / "kodakish"
    write_prepared(root, {"train": SplitData(np.stack(known), np.zeros(3, np.int64))}, {"source": "t", "classes": ["a"]})
    return root


def test_compare_prints_the_check_on_kodak_and_says_it_needs_kodak_elsewhere(prepared, tmp_path, monkeypatch):
    cfg = CompareConfig(qualities=(10, 30, 50), codecs=("jpeg",), reference="kodak")
    md = (run_compare(prepared, [], cfg, tmp_path / "a", env=False).out / "summary.md").read_text()
    assert "Kodak self-check" in md and "images: recognised by their pixels: 3 of the 24 Kodak images" in md
    assert "- jpeg vs JPEG (JPEG (Pillow 7.1.2), as run by CompressAI): " in md
    meta = json.loads((tmp_path / "a" / "config.json").read_text())
    assert meta["kodak_check"]["kodak"] and meta["kodak_check"]["gaps"][0]["codec"] == "jpeg"
    monkeypatch.setattr(kodak, "PIXEL_SHA256", {})  # the same images, no longer known
    md = (run_compare(prepared, [], cfg, tmp_path / "b", env=False).out / "summary.md").read_text()
    assert "the check needs the 24 Kodak images; these are not (0 of 3 images are Kodak" in md
    assert "- jpeg vs JPEG" not in md


def test_assert_kodak_needs_the_kodak_reference(prepared, tmp_path, capsys):
    rc, _, err = run_cli(capsys, "compare", prepared, "--assert-kodak", "--out", tmp_path / "o")
    assert_one_line_error(rc, err, "--assert-kodak needs --reference kodak")
    assert not (tmp_path / "o").exists()
