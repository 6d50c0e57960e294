"""Every typed cell's options are checked when the sweep file is loaded, before any cell runs (``--list``
too), by the cell's own command (audit #4): its parser, then its own checks (``Cell.check_command``), not a
list of rules kept apart. One line naming the file and the cell, exit 2; nothing run, nothing written."""

from __future__ import annotations

import pytest

from tests.cli_helpers import assert_one_line_error, run_cli

PREP = "  - {kind: prepare, id: p, source: synthetic, size: 8, args: {per_class: 2, num_classes: 2}}\n"
ENC = "  - {kind: encode, id: e, data: p, preset: demo, iterations: 5}\n"

CASES = [
    ("unknown-pipeline", PREP + "  - {kind: bench, id: b, data: p, pipeline: toyy}\n",
     "b", "unknown pipeline 'toyy'"),
    ("inr-without-store", PREP + "  - {kind: bench, id: b, data: p, pipeline: inr}\n",
     "b", "--pipeline inr reads an encoded store"),
    ("bench-bad-choice", PREP + "  - {kind: bench, id: b, data: p, pipeline: raw, args: {crop: sideways}}\n",
     "b", "argument --crop: invalid choice"),
    ("unknown-source", "  - {kind: prepare, id: p, source: nosuch}\n", "p", "unknown dataset source 'nosuch'"),
    ("source-needs-root", "  - {kind: prepare, id: p, source: imagefolder}\n", "p", "needs --root"),
    ("builtin-takes-no-root", "  - {kind: prepare, id: p, source: synthetic, root: x}\n", "p", "takes no --root"),
    ("prepare-size", "  - {kind: prepare, id: p, source: synthetic, size: 3}\n", "p", "--size must be between"),
    ("prepare-val-fraction", "  - {kind: prepare, id: p, source: cifar10, root: c10, args: {val_fraction: 0.1}}\n",
     "p", "--val-fraction 0.1 does not apply to cifar10"),
    ("jpeg-qualities", PREP + "  - {kind: compare, id: c, data: p, jpeg_qualities: [0, 500]}\n",
     "c", "--jpeg-qualities"),
    ("compare-codec", PREP + "  - {kind: compare, id: c, data: p, args: {codecs: 'jpeg,nosuch'}}\n", "c", "nosuch"),
    ("meta-init-preset", PREP + "  - {kind: meta-init, id: m, data: p, preset: nosuch}\n", "m", "unknown preset"),
    ("meta-init-validation", PREP + "  - {kind: meta-init, id: m, data: p, args: {validation: 4}}\n",
     "m", "--validation 4 sets train images aside"),
]


@pytest.mark.parametrize(("body", "cell", "says"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
@pytest.mark.parametrize("listing", [True, False], ids=["list", "run"])
def test_a_cell_its_command_would_refuse_is_refused_when_the_sweep_loads(tmp_path, capsys, body, cell, says,
                                                                         listing):
    y = tmp_path / "s.yaml"
    y.write_text("name: s\nreport: false\ncells:\n" + body)
    out = tmp_path / "run"
    rc, stdout, err = run_cli(capsys, "sweep", y, "--out", out, "--no-progress", *(["--list"] if listing else []))
    assert_one_line_error(rc, err, str(y), f"cell '{cell}'", says)
    assert stdout == "" and not out.exists()  # no cell listed or run, nothing written


def test_bench_counts_are_refused_when_the_sweep_loads(tmp_path, capsys):
    y = tmp_path / "s.yaml"
    y.write_text("name: s\nreport: false\ncells:\n" + PREP + "  - {kind: bench, id: b, data: p, pipeline: raw, epochs: -1}\n")
    rc, _, err = run_cli(capsys, "sweep", y, "--list")
    assert_one_line_error(rc, err, str(y), "cell 'b'", "epochs")


def test_cells_that_are_fine_still_load(tmp_path, capsys):
    """What only the run can check is left to it: the prepared folder and the stores do not exist yet."""
    y = tmp_path / "s.yaml"
    y.write_text("name: s\nreport: false\ncells:\n" + PREP + ENC
                 + "  - {kind: prepare, id: q, source: imagefolder, root: my-photos, size: 16}\n"
                 + "  - {kind: meta-init, id: m, data: p, preset: demo, outer_steps: 2, candidates: 2}\n"
                 + "  - {kind: compare, id: c, data: p, stores: [e], jpeg_qualities: [10, 90]}\n"
                 + "  - {kind: bench, id: b, data: p, store: e, pipeline: inr, mode: train, epochs: 1}\n")
    rc, stdout, err = run_cli(capsys, "sweep", y, "--list")
    assert rc == 0, err
    assert [ln.split()[0] for ln in stdout.splitlines() if not ln.startswith(" ")] == ["p", "e", "q", "m", "c", "b"]
