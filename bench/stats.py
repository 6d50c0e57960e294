"""Intervals and tests behind every comparison the report makes (numpy/scipy). One sample or no spread
gives NaN bounds and ``why``, never a zero-width interval; formatting rounds bounds outward.
Which test for what, and why these units: docs/measurement.md."""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

CONFIDENCE = 0.95
N_RESAMPLES = 2000
SEED = 0
NO_DIFFERENCE = "no difference detected"
# fewest items for a bootstrap interval of a mean; below it Student's t (a bootstrap of few items is too
# narrow: docs/measurement.md, "Few items")
BOOTSTRAP_MIN_N = 30
ONE_SAMPLE = "one sample"
NO_SPREAD = "no spread"


@dataclass(frozen=True)
class Interval:
    """A point estimate with its confidence interval; NaN everywhere when it cannot be computed."""

    value: float
    lo: float
    hi: float
    n: int = 0  # samples behind it (smaller of the two for two-sample statistics)
    why: str = ""  # where there is a value but no interval: why not (``ONE_SAMPLE``, ``NO_SPREAD``, ...)

    @property
    def ok(self) -> bool:
        return all(math.isfinite(v) for v in (self.value, self.lo, self.hi))

    def excludes(self, v: float) -> bool:
        """True when ``v`` lies outside the interval (the difference from ``v`` is supported)."""
        return self.ok and (v < self.lo or v > self.hi)


NAN = Interval(math.nan, math.nan, math.nan, 0)


def _scipy():
    """``scipy.stats``, imported on first use: ~1.3 s that a fitting process (``inr.meta`` imports this
    module) never needs."""
    from scipy import stats

    return stats


def _clean(x: Sequence[float]) -> np.ndarray:
    a = np.asarray(x, dtype=float).ravel()
    return a[np.isfinite(a)]


def _bootstrap(data: tuple[np.ndarray, ...], statistic, seed: int, n_resamples: int,
               confidence: float) -> tuple[float, float]:
    for method in ("BCa", "percentile"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # BCa on degenerate data warns and returns NaN: fall back
            res = _scipy().bootstrap(data, statistic, n_resamples=n_resamples, confidence_level=confidence,
                                  method=method, vectorized=True, rng=np.random.default_rng(seed))
        lo, hi = (float(v) for v in res.confidence_interval)
        if math.isfinite(lo) and math.isfinite(hi):
            return lo, hi
    return math.nan, math.nan


def bonferroni(comparisons: int, confidence: float = CONFIDENCE) -> float:
    """The per-comparison confidence that keeps ``comparisons`` intervals at ``confidence`` together
    (Bonferroni), so valid for a pair picked after looking (the slowest / fastest of k ranks)."""
    return 1.0 - (1.0 - confidence) / max(int(comparisons), 1)


def _no_spread(x: np.ndarray) -> bool:
    """All values equal, up to float rounding."""
    return bool(np.ptp(x) <= 1e-9 * max(1.0, float(np.abs(x).max())))


def log_ratio_ci(base: Sequence[float], other: Sequence[float], confidence: float = CONFIDENCE) -> Interval:
    """exp(mean log base - mean log other), the ratio of geometric means of two independent samples (each
    value one unit), with Welch's t interval on the logs: ``unit_ratio_ci`` with one value a unit."""
    return unit_ratio_ci([[v] for v in _clean(base)], [[v] for v in _clean(other)], confidence)


def unit_ratio_ci(base_units: Sequence[Sequence[float]], other_units: Sequence[Sequence[float]],
                  confidence: float = CONFIDENCE) -> Interval:
    """Ratio of epoch times with the process as the unit (its median epoch counts once): the ratio of
    geometric means with Welch's t interval on the logs; >= 2 units a side for an interval."""
    meds = []
    for units in (base_units, other_units):
        m = [float(np.median(u)) for u in (_clean(u) for u in units) if u.size]
        meds.append(np.log([v for v in m if v > 0]))
    a, b = meds
    n = int(min(a.size, b.size))
    if n == 0:
        return NAN
    value = float(np.exp(a.mean() - b.mean()))
    if n < 2:
        return Interval(value, math.nan, math.nan, n, ONE_SAMPLE)
    if _no_spread(a) and _no_spread(b):
        return Interval(value, math.nan, math.nan, n, NO_SPREAD)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # near-identical logs on one side: scipy warns, the interval stands
        ci = _scipy().ttest_ind(a, b, equal_var=False).confidence_interval(confidence)
    return Interval(value, float(np.exp(ci.low)), float(np.exp(ci.high)), n)


def wilson(k: int, n: int, confidence: float = CONFIDENCE) -> Interval:
    """Proportion ``k/n`` with its Wilson score interval."""
    if n <= 0:
        return NAN
    ci = _scipy().binomtest(int(k), int(n)).proportion_ci(confidence_level=confidence, method="wilson")
    return Interval(k / n, float(ci.low), float(ci.high), int(n))


@dataclass(frozen=True)
class McNemar:
    """Exact McNemar test of paired correct/incorrect outcomes of A and B on the same items."""

    n: int  # paired items
    only_a: int  # A right, B wrong
    only_b: int  # A wrong, B right
    p_value: float

    def significant(self, alpha: float = 1 - CONFIDENCE) -> bool:
        return self.p_value < alpha


def mcnemar(a_correct: Sequence[bool], b_correct: Sequence[bool]) -> McNemar:
    """Exact (binomial) McNemar test; ``p = 1`` when there is no discordant pair."""
    a = np.asarray(a_correct, dtype=bool)
    b = np.asarray(b_correct, dtype=bool)
    if a.shape != b.shape:
        raise ValueError(f"paired outcomes differ in shape: {a.shape} vs {b.shape}")
    only_a, only_b = int((a & ~b).sum()), int((~a & b).sum())
    p = 1.0 if only_a + only_b == 0 else float(_scipy().binomtest(only_a, only_a + only_b, 0.5).pvalue)
    return McNemar(int(a.size), only_a, only_b, min(1.0, p))


def paired_diff_method(n: int) -> str:
    """Which interval ``paired_diff_ci`` (and ``geometric_mean_ci``, on the logs) gives over ``n`` items:
    ``"none"``, ``"t"`` or ``"bootstrap"``."""
    return "none" if n < 2 else ("t" if n < BOOTSTRAP_MIN_N else "bootstrap")


def _t_interval(d: np.ndarray, confidence: float) -> Interval:
    """Mean of ``d`` with the one-sample t interval; none below 2 units or without spread."""
    if d.size == 0:
        return NAN
    value = float(d.mean())
    if d.size < 2:
        return Interval(value, math.nan, math.nan, int(d.size), ONE_SAMPLE)
    if _no_spread(d):
        return Interval(value, math.nan, math.nan, int(d.size), NO_SPREAD)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # near-identical values: scipy warns, the interval stands
        ci = _scipy().ttest_1samp(d, 0.0).confidence_interval(confidence)
    return Interval(value, float(ci.low), float(ci.high), int(d.size))


def _mean_interval(d: np.ndarray, seed: int, n_resamples: int, confidence: float) -> Interval:
    """Mean of ``d``: Student's t below ``BOOTSTRAP_MIN_N`` items, a bootstrap from there."""
    if paired_diff_method(d.size) != "bootstrap":
        return _t_interval(d, confidence)
    if _no_spread(d):
        return Interval(float(d.mean()), math.nan, math.nan, int(d.size), NO_SPREAD)
    lo, hi = _bootstrap((d,), np.mean, seed, n_resamples, confidence)
    return Interval(float(d.mean()), lo, hi, int(d.size))


def paired_diff_ci(x: Sequence[float], y: Sequence[float], seed: int = SEED,
                   n_resamples: int = N_RESAMPLES, confidence: float = CONFIDENCE) -> Interval:
    """Mean of ``x - y`` over paired items: a bootstrap interval from ``BOOTSTRAP_MIN_N`` pairs, Student's t
    below; one pair or no spread: the value, no interval."""
    return _mean_interval(_paired_differences(x, y), seed, n_resamples, confidence)


def mean_ci(x: Sequence[float], confidence: float = CONFIDENCE) -> Interval:
    """Mean of a few independent units (one accuracy per training seed) with Student's t interval."""
    return _t_interval(_clean(x), confidence)


def paired_mean_diff_ci(x: Sequence[float], y: Sequence[float], confidence: float = CONFIDENCE) -> Interval:
    """Mean of ``x - y`` over a few paired units (accuracies at the same seeds) with the paired t interval."""
    return _t_interval(_paired_differences(x, y), confidence)


def _paired_differences(x: Sequence[float], y: Sequence[float]) -> np.ndarray:
    """``x - y`` of equal-length samples, pairs with a non-finite side dropped."""
    a, b = np.asarray(x, dtype=float).ravel(), np.asarray(y, dtype=float).ravel()
    if a.shape != b.shape:
        raise ValueError(f"paired samples differ in length: {a.size} vs {b.size}")
    d = a - b
    return d[np.isfinite(d)]


def geometric_mean_ci(x: Sequence[float], seed: int = SEED, n_resamples: int = N_RESAMPLES,
                      confidence: float = CONFIDENCE) -> Interval:
    """Geometric mean of positive ratios (per-image savings) with the exp of the logs' interval, chosen as
    ``paired_diff_ci`` chooses."""
    a = _clean(x)
    a = a[a > 0]
    if a.size == 0:
        return NAN
    iv = _mean_interval(np.log(a), seed, n_resamples, confidence)
    return Interval(float(np.exp(iv.value)), float(np.exp(iv.lo)), float(np.exp(iv.hi)), iv.n, iv.why)


def _outward(lo: float, hi: float, digits: int) -> tuple[float, float]:
    """``lo`` rounded down and ``hi`` rounded up to ``digits`` decimals: the printed interval holds the computed one."""
    k = 10.0 ** digits
    return math.floor(lo * k + 1e-9) / k, math.ceil(hi * k - 1e-9) / k


def _digits(lo: float, hi: float, null: float, digits: int) -> int:
    """``digits``, or more (up to 4 more) where an interval that excludes ``null`` would print a bound on it."""
    for d in range(digits, digits + 5):
        rlo, rhi = _outward(lo, hi, d)
        if not ((lo > null and rlo <= null) or (hi < null and rhi >= null)):
            return d
    return digits + 4


def _num(v: float, digits: int) -> str:
    """``v`` to ``digits`` decimals, never ``-0.00``."""
    t = f"{v:.{digits}f}"
    return t[1:] if t.startswith("-") and float(t) == 0 else t


def _no_interval(iv: Interval) -> str:
    return iv.why or (ONE_SAMPLE if iv.n < 2 else NO_SPREAD)


def fmt_ratio(iv: Interval) -> str:
    """``1.21x [0.97-1.48]``, ``no difference detected [0.97-1.48]``, ``0.91x (no spread: no interval, not a
    result)`` or ``—``; bounds rounded outward, with more digits where one would round onto 1.00."""
    if not iv.ok:
        if math.isfinite(iv.value):
            return f"{iv.value:.2f}x ({_no_interval(iv)}: no interval, not a result)"
        return "—"
    d = _digits(iv.lo, iv.hi, 1.0, 2)
    lo, hi = _outward(iv.lo, iv.hi, d)
    span = f"[{_num(lo, d)}-{_num(hi, d)}]"
    return f"{_num(iv.value, d)}x {span}" if iv.excludes(1.0) else f"{NO_DIFFERENCE} {span}"


def fmt_diff(iv: Interval, scale: float = 100.0, unit: str = "points", digits: int = 1) -> str:
    """``-1.2 points [-3.0, -0.1]`` or ``no difference detected [-3.0, 0.6]`` (values times ``scale``), bounds
    rounded outward, never ``-0.0``; 2+ units without an interval: the value and ``why``; fewer: ``—``."""
    if not iv.ok:
        if iv.n >= 2 and math.isfinite(iv.value):
            why = _no_interval(iv)
            alike = f", the same in all {iv.n}" if why == NO_SPREAD else ""
            return f"{scale * iv.value:+.{digits}f} {unit}{alike} ({why}: no interval, not a result)"
        return "—"
    v, lo, hi = scale * iv.value, scale * iv.lo, scale * iv.hi
    d = _digits(lo, hi, 0.0, digits)
    rlo, rhi = _outward(lo, hi, d)
    span = f"[{_num(rlo, d)}, {_num(rhi, d)}]"
    return f"{'+' if v >= 0 else ''}{_num(v, d)} {unit} {span}" if iv.excludes(0.0) else f"{NO_DIFFERENCE} {span}"
