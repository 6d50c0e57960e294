"""JPEG side of `inrbench compare`: header-free bytes, byte-target quality search, PSNR/SSIM."""

from __future__ import annotations

import io
import math

import numpy as np
import pytest
from PIL import Image

from bench.compare.codecs import Ladder, create
from bench.compare.jpeg import (
    JpegParseError,
    exhaustive_quality,
    parse_layout,
    payload_bytes,
    search_quality,
)
from bench.compare.quality import psnr, ssim, ssim_window


def _photo(name: str, size: int) -> np.ndarray:
    import skimage.data
    from skimage.transform import resize

    a = getattr(skimage.data, name)()
    return (resize(a[..., :3], (size, size), anti_aliasing=True) * 255).round().astype(np.uint8)


def _pil_jpeg(img: np.ndarray, quality: int, **kw) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(img).save(buf, format="JPEG", quality=quality, **kw)
    return buf.getvalue()


def _independent_payload(data: bytes) -> int:
    """Single-scan baseline file with no FFDA inside its tables: the first FFDA is the SOS,
    its 2-byte length follows, the scan data runs to the EOI in the last 2 bytes."""
    sos = data.index(b"\xff\xda")
    seg_len = data[sos + 2] * 256 + data[sos + 3]
    assert data[-2:] == b"\xff\xd9"
    return len(data) - 2 - (sos + 2 + seg_len)


@pytest.mark.parametrize("size,quality", [(32, 75), (64, 30), (224, 90)])
def test_header_free_bytes_match_independent_sos_offset(size, quality):
    data = _pil_jpeg(_photo("astronaut", size), quality)
    lay = parse_layout(data)
    assert lay.payload_bytes == _independent_payload(data)
    assert len(lay.scans) == 1 and lay.scans[0][1] == len(data) - 2
    # PIL's 4:2:0 baseline header (JFIF APP0, 2 DQT, SOF0, 4 DHT, SOS, EOI) is ~600 bytes
    assert 550 < lay.header_bytes < 700


def test_header_free_bytes_ignore_markers_inside_a_comment():
    img = _photo("coffee", 32)
    data = _pil_jpeg(img, 60)
    # A COM segment whose payload holds a fake SOS marker: only a real marker walk skips it.
    payload = b"\xff\xda\x00\x08 fake SOS inside a comment"
    com = b"\xff\xfe" + (len(payload) + 2).to_bytes(2, "big") + payload
    spliced = data[:2] + com + data[2:]
    lay = parse_layout(spliced)
    assert lay.payload_bytes == payload_bytes(data)
    assert lay.header_bytes == parse_layout(data).header_bytes + len(com)
    assert spliced.index(b"\xff\xda") == 6  # a naive search would land in the comment
    jpeg = create("jpeg")
    np.testing.assert_array_equal(jpeg.decode(spliced), jpeg.decode(data))


def test_restart_markers_and_progressive_scans_count_as_payload():
    img = _photo("chelsea", 64)
    rst = _pil_jpeg(img, 50, restart_marker_blocks=1)
    assert rst.count(b"\xff\xd0") >= 1
    assert payload_bytes(rst) == _independent_payload(rst)
    prog = parse_layout(_pil_jpeg(img, 50, progressive=True))
    assert len(prog.scans) > 1
    assert prog.payload_bytes == sum(e - s for s, e in prog.scans)


def test_truncated_or_foreign_bytes_are_refused():
    data = _pil_jpeg(_photo("astronaut", 32), 50)
    with pytest.raises(JpegParseError, match="SOI"):
        parse_layout(b"\x89PNG" + data)
    with pytest.raises(JpegParseError):
        parse_layout(data[: len(data) // 2])


@pytest.mark.parametrize("name,size", [("astronaut", 32), ("rocket", 32), ("coffee", 48)])
def test_binary_search_equals_exhaustive_scan(name, size):
    ladder = Ladder(create("jpeg"), _photo(name, size))
    for key in ("file", "header-free"):
        sz = ladder.size(key)
        sizes = sorted({sz(q) for q in range(1, 101)})
        targets = [sizes[0] - 1] + [t + d for t in sizes for d in (-1, 0, 1)] + [sizes[-1] + 500]
        for t in targets:
            assert search_quality(sz, t) == exhaustive_quality(sz, t), (key, t)
    assert exhaustive_quality(ladder.size("file"), ladder(1).file_bytes - 1) is None  # below q=1: unreachable


def test_repair_window_recovers_a_non_monotone_dip():
    sizes = {q: 10 * q for q in range(1, 101)}
    sizes[61] = 590  # q=61 smaller than q=60, as libjpeg sometimes does
    size = sizes.__getitem__
    assert exhaustive_quality(size, 595) == 61
    assert search_quality(size, 595, window=0) == 59  # plain binary search misses it
    assert search_quality(size, 595, window=3) == 61
    sizes[70] = 595  # a dip further than the window above the answer: a documented miss
    assert exhaustive_quality(size, 595) == 70
    assert search_quality(size, 595, window=3) == 61
    assert search_quality(size, 5) is None and exhaustive_quality(size, 5) is None


def test_psnr_follows_the_clamp_round_convention_by_hand():
    original = np.full((1, 2, 2, 3), 100, np.uint8)
    # pixels: 100.4 -> 100 (d 0), 101.6 -> 102 (d 2), 1.2 -> clamp 255 (d 155), -0.1 -> 0 (d -100)
    vals = np.array([100.4 / 255, 101.6 / 255, 1.2, -0.1]).reshape(1, 2, 2, 1)
    decoded = np.repeat(vals, 3, axis=-1).astype(np.float32)
    mse = (0**2 + 2**2 + 155**2 + 100**2) / 4  # = 8507.25, per channel identical
    expected = 10 * math.log10(255**2 / mse)
    assert psnr(decoded, original)[0] == pytest.approx(expected, abs=1e-6)
    assert expected == pytest.approx(8.8336, abs=1e-3)


def _reference_ssim(x: np.ndarray, y: np.ndarray) -> float:
    """The documented convention written out: 7x7 uniform window, sample covariance,
    K1 0.01, K2 0.03, L 255, 3-pixel border cropped, mean over pixels then channels."""
    from scipy.ndimage import uniform_filter

    c1, c2, n = (0.01 * 255) ** 2, (0.03 * 255) ** 2, 49
    vals = []
    for c in range(3):
        a, b = x[..., c].astype(np.float64), y[..., c].astype(np.float64)
        ua, ub = uniform_filter(a, 7), uniform_filter(b, 7)
        va = (uniform_filter(a * a, 7) - ua * ua) * n / (n - 1)
        vb = (uniform_filter(b * b, 7) - ub * ub) * n / (n - 1)
        cov = (uniform_filter(a * b, 7) - ua * ub) * n / (n - 1)
        s = ((2 * ua * ub + c1) * (2 * cov + c2)) / ((ua**2 + ub**2 + c1) * (va + vb + c2))
        vals.append(s[3:-3, 3:-3].mean())
    return float(np.mean(vals))


def test_ssim_window_and_convention_at_32x32():
    assert ssim_window(32, 32) == 7 and ssim_window(6, 9) == 5 and ssim_window(5, 5) == 5
    img = _photo("astronaut", 32)[None]
    assert ssim(img, img)[0] == pytest.approx(1.0)
    noisy = np.clip(img.astype(int) + np.random.default_rng(0).integers(-40, 41, img.shape), 0, 255).astype(np.uint8)
    got = ssim(noisy, img)[0]
    assert got == pytest.approx(_reference_ssim(noisy[0], img[0]), abs=1e-9)
    assert got < 0.95
