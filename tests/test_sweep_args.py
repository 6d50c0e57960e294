"""A sweep file cannot send a cell's output elsewhere: ``args`` may not set what the cell kind sets
itself (audit 1.1), and the sweep's own ``name`` is a plain file name (audit 1.2). Both are refused
when the file is loaded, before any cell runs (``--list`` too): one line naming the file, exit 2."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from cli_helpers import assert_one_line_error, run_cli, snapshot

from bench.errors import InputError
from bench.sweep.cells import KINDS, SWEEP_OWNED, command_parser, owned_options
from bench.sweep.runner import SweepContext
from bench.sweep.spec import builtin_names, load_sweep

TYPED = [k for k, c in KINDS.items() if c.command]


def _sweep(tmp_path: Path, body: str, name: str = "s.yaml") -> Path:
    p = tmp_path / name
    p.write_text(textwrap.dedent(body))
    return p


def _refused(tmp_path: Path, body: str, *fragments: str) -> str:
    p = _sweep(tmp_path, body)
    with pytest.raises(InputError) as e:
        load_sweep(str(p))
    msg = str(e.value)
    assert msg.startswith(f"{p}: ") and "\n" not in msg, msg
    for f in fragments:
        assert f in msg, (f, msg)
    return msg


def test_audit_args_out_overwrite_cannot_replace_a_users_dataset(tmp_path, capsys):
    """The audit's file: ``args: {out: <user's prepared set>, overwrite: true}`` on a prepare cell.
    Refused by ``--list`` and by a run, naming the file, the cell and the key; nothing is written."""
    mine = tmp_path / "myprep"
    mine.mkdir()
    (mine / "manifest.json").write_text('{"source": "photos"}')
    y = _sweep(tmp_path, f"""
        name: t14
        report: false
        cells:
          - {{kind: prepare, id: p, source: synthetic, size: 8, args: {{out: {mine}, overwrite: true}}}}
    """, "bad14.yaml")
    before = snapshot(tmp_path)
    for extra in (["--list"], []):
        rc, out, err = run_cli(capsys, "sweep", y, "--out", tmp_path / "runs" / "t14", *extra)
        assert_one_line_error(rc, err, str(y), "cell 'p'", "args key 'out'", "--out")
        assert out == ""
    assert snapshot(tmp_path) == before  # no sweep folder, the user's set untouched


@pytest.mark.parametrize("kind", TYPED)
def test_every_option_the_sweep_owns_is_refused_by_any_spelling(tmp_path, kind):
    """``--out``, ``--overwrite``, ``--rdzv-*`` (and ``--nproc``/``--nnodes`` in ``args``), as ``x_y``, ``x-y``
    and ``--x-y``, as a field and in ``args``."""
    opts = KINDS[kind].options
    owned = [k for k in opts if k in SWEEP_OWNED]
    assert "out" in owned
    cells = _cells_for(kind)
    for name in owned + [k for k in ("nproc", "nnodes") if k in opts]:
        flag = "--" + name.replace("_", "-")
        for key in {name, name.replace("_", "-"), flag}:
            _refused(tmp_path, cells.replace("ARGS", f"{{'{key}': x}}"), "cell 'c'", f"args key '{key}'", flag)
    _refused(tmp_path, cells.replace("args: ARGS", "out: x"), "cell 'c'", "field 'out' would set --out")


def _cells_for(kind: str) -> str:
    """A valid sweep whose last cell ``c`` is of ``kind`` with ``args: ARGS``."""
    cell = {
        "prepare": "{kind: prepare, id: c, source: synthetic, args: ARGS}",
        "meta-init": "{kind: meta-init, id: c, data: p, args: ARGS}",
        "encode": "{kind: encode, id: c, data: p, args: ARGS}",
        "compare": "{kind: compare, id: c, data: p, stores: [e], args: ARGS}",
        "bench": "{kind: bench, id: c, data: p, pipeline: raw, args: ARGS}",
    }[kind]
    return f"""
        cells:
          - {{kind: prepare, id: p, source: synthetic}}
          - {{kind: encode, id: e, data: p}}
          - {cell}
    """


@pytest.mark.parametrize("kind, flags", [
    ("prepare", ["--out", "--overwrite"]),
    ("meta-init", ["--out", "--overwrite"]),
    ("encode", ["--fit-cache", "--init", "--nnodes", "--nproc", "--out", "--overwrite", "--rdzv-endpoint", "--rdzv-id"]),
    ("compare", ["--out", "--store"]),
    ("bench", ["--data", "--nnodes", "--nproc", "--out", "--rdzv-endpoint", "--rdzv-id", "--store"]),
])
def test_the_sweep_owns_outputs_references_and_the_launch(kind, flags):
    assert owned_options(KINDS[kind]) == flags


@pytest.mark.parametrize("name", builtin_names())
def test_builtin_cells_parse_and_write_inside_their_folder(name):
    """Every built-in cell's line is one its command's parser reads, with ``--out`` inside the cell's folder."""
    cfg = load_sweep(name)
    ctx = SweepContext(out=Path("/o"), data_root=Path("/d"), cells=cfg.by_id())
    for c in cfg.cells:
        if KINDS[c.kind].command:
            ns = command_parser(c.kind).parse_args(c.argv(ctx)[1:])
            assert Path(ns.out).parent == Path("/o/cells") / c.id and not getattr(ns, "overwrite", False), c.id


@pytest.mark.parametrize("args, fragment", [
    ("{ou: /x}", "args key 'ou': inrbench prepare has no option --ou"),  # never completed as a prefix
    ("{o: /x}", "has no option --o"),
    ("{data_root: /x}", "has no option --data-root"),
    ("{data-root: /x}", "has no option --data-root"),
    ("{colour: red}", "inrbench prepare has no option --colour"),
    ("{root: /x}, root: y", "args key 'root' sets 'root' a second time"),
    ("{name: ../x}", "name '../x' must be a plain file name"),
    ("{'--per-class': 3}", "write the option name without dashes ('per_class')"),
    ("{per_class: [3, --out, /x]}", "value '--out' would be read as an option"),
    ("{per_class: '--out=/x'}", "value '--out=/x' would be read as an option"),
    ("{help: true}", "has no option --help"),
    ("{'out=/x': 1}", "must be an option name"),
])
def test_args_that_reach_a_managed_option_another_way_are_refused(tmp_path, args, fragment):
    _refused(tmp_path, f"cells: [{{kind: prepare, id: p, source: synthetic, args: {args}}}]", "cell 'p'", fragment)


def test_defaults_and_matrix_items_are_checked_too(tmp_path):
    _refused(tmp_path, """
        defaults: {bench: {args: {out: /x}}}
        cells:
          - {kind: prepare, id: p, source: synthetic}
          - {kind: bench, id: b, data: p, pipeline: raw}
    """, "cell 'b'", "args key 'out'")
    _refused(tmp_path, """
        cells:
          - {kind: prepare, id: p, source: synthetic}
          - kind: bench
            id: "b-{label}"
            data: p
            pipeline: raw
            matrix: {m: [{label: one}, {label: two, args: {data: /x}}]}
    """, "cell 'b-two'", "args key 'data'")


def test_legitimate_args_still_pass(tmp_path):
    p = _sweep(tmp_path, """
        cells:
          - {kind: prepare, id: p, source: synthetic, args: {per_class: 4, num-classes: 2, seed: 3}}
          - {kind: encode, id: e, data: p, prune: 0.2, args: {shard_size: 2, keep_work: true, prune_rounds: 1}}
          - kind: bench
            id: b
            data: p
            pipeline: raw
            args: {crop: random-pad, threads: 1, no-step-sync: true, scale: [0.5, 1.0], min_seconds: 0,
                   dist_timeout: 120, lr: -0.5}
    """)
    cells = load_sweep(str(p)).by_id()
    assert cells["b"].scale == [0.5, 1.0] and cells["e"].shard_size == 2


@pytest.mark.parametrize("kind", ["inrbench", "python"])
def test_command_kinds_take_args_verbatim(tmp_path, kind):
    """``inrbench``/``python`` cells run the command as written (docs/sweeps.md): ``args`` only appends to it."""
    assert KINDS[kind].command is None and not owned_options(KINDS[kind])
    p = _sweep(tmp_path, f"cells: [{{kind: {kind}, id: c, command: [x], args: {{out: y}}}}]")
    cell = load_sweep(str(p)).cells[0]
    assert cell.args == {"out": "y"} and cell.argv(SweepContext(out=tmp_path, data_root=None, cells={})) == \
        ["x", "--out", "y"]


# --- the sweep's own name (audit 1.2) ---------------------------------------------------------------

@pytest.mark.parametrize("name", ["../escaped", "ABS/walk/abs", "a/b", "..", "."])
def test_sweep_name_must_be_a_plain_file_name(tmp_path, capsys, monkeypatch, name):
    monkeypatch.chdir(tmp_path)  # runs/<name> is taken from here
    name = name.replace("ABS", str(tmp_path))
    y = _sweep(tmp_path, f"name: '{name}'\nreport: false\ncells: [{{kind: prepare, id: p, source: synthetic}}]\n")
    before = snapshot(tmp_path)
    for extra in (["--list"], []):
        rc, _, err = run_cli(capsys, "sweep", y, "--no-progress", *extra)
        assert_one_line_error(rc, err, str(y), f"sweep name {name!r} must be a plain file name", "runs/<name>")
    assert snapshot(tmp_path) == before


def test_a_sweep_named_after_its_file_is_checked_too(tmp_path):
    y = _sweep(tmp_path, "cells: [{kind: prepare, id: p, source: synthetic}]\n", "..yaml")  # stem '.'
    with pytest.raises(InputError, match=r"sweep name '\.' must be a plain file name"):
        load_sweep(str(y))
    assert load_sweep(str(_sweep(tmp_path, "cells: [{kind: prepare, id: p, source: synthetic}]\n",
                                 "my-sweep.yaml"))).name == "my-sweep"


@pytest.mark.parametrize(("extra", "says"), [
    ("args: {prune_rounds: 2}", "--prune-rounds 2 applies to iterative pruning only"),
    ("bits: '32:32:32', args: {qat: 5}", "--qat 5 fine-tunes against quantized weights"),
    ("args: {qat: many}", "argument --qat"),
])
def test_encode_options_the_command_would_refuse_are_refused_when_the_sweep_loads(tmp_path, capsys, extra, says):
    """Not as an error cell hours into the sweep: `--list` already says it, naming the file and the cell."""
    y = tmp_path / "enc.yaml"
    y.write_text("name: enc\nreport: false\ncells:\n  - {kind: prepare, id: p, source: synthetic, size: 8}\n"
                 f"  - {{kind: encode, id: e, data: p, preset: demo, {extra}}}\n")
    rc, _, err = run_cli(capsys, "sweep", str(y), "--list")
    assert_one_line_error(rc, err, str(y), "cell 'e'", says)
