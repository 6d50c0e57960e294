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


# sitecustomize for the sweep's processes: in the process that imports ``inr.encode``, the second shard's fit
# (``encode_images``'s second call) first writes WAITING, then sleeps until a Ctrl-C: the sweep is
# interrupted mid-cell with exactly one shard finished, however fast or slow the machine
SHARD_HOOK = """
import importlib.abc, importlib.machinery, pathlib, sys, time

WAITING = {waiting!r}


class _AfterImport(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name != "inr.encode":
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        load = spec.loader.exec_module

        def exec_module(module):
            load(module)
            fit, calls = module.encode_images, []

            def encode_images(*args, **kwargs):
                calls.append(1)
                if len(calls) == 2:
                    pathlib.Path(WAITING).write_text("shard 1")
                    time.sleep(600)
                return fit(*args, **kwargs)

            module.encode_images = encode_images

        spec.loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, _AfterImport())
"""


def test_interrupted_encode_cell_resumes_from_its_finished_shards(tmp_path):
    """Audit: a sweep rerun deleted an interrupted encode cell's finished shards and fitted them again."""
    doc = {"name": "long", "report": False, "device": "cpu", "cells": [
        {"kind": "prepare", "id": "prep", "source": "synthetic", "name": "p8", "size": 8,
         "args": {"per_class": 4, "num_classes": 2}},
        {"kind": "encode", "id": "enc", "data": "prep", "name": "fp32", "iterations": 20, "layers": 2, "hidden": 4,
         "args": {"shard_size": 2, "keep_work": True, "no_progress": True}},
    ]}
    y = tmp_path / "long.yaml"
    y.write_text(yaml.safe_dump(doc))
    out = tmp_path / "run"
    work = work_path(out / "cells" / "enc" / "fp32.inr", "encode")
    site, waiting = tmp_path / "site", tmp_path / "waiting"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SHARD_HOOK.format(waiting=str(waiting)))
    env = {**os.environ, "PYTHONPATH": f"{site}{os.pathsep}{REPO}"}
    proc = subprocess.Popen([sys.executable, "-m", "bench", "sweep", str(y), "--out", str(out), "--no-progress"],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        t0 = time.monotonic()
        while not waiting.exists():  # shard 0 written, shard 1's fit begun
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() - t0 < 300, "the second shard's fit never began"
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=60)
    finally:  # a failed wait must not leave the sweep (and its waiting encode) running
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130
    shards = sorted(p.name for p in work.glob("shard_*.inr"))
    assert shards == ["shard_00000.inr"], shards  # interrupted with a shard left to fit
    first = (work / "shard_00000.inr").stat()
    cfg = load_sweep(str(y))
    assert run_sweep(cfg, out, progress=False).status == {"prep": "ok", "enc": "ok"}
    again = (work / "shard_00000.inr").stat()
    assert (again.st_ino, again.st_mtime_ns) == (first.st_ino, first.st_mtime_ns)  # reused, not fitted again
    assert (work / "shard_00001.inr").is_file() and (out / "cells" / "enc" / "fp32.inr").is_file()
    assert "encode: resuming, 1 of 3 shards already fitted" in (out / "cells" / "enc" / "stdout.log").read_text()
