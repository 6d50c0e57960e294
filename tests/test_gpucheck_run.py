"""gpu-check's parent on the CPU, with stand-in steps (``FAKE``: this module's steps replace ``STEPS`` in the
parent and in each step's subprocess): a step killed at its cap keeps the figures it wrote; a step that loops
over pipelines runs one subprocess per adapter, so one adapter's native crash loses only its own figures;
SIGTERM kills the running step's processes (one that started a session of its own included) and writes the
document with that step marked killed; an existing empty OUT_DIR is used as is (a mount point cannot be renamed).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import psutil

from devtools import gpucheck
from devtools.gpucheck import CPU_CAP_FACTOR

REPO = Path(__file__).resolve().parent.parent

FAKE = '''
import os, subprocess, sys, time
from pathlib import Path

from devtools import gpucheck as g


def capped(ctx):
    g.partial(ctx, {"loader.img_per_s": 12.5})  # the first run's figure, then a run that never ends
    time.sleep(600)


def per_adapter(ctx):
    (name,) = ctx["pipelines"]
    if name == "torch-jpeg":
        os.abort()  # a native crash
    return {"img_per_s": 3.0, "pid": os.getpid()}


def sleepy(ctx):
    g.partial(ctx, {"done_before_kill": 1})
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
    Path(ctx["work"], "grandchild.pid").write_text(str(p.pid))
    time.sleep(600)


g.STEPS = (
    g.Step("capped", "writes a figure, then runs past its cap", 1, 1, capped, needs_setup=False),
    g.Step("per-adapter", "one subprocess per adapter", 60, 1, per_adapter, needs_setup=False, per_pipeline=True),
    g.Step("sleepy", "runs until killed", 120, 1, sleepy, needs_setup=False),
    g.Step("after", "never reached", 10, 1, lambda ctx: {}, needs_setup=False),
)
g.STEP_NAMES = tuple(s.name for s in g.STEPS)
g.VALUABLE = g.STEP_NAMES
g.CHILD = [sys.executable, __file__]
g.GRACE_S = 1.0  # the capped step is killed 1 s past its cap, not 5
sys.exit(g.main())
'''


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_caps_crashes_and_sigterm_keep_every_figure_and_leave_no_process(tmp_path):
    script = tmp_path / "fake_gpucheck.py"
    script.write_text(FAKE)
    out = tmp_path / "mount"
    out.mkdir()  # the caller's existing empty folder: used as is
    inode = out.stat().st_ino
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    p = subprocess.Popen([sys.executable, str(script), str(out), "--cpu", "--pipelines", "raw,torch-jpeg"], cwd=REPO,
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    pidfile = out / "work" / "grandchild.pid"
    t0 = time.time()
    while not pidfile.is_file() and p.poll() is None and time.time() - t0 < 90:
        time.sleep(0.2)
    assert pidfile.is_file(), p.communicate(timeout=30)
    time.sleep(0.5)
    grandchild = int(pidfile.read_text())
    p.send_signal(signal.SIGTERM)
    stdout, stderr = p.communicate(timeout=60)
    assert p.returncode == 128 + signal.SIGTERM, stdout[-2000:] + stderr[-2000:]

    assert out.stat().st_ino == inode
    doc = json.loads((out / "gpu-check.json").read_text())
    steps = {s["name"]: s for s in doc["steps"]}
    assert not doc["complete"] and doc["state"].startswith("KILLED by SIGTERM")
    capped = steps["capped"]
    assert capped["status"] == "fail" and capped["error"].startswith(f"timed out after {1 * CPU_CAP_FACTOR:.0f} s")  # --cpu
    assert capped["figures"] == {"loader.img_per_s": 12.5} and capped["seconds"] < 30
    per = steps["per-adapter"]
    assert per["status"] == "fail" and per["figures"]["raw.status"] == "ok" and per["figures"]["raw.img_per_s"] == 3.0
    assert per["figures"]["torch-jpeg.status"] == "fail" and "died" in per["error"]
    assert per["figures"]["raw.pid"] != os.getpid()
    sleepy = steps["sleepy"]
    assert sleepy["status"] == "killed" and sleepy["figures"] == {"done_before_kill": 1}
    assert steps["after"]["status"] == "skip" and steps["after"]["error"] == "not reached: gpu-check was killed by SIGTERM"
    assert _gone(grandchild), "a process the killed step started still runs"
    assert "| sleepy | killed |" in (out / "gpu-check.md").read_text()
    with tarfile.open(out / gpucheck.LOGS) as tar:
        names = set(tar.getnames())
    assert {"gpu-check-logs/steps/sleepy.log", "gpu-check-logs/steps/per-adapter.torch-jpeg.log"} <= names


def test_the_valuable_steps_fit_the_budget_and_the_budget_one_call():
    """The caps of the steps up to bench-smoke fit the default budget, which fits one call of 9 minutes; the
    steps run in the order of their value."""
    assert gpucheck.STEP_NAMES[:6] == ("env", "pytest-pipelines", "perf-decode", "perf-encode", "perf-subsample",
                                       "setup")
    assert gpucheck.valuable_caps_s() <= gpucheck.BUDGET_S - gpucheck.RESERVE_S
    assert gpucheck.BUDGET_S + 20 <= gpucheck.CALL_S <= 540
    assert all(s.estimate_s <= s.timeout_s for s in gpucheck.STEPS)
