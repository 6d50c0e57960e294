"""studies/compression/compression-study: pairs are the same image (merged on the image id, never by sorted position), and
its differences print through bench.stats.fmt_diff (no difference detected when the interval holds 0)."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import math
from pathlib import Path

import pandas as pd

from bench import stats as S

SCRIPT = Path(__file__).resolve().parent / "compression-study"


def _script():
    loader = importlib.machinery.SourceFileLoader("compression_study", str(SCRIPT))
    spec = importlib.util.spec_from_loader("compression_study", loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


def test_pairs_are_merged_on_the_image_id():
    cs = _script()
    # variant b lacks image 1: by sorted position its image 2 would pair with a's image 1
    pi = pd.DataFrame({"method": ["inr"] * 5, "variant": ["a", "a", "a", "b", "b"], "image": [0, 1, 2, 0, 2],
                       "psnr": [30.0, 20.0, 32.0, 29.0, 31.0], "bpp": [1.0] * 5})
    psnr, _ = cs._inr_psnr(pi)
    assert list(psnr["a"].index) == [0, 1, 2] and psnr["b"].loc[2] == 31.0 and math.isnan(psnr["b"].loc[1])
    iv = S.paired_diff_ci(psnr["a"], psnr["b"])
    assert iv.n == 2 and iv.value == 1.0  # images 0 and 2: +1 dB each (by position it was (1 + -11) / 2)
    a, b = psnr["a"].align(psnr["b"].dropna(), join="inner")
    assert list(a.index) == [0, 2]


def test_differences_print_through_fmt_diff():
    cs = _script()
    assert cs._ci(S.Interval(0.05, -0.02, 0.12, 5)) == f"{S.NO_DIFFERENCE} [-0.02, 0.12]"  # was "+0.05 [-0.02, +0.12]"
    assert cs._ci(S.Interval(0.5, 0.2, 0.8, 5)) == "+0.50 dB [0.20, 0.80]"
    assert cs._ci(S.Interval(0.01, 0.0004, 0.02, 5), "bpp") == "+0.0100 bpp [0.0004, 0.0200]"
