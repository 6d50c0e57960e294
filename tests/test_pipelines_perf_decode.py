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
    assert {"PIL", "torchvision.io.decode_jpeg", "torchcodec.decoders.decode_jpeg", "DALI", "INR"} <= methods
    for r in rows:
        assert r["size"] == 16
        if "skipped" not in r:
            assert r["images_per_s"] > 0
    inr = [r for r in rows if r["method"].startswith("INR")]
    assert len(inr) == 4 and all(r["gflops"] > 0 and 0 < r["pct_peak"] for r in inr)
    for r in inr:  # fp32 variants compute the reference function: 8-bit identical or nearly
        if "bf16" not in r["variant"]:
            assert r["psnr_vs_reference_db"] >= 60.0, r


def test_perf_decode_measures_torchcodec_beside_torchvision(capsys):
    """The TorchCodec CPU row is measured where ``torch-nvjpeg`` would use TorchCodec, and skipped with
    the reason only where it cannot be imported; both decoders' versions are in their rows."""
    from pipelines.torch_nvjpeg import jpeg_decoder

    rc = main(["perf", "decode", "--json", "--sizes", "16", "--no-compile", "--seconds", "0.01", "--repeats", "1"])
    assert rc == 0
    rows = {r["method"].split(" ")[0]: r for r in json.loads(capsys.readouterr().out)["rows"]}
    tv, tc = rows["torchvision.io.decode_jpeg"], rows["torchcodec.decoders.decode_jpeg"]
    assert tv["images_per_s"] > 0 and tv["variant"] == tc["variant"] == "cpu, one image per call"
    dec = jpeg_decoder()
    if dec.library == "torchcodec":
        assert "skipped" not in tc and tc["images_per_s"] > 0
        assert tc["method"] == f"torchcodec.decoders.decode_jpeg {dec.version}"
    else:
        assert tc["skipped"].startswith("torchcodec cannot be imported: ") and "rate" not in tc


def test_perf_decode_skips_the_torchcodec_row_with_the_reason(monkeypatch, capsys):
    import sys

    monkeypatch.setitem(sys.modules, "torchcodec.decoders", None)
    rc = main(["perf", "decode", "--sizes", "16", "--no-compile", "--seconds", "0.01", "--repeats", "1"])
    assert rc == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if "torchcodec" in x)
    assert "skipped" in line and "torchcodec.decoders.decode_jpeg: torchcodec cannot be imported" in line
