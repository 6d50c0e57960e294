"""`inrbench perf encode --json`: both methods run, the ratio is their rates' ratio, same work done."""

from __future__ import annotations

import json

from bench.cli import main


def test_perf_encode_json(capsys):
    rc = main(["perf", "encode", "--json", "--synthetic", "--iterations", "5", "--batch", "6", "--loop-images", "2",
               "--layers", "2", "--hidden", "8", "--size", "8", "--threads", "1"])
    assert rc == 0
    r = json.loads(capsys.readouterr().out)
    loop, batched = r["loop"], r["batched"]
    assert loop["images"] == 2 and batched["images"] == 6 and loop["iterations"] == batched["iterations"] == 5
    for m in (loop, batched):
        assert m["image_iterations_per_s"] == m["images"] * 5 / m["seconds"] > 0
        assert m["peak_memory_bytes"] >= 0 and m["threads"] == 1
    assert abs(r["speedup"] - batched["image_iterations_per_s"] / loop["image_iterations_per_s"]) < 1e-9
    # the same fit: on the same first images both reach (nearly) the same PSNR
    assert abs(loop["mean_psnr_first"]["2"] - batched["mean_psnr_first"]["2"]) < 0.5
