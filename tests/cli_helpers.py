"""Shared by the CLI suites (hostile input, output safety): run the real CLI, check its one-line
error, and take a byte-exact snapshot of a tree to prove nothing was touched."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from bench import cli


def run_cli(capsys, *argv) -> tuple[int, str, str]:
    """``bench.cli.main(argv)`` -> (exit code, stdout, stderr)."""
    rc = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def assert_one_line_error(rc: int, err: str, *fragments) -> str:
    """Exit 2, no traceback, exactly one ``inrbench: error:`` line holding every fragment; returns it."""
    assert rc == 2, err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("inrbench: error: "), err
    for f in fragments:
        assert str(f) in lines[0], (f, lines[0])
    return lines[0]


def snapshot(top: str | Path, dirs: bool = False) -> dict[str, str]:
    """Relative path -> sha256 of the bytes (``-> target`` for a symlink, never followed;
    ``dir`` for a folder when ``dirs``): equal snapshots mean nothing was changed, added or removed."""
    out = {}
    for d, subdirs, files in os.walk(top, followlinks=False):
        for name in files + subdirs:
            p = os.path.join(d, name)
            rel = os.path.relpath(p, top)
            if os.path.islink(p):
                out[rel] = "-> " + os.readlink(p)
            elif name in files:
                with open(p, "rb") as f:
                    out[rel] = hashlib.sha256(f.read()).hexdigest()
            elif dirs:
                out[rel] = "dir"
    return out
