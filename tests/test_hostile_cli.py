"""Hostile input and careless use through the real CLI (issue 34, items 12, 13 and 15-26), table-driven.

Each case ends in its one documented way: one ``inrbench: error: ...`` line (short) and exit 2, or the
command's own status with nothing lost; never a traceback, a hang or a split line. Cases that need real
file descriptors (stdout closed, full, a pipe without a reader) or that would hang run a child process.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from cli_helpers import assert_one_line_error, run_cli

from bench import results
from bench.sweep import layout

pytestmark = pytest.mark.usefixtures("one_torch_thread")

ROOT = Path(__file__).resolve().parents[1]
PREPARE = ["prepare", "synthetic", "--size", "8", "--per-class", "2", "--num-classes", "2"]
BENCH = ["bench", "--pipeline", "raw", "--device", "cpu", "--repeats", "1", "--warmup", "0", "--batch-size", "4",
         "--workers", "0", "--backbone", "small-cnn", "--monitor-period", "0.5"]


def child(*argv: str, cwd: Path, stdout=subprocess.PIPE, env: dict | None = None, close_stdout: bool = False,
          code: str | None = None, small: bool = False) -> subprocess.CompletedProcess:
    """``python -m bench ARGV`` (or ``python -c CODE``) in ``cwd``, for at most 120 s; ``small``: with at
    most 1 GB of address space (no torch then), so that a case that once blew up fails here instead of
    taking the machine down."""
    def limits():
        if small:
            resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))
        if close_stdout:
            os.close(1)

    cmd = [sys.executable, *(["-c", code] if code else ["-m", "bench"]), *argv]
    return subprocess.run(cmd, cwd=cwd, stdout=stdout, stderr=subprocess.PIPE, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}, preexec_fn=limits)


def one_error_line(p: subprocess.CompletedProcess, *fragments: str) -> str:
    assert "Traceback" not in p.stderr, p.stderr
    return assert_one_line_error(p.returncode, p.stderr, *fragments)


# ------------------------------------------------------------------ 12, 15, 16, 25: sweep files

BOMB = ("name: s\ndescription: &i [&h [&g [&f [&e [&d [&c [&b [&a [x,x,x,x,x,x,x,x,x]"
        + "".join(f",*{c}" * 8 + "]" for c in "abcdefgh") + "\n"
        "cells:\n  - {kind: python, id: a, command: ['-c', '1']}\n")
TEN = "[0, 1, 2, 3, 4, 5, 6, 7, 8, 9]"
SWEEPS = [
    # 12: a billion values from a few lines (YAML aliases), a billion cells from one matrix
    ("alias-bomb", BOMB, "more than 1,000,000 values once its YAML aliases"),
    ("billion-cell-matrix", "name: s\ncells:\n  - {kind: python, id: 'c{a}{b}{c}{d}{e}{f}{g}{h}{i}', command: ['-c', '1'], "
     "matrix: {" + ", ".join(f"{k}: {TEN}" for k in "abcdefghi") + "}}\n",
     "'matrix' makes 1,000,000,000 cells, more than a sweep may hold (10,000)"),
    # 15: attribute access in the id template
    ("id-attribute", "name: s\ncells:\n  - {kind: python, id: 'p{args.nope}', command: ['-c', '1'], args: {x: 1}}\n",
     "cannot format id 'p{args.nope}': {args.nope}: a field is a name, or name[key] (no attribute access)"),
    # 16: not UTF-8
    ("latin-1", "name: s\ncells:\n  - {kind: python, id: 'caf\xe9', command: ['-c', '1']}\n".encode("latin-1"),
     "cannot read sweep YAML: 'utf-8' codec can't decode byte 0xe9"),
    # 25: a 200 KB id, from a format spec or written out
    ("id-wide-format-spec", "name: s\ncells:\n  - {kind: python, id: 'p{x:>200000}', x: 1, command: ['-c', '1']}\n",
     "{x:>200000}: widths and precisions are at most 200"),
    ("id-200k-characters", "name: s\ncells:\n  - {kind: python, id: '" + "a" * 200_000 + "', command: ['-c', '1']}\n",
     "characters) is 200000 characters long, at most 200"),
]


@pytest.mark.parametrize("name,text,message", SWEEPS, ids=[s[0] for s in SWEEPS])
def test_a_hostile_sweep_file_is_one_short_line(tmp_path, name, text, message):
    f = tmp_path / "s.yaml"
    f.write_bytes(text if isinstance(text, bytes) else text.encode())
    p = child("sweep", str(f), "--list", cwd=tmp_path, small=True)
    line = one_error_line(p, "s.yaml: ", message)
    assert len(line) < 300, len(line)
    assert not (tmp_path / "runs").exists()


def test_a_thousand_cells_list_and_item_access_in_an_id_still_work(tmp_path):
    f = tmp_path / "s.yaml"
    f.write_text("name: s\ncells:\n  - {kind: python, id: 'c{a}-{b}-{c}-{args[x]}', command: ['-c', '1'], args: {x: 7}, "
                 f"matrix: {{a: {TEN}, b: {TEN}, c: {TEN}}}}}\n")
    p = child("sweep", str(f), "--list", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    ids = [line.split()[0] for line in p.stdout.splitlines() if not line.startswith(" ")]
    assert len(ids) == 1000 and ids[0] == "c0-0-0-7" and ids[-1] == "c9-9-9-7"


# ------------------------------------------------------------------ 13, 18, 22: stdout closed, full, ASCII

STDOUT = [
    # (id, argv, how stdout is given, expected exit, expected stderr fragment or None for empty)
    ("datasets-stdout-closed", ["datasets"], "closed", 2, "cannot write to stdout: it is closed"),
    ("prepare-stdout-closed", [*PREPARE, "--out", "ds"], "closed", 2, "cannot write to stdout: it is closed"),
    ("prepare-stdout-full", [*PREPARE, "--out", "ds"], "/dev/full", 2,
     "cannot write to stdout: No space left on device; the command ran to its end"),
    ("prepare-ascii-stdout-non-ascii-out", [*PREPARE, "--out", "dé"], "ascii", 0, None),
]


@pytest.mark.parametrize("case", STDOUT, ids=[c[0] for c in STDOUT])
def test_stdout_that_cannot_take_the_output_is_said_once_and_loses_nothing(tmp_path, case):
    cid, argv, how, code, message = case
    if how == "/dev/full" and not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full on this system")
    kw: dict = {"close_stdout": how == "closed"}
    if how == "/dev/full":
        kw["stdout"] = open("/dev/full", "w")  # noqa: SIM115 - closed below
    if how == "ascii":
        kw["env"] = {"PYTHONIOENCODING": "ascii"}
    try:
        p = child(*argv, cwd=tmp_path, **kw)
    finally:
        if how == "/dev/full":
            kw["stdout"].close()
    if message is None:
        assert p.returncode == code and p.stderr == "", p.stderr
        assert "d\\xe9" in p.stdout  # the name, escaped
    else:
        line = one_error_line(p, message)
        assert "--out" not in line  # the output is fine: stdout is what failed
    if "--out" in argv:  # the dataset is whole, whatever happened to what was printed about it
        out = tmp_path / argv[argv.index("--out") + 1]
        from bench.datasets.prepared import open_prepared

        assert len(open_prepared(out).split("train").labels) == 2  # checksums verified


# ------------------------------------------------------------------ 21: a sweep's reader goes away

def test_a_sweep_whose_reader_stopped_runs_every_cell(tmp_path):
    """``inrbench sweep s.yaml | head -1``: the sweep runs on to its last cell (it stopped after the first
    line before), then exits 141 as a cut-short listing does, saying nothing."""
    f = tmp_path / "s.yaml"
    f.write_text("name: s\nreport: false\ncells:\n" + "".join(
        f"  - {{kind: python, id: {c}, command: ['-c', 'print({i})']}}\n" for i, c in enumerate("abc")))
    r, w = os.pipe()
    os.close(r)
    try:
        p = child("sweep", str(f), "--out", str(tmp_path / "out"), "--no-progress", cwd=tmp_path, stdout=w)
    finally:
        os.close(w)
    assert p.returncode == 141 and p.stderr == "", p.stderr
    for c in "abc":
        assert layout.read_marker(tmp_path / "out" / layout.CELLS_DIR / c)["status"] == "ok", c


# ------------------------------------------------------------------ 19: Ctrl-C

def test_a_ctrl_c_while_the_process_shuts_down_prints_nothing(tmp_path):
    """A Ctrl-C that comes once the command is over (the interpreter joining threads, running atexit
    handlers) printed "Exception ignored ... KeyboardInterrupt"."""
    code = ("import atexit, os, signal, sys; atexit.register(os.kill, os.getpid(), signal.SIGINT); "
            "from bench.cli import main; sys.argv[1:] = ['datasets']; sys.exit(main())")
    p = child(cwd=tmp_path, code=code)
    assert p.returncode == 0 and p.stderr == "", p.stderr


def test_a_ctrl_c_to_a_torch_jpeg_worker_is_left_to_the_parent(tmp_path, capsys):
    """Ctrl-C reaches the whole process group: a DataLoader worker that died of it took the epoch down
    ("worker exited unexpectedly"), or printed a multiprocessing BrokenPipeError traceback; it is the
    parent's to stop them."""
    import pipelines
    from bench.datasets.prepared import open_prepared
    from pipelines.base import PipelineConfig

    assert run_cli(capsys, *PREPARE, "--out", tmp_path / "ds")[0] == 0
    pipe = pipelines.create("torch-jpeg", open_prepared(tmp_path / "ds"), PipelineConfig(batch_size=1, workers=1))
    try:
        it = iter(pipe)
        next(it)
        worker = pipe.loader._iterator._workers[0]
        os.kill(worker.pid, signal.SIGINT)
        worker.join(timeout=1)
        assert worker.is_alive()
        assert sum(1 for _ in it) + 1 == len(pipe) == 2 and sum(1 for _ in pipe) == 2  # this epoch and the next
    finally:
        pipe.close()


# ------------------------------------------------------------------ 17, 23, 24: stores, long names

@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("store")
    from bench.cli import main

    assert main([*PREPARE, "--out", str(d / "ds")]) == 0
    assert main(["encode", str(d / "ds"), "--out", str(d / "s.inr"), "--iterations", "2", "--no-progress"]) == 0
    return d / "s.inr"


def huge_labels(store: Path, tmp: Path) -> Path:
    """The labels array said to be [2**32, 2**32] of 0 bytes (2**64 wraps to 0 in int64), checksums right."""
    import zlib

    from inr import store as S

    raw = store.read_bytes()
    _, _, hlen, _ = S.PREFIX.unpack_from(raw, 0)
    header = json.loads(raw[S.PREFIX.size : S.PREFIX.size + hlen])
    body = bytearray(raw[S.aligned(S.PREFIX.size + hlen):])
    e = next(a for a in header["arrays"] if a["name"] == "labels")
    e.update(shape=[2**32, 2**32], nbytes=0, crc32=zlib.crc32(b""))
    (tmp / "s.inr").write_bytes(S.pack_file(header, body))
    return tmp / "s.inr"


def fifo(store: Path, tmp: Path) -> Path:
    os.mkfifo(tmp / "f.inr")
    return tmp / "f.inr"


def loop(store: Path, tmp: Path) -> Path:
    (tmp / "l.inr").symlink_to("l.inr")
    return tmp / "l.inr"


INSPECT = [
    ("shape-2^32-by-2^32", huge_labels, "array 'labels' is |u1 [4294967296, 4294967296] (18446744073709551616 bytes), "
                                        "header says 0 bytes"),
    ("fifo", fifo, "f.inr: is a named pipe (FIFO), not an INR store file"),
    ("dev-zero", lambda s, t: Path("/dev/zero"), "/dev/zero: is a character device, not an INR store file"),
    ("symlink-loop", loop, "l.inr: cannot open it as an INR store file: Too many levels of symbolic links"),
]


@pytest.mark.parametrize("name,build,message", INSPECT, ids=[c[0] for c in INSPECT])
def test_inspect_says_what_is_wrong_with_the_file(store, tmp_path, capsys, name, build, message):
    rc, out, err = run_cli(capsys, "inspect", build(store, tmp_path))
    assert_one_line_error(rc, err, message)


def test_a_legal_244_byte_output_name_is_accepted(store, tmp_path, capsys):
    """Its lock and temporary names (``.NAME.inrbench-...``) were longer than a name may be (255 bytes)."""
    name = "n" * 240
    assert run_cli(capsys, "env", "--out", tmp_path / f"{name}.json")[0] == 0
    assert json.loads((tmp_path / f"{name}.json").read_text())
    rc, out, err = run_cli(capsys, "encode", store.parent / "ds", "--out", tmp_path / f"{name}.inr",
                           "--iterations", "2", "--no-progress")
    assert rc == 0 and "File name too long" not in err, err
    rc, out, err = run_cli(capsys, "inspect", tmp_path / f"{name}.inr", "--json")
    assert rc == 0 and json.loads(out)["num_images"] == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"{name}.inr", f"{name}.json"]  # no lock or temp left


# ------------------------------------------------------------------ 20, 26: bench and report

@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    """A dataset whose folder name holds a line break, and one bench run of it."""
    from bench.cli import main

    d = tmp_path_factory.mktemp("runs")
    assert main([*PREPARE, "--out", str(d / "ds\nx")]) == 0
    assert main([*BENCH, "--data", str(d / "ds\nx"), "--out", str(d / "results")]) == 0
    return d


def _empty_rows(tmp: Path, monkeypatch) -> None:
    (tmp / "results" / results.RUNS_DIR / "other").mkdir()
    (tmp / "results" / results.RUNS_DIR / "other" / results.ROWS_FILE).write_text("")


def _full_disk_at_the_views(tmp: Path, monkeypatch) -> None:
    real = results.atomic_write_bytes

    def write(path, data):
        if Path(path).name == results.MERGED_CSV:
            raise OSError(28, "No space left on device", str(path))
        return real(path, data)

    monkeypatch.setattr(results, "atomic_write_bytes", write)


VIEWS = [("disk-full-at-the-views", _full_disk_at_the_views, "results.csv: No space left on device")]


def test_bench_refuses_a_folder_with_an_unreadable_run_before_measuring(runs, tmp_path, capsys, monkeypatch):
    """Another run's empty rows.csv is found when bench claims --out: one line, exit 2, no run added
    (the rerun, once the folder is fixed, records one run)."""
    import shutil

    shutil.copytree(runs / "results", tmp_path / "results")
    _empty_rows(tmp_path, monkeypatch)
    before = {p.name for p in (tmp_path / "results" / results.RUNS_DIR).iterdir()}
    rc, out, err = run_cli(capsys, *BENCH, "--data", runs / "ds\nx", "--out", tmp_path / "results")
    assert_one_line_error(rc, err, "rows.csv", "cannot read results rows")
    assert {p.name for p in (tmp_path / "results" / results.RUNS_DIR).iterdir()} == before


@pytest.mark.parametrize("name,damage,why", VIEWS, ids=[v[0] for v in VIEWS])
def test_bench_whose_views_cannot_be_rebuilt_keeps_its_recorded_run(runs, tmp_path, capsys, monkeypatch, name, damage,
                                                                    why):
    """The run is recorded before the merged views are rebuilt: a view that fails is a warning, not exit 2
    with advice to rerun (which added a second run)."""
    import shutil

    shutil.copytree(runs / "results", tmp_path / "results")
    damage(tmp_path, monkeypatch)
    before = {p.name for p in (tmp_path / "results" / results.RUNS_DIR).iterdir()}
    rc, out, err = run_cli(capsys, *BENCH, "--data", runs / "ds\nx", "--out", tmp_path / "results")
    assert rc == 0 and "Traceback" not in err, err
    new = {p.name for p in (tmp_path / "results" / results.RUNS_DIR).iterdir()} - before
    assert len(new) == 1
    assert (tmp_path / "results" / results.RUNS_DIR / new.pop() / results.ROWS_FILE).stat().st_size > 0
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("inrbench: warning: run ") and why in lines[0], err
    assert "is recorded" in lines[0] and "rerunning this one would add a second run" in lines[0]


def test_a_line_break_in_a_dataset_name_stays_inside_its_headings(runs, tmp_path, capsys):
    rc, out, err = run_cli(capsys, "report", runs / "results", "--out", tmp_path / "report")
    assert rc == 0, err
    text = (tmp_path / "report" / "README.md").read_text()
    headings = [line for line in text.splitlines() if "ds\\nx" in line and line.startswith(("#", "!["))]
    assert len(headings) >= 3, headings  # headline, throughput, speedup...
    assert not [line for line in text.splitlines() if line.startswith("x ") or line.startswith("x]")]
