"""``scripts/gpu-check --cpu`` under a copy of the lent GPU machine's conditions: no DALI and no TorchCodec
to import, and the project not installed (only ``PYTHONPATH``), as ``docs/gpu-check.md``'s command runs it.

``IMAGE`` is a ``sitecustomize`` put first on ``PYTHONPATH``, so every process gpu-check starts (steps,
``python -m bench``, pytest) sees the same: importing ``nvidia.dali`` or ``torchcodec`` raises
``ModuleNotFoundError``, and the editable install's finder and distribution record are gone.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from bench import outputs
from devtools import gpucheck

REPO = Path(__file__).resolve().parent.parent

IMAGE = '''
import importlib.abc
import importlib.metadata
import sys

BLOCKED = ("nvidia.dali", "torchcodec")


class _NotOnTheImage(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if any(name == b or name.startswith(b + ".") for b in BLOCKED):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


# the project is not installed: no editable finder, no distribution record
sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in repr(f).lower()]
sys.meta_path.insert(0, _NotOnTheImage())
_distribution = importlib.metadata.distribution


def distribution(name):
    if name.replace("_", "-").lower() == "inr-bench":
        raise importlib.metadata.PackageNotFoundError(name)
    return _distribution(name)


importlib.metadata.distribution = distribution
'''


@pytest.fixture
def image_env(tmp_path) -> dict:
    site = tmp_path / "image-site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(IMAGE)
    return {**os.environ, "PYTHON": sys.executable, "PYTHONPATH": f"{site}{os.pathsep}{REPO}"}


def test_the_image_copy_hides_dali_torchcodec_and_the_install(image_env):
    code = ("import importlib.metadata as md, importlib.util as u\n"
            "for m in ('nvidia.dali', 'torchcodec'):\n"
            "    try:\n        __import__(m)\n    except ModuleNotFoundError:\n        print(m, 'missing')\n"
            "try:\n    md.version('inr-bench')\nexcept md.PackageNotFoundError:\n    print('not installed')\n"
            "import bench\nprint(bench.__file__)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=image_env, cwd="/",
                       timeout=60)
    assert r.stdout.splitlines() == ["nvidia.dali missing", "torchcodec missing", "not installed",
                                     str(REPO / "bench" / "__init__.py")], r.stderr


@pytest.mark.slow
def test_gpu_check_on_the_image_copy_runs_the_selected_steps_and_reports_every_step(tmp_path, image_env, monkeypatch,
                                                                                    capsys):
    """One ``--cpu`` run of the steps that can run here, for ``raw`` and ``dali`` (not installed on the image):
    every step reported, in order, the unselected ones as skips; then a rerun into the same folder."""
    out = tmp_path / "out"
    out.mkdir()  # the lent machine's $OUT: an existing empty folder
    t0 = time.time()
    r = subprocess.run([str(REPO / "scripts" / "gpu-check"), str(out), "--cpu", "--work", str(tmp_path / "work"),
                        "--steps", "env,setup,sync-debug,bench-smoke,cpu-vs-device,dali-crops", "--pipelines", "dali,raw"],
                       capture_output=True, text=True, env=image_env, cwd=REPO, timeout=400)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert time.time() - t0 < gpucheck.CALL_S
    plan = [ln for ln in r.stdout.splitlines() if ln.startswith("gpu-check:   ")]
    assert [ln.split()[1] for ln in plan] == list(gpucheck.STEP_NAMES)  # the parent's plan, every step, in order
    assert f"sum to {gpucheck.valuable_caps_s():.0f} s" in r.stdout
    doc = json.loads((out / "gpu-check.json").read_text())
    assert doc["kind"] == "gpu-check" and doc["device"] == "cpu" and doc["complete"] and doc["pipelines"] == ["dali", "raw"]
    assert doc["budget_s"] <= gpucheck.CALL_S and doc["valuable_caps_s"] <= doc["budget_s"]
    steps = {s["name"]: s for s in doc["steps"]}
    assert list(steps) == list(gpucheck.STEP_NAMES)
    assert not [s for s in doc["steps"] if s["status"] in ("fail", "killed")], doc["summary"]
    for s in doc["steps"]:
        assert s["seconds"] >= 0 and "\n" not in s["error"] and s["asserts"]
    for name in set(steps) - {"env", "setup", "sync-debug", "bench-smoke", "cpu-vs-device", "dali-crops"}:
        assert steps[name]["status"] == "skip" and steps[name]["error"] == "not selected (--steps)"
    env = steps["env"]
    assert env["status"] == "ok" and env["figures"]["modules_imported"] > 50, env
    assert env["figures"]["nvidia-dali"] == env["figures"]["torchcodec"] == "not installed here"
    assert doc["env"]["dali"] == "not installed here" and doc["env"]["torch_nvjpeg_decoder"].startswith("torchvision ")
    assert steps["setup"]["status"] == "ok" and steps["setup"]["figures"]["train_images"] > 0
    assert steps["sync-debug"]["status"] == "skip" and "needs CUDA" in steps["sync-debug"]["error"]
    smoke = steps["bench-smoke"]
    assert smoke["status"] == "ok" and "dali: not installed here" in smoke["error"], smoke
    for mode in ("loader", "train"):  # the median and range of the repeats
        spread = smoke["figures"][f"raw.{mode}.img_per_s"]
        assert spread["n"] == 2 and 0 < spread["range"][0] <= spread["median"] <= spread["range"][1], spread
    cvd = steps["cpu-vs-device"]
    assert cvd["status"] == "ok" and cvd["figures"]["raw.status"] == "ok"
    assert cvd["figures"]["raw.max_abs_diff"] == 0.0  # cpu twice: deterministic
    assert cvd["figures"]["dali.status"] == "not installed" and "dali: not installed here" in cvd["error"]
    assert steps["dali-crops"]["status"] == "not installed"
    md = (out / "gpu-check.md").read_text()
    assert md.startswith("# inr-bench gpu-check") and "| bench-smoke | ok |" in md and "| sync-debug | skip |" in md
    assert "| dali-crops | not installed |" in md
    assert sorted(p.name for p in out.iterdir()) == [".inrbench.json", "gpu-check-logs.tar.gz", "gpu-check.json",
                                                     "gpu-check.md"]  # compact: the work is elsewhere
    assert outputs.marker_kind(out) == "gpu-check" and outputs.is_own(out, "gpu-check")
    with tarfile.open(out / gpucheck.LOGS) as tar:  # one log per adapter subprocess
        assert {"gpu-check-logs/steps/setup.log", "gpu-check-logs/steps/bench-smoke.raw.log",
                "gpu-check-logs/steps/bench-smoke.dali.log"} <= set(tar.getnames())

    # a rerun replaces the earlier output's files (and only those) in the same folder; a spent budget is a skip
    # per step, never a hang
    inode = out.stat().st_ino
    for var in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"):  # set by gpucheck.main: restored afterwards
        monkeypatch.setenv(var, os.environ.get(var, ""))
        monkeypatch.delenv(var)
    rc = gpucheck.main([str(out), "--cpu", "--steps", "cpu-vs-device", "--budget", "1"])
    log = "".join(capsys.readouterr())
    assert rc == 0, log
    doc2 = json.loads((out / "gpu-check.json").read_text())
    assert doc2["started_utc"] >= doc["started_utc"] and out.stat().st_ino == inode
    assert {s["status"] for s in doc2["steps"]} == {"skip"} and any("budget" in s["error"] for s in doc2["steps"])
    assert not (out / "work" / "syn32").exists()  # nothing ran: no setup
