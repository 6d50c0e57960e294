"""A sweep cell forked from the server runs as ``python -m bench`` in a fresh process would."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from bench.sweep import forkserver
from bench.sweep.runner import REPO_ROOT


@pytest.fixture(scope="module")
def server():
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "PYTHONUNBUFFERED": "1"}
    s = forkserver.ForkServer(env)
    assert s.ok
    yield s
    s.close()


def _both(server, tmp_path, argv):
    """(exit code, stdout, stderr) forked and as a subprocess, each in its own working folder."""
    got = []
    for how in ("fork", "plain"):
        cwd = tmp_path / how
        cwd.mkdir()
        so, se = cwd / "stdout.log", cwd / "stderr.log"
        if how == "fork":
            rc = server.start(argv, str(cwd), str(so), str(se)).wait(timeout=120)
        else:
            with open(so, "wb") as o, open(se, "wb") as e:
                rc = subprocess.call([sys.executable, "-m", "bench", *argv], cwd=cwd, stdout=o, stderr=e,
                                     env=server.env)
        got.append((rc, so.read_text(), se.read_text().replace(str(cwd), "CWD")))
    return got


@pytest.mark.parametrize("argv", [
    ["datasets"],
    ["prepare", "synthetic", "--out", "ds", "--size", "8", "--per-class", "2", "--num-classes", "2", "--no-progress"],
    ["prepare", "synthetic", "--out", "ds", "--size", "-1"],  # a usage error: exit 2, one line
    ["inspect", "missing.inr"],
])
def test_a_forked_cell_matches_a_fresh_interpreter(server, tmp_path, argv):
    fork, plain = _both(server, tmp_path, argv)
    assert fork[0] == plain[0] and fork[2] == plain[2]
    assert fork[1].replace(str(tmp_path / "fork"), "CWD") == plain[1].replace(str(tmp_path / "plain"), "CWD")
    if argv[0] == "prepare" and fork[0] == 0:  # the relative --out lands in the cell's own folder
        assert (tmp_path / "fork" / "ds").is_dir() and not (tmp_path / "ds").exists()


def test_a_forked_cell_can_be_stopped_like_a_subprocess(server, tmp_path):
    y = tmp_path / "s.yaml"
    code = "import pathlib, time; pathlib.Path('started').write_text('1'); time.sleep(120)"
    y.write_text(f'cells:\n  - {{kind: python, id: slow, command: ["-c", "{code}"]}}\n')
    cell = server.start(["sweep", str(y), "--out", "o", "--no-report", "--no-progress"], str(tmp_path),
                        str(tmp_path / "so"), str(tmp_path / "se"))
    started, t0 = tmp_path / "o" / "cells" / "slow" / "started", time.monotonic()
    while not started.exists():  # the sweep reached its cell (which runs in the cell's folder)
        assert time.monotonic() - t0 < 120, "the cell never started"
        time.sleep(0.05)
    with pytest.raises(subprocess.TimeoutExpired):
        cell.wait(timeout=1)
    cell.send_signal(signal.SIGINT)
    assert cell.wait(timeout=60) == 130  # the sweep's own "interrupted" exit
    assert "interrupted" in (tmp_path / "se").read_text()
    # the server serves the next cell
    assert server.start(["datasets"], str(tmp_path), str(tmp_path / "so2"), str(tmp_path / "se2")).wait(60) == 0
