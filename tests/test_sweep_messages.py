"""What ``inrbench sweep`` prints about its cells: the log of each failed cell, by its real path."""

from __future__ import annotations

import yaml

from tests.cli_helpers import run_cli

FAIL = "import sys; print('ValueError: boom', file=sys.stderr); sys.exit(3)"


def _write(path, doc):
    path.write_text(yaml.safe_dump(doc))
    return path


def test_failed_cells_print_the_real_path_of_their_log(tmp_path, capsys):
    """Audit #13a: the line said ``(see .../cells/<id>/stderr.log)``, a placeholder to fill in by hand."""
    spec = _write(tmp_path / "sw.yaml", {"name": "sw", "cells": [
        {"kind": "python", "id": "a", "command": ["-c", "pass"]},
        {"kind": "python", "id": "b", "command": ["-c", FAIL]},
        {"kind": "python", "id": "c", "command": ["-c", FAIL]},
    ]})
    out = tmp_path / "sw bad"
    rc, _, err = run_cli(capsys, "sweep", spec, "--out", out, "--no-report", "--no-progress")
    assert rc == 1, err
    assert "<id>" not in err
    lines = [ln for ln in err.splitlines() if ln.startswith("failed cell")]
    assert lines == [f"failed cell b: see {out}/cells/b/stderr.log", f"failed cell c: see {out}/cells/c/stderr.log"]
    for cid in ("b", "c"):
        assert "ValueError: boom" in (out / "cells" / cid / "stderr.log").read_text()
