"""Output piped into a reader that stops early (``inrbench sweep demo --list | head -1``): a quiet exit
141 (128 + SIGPIPE), no ``inrbench: error: Broken pipe`` and not exit 2, the bad-input status."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from bench import cli, errors

ROOT = Path(__file__).resolve().parents[1]


def _closed_reader(*argv: str) -> subprocess.CompletedProcess:
    """Run ``python -m bench ARGV`` with stdout a pipe whose reader is closed before it writes."""
    r, w = os.pipe()
    os.close(r)
    try:
        return subprocess.run([sys.executable, "-m", "bench", *argv], stdout=w, stderr=subprocess.PIPE,
                              text=True, cwd=ROOT, timeout=120)
    finally:
        os.close(w)


def test_a_listing_into_a_closed_pipe_exits_141_quietly():
    p = _closed_reader("sweep", "demo", "--list")
    assert p.returncode == errors.EXIT_BROKEN_PIPE == 141
    assert p.stderr == ""  # no "inrbench: error: Broken pipe", no "Exception ignored ... BrokenPipeError"


def test_a_broken_pipe_from_the_commands_own_pipe_is_still_an_error(monkeypatch, capsys):
    """Only stdout's reader going away is the user's ``| head``; another pipe breaking is an error."""
    def body():
        raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(errors, "stdout_closed", lambda: False)
    assert errors.guarded(body) == 2
    assert "inrbench: error: Broken pipe" in capsys.readouterr().err
    monkeypatch.setattr(errors, "stdout_closed", lambda: True)
    monkeypatch.setattr(errors, "stdout_gone", lambda: errors.EXIT_BROKEN_PIPE)  # no dup2 onto pytest's stdout
    assert errors.guarded(body) == 141
    assert capsys.readouterr().err == ""


def test_stdout_closed_tells_a_closed_pipe_from_an_open_one(monkeypatch):
    r, w = os.pipe()
    try:
        class Out:
            def fileno(self) -> int:
                return w

        monkeypatch.setattr(sys, "stdout", Out())
        assert not errors.stdout_closed()
        os.close(r)
        r = -1
        assert errors.stdout_closed()
    finally:
        os.close(w)
        if r >= 0:
            os.close(r)


def test_a_failed_command_keeps_its_status_when_the_reader_stopped_early(monkeypatch):
    """A command that failed (exit 1: a sweep with a failed cell) whose buffered output meets a closed pipe
    at the final flush exits with its own status, not 141: ``| head`` must not turn a failure into
    'stopped reading'; a command that succeeded gets 141 there."""
    class Closed:
        def flush(self):
            raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(cli, "stdout_gone", lambda: errors.EXIT_BROKEN_PIPE)  # no dup2 onto pytest's stdout
    for status, want in ((1, 1), (3, 3), (0, errors.EXIT_BROKEN_PIPE)):
        monkeypatch.setattr(cli, "guarded", lambda fn, out=None, status=status: status)
        monkeypatch.setattr(sys, "stdout", Closed())
        got = cli.main(["env"])
        monkeypatch.setattr(sys, "stdout", sys.__stdout__)
        assert got == want, (status, got)
