"""compare: "Where INR stands against each codec's curve" carries the paired per-image interval.

Each INR variant's gap to a codec's sweep is the mean over images of INR PSNR minus the codec's PSNR
on that image's own sweep at the INR's bytes (linear in log bytes), with ``bench.stats.paired_diff_ci``'s
interval, as the matched-bytes table has it (audit #8: every nonzero gap was called ahead or behind,
with no interval). A gap whose interval holds 0 is no difference detected; a line without an interval is
a point reading, not a result; so is a crossing the gaps on either side do not support.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from bench import stats
from bench.compare.core import COLUMNS
from bench.compare.table import crossovers, markdown, summarize

BASE = dict.fromkeys([*COLUMNS, "bpp", "bpp_header_free", "pct_raw"], np.nan)
N = 24
# each image's JPEG sweep: 2 qualities, bytes and PSNR that differ per image
LO_B = np.linspace(300.0, 400.0, N)
HI_B = np.linspace(3000.0, 4000.0, N)
LO_P = np.linspace(24.0, 28.0, N)
HI_P = np.linspace(36.0, 40.0, N)


def _jpeg_at(b: float) -> np.ndarray:
    """Each image's sweep PSNR at ``b`` bytes, linear in log bytes."""
    t = (np.log(b) - np.log(LO_B)) / (np.log(HI_B) - np.log(LO_B))
    return LO_P + t * (HI_P - LO_P)


def _rows(variants: dict[str, tuple[float, np.ndarray]], n: int = N) -> pd.DataFrame:
    rows = []
    for i in range(n):
        for q, b, p in ((10, LO_B[i], LO_P[i]), (90, HI_B[i], HI_P[i])):
            rows.append({**BASE, "method": "jpeg-sweep", "codec": "jpeg", "variant": "", "match": "", "image": i,
                         "status": "ok", "quality": q, "file_bytes": b, "header_free_bytes": b - 200, "psnr": p,
                         "ssim": 0.9, "bpp": b * 8 / 1000})
        for v, (b, psnr) in variants.items():
            rows.append({**BASE, "method": "inr", "variant": v, "match": "", "image": i, "status": "ok",
                         "file_bytes": b, "psnr": psnr[i], "ssim": 0.9, "bpp": b * 8 / 1000})
    return pd.DataFrame(rows)


def _variants() -> dict[str, tuple[float, np.ndarray]]:
    rng = np.random.default_rng(0)
    return {
        # ahead by ~2 dB at 500 B, behind by ~2 dB at 2000 B; "tie" sits on the curve with noise
        "small": (500.0, _jpeg_at(500.0) + 2.0 + rng.normal(0, 0.3, N)),
        "tie": (1000.0, _jpeg_at(1000.0) + rng.normal(0, 1.0, N)),
        "big": (2000.0, _jpeg_at(2000.0) - 2.0 + rng.normal(0, 0.3, N)),
    }


def _line(lines: list[str], variant: str) -> str:
    (hit,) = [ln for ln in lines if ln.startswith(f"inr-{variant} ") and "file bytes" in ln]
    return hit


def test_each_gap_is_the_paired_per_image_difference_with_its_interval():
    v = _variants()
    per_image = _rows(v)
    lines = crossovers(summarize(per_image), 1000, "file_bytes", "jpeg", per_image=per_image)
    for name, (b, inr) in v.items():
        iv = stats.paired_diff_ci(inr, _jpeg_at(b))
        text = stats.fmt_diff(iv, scale=1.0, unit="dB", digits=2)
        assert text in _line(lines, name), (text, _line(lines, name))
        assert f"(t interval, {N} images" in _line(lines, name)
    assert "INR behind: INR − JPEG -" in _line(lines, "big")
    assert "INR ahead: INR − JPEG +" in _line(lines, "small")
    tie = _line(lines, "tie")
    assert "INR − JPEG no difference detected [" in tie and "ahead" not in tie and "behind" not in tie


def test_a_crossing_between_supported_gaps_says_so_and_one_between_unsupported_is_no_result():
    v = _variants()
    per_image = _rows(v)
    lines = crossovers(summarize(per_image), 1000, "file_bytes", "jpeg", per_image=per_image)
    cross = [ln for ln in lines if ln.startswith("crossing")]
    # the frontier small -> tie -> big: the sign changes next to "tie", whose gap holds 0
    assert cross and all("a point reading, not a result" in ln for ln in cross), cross
    del v["tie"]
    per_image = _rows(v)
    cross = [ln for ln in crossovers(summarize(per_image), 1000, "file_bytes", "jpeg", per_image=per_image)
             if ln.startswith("crossing")]
    assert len(cross) == 1 and "INR ahead of JPEG below, behind above" in cross[0]
    assert "both exclude 0" in cross[0] and "not a result" not in cross[0]


def test_one_image_is_a_point_reading():
    one = _rows({"v": (1000.0, _jpeg_at(1000.0) - 1.0)}, n=1)
    line = _line(crossovers(summarize(one), 1000, per_image=one), "v")
    assert "(one image: no interval, a point reading, not a result)" in line and "behind" not in line


def test_only_images_whose_sweep_spans_the_bytes_count():
    inr = _jpeg_at(310.0) - 1.0 + np.random.default_rng(1).normal(0, 0.2, N)
    per_image = _rows({"v": (310.0, inr)})  # the sweeps start at 300..400 bytes: images 0..2 reach 310 B
    reach = LO_B <= 310.0
    line = _line(crossovers(summarize(per_image), 1000, per_image=per_image), "v")
    assert f", {int(reach.sum())}/{N} imgs" in line
    iv = stats.paired_diff_ci(inr[reach], _jpeg_at(310.0)[reach])
    assert f"{iv.value:+.2f}" in line


def test_summary_md_prints_the_intervals():
    per_image = _rows(_variants())
    meta = {"image_size": (25, 40), "dataset": "t", "split": "train", "n_images": N}
    md = markdown(summarize(per_image), meta, per_image)
    section = md[md.index("Where INR stands"):]
    assert "paired 95% interval" in section and "no difference detected [" in section
    assert "point reading" not in section.split("crossing")[0]


def test_lossless_images_count_as_the_cap():
    v = _variants()
    b, inr = v["big"]
    inr = inr.copy()
    inr[0] = np.inf  # a lossless INR image: capped at PSNR_CAP_DB, as in the matched-bytes table
    per_image = _rows({"big": (b, inr)})
    line = _line(crossovers(summarize(per_image), 1000, per_image=per_image), "big")
    from bench.metrics import PSNR_CAP_DB

    iv = stats.paired_diff_ci(np.minimum(inr, PSNR_CAP_DB), _jpeg_at(b))
    assert stats.fmt_diff(iv, scale=1.0, unit="dB", digits=2) in line and "inf" not in line
