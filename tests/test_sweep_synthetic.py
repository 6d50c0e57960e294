"""A tiny real sweep on ``synthetic``, end to end through ``inrbench sweep`` (CPU, in-process; cells are processes):
prepare -> encode -> compare -> bench (raw and inr; loader and train) -> report.
"""

from __future__ import annotations

import json

import pandas as pd
import pytest
import yaml

from tests.report_tables import parse_tables

SWEEP = {
    "name": "tiny",
    "description": "synthetic end-to-end test sweep",
    "device": "cpu",
    "defaults": {
        "encode": {"preset": "demo", "iterations": 30},
        "bench": {"epochs": 1, "warmup": 0, "repeats": 2, "batch_size": 16, "workers": 0,
                  "backbone": "small-cnn", "args": {"crop": "random-pad", "min_seconds": 0}},
    },
    "cells": [
        {"kind": "prepare", "id": "prep", "source": "synthetic", "name": "syn16", "size": 16,
         "args": {"per_class": 6, "num_classes": 3}},
        {"kind": "encode", "id": "enc-q8", "data": "prep", "name": "q8", "bits": "8"},
        {"kind": "compare", "id": "cmp", "data": "prep", "stores": ["enc-*"], "jpeg_qualities": [30, 90]},
        {"kind": "bench", "id": "b-{pipeline}-{mode}", "data": "prep",
         "matrix": {"mode": ["loader", "train"],
                    "feed": [{"pipeline": "raw"}, {"pipeline": "inr", "store": "enc-q8"}]}},
    ],
}


@pytest.mark.slow
def test_tiny_synthetic_sweep_end_to_end(tmp_path, monkeypatch, run):
    from bench.sweep import runner

    # the code version (part of every cell's identity) stays fixed while others may edit the checkout
    ident = runner.code_identity()
    monkeypatch.setattr(runner, "code_identity", lambda: ident)
    monkeypatch.chdir(tmp_path)
    y = tmp_path / "tiny.yaml"
    y.write_text(yaml.safe_dump(SWEEP))
    out, rep = tmp_path / "out", tmp_path / "report"
    argv = ["sweep", str(y), "--out", str(out), "--report", str(rep), "--no-progress"]
    rc, stdout, err = run(*argv)
    assert rc == 0, stdout[-3000:] + err[-3000:]
    assert "7 cells (7 ok, 0 skip, 0 error; 0 kept from before)" in stdout

    df = pd.read_csv(out / "results.csv", low_memory=False)
    status = df[df.metric == "cell_s"].set_index("run_id")["status"]
    assert (status == "ok").all() and len(status) == 7
    ips = df[(df.metric == "images_per_s") & (df.status == "ok")]
    assert set(zip(ips.pipeline, ips["mode"], strict=True)) == {
        (p, m) for p in ("raw", "inr") for m in ("loader", "train")}
    assert (ips["value"] > 0).all()
    assert not df.duplicated().any()

    tables = parse_tables((rep / "README.md").read_text())
    t = tables["syn16 — images/s, median (IQR)"][0].set_index("pipeline")
    assert list(t.index) == ["raw", "inr"] and list(t.columns) == ["loader", "train"]
    for p in t.index:
        for m in t.columns:
            assert "(IQR" in t.loc[p, m], (p, m, t.loc[p, m])
    comp = tables["syn16 — PSNR and bytes (cmp)"][0]
    assert "q8" in set(comp["variant"]) and "jpeg-matched" in set(comp["method"])
    assert (rep / "psnr_vs_bytes_cmp.png").is_file() and (rep / "epoch_split_syn16.png").is_file()
    assert not (rep / "speedup_syn16.png").exists()  # no torch-jpeg/dali baseline in this sweep

    # a rerun with the same code keeps all seven cells and runs nothing (the report is tested above)
    rc2, stdout2, err2 = run(*argv, "--resume", "--no-report")
    assert rc2 == 0 and "7 kept from before" in stdout2, stdout2 + err2
    assert "stale" not in stdout2
    assert json.loads((out / "sweep.json").read_text())["code"] == ident
    assert len(pd.read_csv(out / "results.csv", low_memory=False)) == len(df)
