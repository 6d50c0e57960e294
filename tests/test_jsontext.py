"""``--json`` outputs are strict JSON: an absent bound (NaN in bench.stats) is null, never a bare NaN token."""
import json
import math

import numpy as np
import pytest

from bench import jsontext
from bench.stats import geometric_mean_ci


def _strict(text: str):
    def refuse(token):
        raise ValueError(f"not JSON: {token}")
    return json.loads(text, parse_constant=refuse)


def test_an_interval_without_bounds_is_written_as_null_at_any_depth():
    iv = geometric_mean_ci([4.2] * 8)  # no spread: no interval, NaN bounds
    assert math.isnan(iv.lo) and math.isnan(iv.hi)
    doc = {"sets": [{"per_image": {"geomean": iv.value, "lo": iv.lo, "hi": iv.hi, "n": iv.n}}],
           "ci": (float("inf"), -float("inf")), "np": np.float64("nan"), "ok": 1.5, "k": 3}
    with pytest.raises(ValueError):
        _strict(json.dumps(doc))  # what the standard library writes
    back = _strict(jsontext.dumps(doc, sort_keys=True))
    assert back["sets"][0]["per_image"] == {"geomean": pytest.approx(4.2), "lo": None, "hi": None, "n": 8}
    assert back["ci"] == [None, None] and back["np"] is None
    assert back["ok"] == 1.5 and back["k"] == 3


def test_numpy_scalars_are_plain_json_numbers_and_a_float32_nan_is_null():
    back = _strict(jsontext.dumps({"f32": np.float32("nan"), "f": np.float32(1.5), "i": np.int64(3), "b": True}))
    assert back == {"f32": None, "f": 1.5, "i": 3, "b": True}
