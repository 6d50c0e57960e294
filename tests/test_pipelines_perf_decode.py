"""`inrbench perf decode` end to end on a tiny size: every row measured, optimized INR decodes agree."""

from __future__ import annotations

import json

from bench.cli import main


def test_perf_decode_json(capsys):
    rc = main(["perf", "decode", "--json", "--sizes", "16", "--no-compile", "--seconds", "0.01", "--repeats", "1"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert out["threads"] == 1 and out["matmul_peak_gflops"]["fp32"] > 0
    rows = out["rows"]
    methods = {r["method"].split(" ")[0] for r in rows}
    assert {"PIL", "torchvision.io.decode_jpeg", "DALI", "INR"} <= methods
    for r in rows:
        assert r["size"] == 16
        if "skipped" not in r:
            assert r["images_per_s"] > 0
    inr = [r for r in rows if r["method"].startswith("INR")]
    assert len(inr) == 4 and all(r["gflops"] > 0 and 0 < r["pct_peak"] for r in inr)
    for r in inr:  # fp32 variants compute the reference function: 8-bit identical or nearly
        if "bf16" not in r["variant"]:
            assert r["psnr_vs_reference_db"] >= 60.0, r
