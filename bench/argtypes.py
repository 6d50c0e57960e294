"""argparse ``type=`` validators: a bad number is refused while parsing, in one line, exit 2.

Used where a value of 0 would otherwise silently mean "automatic" (``--batch 0``) or a
non-finite float would reach an optimizer (``--lr nan``).
"""

from __future__ import annotations

import argparse
import math


def positive_int(text: str) -> int:
    """An integer >= 1."""
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {v}")
    return v


def positive_float(text: str) -> float:
    """A finite float > 0."""
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not 0 < v < math.inf:
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text}")
    return v
