"""The codec registry of ``inrbench compare`` (``bench.compare.codecs``), parametrized over it,
and the published reference curves (``bench.compare.references``)."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

from bench.compare import codecs, figures, references
from bench.compare.config import CompareConfig
from bench.compare.core import InrDecoded
from bench.compare.jpeg import exhaustive_quality, search_quality
from bench.compare.run import run_compare
from bench.datasets.prepared import SplitData, write_prepared


def _photo(h: int, w: int, seed: int = 0) -> np.ndarray:
    import skimage.data
    from skimage.transform import resize

    a = skimage.data.astronaut()[60 + 40 * seed : 320 + 40 * seed, 100:400]
    return (resize(a, (h, w), anti_aliasing=True) * 255).round().astype(np.uint8)


@pytest.fixture(scope="module")
def image():
    return _photo(32, 32)


@pytest.mark.parametrize("name", codecs.names())
def test_quality_search_hits_the_byte_target_or_reports_unreachable(name, image):
    codec = codecs.create(name)
    why = codec.unavailable()
    d = codec.describe()
    if why is not None:
        assert d["available"] is False and d["reason"] == why
        pytest.skip(f"{name}: {why}")
    assert d["available"] and d["library"] and d["version"] and isinstance(d["settings"], dict)
    ladder = codecs.Ladder(codec, image)
    size = ladder.size("file")
    sizes = [size(q) for q in range(1, 101)]
    smallest = min(sizes)
    targets = [smallest - 1, smallest, float(np.median(sizes)), float(np.percentile(sizes, 80)) + 0.5, max(sizes) + 10]
    for t in targets:
        q = search_quality(size, t, window=5)
        assert q == exhaustive_quality(size, t), (name, t)
        if t < smallest:
            assert q is None  # unreachable: reported, never a larger file
        else:
            assert q is not None and size(q) <= t
            assert all(size(c) > t for c in range(q + 1, 101))  # the highest quality that fits
    assert ladder.encodes == 100  # memoized: the searches re-encoded nothing
    e = ladder(100)
    dec = codec.decode(e.data)
    assert dec.shape == image.shape and dec.dtype == np.uint8
    if e.payload_bytes is not None:
        assert 0 < e.payload_bytes <= e.file_bytes and e.overhead_bytes == e.file_bytes - e.payload_bytes
    if not codec.header_free:
        with pytest.raises(ValueError):
            ladder.size("header-free")


@pytest.mark.parametrize("name", codecs.names())
def test_codecs_take_non_square_images(name):
    codec = codecs.create(name)
    if codec.unavailable() is not None:
        pytest.skip(codec.unavailable())
    img = _photo(24, 40, seed=1)
    dec = codec.decode(codec.encode(img, 75))
    assert dec.shape == img.shape


def test_unknown_codec_is_refused_with_the_known_ones():
    with pytest.raises(ValueError, match="known: jpeg"):
        CompareConfig(codecs=("jpeg", "heic"))
    assert CompareConfig(codecs=("WebP", "jpeg", "webp")).codecs == ("webp", "jpeg")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    images = np.stack([_photo(32, 32, s) for s in range(3)])
    root = tmp_path_factory.mktemp("codecs") / "tiny"
    write_prepared(root, {"train": SplitData(images, np.arange(3, dtype=np.int64))},
                   {"source": "tiny", "classes": ["a", "b", "c"]})
    rng = np.random.default_rng(0)
    dec = np.clip(images + rng.normal(0, 6, images.shape), 0, 255).round().astype(np.uint8)
    return root, [InrDecoded(name="8bit", bytes_per_image=700.0, decoded=dec),
                  InrDecoded(name="tiny", bytes_per_image=40.0, decoded=dec)]


class _Missing(codecs.Codec):
    def unavailable(self):
        return "not on this machine (test stand-in)"


def test_run_with_several_codecs_a_skip_row_and_references(tiny, tmp_path, monkeypatch):
    monkeypatch.setitem(codecs._REGISTRY, "missing", lambda sub: _Missing("missing", sub))
    root, variants = tiny
    cfg = CompareConfig(qualities=(10, 50, 90), codecs=("jpeg", "webp", "missing"), reference="cifar10")
    res = run_compare(root, [], cfg, tmp_path / "out", variants=variants, env=False)
    s, pi = res.summary, res.per_image
    # WebP: a sweep and matched rows on file bytes only (header-free bytes stay JPEG's)
    assert set(pi.loc[pi.method == "webp-matched", "match"]) == {"file"}
    assert set(pi.loc[pi.method == "jpeg-matched", "match"]) == {"file", "header-free"}
    w = pi[(pi.method == "webp-matched") & (pi.variant == "8bit") & (pi.status == "ok")]
    assert len(w) == 3 and (w.file_bytes <= 700).all() and w.header_free_bytes.isna().all()
    assert (w.overhead_bytes > 0).all()
    # 40 bytes: below every codec's smallest file -> unreachable rows with the smallest size
    u = pi[(pi.method == "webp-matched") & (pi.variant == "tiny")]
    assert (u.status == "unreachable").all() and (u.min_bytes > 40).all()
    skip = s[s.status == "skipped"]
    assert list(skip.codec) == ["missing"] and "test stand-in" in skip.note.iloc[0]
    md = (res.out / "summary.md").read_text()
    assert "| webp @ inr-8bit | file |" in md and "skipped: not on this machine" in md
    assert "their numbers on their data" in md and "| inr-8bit | 5.47 |" in md
    meta = json.loads((res.out / "config.json").read_text())
    assert meta["codecs"]["missing"] == {"available": False, "quality_scale": "1..100", "settings": {},
                                         "reason": "not on this machine (test stand-in)"}
    assert meta["codecs"]["webp"]["library"].startswith("Pillow + libwebp")
    assert meta["config"]["codecs"] == ["jpeg", "webp", "missing"]
    assert {r["method"] for r in meta["reference_sources"]} >= {"COIN", "COIN++"}
    fig = figures.rd_figure(pd.read_csv(res.out / "summary.csv").fillna({"match": "", "variant": ""}), (32, 32),
                            reference="cifar10")
    lines = {ln.get_gid(): ln for ln in fig.axes[0].get_lines() if ln.get_gid()}
    coin = next(c for c in references.curves("cifar10") if c.method == "COIN")
    np.testing.assert_allclose(lines["reference:COIN"].get_xdata(), np.array(coin.bpp) * 1024 / 8)
    assert "webp-sweep:file" in lines and "webp-matched:file:8bit" in lines
    figures.plt.close(fig)
    labels = [g[0] for g in figures.spread_groups(pi)]
    assert labels[:4] == ["inr-8bit", "jpeg@inr-8bit (file)", "jpeg@inr-8bit (header-free)", "webp@inr-8bit (file)"]


def test_every_reference_point_carries_a_source():
    rows = references._rows()
    assert rows
    for r in rows:
        assert r["dataset"] in references.DATASETS
        assert r["paper"].strip() and r["source"].strip(), r
        assert r["approximate"] in ("yes", "no")
        assert 0 < float(r["bpp"]) < 40 and 10 < float(r["psnr"]) < 60
    kodak = {c.method for c in references.curves("kodak")}
    assert {"COIN", "COIN++", "C3", "Cool-chic v2", "Strümpler et al.", "BPG 4:4:4", "WebP", "JPEG",
            "JPEG 2000"} <= kodak
    assert {"COIN", "COIN++", "BPG 4:4:4", "JPEG", "JPEG 2000"} <= {c.method for c in references.curves("cifar10")}


def test_reference_interpolation():
    c = next(c for c in references.curves("kodak") if c.method == "COIN")
    assert c.psnr_at(c.bpp[0]) == pytest.approx(c.psnr[0])
    mid = math.sqrt(c.bpp[2] * c.bpp[3])  # halfway in log(bpp)
    assert c.psnr_at(mid) == pytest.approx((c.psnr[2] + c.psnr[3]) / 2)
    assert math.isnan(c.psnr_at(c.bpp[-1] * 2))
    with pytest.raises(ValueError, match="kodak"):
        references.curves("imagenet")
