"""What a rank that leaves a data-parallel run before rank 0 wrote it records (``rank<R>.left.json``, and
one ``error`` row per rank that left): docs/distributed.md, "A rank that leaves early"."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from bench import results
from bench.atomic import atomic_write_json

LOCK_FILE = ".left.lock"
MARKER_FILE = ".left"  # rows.csv was written from the ranks' left records, not by rank 0
SUFFIX = ".left.json"


_held: dict[str, Any] = {"depth": 0, "pending": None}  # this process's hold of a run folder's lock


@contextlib.contextmanager
def _locked(run_dir: Path) -> Iterator[None]:
    """An exclusive ``flock`` on the run folder's ``LOCK_FILE`` while the block runs. A SIGTERM that comes
    meanwhile (``on_sigterm``'s handler, which takes the same lock: it would wait on this very process
    forever) is handled once the lock is released."""
    run_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(run_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    _held["depth"] += 1
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock
        _held["depth"] -= 1
        if _held["depth"] == 0 and _held["pending"] is not None:
            pending, _held["pending"] = _held["pending"], None
            pending()


def records(run_dir: Path) -> dict[int, dict[str, Any]]:
    """rank -> its ``rank<R>.left.json`` (unreadable ones skipped)."""
    out = {}
    for p in sorted(run_dir.glob(f"rank*{SUFFIX}")):
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            rec = json.loads(p.read_text())
            out[int(rec["rank"])] = rec
    return out


def record(out: str | Path, run: results.RunRows, rank: int, exit_code: int, reason: str) -> Path:
    """Record that ``rank`` leaves the run ``run`` (its run id, pipeline, dataset, mode, config) with
    ``exit_code`` and ``reason``, and write the run's error rows unless rank 0 wrote it; the run folder."""
    run_dir = Path(out) / results.RUNS_DIR / run.run_id
    run_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_json(run_dir / f"rank{rank}{SUFFIX}", {"rank": rank, "exit_code": exit_code, "reason": reason})
    with _locked(run_dir):
        if (run_dir / results.ROWS_FILE).exists() and not (run_dir / MARKER_FILE).exists():
            return run_dir  # rank 0 wrote the run: its record stands
        left = records(run_dir)
        rows = results.RunRows(run.run_id, run.pipeline, run.dataset, run.mode, run.config)
        rows.fail_ranks("error", {r: f"rank {r}: {left[r]['reason']}" for r in sorted(left)})
        (run_dir / MARKER_FILE).touch()
        if not (run_dir / results.ENV_FILE).exists():
            results.write_env(run_dir)
        results.write_run(out, rows)
    return run_dir


@contextlib.contextmanager
def rank0_writes(run_dir: Path) -> Iterator[None]:
    """Rank 0 writing the run, under the lock: once its ``rows.csv`` is on disk the marker goes, so no later
    left record replaces it (a failed write keeps the marker and the ranks' records)."""
    rows_file = run_dir / results.ROWS_FILE

    def identity() -> tuple[int, int] | None:
        try:
            st = rows_file.stat()
        except FileNotFoundError:
            return None
        return st.st_ino, st.st_mtime_ns

    with _locked(run_dir):
        before = identity()
        try:
            yield
        finally:
            after = identity()
            if after is not None and after != before:
                with contextlib.suppress(FileNotFoundError):
                    (run_dir / MARKER_FILE).unlink()


def reason_of(run: results.RunRows) -> str:
    """The reason on ``run``'s status row ('' for an ok run)."""
    return next((r["reason"] for r in run._rows if r["metric"] == "run"), "") if run.status != "ok" else ""


@contextlib.contextmanager
def on_sigterm(out: str | Path, run: results.RunRows, rank: int, broken: Callable[[], str | None],
               leave: Callable[[int], None]) -> Iterator[None]:
    """While the block runs in the main thread, a SIGTERM records this rank as stopped by the launcher (with
    its own failure so far: ``run``'s error row or ``broken()``), then ``leave(128 + SIGTERM)``."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    code, pid = 128 + signal.SIGTERM, os.getpid()

    def stopped(signum, frame) -> None:
        if os.getpid() != pid:  # a forked child (a DataLoader worker) inherited the handler: default action
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)
            return
        if _held["depth"]:  # this process holds the run folder's lock: once it is released
            _held["pending"] = lambda: stopped(signum, frame)
            return
        so_far = reason_of(run) if run.status == "error" else ""
        if not so_far and broken():
            so_far = f"the process group failed: {broken()}"
        why = "stopped by the launcher (SIGTERM): another rank exited first" + (f"; before that: {so_far}"
                                                                              if so_far else "")
        try:
            record(out, run, rank, code, why)
        except Exception as e:  # leaving anyway: say why nothing was recorded
            print(f"inrbench: rank {rank}: could not record why it left: {results.exception_reason(e)}",
                  file=sys.stderr)
        sys.stdout.flush()
        sys.stderr.flush()
        leave(code)

    previous = signal.signal(signal.SIGTERM, stopped)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
