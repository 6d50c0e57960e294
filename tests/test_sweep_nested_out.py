"""A sweep's ``--out`` may not lie inside another sweep's results folder (audit #10): there it reads as a
cell that sweep never declared. Refused with one line, exit 2, before anything is written."""

from __future__ import annotations

import pytest
import yaml

from bench.sweep import runner as sweep_runner
from tests.cli_helpers import assert_one_line_error, run_cli, snapshot


@pytest.fixture(autouse=True)
def same_code(monkeypatch):
    """One code identity for every run of a test: other edits to the tree between two runs would make
    every cell stale, which is not what these tests are about."""
    ident = {"id": "code-A", "code": {"id": "A", "label": "commit A (clean)"}, "libraries": {}}
    monkeypatch.setattr(sweep_runner, "code_identity", lambda: dict(ident))


def _spec(tmp_path, name):
    p = tmp_path / f"{name}.yaml"
    p.write_text(yaml.safe_dump({"name": name, "cells": [{"kind": "python", "id": "a", "command": ["-c", "pass"]}]}))
    return p


@pytest.mark.parametrize("inside", ["cells/new", "cells/a/deeper", "shared/x", "new"])
def test_out_inside_another_sweeps_folder_is_refused(tmp_path, capsys, inside):
    x = tmp_path / "runs" / "x"
    rc, _, err = run_cli(capsys, "sweep", _spec(tmp_path, "x"), "--out", x, "--no-report", "--no-progress")
    assert rc == 0, err
    before = snapshot(x, dirs=True)
    out = x / inside
    rc, _, err = run_cli(capsys, "sweep", _spec(tmp_path, "y"), "--out", out, "--no-report", "--no-progress")
    assert_one_line_error(rc, err, f"--out {out}", "lies inside the results folder of another sweep", str(x))
    assert snapshot(x, dirs=True) == before and not out.exists()


def test_a_sweep_folder_beside_another_is_fine(tmp_path, capsys):
    runs = tmp_path / "runs"
    for name in ("x", "y"):
        rc, _, err = run_cli(capsys, "sweep", _spec(tmp_path, name), "--out", runs / name, "--no-report",
                             "--no-progress")
        assert rc == 0, err
    # and rerunning a sweep in its own folder is not "inside another sweep"
    rc, out, err = run_cli(capsys, "sweep", _spec(tmp_path, "x"), "--out", runs / "x", "--no-report", "--no-progress")
    assert rc == 0 and "1 kept from before" in out, err
