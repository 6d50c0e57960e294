"""Shared fixtures. Tests are CPU-only by default; ``@pytest.mark.gpu`` tests skip with the reason."""

from __future__ import annotations

import os
import signal

import pytest

# An xdist worker (`-n 2` in pyproject.toml) takes its share of the cores: more threads than cores make
# OpenMP's spinning barriers ~20x slower on a busy machine. Commands the tests start inherit it.
if "PYTEST_XDIST_WORKER_COUNT" in os.environ:
    workers = int(os.environ["PYTEST_XDIST_WORKER_COUNT"])
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // workers)))

import bench.cli  # noqa: E402,F401  (sets MKL's reproducibility mode before any test imports torch)

# A background job of a non-interactive shell (`cmd &`, nohup) starts with SIGINT ignored, and every
# process it starts inherits that: the tests that Ctrl-C a command would see it run on. A handled
# SIGINT is reset to the default at exec, so the commands the tests start get their Ctrl-C back.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_collection_modifyitems(config, items):
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="no CUDA device on this machine (gpu-marked test)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def one_torch_thread():
    """One torch intra-op thread for the duration of a test, restored afterwards.

    The tests are tiny, and on 2 cores shared with other jobs OpenMP's spinning barriers make
    2 threads ~20x slower than 1. Modules opt in with
    ``pytestmark = pytest.mark.usefixtures("one_torch_thread")``.
    """
    from tests.store_helpers import one_thread

    with one_thread():
        yield


@pytest.fixture
def run(monkeypatch, capsys, request):
    """``run(*argv) -> (exit code, stdout, stderr)`` via ``bench.cli.main``.

    A module that defines ``MINE`` (command name -> module) registers only those commands, so
    its tests do not depend on commands it does not test; the dispatcher and its error handling
    are real. A module's own ``run`` fixture takes precedence over this one.
    """
    from bench import cli

    mine = getattr(request.module, "MINE", None)
    if mine is not None:
        monkeypatch.setattr(cli, "COMMANDS", mine)

    def _run(*argv):
        rc = cli.main([str(a) for a in argv])
        out, err = capsys.readouterr()
        return rc, out, err

    return _run


@pytest.fixture
def traced_graphs(monkeypatch):
    """The fit loop's compiled graphs traced by dynamo (``fullgraph``: a graph break still fails) and run by its
    eager backend, without inductor's code generation: ~1-3 CPU-s a chunk shape instead of ~20 on a cold cache.
    For tests of the loop around the graphs; ``test_inr_mixed`` compiles one with inductor (and gpu-check's
    perf steps on the GPU)."""
    import torch

    from inr import loop

    compile_ = torch.compile
    monkeypatch.setattr(loop, "_CACHE", {})  # these graphs stay out of the other tests' cache

    def traced(fn, **kw):
        return compile_(fn, **{k: v for k, v in kw.items() if k != "options"}, backend="eager")

    monkeypatch.setattr(torch, "compile", traced)
