"""Helpers of the data-parallel tests (2 gloo processes on the CPU), and ``once_per_session``: one expensive
launch (or report) per test session, shared by the xdist workers."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

from filelock import FileLock  # torch's own dependency


@contextlib.contextmanager
def once_per_session(tmp_path_factory, name: str) -> Iterator[tuple[Path, bool]]:
    """A folder ``name`` shared by the session's xdist workers, held under a lock: ``(folder, done)``, ``done``
    when another worker already made what it holds; the caller makes it otherwise (and it is then done).

    A module-scoped fixture runs once per worker that runs one of the module's tests (``--dist worksteal``
    may split a module): under this, a fixture's launch runs once, and the other worker reads its outputs."""
    base = tmp_path_factory.getbasetemp()
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base  # pytest-N/, shared by the workers
    folder = root / f"shared-{name}"
    with FileLock(str(root / f"shared-{name}.lock")):
        done = folder / ".done"
        folder.mkdir(exist_ok=True)
        yield folder, done.exists()
        done.touch()


REPO = Path(__file__).resolve().parent.parent
TORCHRUN_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                "TORCHELASTIC_RUN_ID")


def launch_here(monkeypatch, capfd, *argv, **env: str) -> tuple[int, str, str]:
    """``inrbench ARGV --nproc N`` with its launcher in this process (``bench.cli.main``: one process less
    to start, and torch is imported here already); torchrun and the ranks are processes of their own, in
    this environment plus ``env`` (one OpenMP thread, this checkout first on PYTHONPATH, no torchrun
    variables). -> (exit status, stdout, stderr), the processes' output read from the file descriptors."""
    from bench import cli

    for k in TORCHRUN_ENV:
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]))
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.chdir(REPO)
    capfd.readouterr()
    rc = cli.main([str(a) for a in argv])
    out, err = capfd.readouterr()
    return rc, out, err
