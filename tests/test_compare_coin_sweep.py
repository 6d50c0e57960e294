"""The COIN reproduction recipe (``bench/sweeps/coin-kodak.yaml``): COIN's Kodak operating points at
COIN's fit settings on a GPU, a reduced iteration count on a CPU that the report's description states
(``cpu_defaults``), drawn against COIN's published curve."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.compare import references
from bench.errors import InputError
from bench.sweep.runner import SweepContext
from bench.sweep.spec import load_sweep, parse_sweep

RECIPE = Path(__file__).resolve().parents[1] / "bench" / "sweeps" / "coin-kodak.yaml"


def _lines(cfg) -> dict[str, list[str]]:
    ctx = SweepContext(out=Path("/o"), data_root=Path("/d"), cells=cfg.by_id())
    return {c.id: c.argv(ctx) for c in cfg.cells}


def _opt(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def test_gpu_run_fits_coins_five_architectures_at_coins_settings():
    from inr.siren import SirenArch

    cfg = load_sweep(str(RECIPE), device="cuda")
    enc = {c.name: c for c in cfg.cells if c.kind == "encode"}
    assert set(enc) == {"5x20", "5x30", "10x28", "10x40", "13x49"}
    coin = next(c for c in references.curves("kodak") if c.method == "COIN")
    for name, c in enc.items():
        argv = _lines(cfg)[c.id]
        assert (_opt(argv, "--iterations"), _opt(argv, "--lr"), _opt(argv, "--w0"), _opt(argv, "--bits")) == (
            "50000", "0.0002", "30", "16")
        assert f"{_opt(argv, '--layers')}x{_opt(argv, '--hidden')}" == name and _opt(argv, "--device") == "cuda"
        # 16 bits per weight over a 768x512 image lands on one of COIN's published Kodak points
        bpp = SirenArch(c.layers, c.hidden).params_per_image * 16 / (768 * 512)
        assert min(abs(bpp / b - 1) for b in coin.bpp) < 0.015, (name, bpp)
    argv = _lines(cfg)["compare"]
    assert _opt(argv, "--reference") == "kodak" and _opt(argv, "--inr-bytes") == "payload"
    assert argv.count("--store") == 1 and len([a for a in argv if a.endswith(".inr")]) == 5
    assert "cpu_defaults applied" not in cfg.description


def test_cpu_run_reduces_the_iterations_and_says_so():
    cfg = load_sweep(str(RECIPE), device="cpu")
    for c in cfg.cells:
        if c.kind == "encode":
            assert c.iterations == 500 and c.device == "cpu" and c.lr == 0.0002
    assert cfg.description.endswith("On this CPU run, cpu_defaults applied: encode iterations=500.")


def test_cpu_defaults_are_checked_like_defaults(tmp_path):
    doc = {"name": "x", "cells": [{"kind": "prepare", "id": "p", "source": "photos", "name": "p"}],
           "cpu_defaults": {"encoder": {"iterations": 5}}}
    with pytest.raises(InputError, match="'cpu_defaults' names unknown kinds"):
        parse_sweep(doc, tmp_path / "x.yaml", device="cpu")
