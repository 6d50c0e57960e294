"""argparse ``type=`` validators: a bad number is refused while parsing, in one line, exit 2 (``--batch 0``
would otherwise mean "automatic", ``--lr nan`` reach an optimizer, ``--seed -1`` overflow numpy)."""

from __future__ import annotations

import argparse
import math

# Seeds are 0 .. 2**32 - 1: numpy's legacy RandomState takes no more, and derived seeds (``seed + k``,
# ``seed * 1000 + layer``) stay far inside torch's and an int64 column's range.
SEED_MAX = 2**32 - 1


def _parse(text: str, cast, kind: str):
    try:
        return cast(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {kind}, got {text!r}") from None


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise argparse.ArgumentTypeError(message)


def positive_int(text: str) -> int:
    v = _parse(text, int, "an integer")
    _check(v >= 1, f"must be >= 1, got {v}")
    return v


def nonnegative_int(text: str) -> int:
    v = _parse(text, int, "an integer")
    _check(v >= 0, f"must be >= 0, got {v}")
    return v


def positive_float(text: str) -> float:
    v = _parse(text, float, "a number")
    _check(0 < v < math.inf, f"must be a finite number > 0, got {text}")
    return v


def nonnegative_float(text: str) -> float:
    v = _parse(text, float, "a number")
    _check(0 <= v < math.inf, f"must be a finite number >= 0, got {text}")
    return v


def nonempty(text: str) -> str:
    """A path or name that is not empty (``--out ''`` would otherwise mean "not given")."""
    _check(bool(text.strip()), f"must not be empty, got {text!r}")
    return text


def seed(text: str) -> int:
    v = _parse(text, int, "an integer")
    _check(0 <= v <= SEED_MAX, f"a seed must be an integer in 0..{SEED_MAX}, got {v}")
    return v


def pixel_fraction(text: str) -> float:
    """A fraction in (0, 1], as a number (``0.125``) or a ratio of integers (``1/8``)."""
    kind = "a number or a ratio like 1/8"
    num, sep, den = text.partition("/")
    if sep:
        a, b = _parse(num.strip(), int, kind), _parse(den.strip(), int, kind)
        _check(b != 0, f"must be in (0, 1], got {text}")
        v = a / b
    else:
        v = _parse(text, float, kind)
    _check(0 < v <= 1, f"must be in (0, 1], got {text}")
    return v
