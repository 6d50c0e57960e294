"""Strict JSON text for ``--json`` outputs: a non-finite float is written as ``null`` (Python's ``NaN`` and
``Infinity`` tokens are not JSON; ``jq`` and JavaScript refuse the whole document)."""
from __future__ import annotations

import json
import math
import numbers
from typing import Any


def finite_or_null(obj: Any) -> Any:
    """``obj`` with every non-finite float, at any depth of dicts, lists and tuples, replaced by None."""
    if isinstance(obj, bool):
        return obj
    if isinstance(obj, numbers.Integral):  # int, numpy integers (which json cannot write)
        return int(obj)
    if isinstance(obj, numbers.Real):  # float, numpy floats
        return float(obj) if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite_or_null(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite_or_null(v) for v in obj]
    return obj


def dumps(obj: Any, **kwargs: Any) -> str:
    """``json.dumps`` of ``finite_or_null(obj)``, refusing anything that would still not be JSON."""
    return json.dumps(finite_or_null(obj), allow_nan=False, **kwargs)


def diff_keys(a, b, prefix: str = "") -> list[str]:
    """Dotted keys where two JSON documents differ."""
    if isinstance(a, dict) and isinstance(b, dict):
        out: list[str] = []
        for k in sorted(set(a) | set(b)):
            out += diff_keys(a.get(k), b.get(k), f"{prefix}{k}.")
        return out
    return [] if a == b else [prefix.rstrip(".") or "(root)"]
