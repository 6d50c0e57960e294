"""Runs the suite in pytest-xdist workers by default (up to 4, one per core), where xdist is installed and
the command line says neither ``-n`` nor ``-p no:xdist``: a machine without xdist (a bare GPU image) still
runs it, in one process. ``--dist worksteal``: an idle worker takes tests from a busy one."""

from __future__ import annotations

import importlib.util
import os


def pytest_load_initial_conftests(early_config, parser, args: list[str]) -> None:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    said = any(a.startswith(("-n", "--numprocesses")) for a in args)
    blocked = any(a in ("no:xdist", "-pno:xdist") for a in args)
    if cores > 1 and not said and not blocked and importlib.util.find_spec("xdist"):
        args[:] = ["-n", str(min(cores, 4)), "--dist", "worksteal", *args]
