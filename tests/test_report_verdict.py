"""The report reads top-down (issue #31): a verdict written from the intervals, the headline table, the figures,
the details, and the methodology once, at the end (tests/fixtures/results/sweep, real schema)."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from bench.report import verdict as V
from bench.report.build import build_report
from bench.report.tables import SPEEDUP_COLUMNS
from tests.report_tables import _quick_reports, parse_tables, sweep_report  # noqa: F401

FIX = Path(__file__).resolve().parent / "fixtures" / "results" / "sweep"


def _speedups(*rows) -> pd.DataFrame:
    """``(pipeline, baseline, ratio, lo, hi[, flagged])`` rows of ``tables.speedups``, all train, dataset d."""
    out = [{"dataset": "d", "mode": "train", "pipeline": p, "baseline": b, "ratio": r, "lo": lo, "hi": hi,
            "detected": not lo <= 1 <= hi, "flagged": bool(f and f[0]), "why": ""} for p, b, r, lo, hi, *f in rows]
    return pd.DataFrame(out, columns=SPEEDUP_COLUMNS)


def test_the_fastest_is_compared_with_every_pipeline_it_was_timed_against_in_either_direction():
    """dali is fastest: its ratio over torch-jpeg is read as stored, those over raw and inr are the inverses of
    raw/inr against dali (bounds swapped); torch-nvjpeg's comparison failed a sanity check and is left out."""
    sp = _speedups(("dali", "torch-jpeg", 1.20, 1.03, 1.40), ("raw", "dali", 0.95, 0.90, 1.01),
                   ("inr", "dali", 0.71, 0.59, 0.86), ("torch-nvjpeg", "dali", 0.98, 0.80, 1.10, True))
    medians = {"raw": 3127.0, "torch-jpeg": 2781.0, "torch-nvjpeg": 3007.0, "dali": 3275.0, "inr": 2414.0}
    assert V.speed_sentence(medians, sp, "d", "train") == (
        "End to end, `dali` had the highest median (3,275 img/s): 1.20x [1.03-1.40] as fast as `torch-jpeg` and "
        "1.41x [1.16-1.70] as fast as `inr`; no difference detected against `raw` [0.99-1.12].")


def test_no_difference_is_said_as_such_and_no_interval_is_no_claim():
    sp = _speedups(("raw", "torch-jpeg", 1.10, 0.96, 1.36), ("inr", "torch-jpeg", 1.05, np.nan, np.nan))
    medians = {"raw": 100.0, "torch-jpeg": 90.0, "inr": np.nan}
    assert V.speed_sentence(medians, sp, "d", "train") == (
        "End to end, `raw` had the highest median (100 img/s): no difference detected against `torch-jpeg` "
        "[0.96-1.36].")
    sp = _speedups(("raw", "torch-jpeg", 1.10, np.nan, np.nan))
    assert "no comparison with it has an interval" in V.speed_sentence(medians, sp, "d", "train")
    assert V.speed_sentence({"raw": 100.0}, sp, "d", "train") is None


def test_inr_against_jpeg_names_the_store_inr_reads_and_the_best_variant():
    def row(method, variant, match="", file_bytes=np.nan, diff=np.nan, lo=np.nan, hi=np.nan):
        return {"method": method, "variant": variant, "match": match, "file_bytes": file_bytes, "psnr_diff": diff,
                "psnr_diff_lo": lo, "psnr_diff_hi": hi, "psnr_diff_n": 80, "psnr_diff_interval": "bootstrap"}

    summary = pd.DataFrame([
        row("inr", "pruned-8bit", file_bytes=907), row("inr", "learned-init", file_bytes=930),
        row("jpeg-matched", "pruned-8bit", "file", 901, -2.73, -3.05, -2.43),
        row("jpeg-matched", "pruned-8bit", "header-free", 1449, -8.29, -8.59, -8.00),
        row("jpeg-matched", "learned-init", "file", 922, 0.55, 0.35, 0.76),
        row("jpeg-matched", "learned-init", "header-free", 1466, 4.0, 3.5, 4.5),  # not whole files: not read
    ])
    assert V.inr_sentence(summary, "pruned-8bit") == (
        "At matched bytes, INR minus JPEG PSNR (per image, paired) is -2.73 dB [-3.05, -2.43] for `pruned-8bit`, "
        "907 bytes/image (the store `inr` trains from) and +0.55 dB [0.35, 0.76] for `learned-init`, 930 "
        "bytes/image (the best variant).")
    summary.loc[4, ["psnr_diff", "psnr_diff_lo", "psnr_diff_hi"]] = [0.05, -0.10, 0.20]
    assert V.inr_sentence(summary, None) == (
        "At matched bytes, INR minus JPEG PSNR (per image, paired) is no difference detected [-0.10, 0.20] dB for "
        "`learned-init`, 930 bytes/image (the best variant).")


@pytest.fixture(scope="module")
def text(tmp_path_factory) -> str:
    return (sweep_report(tmp_path_factory) / "README.md").read_text()


def test_the_report_reads_top_down(text):
    heads = [ln for ln in text.splitlines() if ln.startswith("## ")]
    order = ["## Headline", "## Figures", "## Speedup", "## Compression", "## Accuracy", "## Throughput",
             "## Methodology", "## What was run", "## Environment", "## Sweep cells"]
    at = [next(i for i, h in enumerate(heads) if h.startswith(o)) for o in order]
    assert at == sorted(at), heads
    # every figure drawn from the numbers is in *Figures*, none beside its table
    figures = text.split("## Figures")[1].split("\n## ")[0]
    drawn = re.findall(r"!\[[^]]*\]\(([^)]+)\)", text)
    assert drawn and all(f in figures for f in drawn if not f.startswith("compare_weights_")), drawn
    # the verdict opens the headline and quotes the speedup table's own cells
    speed = parse_tables(text)["photos32 — speedup"][0].set_index("pipeline")
    verdict = text.split("## Headline\n\n")[1].split("\n")[0]
    assert verdict.startswith("End to end, `raw` had the highest median (659 img/s): "
                              f"{speed.loc['raw', 'vs torch-jpeg (train)']} as fast as `torch-jpeg`."), verdict
    assert f"{speed.loc['raw', 'vs dali (loader)']} as fast as `dali`." in verdict
    # short explanations above the methodology: the long ones are in docs/measurement.md
    body = text.split("## Methodology")[0]
    prose = [ln for ln in body.splitlines() if ln and not ln.startswith(("|", "#", "!"))]
    assert max(map(len, prose)) < 600, max(prose, key=len)
    assert text.count("Welch's 95% t interval") == 1 and "docs/measurement.md" in text


def _ident(cid: str) -> dict:
    return {"id": f"ident-{cid}", "code": {"id": cid, "label": f"commit-{cid} (clean)"},
            "libraries": {"torch": "2.0", "torchvision": "0.1", "nvidia-dali": None, "PIL": "Pillow 11"}}


@pytest.fixture(scope="module")
def edited(tmp_path_factory) -> str:
    """The fixture sweep, two edits apart (one report read by two tests): its compare summary's
    file-matched JPEG rows made reachable (fp32 +0.4 dB, pruned-8bit -1.2 dB), and its cells kept
    with --keep-stale: bench-inr-train computed by code B, the sweep and every other cell by A."""
    import json

    tmp = tmp_path_factory.mktemp("edited")
    res = tmp / "res"
    shutil.copytree(FIX, res)
    f = res / "cells" / "compare" / "compare" / "summary.csv"
    s = pd.read_csv(f)
    matched = (s["method"] == "jpeg-matched") & (s["match"] == "file")  # fp32, then pruned-8bit (made reachable)
    s.loc[matched, ["status", "psnr_diff", "psnr_diff_lo", "psnr_diff_hi", "psnr_diff_n"]] = [
        ["ok", 0.4, 0.1, 0.7, 40], ["ok", -1.2, -1.5, -0.9, 40]]
    s.to_csv(f, index=False)
    sweep = json.loads((res / "sweep.json").read_text())
    sweep["code"] = _ident("A")
    (res / "sweep.json").write_text(json.dumps(sweep))
    for marker in res.glob("cells/*/cell.json"):
        m = json.loads(marker.read_text())
        m["code"] = _ident("B" if m["id"] == "bench-inr-train" else "A")
        marker.write_text(json.dumps(m))
    build_report(res, tmp / "rep")
    return (tmp / "rep" / "README.md").read_text()


def test_the_headline_places_the_store_inr_trains_from_against_jpeg(edited):
    """Through the sweep: the bench cells' ``store`` (enc-pruned-8bit) names the compare variant the sentence quotes."""
    verdict = edited.split("## Headline\n\n")[1].split("\n")[0]
    assert verdict.endswith("At matched bytes, INR minus JPEG PSNR (per image, paired) is -1.20 dB [-1.50, -0.90] "
                            "for `pruned-8bit`, 700 bytes/image (the store `inr` trains from) and +0.40 dB [0.10, "
                            "0.70] for `fp32`, 3,300 bytes/image (the best variant)."), verdict


def test_stale_sweep_cells_are_marked(edited):
    """A sweep whose cells were kept with --keep-stale: each stale cell is marked, with a warning."""
    cells = parse_tables(edited)["Sweep cells"][0].set_index("cell")
    assert cells.loc["bench-inr-train", "code"] == "commit-B (clean) — stale (--keep-stale)"
    assert cells.loc["bench-raw-train", "code"] == "commit-A (clean)"
    assert ("**Warning: these results come from 2 different code/library versions; 1 cells are stale "
            "(computed by another version than the sweep's current one, kept with `--keep-stale`): "
            "bench-inr-train.**") in edited
    versions = parse_tables(edited)["Environment"][1].set_index("current")
    assert int(versions.loc["yes", "cells"]) == 20 and int(versions.loc["no", "cells"]) == 1
