"""Intervals and tests behind every comparison the report makes (numpy/scipy, no hand-rolled stats).

- ``ratio_ci(base, other)``: median(base) / median(other) of two independent samples with a seeded
  two-sample bootstrap interval (``scipy.stats.bootstrap``, BCa; percentile when BCa is degenerate);
  no interval below ``RATIO_MIN_N`` samples a side (a bootstrap of 2-4 samples excluded 1.0 in
  10-32% of equal pairs). No report figure uses it: speedups take ``unit_ratio_ci``.
- ``log_ratio_ci(base, other, confidence)``: ratio of geometric means of two independent samples,
  each value a unit, with Welch's t interval on the logs (``unit_ratio_ci`` with one value a unit).
  ``bonferroni(m)``: the per-comparison confidence that keeps ``m`` intervals at 95% together,
  for a ratio picked after looking (the slowest / fastest of k ranks, ``bench.report.ranks``).
- ``unit_ratio_ci(base_units, other_units)``: the same ratio when each process (one run, all its
  repeats) is one unit (its median epoch): ratio of geometric means with Welch's t interval on
  the logs. The report's speedups use it: epochs, and repeats, of one process are not
  independent samples.
- ``wilson(k, n)``: the Wilson score interval of a proportion
  (``scipy.stats.binomtest(k, n).proportion_ci(method="wilson")``).
- ``mcnemar(a_correct, b_correct)``: exact McNemar test on paired predictions (the same test
  images): discordant pairs ``b`` (only A right) and ``c`` (only B right), two-sided exact
  binomial p-value of ``b`` among ``b + c`` at 1/2 (``scipy.stats.binomtest``).
- ``paired_diff_ci(x, y)``: mean of the per-item differences ``x - y`` with a seeded bootstrap
  interval (BCa), e.g. per-image PSNR of INR minus matched JPEG; below ``BOOTSTRAP_MIN_N`` items,
  Student's t interval on the differences (``paired_diff_method``), and none for one item.
- ``mean_ci(x)``: mean with Student's t interval (``scipy.stats.ttest_1samp``), for a few
  independent units, e.g. test accuracy over training seeds.
- ``paired_mean_diff_ci(x, y)``: mean of ``x - y`` over a few paired units with the paired t
  interval (``scipy.stats.ttest_rel``), e.g. two pipelines' accuracies paired by training seed.

An ``Interval`` ``excludes(v)`` only when ``v`` lies outside ``[lo, hi]``: a difference whose
interval contains the null value (1.0 for a ratio, 0 for a difference) is "no difference detected".
No function returns a zero-width interval: one sample, or no spread at all, gives the value with NaN
bounds and ``why`` says which (2-3 equal values are no proof of zero spread, and a zero-width
interval would read as certainty). ``fmt_ratio`` / ``fmt_diff`` print bounds rounded outward, with
more digits where a bound would otherwise round onto the null value.
"""

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
# Fewest items for a bootstrap interval of a mean (``paired_diff_ci``); below it, Student's t. A
# bootstrap interval resamples the observed items only, so with few it is too narrow: in 400 simulated
# samples each (tests/test_compare_small_n.py re-checks n = 5), the BCa interval of a mean held
# the true mean in 81% of normal samples at n = 4, 87% at n = 6-8, 91-93% at n = 10-15 and 92-94% at
# 20-30, against 94-96% for the t interval at every n; on skewed (lognormal) data the t interval held
# it as often or more at every n up to 30. 30 is where the two agree within simulation noise, and it
# is the usual rule of thumb. The project's other few-unit means (``mean_ci``, ``paired_mean_diff_ci``)
# use the same t interval.
BOOTSTRAP_MIN_N = 30
# Fewest samples a side for ``ratio_ci``'s two-sample bootstrap of medians: with 2-3 a side it excluded 1.0 in
# 32% / 10% of equal pairs (tests/test_stats.py re-simulates it); below, no interval.
RATIO_MIN_N = 6
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


def _clean(x: Sequence[float]) -> np.ndarray:
    a = np.asarray(x, dtype=float).ravel()
    return a[np.isfinite(a)]


def _bootstrap(data: tuple[np.ndarray, ...], statistic, seed: int, n_resamples: int,
               confidence: float) -> tuple[float, float]:
    from scipy import stats

    for method in ("BCa", "percentile"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # BCa on degenerate data warns and returns NaN: fall back
            res = stats.bootstrap(data, statistic, n_resamples=n_resamples, confidence_level=confidence,
                                  method=method, vectorized=True, rng=np.random.default_rng(seed))
        lo, hi = (float(v) for v in res.confidence_interval)
        if math.isfinite(lo) and math.isfinite(hi):
            return lo, hi
    return math.nan, math.nan


def _median_ratio(a: np.ndarray, b: np.ndarray, axis: int = -1) -> np.ndarray:
    return np.median(a, axis=axis) / np.median(b, axis=axis)


def bonferroni(comparisons: int, confidence: float = CONFIDENCE) -> float:
    """The per-comparison confidence that makes ``comparisons`` intervals hold together with
    probability >= ``confidence`` (Bonferroni): ``1 - (1 - confidence) / comparisons``. An interval
    at this level stays valid for a comparison picked after looking at the data (e.g. the slowest
    and fastest of k ranks: ``comparisons = k (k - 1) / 2``)."""
    return 1.0 - (1.0 - confidence) / max(int(comparisons), 1)


def ratio_ci(base: Sequence[float], other: Sequence[float], seed: int = SEED,
             n_resamples: int = N_RESAMPLES, confidence: float = CONFIDENCE) -> Interval:
    """median(base) / median(other) with a two-sample bootstrap interval (each sample resampled
    on its own). For epoch times, > 1 means ``other`` is faster. Needs ``RATIO_MIN_N`` finite samples
    a side for an interval (fewer: the value, no interval, ``why`` says so), and some spread.
    Past 95% confidence the resamples grow so that each tail holds at least 20 of them."""
    n_resamples = max(int(n_resamples), math.ceil(20 / ((1.0 - confidence) / 2)))
    a, b = _clean(base), _clean(other)
    if a.size == 0 or b.size == 0 or np.median(b) <= 0:
        return NAN
    value = float(np.median(a) / np.median(b))
    n = int(min(a.size, b.size))
    if n < RATIO_MIN_N:
        return Interval(value, math.nan, math.nan, n, ONE_SAMPLE if n < 2 else f"fewer than {RATIO_MIN_N} samples a side")
    if _no_spread(a) and _no_spread(b):
        return Interval(value, math.nan, math.nan, n, NO_SPREAD)
    lo, hi = _bootstrap((a, b), _median_ratio, seed, n_resamples, confidence)
    return Interval(value, lo, hi, n)


def _no_spread(x: np.ndarray) -> bool:
    """All values equal, up to float rounding."""
    return bool(np.ptp(x) <= 1e-9 * max(1.0, float(np.abs(x).max())))


def log_ratio_ci(base: Sequence[float], other: Sequence[float], confidence: float = CONFIDENCE) -> Interval:
    """exp(mean log base - mean log other), the ratio of geometric means of two independent samples (each
    value one unit), with Welch's t interval on the logs: ``unit_ratio_ci`` with one value a unit."""
    return unit_ratio_ci([[v] for v in _clean(base)], [[v] for v in _clean(other)], confidence)


def unit_ratio_ci(base_units: Sequence[Sequence[float]], other_units: Sequence[Sequence[float]],
                  confidence: float = CONFIDENCE) -> Interval:
    """Ratio of epoch times when the independent unit is the process, not the epoch or the repeat.

    Epochs and repeats of one process (one ``bench`` run) share its conditions (machine load,
    memory layout, clocks, the interpreter's and the libraries' state), so between processes times
    vary more than within one, and an interval over pooled epochs, or over one process's repeats,
    is too narrow. Measured with the demo's loader settings (6 processes x 3 repeats,
    ``docs/measurement.md``): the process means of raw and torch-jpeg spread 2.3-2.6x more than
    their repeats predict (one-way ANOVA p < 0.01). Here each unit (a process) counts once, as its median epoch time:
    value = exp(mean log median(base unit) - mean log median(other unit)), the ratio of geometric
    means, with Welch's t interval on those logs (``scipy.stats.ttest_ind``, ``equal_var=False``).
    Simulated with 3 units of 3 epochs a side and 8% between-unit noise, it excluded 1.0 in 5 of
    200 equal pairs where the pooled-epoch bootstrap did in 34 (``tests/test_stats.py``). Needs
    >= 2 units a side for an interval; with fewer: the value, no interval (``n`` = the smaller
    number of units)."""
    from scipy import stats

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
    if _no_spread(a) and _no_spread(b):  # equal logs on both sides are no proof of zero spread: no interval
        return Interval(value, math.nan, math.nan, n, NO_SPREAD)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # near-identical logs on one side: scipy warns, the interval stands
        ci = stats.ttest_ind(a, b, equal_var=False).confidence_interval(confidence)
    return Interval(value, float(np.exp(ci.low)), float(np.exp(ci.high)), n)


def wilson(k: int, n: int, confidence: float = CONFIDENCE) -> Interval:
    """Proportion ``k/n`` with its Wilson score interval."""
    from scipy import stats

    if n <= 0:
        return NAN
    ci = stats.binomtest(int(k), int(n)).proportion_ci(confidence_level=confidence, method="wilson")
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
    from scipy import stats

    a = np.asarray(a_correct, dtype=bool)
    b = np.asarray(b_correct, dtype=bool)
    if a.shape != b.shape:
        raise ValueError(f"paired outcomes differ in shape: {a.shape} vs {b.shape}")
    only_a, only_b = int((a & ~b).sum()), int((~a & b).sum())
    p = 1.0 if only_a + only_b == 0 else float(stats.binomtest(only_a, only_a + only_b, 0.5).pvalue)
    return McNemar(int(a.size), only_a, only_b, min(1.0, p))


def _mean(d: np.ndarray, axis: int = -1) -> np.ndarray:
    return np.mean(d, axis=axis)


def paired_diff_method(n: int) -> str:
    """Which interval ``paired_diff_ci`` gives over ``n`` pairs: ``"bootstrap"`` (``BOOTSTRAP_MIN_N`` or
    more), ``"t"`` (2 to ``BOOTSTRAP_MIN_N - 1``), ``"none"`` (fewer than 2)."""
    return "none" if n < 2 else ("t" if n < BOOTSTRAP_MIN_N else "bootstrap")


def paired_diff_ci(x: Sequence[float], y: Sequence[float], seed: int = SEED,
                   n_resamples: int = N_RESAMPLES, confidence: float = CONFIDENCE) -> Interval:
    """Mean of ``x - y`` over paired items with a bootstrap interval (pairs resampled together), or,
    below ``BOOTSTRAP_MIN_N`` pairs, Student's t interval on the differences (a bootstrap of a few
    items is too narrow: see ``BOOTSTRAP_MIN_N``; equal differences there give no interval, as
    ``_t_interval`` says). One pair: the value, no interval. ``BOOTSTRAP_MIN_N`` or more differences
    that are all equal (a constant per-item offset): the value, no interval (``why`` says no spread)."""
    d = _paired_differences(x, y)
    if d.size == 0:
        return NAN
    value = float(d.mean())
    if d.size < 2:
        return Interval(value, math.nan, math.nan, int(d.size), ONE_SAMPLE)
    if paired_diff_method(d.size) == "t":  # a few equal differences are no proof of zero spread: no interval
        return _t_interval(d, confidence)
    if _no_spread(d):  # a constant offset: the value, no zero-width interval
        return Interval(value, math.nan, math.nan, int(d.size), NO_SPREAD)
    lo, hi = _bootstrap((d,), _mean, seed, n_resamples, confidence)
    return Interval(value, lo, hi, int(d.size))


def _t_interval(d: np.ndarray, confidence: float) -> Interval:
    """Mean of ``d`` with the one-sample t interval; no interval below 2 units, nor without spread:
    2-3 equal units (likely for accuracies, which move in steps of one test image) are no evidence
    that the spread is 0, and a zero-width interval would read as certainty."""
    from scipy import stats

    value = float(d.mean())
    if d.size < 2:
        return Interval(value, math.nan, math.nan, int(d.size), ONE_SAMPLE)
    if _no_spread(d):  # no spread (up to float rounding): no interval
        return Interval(value, math.nan, math.nan, int(d.size), NO_SPREAD)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # near-identical values: scipy warns, the interval stands
        ci = stats.ttest_1samp(d, 0.0).confidence_interval(confidence)
    return Interval(value, float(ci.low), float(ci.high), int(d.size))


def mean_ci(x: Sequence[float], confidence: float = CONFIDENCE) -> Interval:
    """Mean of a few independent units (e.g. one accuracy per training seed) with Student's t
    interval (``scipy.stats.ttest_1samp(x).confidence_interval()``). Non-finite values are dropped;
    one unit, or no spread: the value, no interval (``n`` says how many units)."""
    a = _clean(x)
    if a.size == 0:
        return NAN
    return _t_interval(a, confidence)


def paired_mean_diff_ci(x: Sequence[float], y: Sequence[float], confidence: float = CONFIDENCE) -> Interval:
    """Mean of ``x - y`` over a few paired units (e.g. two pipelines' accuracies at the same training
    seeds) with the paired t interval (``scipy.stats.ttest_rel(x, y).confidence_interval()``): the
    units, not items within them, are the samples. Pairs with a non-finite side are dropped; one
    pair, or a constant difference: the value, no interval (``n`` says how many pairs)."""
    d = _paired_differences(x, y)
    return NAN if d.size == 0 else _t_interval(d, confidence)


def _paired_differences(x: Sequence[float], y: Sequence[float]) -> np.ndarray:
    """``x - y`` of equal-length samples, pairs with a non-finite side dropped."""
    a, b = np.asarray(x, dtype=float).ravel(), np.asarray(y, dtype=float).ravel()
    if a.shape != b.shape:
        raise ValueError(f"paired samples differ in length: {a.size} vs {b.size}")
    d = a - b
    return d[np.isfinite(d)]


def geometric_mean_ci(x: Sequence[float], seed: int = SEED, n_resamples: int = N_RESAMPLES,
                      confidence: float = CONFIDENCE) -> Interval:
    """Geometric mean of positive ratios (e.g. per-image savings) with its interval over items: the
    exp of the logs' interval as ``paired_diff_ci`` gives it (``geometric_mean_method``): Student's t
    below ``BOOTSTRAP_MIN_N`` items (a bootstrap of 2-15 items excluded the true value in 9-50% of
    simulated samples), a bootstrap from ``BOOTSTRAP_MIN_N`` on. One item, or all equal: the value,
    no interval (``why`` says which)."""
    a = _clean(x)
    a = a[a > 0]
    if a.size == 0:
        return NAN
    logs = np.log(a)
    value = float(np.exp(logs.mean()))
    if a.size < 2:
        return Interval(value, math.nan, math.nan, int(a.size), ONE_SAMPLE)
    if _no_spread(logs):
        return Interval(value, math.nan, math.nan, int(a.size), NO_SPREAD)
    if geometric_mean_method(a.size) == "t":
        t = _t_interval(logs, confidence)
        return Interval(value, float(np.exp(t.lo)), float(np.exp(t.hi)), int(a.size))
    lo, hi = _bootstrap((logs,), _mean, seed, n_resamples, confidence)
    return Interval(value, float(np.exp(lo)), float(np.exp(hi)), int(a.size))


def geometric_mean_method(n: int) -> str:
    """Which interval ``geometric_mean_ci`` gives over ``n`` items: as ``paired_diff_method`` (on the logs)."""
    return paired_diff_method(n)


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
    """``1.21x [0.97-1.48]``, or ``no difference detected [0.97-1.48]`` when the interval holds 1. Bounds
    are rounded outward, with more digits where the value or a bound would round onto 1.00 (``1.003x
    [1.001-1.006]``). A value without an interval: ``0.91x (no spread: no interval, not a result)``; nothing: ``—``."""
    if not iv.ok:
        if math.isfinite(iv.value):
            return f"{iv.value:.2f}x ({_no_interval(iv)}: no interval, not a result)"
        return "—"
    d = _digits(iv.lo, iv.hi, 1.0, 2)
    lo, hi = _outward(iv.lo, iv.hi, d)
    span = f"[{_num(lo, d)}-{_num(hi, d)}]"
    return f"{_num(iv.value, d)}x {span}" if iv.excludes(1.0) else f"{NO_DIFFERENCE} {span}"


def fmt_diff(iv: Interval, scale: float = 100.0, unit: str = "points", digits: int = 1) -> str:
    """``-1.2 points [-3.0, -0.1]``, or ``no difference detected [-3.0, 0.6]`` when the interval
    holds 0 (values times ``scale``: a difference of shares in percentage points); bounds rounded outward,
    more digits where a bound would round onto 0 (``+0.2 points [0.04, 0.3]``), never ``-0.0``; ``n`` >= 2
    units without an interval: the value, said to be no result, with ``why`` (all alike: "the same in all
    ``n``"); fewer: ``—``."""
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
