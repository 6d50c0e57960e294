"""``bench.errors.os_error_message``: an ``OSError`` raised without an errno still says what happened, and
numpy's short write (its only sign of a full disk) says that the disk may be full."""

from __future__ import annotations

import errno
import os

import numpy as np

from bench.errors import os_error_message
from tests.cli_helpers import assert_one_line_error, run_cli

SHORT_WRITE = "3932160 requested and 302976 written"  # what np.save raises on a full disk: no errno


def test_short_write_says_the_disk_may_be_full():
    msg = os_error_message(OSError(SHORT_WRITE))
    assert "302976 of 3932160 bytes written" in msg and "the disk may be full" in msg, msg
    assert "free some space and rerun" in msg, msg
    assert msg != "OSError"


def test_no_errno_falls_back_to_the_message():
    assert os_error_message(OSError("cannot map the file")) == "cannot map the file"
    assert os_error_message(OSError()) == "OSError"  # nothing to say but the type


def test_errno_errors_unchanged():
    e = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "/x/f.npy")
    assert os_error_message(e) == ("/x/f.npy: No space left on device "
                                   "(free some space and rerun: finished work is kept and resumed)")
    e = OSError(errno.EACCES, os.strerror(errno.EACCES), "/x/f.npy")
    assert os_error_message(e) == "/x/f.npy: Permission denied"


def test_prepare_on_a_full_disk_names_out_and_says_full(tmp_path, capsys, monkeypatch):
    """The audit's case: ``prepare`` on a full disk printed ``--out .../p64: OSError``."""

    def short_write(*a, **k):
        raise OSError(SHORT_WRITE)

    monkeypatch.setattr(np, "save", short_write)
    out = tmp_path / "p64"
    rc, _, err = run_cli(capsys, "prepare", "synthetic", "--out", out, "--size", "8", "--per-class", "2",
                         "--num-classes", "2")
    line = assert_one_line_error(rc, err, f"--out {out}", "the disk may be full", "free some space")
    assert not line.endswith("OSError")
    assert not out.exists()
