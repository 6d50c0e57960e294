"""compare on a few images (``--limit 4``): the paired PSNR difference gets Student's t interval, not a
bootstrap of 4 items, and says so; one image gets no interval. ``bench.stats.paired_diff_ci`` below
``BOOTSTRAP_MIN_N`` pairs is the t interval, and its coverage holds where the bootstrap's did not."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from scipy import stats as st

from bench import stats as S
from bench.compare.core import COLUMNS
from bench.compare.table import markdown, psnr_diff_text, summarize


def test_below_the_minimum_the_paired_interval_is_students_t():
    x = np.array([31.2, 28.4, 35.0, 30.1])
    y = np.array([27.9, 26.0, 30.2, 28.3])
    iv = S.paired_diff_ci(x, y)
    ci = st.ttest_1samp(x - y, 0.0).confidence_interval(0.95)
    assert iv.value == pytest.approx(np.mean(x - y)) and iv.n == 4
    assert (iv.lo, iv.hi) == pytest.approx((ci.low, ci.high))
    assert S.paired_diff_method(4) == "t" and S.paired_diff_method(S.BOOTSTRAP_MIN_N) == "bootstrap"
    assert S.paired_diff_method(1) == "none"
    one = S.paired_diff_ci([31.0], [28.0])  # one pair: the value, no interval (it was [3, 3], "certain")
    assert one.value == 3.0 and not one.ok and one.n == 1


def test_from_the_minimum_on_it_is_the_bootstrap():
    rng = np.random.default_rng(1)
    d = rng.normal(0.5, 1.0, S.BOOTSTRAP_MIN_N)
    iv = S.paired_diff_ci(d, np.zeros_like(d))
    lo, hi = S._bootstrap((d,), np.mean, S.SEED, S.N_RESAMPLES, S.CONFIDENCE)
    assert (iv.lo, iv.hi) == (lo, hi)


def test_small_samples_are_covered_at_the_nominal_rate():
    """At n = 5 the BCa bootstrap held the true mean in about 85% of samples; the t interval holds 95%."""
    rng = np.random.default_rng(7)
    trials, hits = 300, 0
    for i in range(trials):
        d = rng.normal(0.5, 1.0, 5)
        iv = S.paired_diff_ci(d, np.zeros(5), seed=i)
        hits += iv.lo <= 0.5 <= iv.hi
    assert 0.92 <= hits / trials <= 0.98, hits


def _per_image(n: int) -> pd.DataFrame:
    rng = np.random.default_rng(0)
    inr = rng.normal(30.0, 4.0, n)
    jpeg = inr - 2.0 + rng.normal(0.0, 0.5, n)
    rows = []
    for i in range(n):
        base = dict.fromkeys([*COLUMNS, "bpp", "bpp_header_free", "pct_raw"], np.nan)
        rows.append({**base, "method": "inr", "variant": "v", "match": "", "image": i, "status": "ok",
                     "file_bytes": 500.0, "psnr": inr[i], "ssim": 0.9})
        rows.append({**base, "method": "jpeg-matched", "variant": "v", "match": "file", "image": i, "status": "ok",
                     "quality": 50.0, "target_bytes": 500.0, "file_bytes": 480.0, "psnr": jpeg[i], "ssim": 0.9})
    return pd.DataFrame(rows)


def test_a_compare_of_four_images_says_its_interval_is_a_t_interval():
    s = summarize(_per_image(4))
    r = s[s["method"] == "jpeg-matched"].iloc[0]
    assert r["psnr_diff_interval"] == "t" and r["n_ok"] == 4
    text = psnr_diff_text(r)
    assert text.startswith(f"{r['psnr_diff']:+.2f} dB [") and text.endswith(
        f"(t interval, 4 images: fewer than {S.BOOTSTRAP_MIN_N} for a bootstrap)")
    md = markdown(s, {"image_size": (8, 8), "dataset": "t", "split": "test", "n_images": 4}, _per_image(4))
    assert "(t interval, 4 images" in md and f"Student's t on the per-image differences below {S.BOOTSTRAP_MIN_N}" in md
    many = summarize(_per_image(S.BOOTSTRAP_MIN_N))
    r = many[many["method"] == "jpeg-matched"].iloc[0]
    assert r["psnr_diff_interval"] == "bootstrap" and "t interval" not in psnr_diff_text(r)


def test_one_image_is_no_result():
    s = summarize(_per_image(1))
    r = s[s["method"] == "jpeg-matched"].iloc[0]
    assert psnr_diff_text(r) == f"{r['psnr_diff']:+.2f} dB (one image: no interval, not a result)"


def test_equal_differences_on_a_few_images_are_no_interval_and_the_table_keeps_the_value():
    """2-29 equal per-image differences: the t path says no interval (no spread is no proof of zero
    spread), never a zero-width [v, v]; the table prints the value with that reason, not a bare dash."""
    import math

    from bench import stats
    from bench.compare.table import psnr_diff_text

    iv = stats.paired_diff_ci([31.5, 30.5, 29.5], [30.0, 29.0, 28.0])
    assert iv.value == 1.5 and math.isnan(iv.lo) and math.isnan(iv.hi) and iv.n == 3
    text = psnr_diff_text({"psnr_diff": iv.value, "psnr_diff_lo": iv.lo, "psnr_diff_hi": iv.hi, "psnr_diff_n": 3,
                           "psnr_diff_interval": "t"})
    assert text == "+1.50 dB (the same on all 3 images: no spread, no interval, not a result)"


def test_the_text_counts_the_images_in_the_interval_not_the_ok_rows():
    """Two images, one with a NaN INR PSNR: the interval has one pair (no interval), and the text says one
    image, not "the same on all 2 images" (it read ``n_ok``, which counts both)."""
    df = _per_image(2)
    df.loc[(df["method"] == "inr") & (df["image"] == 1), "psnr"] = np.nan
    r = summarize(df)
    r = r[r["method"] == "jpeg-matched"].iloc[0]
    assert r["n_ok"] == 2 and r["psnr_diff_n"] == 1
    assert psnr_diff_text(r) == f"{r['psnr_diff']:+.2f} dB (one image: no interval, not a result)"


def test_psnr_diff_text_rounds_outward_and_never_onto_zero():
    row = {"psnr_diff": 0.002, "psnr_diff_lo": 0.0004, "psnr_diff_hi": 0.0061, "psnr_diff_n": 8, "n_ok": 8,
           "psnr_diff_interval": "t"}
    tag = f" (t interval, 8 images: fewer than {S.BOOTSTRAP_MIN_N} for a bootstrap)"
    assert psnr_diff_text(row) == "+0.0020 dB [0.0004, 0.0061]" + tag  # was "+0.00 dB [+0.00, +0.01]"
    row.update(psnr_diff=0.1, psnr_diff_lo=-0.0, psnr_diff_hi=0.251)
    assert psnr_diff_text(row) == f"{S.NO_DIFFERENCE} [0.00, 0.26] dB" + tag  # never [-0.00, ...]
