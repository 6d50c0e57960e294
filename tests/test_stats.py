"""bench.stats against known distributions and hand-computed values."""

from __future__ import annotations

import math

import numpy as np
import pytest

from bench import stats as S

TRIALS = 200
# 95% intervals over 200 independent trials: the hit count is Binomial(200, 0.95), sd ~ 3 hits;
# [180, 198] hits is about -5 to +1 sd and fails for a badly calibrated method.
COVERAGE_BAND = (0.90, 0.99)


def pooled_ratio(base, other, seed: int = 0) -> S.Interval:
    """The two-sample bootstrap of medians over pooled samples that ``unit_ratio_ci`` replaced: the
    baseline the tests show failing."""
    a, b = np.asarray(base, dtype=float), np.asarray(other, dtype=float)
    lo, hi = S._bootstrap((a, b), lambda x, y, axis=-1: np.median(x, axis=axis) / np.median(y, axis=axis),
                          seed, S.N_RESAMPLES, S.CONFIDENCE)
    return S.Interval(float(np.median(a) / np.median(b)), lo, hi, min(a.size, b.size))


def test_fmt_ratio_prints_a_value_without_interval_and_nothing():
    assert S.fmt_ratio(S.Interval(2.0, math.nan, math.nan, 6, S.NO_SPREAD)) == "2.00x (no spread: no interval, not a result)"
    assert S.fmt_ratio(S.NAN) == "—"
    fast = S.Interval(2.0, 1.9712, 2.0301)
    assert S.fmt_ratio(fast) == "2.00x [1.97-2.04]"  # rounded outward
    assert S.fmt_ratio(S.Interval(1.0, 0.97, 1.04)).startswith("no difference detected [")


def test_wilson_matches_the_reference_values():
    iv = S.wilson(8, 10)  # the textbook example: 8/10 -> [0.490, 0.943]
    assert iv.value == 0.8
    assert iv.lo == pytest.approx(0.4902, abs=5e-4) and iv.hi == pytest.approx(0.9433, abs=5e-4)
    # the closed form: (p + z^2/2n +- z sqrt(p(1-p)/n + z^2/4n^2)) / (1 + z^2/n)
    k, n, z = 75, 80, 1.959963984540054
    p = k / n
    c, h = p + z * z / (2 * n), z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    iv = S.wilson(k, n)
    assert iv.lo == pytest.approx((c - h) / (1 + z * z / n), abs=1e-9)
    assert iv.hi == pytest.approx((c + h) / (1 + z * z / n), abs=1e-9)
    assert S.wilson(10, 10).hi == 1.0 and S.wilson(10, 10).lo < 1.0
    assert not S.wilson(0, 0).ok


def test_mcnemar_exact_p_value_by_hand():
    # 8 images only A gets right, 2 only B, 30 both, 10 neither:
    # p = 2 * P(X <= 2), X ~ Bin(10, 1/2) = 2 * (1 + 10 + 45) / 1024 = 0.109375
    a = [True] * 8 + [False] * 2 + [True] * 30 + [False] * 10
    b = [False] * 8 + [True] * 2 + [True] * 30 + [False] * 10
    t = S.mcnemar(a, b)
    assert (t.n, t.only_a, t.only_b) == (50, 8, 2)
    assert t.p_value == pytest.approx(112 / 1024, abs=1e-12) and not t.significant()
    t = S.mcnemar([True] * 10 + [False] * 5, [False] * 10 + [False] * 5)  # 10 vs 0: p = 2/1024
    assert t.p_value == pytest.approx(2 / 1024) and t.significant()
    assert S.mcnemar([True, False], [True, False]).p_value == 1.0  # no discordant pair
    with pytest.raises(ValueError, match="differ in shape"):
        S.mcnemar([True], [True, False])


def test_paired_diff_ci_covers_a_known_mean_difference():
    rng = np.random.default_rng(5)
    hits = 0
    for i in range(TRIALS):
        y = rng.normal(30.0, 3.0, 40)  # per-image PSNR of one method
        x = y + rng.normal(0.5, 1.0, 40)  # the other: +0.5 dB on average, paired per image
        iv = S.paired_diff_ci(x, y, seed=i)
        hits += iv.lo <= 0.5 <= iv.hi
    assert COVERAGE_BAND[0] <= hits / TRIALS <= COVERAGE_BAND[1], hits
    # pairing matters: a constant per-image offset is known exactly despite the spread across images
    # (from BOOTSTRAP_MIN_N images on; fewer equal differences give no interval: tests/test_compare_small_n.py)
    y = rng.normal(30.0, 5.0, S.BOOTSTRAP_MIN_N + 10)
    iv = S.paired_diff_ci(y + 1.0, y)
    assert iv.value == pytest.approx(1.0) and not iv.ok and iv.why == S.NO_SPREAD  # no zero-width interval
    with pytest.raises(ValueError, match="differ in length"):
        S.paired_diff_ci([1.0, 2.0], [1.0])


def test_geometric_mean_ci_of_known_savings():
    from bench.stats import geometric_mean_ci

    iv = geometric_mean_ci([2.0, 8.0])  # exp(mean(log)) = 4
    assert abs(iv.value - 4.0) < 1e-12 and iv.n == 2 and iv.lo <= 4.0 <= iv.hi
    rng = np.random.default_rng(0)
    x = np.exp(rng.normal(np.log(3.0), 0.3, 200))
    iv = geometric_mean_ci(x)
    assert 2.8 < iv.lo < 3.0 < iv.hi < 3.2
    one = geometric_mean_ci([5.0])  # one item: the value, no interval
    assert one.value == pytest.approx(5.0) and not one.ok and math.isnan(one.lo) and one.why == S.ONE_SAMPLE
    assert not geometric_mean_ci([]).ok
    assert geometric_mean_ci([3.0]).ok is False and math.isnan(geometric_mean_ci([3.0]).hi)


def test_geometric_mean_ci_is_the_t_interval_of_the_logs_below_30():
    from scipy import stats

    x = [4.4, 1.9, 0.9, 55.6, 2.0, 3.1, 7.5, 1.2]
    iv = S.geometric_mean_ci(x)
    ci = stats.ttest_1samp(np.log(x), 0.0).confidence_interval(0.95)
    assert iv.value == pytest.approx(math.exp(np.log(x).mean()))
    assert (iv.lo, iv.hi) == pytest.approx((math.exp(ci.low), math.exp(ci.high)))
    assert S.paired_diff_method(8) == "t" and S.paired_diff_method(30) == "bootstrap"


def test_geometric_mean_ci_coverage_at_few_items():
    """Null draws (lognormal, geometric mean 1): the bootstrap this replaced excluded 1.0 in 49.5% at n = 2,
    11.9% at n = 8, 8.8% at n = 15; the t interval on the logs about 5% (300 draws each; 12, 19, 17 with this seed)."""
    rng = np.random.default_rng(11)
    for n in (2, 8, 15):
        false = sum(S.geometric_mean_ci(np.exp(rng.normal(0.0, 0.5, n))).excludes(1.0) for _ in range(300))
        assert false <= 27, (n, false)  # 9%: about +3 sd over 5% of 300


def test_zero_spread_gives_no_interval_and_says_why():
    iv = S.unit_ratio_ci([[1.0], [1.0]], [[1.1], [1.1]])
    assert not iv.ok and iv.value == pytest.approx(1 / 1.1) and iv.n == 2 and iv.why == S.NO_SPREAD
    assert S.fmt_ratio(iv) == "0.91x (no spread: no interval, not a result)"
    g = S.geometric_mean_ci([5000 / 5001] * 8)
    assert not g.ok and not g.excludes(1.0) and S.fmt_ratio(g) == "1.00x (no spread: no interval, not a result)"
    assert S.fmt_ratio(S.Interval(3.0, math.nan, math.nan, 1)) == "3.00x (one sample: no interval, not a result)"


def test_fmt_rounds_outward_and_never_hides_the_null():
    assert S.fmt_ratio(S.Interval(1.003, 1.001, 1.006)) == "1.003x [1.001-1.006]"  # was 1.00x [1.00-1.01]
    assert S.fmt_ratio(S.Interval(1.02, 0.996, 1.08)) == f"{S.NO_DIFFERENCE} [0.99-1.08]"
    assert S.fmt_ratio(S.Interval(0.5, 0.4444, 0.5551)) == "0.50x [0.44-0.56]"  # lo down, hi up
    assert S.fmt_ratio(S.Interval(0.99, 0.97, 0.9992)) == "0.9900x [0.9700-0.9992]"  # hi would round up onto 1
    assert S.fmt_diff(S.Interval(0.002, 0.000004, 0.003)) == "+0.2000 points [0.0004, 0.3000]"
    assert S.fmt_diff(S.Interval(0.002, 0.0004, 0.003)) == "+0.20 points [0.04, 0.30]"  # was [0.0, 0.3]
    assert S.fmt_diff(S.Interval(0.001, -0.0, 0.003)) == f"{S.NO_DIFFERENCE} [0.0, 0.3]"  # never -0.0
    assert S.fmt_diff(S.Interval(-0.001, -0.00001, 0.003)) == f"{S.NO_DIFFERENCE} [-0.1, 0.3]"


def _processes(rng, k: int, m: int, between: float, within: float, scale: float = 1.0) -> list[np.ndarray]:
    """k processes of m epoch times: each process has its own level (lognormal, sd ``between``)."""
    return [scale * np.exp(rng.normal(0, between) + rng.normal(0, within, m)) for _ in range(k)]


def test_unit_ratio_counts_each_process_once():
    """Equal pipelines, 3 processes of 3 epochs each, processes 8% apart (as on a shared VM): the
    pooled-epoch bootstrap calls a difference far more often than 5%; the process-level Welch
    interval does not, and still finds a 1.3x difference most of the time."""
    rng = np.random.default_rng(0)
    pooled = units = 0
    for _ in range(200):
        a, b = _processes(rng, 3, 3, 0.08, 0.02), _processes(rng, 3, 3, 0.08, 0.02)
        pooled += pooled_ratio(np.concatenate(a), np.concatenate(b)).excludes(1.0)
        units += S.unit_ratio_ci(a, b).excludes(1.0)
    assert pooled >= 25  # 34 of 200 with this seed
    assert units <= 12  # 5 of 200 with this seed
    found = sum(S.unit_ratio_ci(_processes(rng, 3, 3, 0.08, 0.02, 1.3), _processes(rng, 3, 3, 0.08, 0.02)).lo > 1.0
                for _ in range(100))
    assert found >= 55  # 71 of 100 with this seed


def test_unit_ratio_value_and_one_process():
    a, b = [np.array([2.0, 2.2, 1.8]), np.array([4.0])], [np.array([1.0, 1.0]), np.array([2.0, 2.0])]
    iv = S.unit_ratio_ci(a, b)  # process medians 2, 4 against 1, 2: geometric means 2.83 / 1.41
    assert iv.value == pytest.approx(2.0) and iv.n == 2 and iv.lo < 2.0 < iv.hi
    same = S.unit_ratio_ci([np.array([2.0, 2.0])] * 2, [np.array([1.0])] * 3)  # no spread: the value, no interval
    assert same.value == pytest.approx(2.0) and not same.ok and same.why == S.NO_SPREAD
    one = S.unit_ratio_ci([np.array([2.0, 2.1])], b)
    assert one.value == pytest.approx(2.05 / np.sqrt(2)) and not one.ok and one.n == 1
    assert S.fmt_ratio(one) == "1.45x (one sample: no interval, not a result)"
    wide = S.unit_ratio_ci([np.array([2.0]), np.array([2.4])], [np.array([1.0]), np.array([1.2])])
    assert wide.lo < 2.0 < wide.hi  # two processes a side: Welch's t with ~2 degrees of freedom


def test_mean_ci_is_students_t_interval():
    from scipy import stats

    x = [0.9, 0.825, 0.75]  # e.g. one test accuracy per training seed
    iv = S.mean_ci(x)
    ci = stats.ttest_1samp(x, 0).confidence_interval()
    assert iv.value == pytest.approx(0.825) and (iv.lo, iv.hi) == pytest.approx((ci.low, ci.high)) and iv.n == 3
    one = S.mean_ci([0.8, float("nan")])  # one unit: the value, no interval
    assert one.value == 0.8 and not one.ok and one.n == 1
    flat = S.mean_ci([0.7, 0.7])  # no spread: no interval (two equal accuracies prove no zero spread)
    assert flat.value == 0.7 and not flat.ok and flat.n == 2
    assert not S.mean_ci([]).ok


def test_paired_mean_diff_ci_is_the_paired_t_interval():
    from scipy import stats

    rng = np.random.default_rng(7)
    hits = 0
    for _ in range(TRIALS):  # 4 seeds; a seed-level effect shared by both sides, +0.02 between them
        seed_effect = rng.normal(0.8, 0.05, 4)
        x = seed_effect + 0.02 + rng.normal(0, 0.01, 4)
        y = seed_effect + rng.normal(0, 0.01, 4)
        iv = S.paired_mean_diff_ci(x, y)
        ci = stats.ttest_rel(x, y).confidence_interval()
        assert (iv.lo, iv.hi) == pytest.approx((ci.low, ci.high))
        hits += iv.lo <= 0.02 <= iv.hi
    assert COVERAGE_BAND[0] <= hits / TRIALS <= COVERAGE_BAND[1], hits
    const = S.paired_mean_diff_ci([0.9, 0.8, 0.7], [0.8, 0.7, 0.6])  # a constant difference: no interval
    assert const.value == pytest.approx(0.1) and not const.ok and const.n == 3 and not const.excludes(0.0)
    assert not S.paired_mean_diff_ci([0.9], [0.8]).ok  # one pair: no interval
    with pytest.raises(ValueError, match="differ in length"):
        S.paired_mean_diff_ci([1.0, 2.0], [1.0])


def test_fmt_diff_in_points():
    assert S.fmt_diff(S.Interval(-0.012, -0.03, 0.006)) == f"{S.NO_DIFFERENCE} [-3.0, 0.6]"
    assert S.fmt_diff(S.Interval(-0.012, -0.03, -0.001)) == "-1.2 points [-3.0, -0.1]"
    assert S.fmt_diff(S.Interval(0.1, math.nan, math.nan)) == "—"  # one unit
    assert (S.fmt_diff(S.Interval(0.1, math.nan, math.nan, 3))  # three alike: said, not a result
            == "+10.0 points, the same in all 3 (no spread: no interval, not a result)")
    # another reason is said as it is, not as "the same in all"
    assert (S.fmt_diff(S.Interval(0.1, math.nan, math.nan, 4, "fewer than 6 samples a side"))
            == "+10.0 points (fewer than 6 samples a side: no interval, not a result)")
