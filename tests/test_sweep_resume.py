"""An unfinished sweep cell resumes from what it left to resume from (``Cell.resume_state``: an encode's
finished shards) when the same cell runs again; everything else in its folder is cleared."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from bench.sweep import layout
from bench.sweep.cells import KINDS, Cell, Kind
from bench.sweep.runner import run_sweep
from bench.sweep.spec import SweepConfig, load_sweep
from bench.workdir import work_path

REPO = Path(__file__).resolve().parent.parent

# records what it finds (its state, a leftover scratch file), then stops after its first step (exit 3)
STEPS = ("import pathlib, sys\n"
         "st = pathlib.Path('state'); st.mkdir(exist_ok=True)\n"
         "found = ','.join(sorted(p.name for p in st.iterdir()))\n"
         "open(sys.argv[1], 'a').write(f\"{found}|{pathlib.Path('scratch.txt').exists()}\\n\")\n"
         "pathlib.Path('scratch.txt').write_text('x')\n"
         "if not (st / 'step1').exists():\n"
         "    (st / 'step1').write_text('1'); sys.exit(3)\n"
         "(st / 'step2').write_text('2')\n")


@pytest.fixture(autouse=True)
def resumable(monkeypatch):
    """A python kind that resumes from ``CELL/state``."""
    monkeypatch.setitem(KINDS, "resumable", Kind("resumable", output="x", resume=lambda out: out.with_name("state"), python=True))


def _sweep(log: Path, args: dict | None = None, **fields) -> SweepConfig:
    cell = Cell(id="r", kind="resumable", fields={"command": ["-c", STEPS, str(log)], **({"args": args} if args else {})})
    return SweepConfig(name="resume", description="", device="cpu", report=False,
                       cells=(dataclasses.replace(cell, **fields),))


def _found(log: Path) -> list[str]:
    return log.read_text().splitlines()


def test_same_cell_resumes_its_state_and_nothing_else(tmp_path):
    log, out = tmp_path / "log", tmp_path / "out"
    assert run_sweep(_sweep(log), out, progress=False).status == {"r": "error"}
    # rerun, the timeout raised (it leaves the output alone): the state is kept, the scratch file is not
    assert run_sweep(_sweep(log, timeout_s=600.0), out, progress=False).status == {"r": "ok"}
    assert _found(log) == ["|False", "step1|False"]
    assert layout.read_marker(out / "cells" / "r")["status"] == "ok"


def test_other_argv_or_redo_starts_from_nothing(tmp_path):
    log, out = tmp_path / "log", tmp_path / "out"
    run_sweep(_sweep(log), out, progress=False)
    other = _sweep(log, args={"flag": True})  # another argv: its state is not this run's
    assert run_sweep(other, out, progress=False).status == {"r": "error"}
    assert _found(log)[-1] == "|False"
    assert run_sweep(other, out, progress=False, redo=("r",)).status == {"r": "error"}  # redo: from nothing
    assert _found(log)[-1] == "|False"
    assert run_sweep(other, out, progress=False).status == {"r": "ok"}  # a plain rerun resumes the redo
    assert _found(log)[-1] == "step1|False"


def test_a_cell_folder_from_before_attempt_records_is_cleared(tmp_path):
    log, out = tmp_path / "log", tmp_path / "out"
    run_sweep(_sweep(log), out, progress=False)
    (out / "cells" / "r" / layout.ATTEMPT).unlink()  # unknown start: nothing is known to be resumable
    run_sweep(_sweep(log), out, progress=False)
    assert _found(log)[-1] == "|False"


def test_interrupted_encode_cell_resumes_from_its_finished_shards(tmp_path):
    """Audit: a sweep rerun deleted an interrupted encode cell's finished shards and fitted them again."""
    doc = {"name": "long", "report": False, "device": "cpu", "cells": [
        {"kind": "prepare", "id": "prep", "source": "synthetic", "name": "p8", "size": 8,
         "args": {"per_class": 4, "num_classes": 2}},
        {"kind": "encode", "id": "enc", "data": "prep", "name": "fp32", "iterations": 8000, "layers": 2, "hidden": 4,
         "args": {"shard_size": 2, "keep_work": True, "no_progress": True}},
    ]}
    y = tmp_path / "long.yaml"
    y.write_text(yaml.safe_dump(doc))
    out = tmp_path / "run"
    work = work_path(out / "cells" / "enc" / "fp32.inr", "encode")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-m", "bench", "sweep", str(y), "--out", str(out), "--no-progress"],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        t0 = time.monotonic()
        while not (work / "shard_00000.inr").exists():
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() - t0 < 300, "the first shard never appeared"
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=60)
    finally:  # a failed wait must not leave the sweep (and its 8,000-iteration encode) running
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130
    shards = sorted(p.name for p in work.glob("shard_*.inr"))
    assert shards and len(shards) < 2, shards  # interrupted with a shard left to fit
    first = (work / "shard_00000.inr").stat()
    cfg = load_sweep(str(y))
    assert run_sweep(cfg, out, progress=False).status == {"prep": "ok", "enc": "ok"}
    again = (work / "shard_00000.inr").stat()
    assert (again.st_ino, again.st_mtime_ns) == (first.st_ino, first.st_mtime_ns)  # reused, not fitted again
    assert (work / "shard_00001.inr").is_file() and (out / "cells" / "enc" / "fp32.inr").is_file()

