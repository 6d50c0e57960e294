"""compare: the per-image paired PSNR difference (INR minus matched JPEG) and its interval."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from bench.compare.core import COLUMNS
from bench.compare.table import markdown, psnr_diff_text, summarize
from bench.metrics import PSNR_CAP_DB


def _per_image(n: int = 30) -> pd.DataFrame:
    rng = np.random.default_rng(0)
    rows = []
    for variant, offset, noise in (("ahead", 1.0, 0.2), ("tie", 0.0, 1.0)):
        inr = rng.normal(30.0, 4.0, n)  # wide spread across images, shared by both methods
        jpeg = inr - offset + rng.normal(0.0, noise, n)
        if variant == "ahead":
            inr[0] = jpeg[0] = np.inf  # a lossless image on both sides counts as PSNR_CAP_DB: difference 0
        for i in range(n):
            base = dict.fromkeys([*COLUMNS, "bpp", "bpp_header_free", "pct_raw"], np.nan)
            rows.append({**base, "method": "inr", "variant": variant, "match": "", "image": i, "status": "ok",
                         "file_bytes": 500.0, "psnr": inr[i], "ssim": 0.9})
            rows.append({**base, "method": "jpeg-matched", "variant": variant, "match": "file", "image": i,
                         "status": "ok", "quality": 50.0, "target_bytes": 500.0, "file_bytes": 480.0,
                         "psnr": jpeg[i], "ssim": 0.9})
    return pd.DataFrame(rows), rows


def test_paired_difference_and_interval_in_the_summary():
    per_image, rows = _per_image()
    s = summarize(per_image).set_index(["method", "variant"])
    ahead, tie = s.loc[("jpeg-matched", "ahead")], s.loc[("jpeg-matched", "tie")]
    # the mean of the per-image differences, inf capped on both sides (difference 0 for image 0)
    d = [min(a["psnr"], PSNR_CAP_DB) - min(b["psnr"], PSNR_CAP_DB)
         for a, b in zip(rows[0::2], rows[1::2], strict=True) if a["variant"] == "ahead"]
    assert ahead["psnr_diff"] == pytest.approx(np.mean(d), abs=1e-9)
    assert 0 < ahead["psnr_diff_lo"] < ahead["psnr_diff"] < ahead["psnr_diff_hi"] < 1.5
    assert tie["psnr_diff_lo"] < 0 < tie["psnr_diff_hi"]
    assert np.isnan(s.loc[("inr", "ahead"), "psnr_diff"])  # only matched rows carry a difference
    assert psnr_diff_text(ahead).startswith(f"{ahead['psnr_diff']:+.2f} dB [")
    assert psnr_diff_text(tie).startswith("no difference detected [")
    text = markdown(summarize(per_image), {"image_size": (8, 8), "dataset": "t", "split": "test", "n_images": 30},
                    per_image)
    assert "INR − JPEG no difference detected [" in text and f"INR − JPEG {ahead['psnr_diff']:+.2f} dB" in text
    assert psnr_diff_text(pd.Series({"psnr": 1.0})) == "–"  # a summary.csv from before the columns
