"""A rerun with other settings replaces the changed cells' results (docs/sweeps.md, *Changes*), and says so,
naming them, before the first cell runs (audit #9: only the final count hinted at it)."""

from __future__ import annotations

import pytest
import yaml

from bench.sweep import runner as sweep_runner
from bench.sweep.runner import run_sweep
from bench.sweep.spec import load_sweep
from tests.cli_helpers import run_cli


@pytest.fixture(autouse=True)
def same_code(monkeypatch):
    """One code identity for every run of a test: other edits to the tree between two runs would make
    every cell stale, which is not what these tests are about."""
    ident = {"id": "code-A", "code": {"id": "A", "label": "commit A (clean)"}, "libraries": {}}
    monkeypatch.setattr(sweep_runner, "code_identity", lambda: dict(ident))


WRITE = "import pathlib, sys; pathlib.Path('result.txt').write_text(sys.argv[1])"


def _spec(tmp_path, b_value: str):
    p = tmp_path / "sw.yaml"
    p.write_text(yaml.safe_dump({"name": "sw", "cells": [
        {"kind": "python", "id": "a", "command": ["-c", WRITE, "a"]},
        {"kind": "python", "id": "b", "command": ["-c", WRITE, b_value]},
        {"kind": "python", "id": "c", "needs": ["b"], "command": ["-c", WRITE, "c"]},
    ]}))
    return p


def test_changed_cells_are_listed_before_their_results_are_replaced(tmp_path):
    out = tmp_path / "run"
    first = run_sweep(load_sweep(str(_spec(tmp_path, "b1"))), out, progress=False)
    assert first.changed == [] and first.ran == ["a", "b", "c"]
    seen = {}

    def plan(s):  # before any cell runs: the old results are still there
        seen["changed"] = list(s.changed)
        seen["kept"] = list(s.kept)
        seen["b"] = (out / "cells" / "b" / "result.txt").read_text()

    second = run_sweep(load_sweep(str(_spec(tmp_path, "b2"))), out, progress=False, plan=plan)
    # b changed itself, c through the cell it depends on; a is kept
    assert seen == {"changed": ["b", "c"], "kept": ["a"], "b": "b1"}
    assert second.changed == ["b", "c"] and second.ran == ["b", "c"]
    assert (out / "cells" / "b" / "result.txt").read_text() == "b2"


def test_the_cli_prints_the_changed_cells_before_running_them(tmp_path, capsys):
    out = tmp_path / "run"
    argv = ("sweep", "--out", out, "--no-report", "--no-progress")
    rc, _, err = run_cli(capsys, argv[0], _spec(tmp_path, "b1"), *argv[1:])
    assert rc == 0, err
    rc, stdout, err = run_cli(capsys, argv[0], _spec(tmp_path, "b1"), *argv[1:])
    assert rc == 0 and "changed" not in stdout, stdout  # a plain rerun replaces nothing
    rc, stdout, err = run_cli(capsys, argv[0], _spec(tmp_path, "b2"), *argv[1:])
    assert rc == 0, err
    lines = stdout.splitlines()
    notice = [i for i, ln in enumerate(lines) if ln.startswith("2 finished cells changed")]
    assert notice, stdout
    assert lines[notice[0]].endswith(": b, c") and "earlier results are deleted" in lines[notice[0]]
    assert "another --out" in lines[notice[0]]
    assert notice[0] < next(i for i, ln in enumerate(lines) if ln.startswith("ok") and " b " in ln + " ")
