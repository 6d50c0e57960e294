"""No command destroys what it did not create (``bench.outputs``): a table of hostile ``--out``s.

Every case runs the real CLI (``bench.cli.main``) in a world holding a prepared dataset, an
INR store, a bench results folder, a finished sweep, a source image tree, an unrelated file
and an unrelated folder, and asserts: exit 2, one line naming the path and the problem, and a
world byte-identical afterwards (no file changed, none added, none removed).
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from bench import cli, outputs
from bench.errors import InputError
from tests.cli_helpers import assert_one_line_error, run_cli, snapshot
from tests.fixtures_datasets import write_imagefolder
from tests.report_tables import figures_unrendered

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module", autouse=True)
def _unrendered():
    """compare's and report's figures are built, not rendered to PNG: these tests are about which
    files a command may replace, never about pixels (tests/report_tables.py)."""
    with figures_unrendered():
        yield

REPO = Path(__file__).resolve().parent.parent
ENCODE = ["--iterations", "3", "--layers", "2", "--hidden", "4", "--no-progress"]
BENCH = ["--pipeline", "raw", "--mode", "loader", "--epochs", "1", "--warmup", "0", "--repeats", "1",
         "--batch-size", "8", "--workers", "0", "--device", "cpu", "--monitor-period", "0.5"]


@pytest.fixture(scope="module")
def template(tmp_path_factory) -> Path:
    """The world, built once with the real CLI; each test gets a copy."""
    w = tmp_path_factory.mktemp("world")
    assert cli.main(["prepare", "synthetic", "--out", str(w / "data"), "--size", "8", "--per-class", "4",
                     "--num-classes", "2"]) == 0
    assert cli.main(["encode", str(w / "data"), "--out", str(w / "s.inr"), *ENCODE]) == 0
    assert cli.main(["bench", "--data", str(w / "data"), "--out", str(w / "results"), *BENCH]) == 0
    write_imagefolder(w / "src", classes=("a", "b"), per_class=2)
    (w / "notes.txt").write_text("my notes\n")
    (w / "thesis").mkdir()
    (w / "thesis" / "chapter1.tex").write_text("\\chapter{One}\n")
    (w / "sweep.yaml").write_text(textwrap.dedent("""\
        name: tiny
        report: true
        cells:
          - {kind: python, id: one, command: ["-c", "open('done.txt', 'w').write('1')"]}
        """))
    assert cli.main(["sweep", str(w / "sweep.yaml"), "--out", str(w / "sw"), "--no-report", "--no-progress"]) == 0
    return w


@pytest.fixture
def world(template, tmp_path) -> Path:
    w = tmp_path / "w"
    shutil.copytree(template, w, symlinks=True)
    return w


# id, argv (``{W}`` = the world), fragments of the one-line message, set-up before the run
CASES = [
    ("compare-out-is-data", ["compare", "{W}/data", "--store", "{W}/data/s.inr", "--out", "{W}/data"],
     ["--out {W}/data", "is the prepared dataset itself"], "store-in-data"),
    ("compare-out-is-parent", ["compare", "{W}/data", "--store", "{W}/s.inr", "--out", "{W}"],
     ["contains the prepared dataset"], None),
    ("compare-out-is-store", ["compare", "{W}/data", "--store", "{W}/s.inr", "--out", "{W}/s.inr"],
     ["is the store itself"], None),
    ("compare-out-foreign-folder", ["compare", "{W}/data", "--store", "{W}/s.inr", "--out", "{W}/thesis"],
     ["{W}/thesis", "folder that inr-bench did not write"], None),
    ("compare-out-other-kind", ["compare", "{W}/data", "--store", "{W}/s.inr", "--out", "{W}/results"],
     ["is an existing results folder, not a compare output folder"], None),
    ("report-out-is-results", ["report", "{W}/results", "--out", "{W}/results"],
     ["is the results folder itself"], None),
    ("report-out-inside-results", ["report", "{W}/results", "--out", "{W}/results/runs/report"],
     ["lies inside the results folder"], None),
    ("report-out-foreign-folder", ["report", "{W}/results", "--out", "{W}/thesis"],
     ["folder that inr-bench did not write"], None),
    ("report-out-is-file", ["report", "{W}/results", "--out", "{W}/notes.txt"],
     ["is a file, not a report folder"], None),
    ("sweep-report-is-out", ["sweep", "{W}/sweep.yaml", "--out", "{W}/sw", "--report", "{W}/sw", "--no-progress"],
     ["--report {W}/sw", "is the sweep results folder (--out) itself"], None),
    ("sweep-out-foreign-folder", ["sweep", "{W}/sweep.yaml", "--out", "{W}/thesis", "--no-report"],
     ["folder that inr-bench did not write"], None),
    ("sweep-out-is-data-root", ["sweep", "{W}/sweep.yaml", "--out", "{W}/src", "--data-root", "{W}/src",
                                "--no-report"], ["is the --data-root itself"], None),
    ("prepare-out-is-root", ["prepare", "imagefolder", "--root", "{W}/src", "--out", "{W}/src", "--overwrite"],
     ["is the source root (--root) itself"], None),
    ("prepare-out-is-root-parent", ["prepare", "imagefolder", "--root", "{W}/src", "--out", "{W}", "--overwrite"],
     ["contains the source root (--root)"], None),
    ("prepare-out-inside-root", ["prepare", "imagefolder", "--root", "{W}/src", "--out", "{W}/src/a/p"],
     ["lies inside the source root (--root)"], None),
    ("prepare-exists-no-overwrite", ["prepare", "synthetic", "--out", "{W}/data"],
     ["already exists (pass --overwrite"], None),
    ("prepare-overwrite-foreign", ["prepare", "synthetic", "--out", "{W}/thesis", "--overwrite"],
     ["folder that inr-bench did not write"], None),
    ("prepare-overwrite-other-kind", ["prepare", "synthetic", "--out", "{W}/sw", "--overwrite"],
     ["is an existing sweep results folder, not a prepared dataset folder"], None),
    ("encode-out-unrelated-file", ["encode", "{W}/data", "--out", "{W}/notes.txt", *ENCODE],
     ["--out {W}/notes.txt", "file that inr-bench did not write"], None),
    ("encode-out-unrelated-file-overwrite", ["encode", "{W}/data", "--out", "{W}/notes.txt", "--overwrite", *ENCODE],
     ["file that inr-bench did not write"], None),
    ("encode-out-folder", ["encode", "{W}/data", "--out", "{W}/thesis", *ENCODE],
     ["is a folder, not an INR store file"], None),
    ("encode-out-inside-data", ["encode", "{W}/data", "--out", "{W}/data/x.inr", *ENCODE],
     ["lies inside the prepared dataset"], None),
    ("encode-store-exists", ["encode", "{W}/data", "--out", "{W}/s.inr", *ENCODE],
     ["already exists (pass --overwrite"], None),
    ("encode-fit-cache-is-data", ["encode", "{W}/data", "--out", "{W}/t.inr", "--fit-cache", "{W}/data", *ENCODE],
     ["--fit-cache {W}/data", "is the prepared dataset itself"], None),
    # audit: the cache was removed with the work folder once the store was written
    ("encode-fit-cache-is-work", ["encode", "{W}/data", "--out", "{W}/t.inr", "--fit-cache", "{W}/.t.inr.inrbench-encode.work", *ENCODE],
     ["--fit-cache {W}/.t.inr.inrbench-encode.work", "lies in this encode's work folder"], None),
    ("encode-fit-cache-in-work", ["encode", "{W}/data", "--out", "{W}/t.inr", "--fit-cache", "{W}/.t.inr.inrbench-encode.work/c",
                                  *ENCODE], ["--fit-cache {W}/.t.inr.inrbench-encode.work/c", "removed once the store is written"], None),
    ("encode-parent-is-file", ["encode", "{W}/data", "--out", "{W}/notes.txt/x.inr", *ENCODE],
     ["notes.txt is a file, not a folder"], None),
    ("bench-out-file", ["bench", "--data", "{W}/data", "--out", "{W}/notes.txt", *BENCH],
     ["is a file, not a results folder"], None),
    ("bench-out-foreign-folder", ["bench", "--data", "{W}/data", "--out", "{W}/thesis", *BENCH],
     ["folder that inr-bench did not write"], None),
    ("bench-out-is-data", ["bench", "--data", "{W}/data", "--out", "{W}/data", *BENCH],
     ["is the prepared dataset (--data) itself"], None),
    ("env-out-unrelated-file", ["env", "--out", "{W}/notes.txt"], ["file that inr-bench did not write"], None),
]


def _setup(world: Path, what: str | None) -> None:
    if what == "store-in-data":
        shutil.copy2(world / "s.inr", world / "data" / "s.inr")


@pytest.mark.parametrize("case_id,argv,fragments,setup", CASES, ids=[c[0] for c in CASES])
def test_refused_before_any_work_and_nothing_touched(world, capsys, monkeypatch, case_id, argv, fragments, setup):
    _setup(world, setup)
    monkeypatch.chdir(world)  # default outputs (reports/, runs/) would land here: none may appear
    before = snapshot(world, dirs=True)
    rc, _, err = run_cli(capsys, *(a.replace("{W}", str(world)) for a in argv))
    assert_one_line_error(rc, err, *(f.replace("{W}", str(world)) for f in fragments))
    assert snapshot(world, dirs=True) == before


def test_own_outputs_are_replaced_or_appended(world, capsys):
    """The same commands on their own outputs work: compare/report replace, bench appends."""
    w = str(world)
    for _ in range(2):
        rc, _, err = run_cli(capsys, "compare", f"{w}/data", "--store", f"{w}/s.inr", "--out", f"{w}/cmp",
                             "--jpeg-qualities", "50", "90", "--weight-images", "4")
        assert rc == 0, err
        rc, _, err = run_cli(capsys, "report", f"{w}/results", "--out", f"{w}/rep")
        assert rc == 0, err
    assert outputs.marker_kind(world / "cmp") == "compare" and outputs.marker_kind(world / "rep") == "report"
    rc, _, err = run_cli(capsys, "bench", "--data", f"{w}/data", "--out", f"{w}/results", *BENCH)
    assert rc == 0, err
    assert len(list((world / "results" / "runs").iterdir())) == 2
    rc, _, err = run_cli(capsys, "encode", f"{w}/data", "--out", f"{w}/s.inr", "--overwrite", *ENCODE)
    assert rc == 0, err
    rc, _, err = run_cli(capsys, "prepare", "synthetic", "--out", f"{w}/data", "--size", "8", "--per-class", "4",
                         "--num-classes", "2", "--overwrite")
    assert rc == 0, err
    # an empty folder holds nothing to lose: accepted
    (world / "empty").mkdir()
    rc, _, err = run_cli(capsys, "compare", f"{w}/data", "--out", f"{w}/empty", "--jpeg-qualities", "90")
    assert rc == 0, err


def test_outputs_are_recognized_by_marker_or_format_only(world):
    """No compatibility before 1.0: an unmarked folder laid out as a report is not ours; a store is, by its magic."""
    rep = world / "old-report"
    rep.mkdir()
    (rep / "README.md").write_text("# inr-bench report: demo\n")
    (rep / "fig.png").write_bytes(b"\x89PNG")
    assert not outputs.is_own(rep, "report")
    outputs.write_marker(rep, "report")
    assert outputs.is_own(rep, "report") and not outputs.is_own(rep, "compare")
    assert outputs.is_own(world / "data", "prepared") and outputs.is_own(world / "s.inr", "store")
    assert not outputs.is_own(world / "notes.txt", "store") and not outputs.is_own(world / "thesis", "compare")


def test_second_writer_is_refused_naming_the_first(world, capsys):
    """Another process holds the output's lock: refused before any work (nothing printed), naming its pid."""
    out = world / "busy.inr"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time, pathlib; from bench.outputs import output_lock\n"
         "with output_lock(pathlib.Path(sys.argv[1]).resolve()):\n    print('held', flush=True); time.sleep(60)",
         str(out)], stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        assert holder.stdout.readline().strip() == "held"
        rc, stdout, err = run_cli(capsys, "encode", f"{world}/data", "--out", str(out), *ENCODE)
    finally:
        holder.kill()
        holder.wait()
    assert_one_line_error(rc, err, f"pid {holder.pid}", "is writing it")
    assert stdout == "" and not out.exists() and not (world / ".busy.inr.inrbench-encode.work").exists()


def test_the_lock_is_reentrant_within_one_process(tmp_path):
    out = (tmp_path / "x.inr").resolve()
    with outputs.output_lock(out):
        with outputs.claim(out, "store"):  # the command holds it, the library call inside claims it again
            assert (tmp_path / ".x.inr.inrbench-lock").is_file()
        assert (tmp_path / ".x.inr.inrbench-lock").is_file()  # still held by the outer
    assert not (tmp_path / ".x.inr.inrbench-lock").exists()


def test_stale_lock_of_a_dead_process_is_taken_over(world, capsys):
    out = world / "stale.inr"
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    (world / f".{out.name}.inrbench-lock").write_text(dead.stdout)  # left by a killed encode: no flock held
    rc, _, err = run_cli(capsys, "encode", f"{world}/data", "--out", str(out), *ENCODE)
    assert rc == 0, err
    assert out.is_file() and not (world / f".{out.name}.inrbench-lock").exists()


def test_killed_runs_leftovers_are_removed_but_nothing_else(world, capsys):
    """A killed prepare leaves .partial/.scratch folders: the next run of that command removes them."""
    leftovers = [world / ".p.inrbench-x1abcdef.partial", world / ".p.inrbench-x2_bcdef.scratch"]
    for d in leftovers:
        d.mkdir()
        (d / "pixels.npy").write_bytes(b"0" * 1000)
    (world / ".p.inrbench-x3abcdef.tmp").write_bytes(b"half")
    mine = [world / ".p.old", world / ".p.partial", world / ".q.inrbench-x1abcdef.partial",  # not this output's
            world / ".p.my-notes.partial", world / ".p.k2j_9x0a.scratch"]  # temps (untagged: the user's)
    for m in mine:
        m.mkdir()
    rc, _, err = run_cli(capsys, "prepare", "synthetic", "--out", f"{world}/p", "--size", "8", "--per-class", "2",
                         "--num-classes", "2")
    assert rc == 0, err
    assert not any(d.exists() for d in leftovers) and not (world / ".p.inrbench-x3abcdef.tmp").exists()
    assert all(m.is_dir() for m in mine)


def test_outputs_honour_the_umask(world, capsys):
    old = os.umask(0o022)
    try:
        rc, _, err = run_cli(capsys, "prepare", "synthetic", "--out", f"{world}/p", "--size", "8", "--per-class", "2",
                             "--num-classes", "2")
        assert rc == 0, err
        rc, _, err = run_cli(capsys, "encode", f"{world}/p", "--out", f"{world}/p.inr", *ENCODE)
        assert rc == 0, err
    finally:
        os.umask(old)
    assert (world / "p").stat().st_mode & 0o777 == 0o755
    assert (world / "p" / "manifest.json").stat().st_mode & 0o777 == 0o644
    assert (world / "p.inr").stat().st_mode & 0o777 == 0o644


def test_work_folder_of_the_same_encode_resumes_from_another_path(world, capsys, monkeypatch):
    """A killed encode's .work is resumed even when the dataset is named by another path."""
    import inr.encode as E

    calls = {"n": 0}
    real = E.encode_images

    def dies_after_first_shard(*a, **k):
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(E, "encode_images", dies_after_first_shard)
    out = world / "r.inr"
    rc, _, _ = run_cli(capsys, "encode", f"{world}/data", "--out", str(out), "--shard-size", "4", *ENCODE)
    assert rc == 130 and not out.exists() and (world / ".r.inr.inrbench-encode.work" / "shard_00000.inr").is_file()
    monkeypatch.setattr(E, "encode_images", real)
    (world / "alias").symlink_to(world / "data")
    rc, _, err = run_cli(capsys, "encode", f"{world}/alias", "--out", str(out), "--shard-size", "4",
                         "--iterations", "4", *ENCODE[2:])
    line = assert_one_line_error(rc, err, ".r.inr.inrbench-encode.work", "other settings", "encode.fit.iterations")
    assert "another configuration" not in line
    monkeypatch.chdir(world)
    rc, _, err = run_cli(capsys, "encode", "alias", "--out", "r.inr", "--shard-size", "4", *ENCODE)
    assert rc == 0, err
    assert not (world / ".r.inr.inrbench-encode.work").exists()
    rc, _, err = run_cli(capsys, "encode", "data", "--out", "whole.inr", "--shard-size", "4", *ENCODE)
    assert rc == 0, err
    from inr.store import load

    resumed, whole = load(out).quantized_layers(), load(world / "whole.inr").quantized_layers()
    assert len(resumed) == len(whole) and resumed[0].codes.shape[0] > 4  # more than the first shard
    for a, b in zip(resumed, whole, strict=True):
        assert torch.equal(a.codes, b.codes)  # resumed == uninterrupted, shard for shard


@pytest.mark.parametrize("empty", [False, True], ids=["with-a-file", "empty"])
def test_foreign_work_folder_is_not_used_or_removed(world, capsys, empty):
    """An empty folder too: the work folder appears with its work.json in one rename, so an empty one
    at that name was made by someone else (it used to be taken, then removed after the merge)."""
    work = world / ".f.inr.inrbench-encode.work"
    work.mkdir()
    if not empty:
        (work / "data.csv").write_text("precious\n")
    before = snapshot(world, dirs=True)
    rc, _, err = run_cli(capsys, "encode", f"{world}/data", "--out", f"{world}/f.inr", *ENCODE)
    assert_one_line_error(rc, err, ".f.inr.inrbench-encode.work", "not an encode work folder")
    assert snapshot(world, dirs=True) == before


@pytest.mark.parametrize("command", ["prepare", "encode"])
def test_disk_full_is_one_line_and_leaves_nothing(world, capsys, monkeypatch, command):
    """ENOSPC while writing: one line naming the file, exit 2, no temp folder or file left."""
    import numpy as np

    import bench.atomic

    def full(path, *a, **k):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

    before = snapshot(world, dirs=True)
    if command == "prepare":
        monkeypatch.setattr(np, "save", full)
        argv = ["prepare", "synthetic", "--out", f"{world}/p", "--size", "8", "--per-class", "2", "--num-classes", "2"]
    else:
        monkeypatch.setattr(bench.atomic.outputs, "make_temp_file", lambda p: full(p))
        argv = ["encode", f"{world}/data", "--out", f"{world}/e.inr", *ENCODE]
    rc, _, err = run_cli(capsys, *argv)
    assert_one_line_error(rc, err, "No space left on device")
    after = snapshot(world, dirs=True)
    new = sorted(set(after) - set(before))
    assert all(n.endswith(".work") or ".work/" in n for n in new), new  # only encode's resumable work folder
    assert {k: after[k] for k in before} == before


def test_check_output_relations_are_symlink_aware(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "data")
    with pytest.raises(InputError, match="lies inside the prepared dataset"):
        outputs.check_output(tmp_path / "link" / "cmp", "compare", inputs={"prepared dataset": tmp_path / "data"})
    with pytest.raises(InputError, match="is the prepared dataset itself"):
        outputs.check_output(tmp_path / "link", "compare", inputs={"prepared dataset": tmp_path / "data"})
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    with pytest.raises(InputError, match="dangling symlink"):
        outputs.check_output(tmp_path / "dangling", "store")


@pytest.mark.parametrize("argv,fragment", [
    (["bench", "--data", "{W}/notes.txt", "--out", "{W}/r2", *BENCH], "notes.txt: is a file, not a prepared dataset folder"),
    (["report", "{W}/notes.txt", "--out", "{W}/rep"], "notes.txt: is a file, not a results folder"),
    (["encode", "{W}/notes.txt", "--out", "{W}/n.inr", *ENCODE], "notes.txt: is a file, not a prepared dataset folder"),
    (["prepare", "imagefolder", "--root", "{W}/notes.txt", "--out", "{W}/p"], "notes.txt: not a folder"),
], ids=["bench-data", "report-results", "encode-data", "prepare-root"])
def test_messages_name_the_right_kind_of_thing(world, capsys, argv, fragment):
    before = snapshot(world, dirs=True)
    rc, _, err = run_cli(capsys, *(a.replace("{W}", str(world)) for a in argv))
    assert_one_line_error(rc, err, fragment.replace("{W}", str(world)))
    assert snapshot(world, dirs=True) == before


@pytest.mark.parametrize("command", ["compare", "report", "prepare", "sweep-report"])
def test_a_replace_never_deletes_what_the_user_added(world, capsys, command):
    """Audit: a rerun of compare/report (same --out) or prepare --overwrite deleted a user's file in the old
    output folder. Now refused (one line naming the folder and the entry, exit 2), nothing touched."""
    w = str(world)
    argv = {
        "compare": ["compare", f"{w}/data", "--store", f"{w}/s.inr", "--jpeg-qualities", "50", "--out", f"{w}/out"],
        "report": ["report", f"{w}/results", "--out", f"{w}/out"],
        "prepare": ["prepare", "synthetic", "--out", f"{w}/out", "--size", "8", "--per-class", "2",
                    "--num-classes", "2", "--overwrite"],
        "sweep-report": ["sweep", f"{w}/sweep.yaml", "--out", f"{w}/sw", "--report", f"{w}/out", "--no-progress"],
    }[command]
    rc, _, err = run_cli(capsys, *argv)
    assert rc == 0, err
    (world / "out" / "my_notes.md").write_text("my analysis\n")
    before = snapshot(world, dirs=True)
    rc, _, err = run_cli(capsys, *argv)
    assert_one_line_error(rc, err, f"{w}/out", "holds my_notes.md", "which inr-bench did not write")
    assert snapshot(world, dirs=True) == before
    (world / "out" / "my_notes.md").unlink()  # once it is moved out, the replace goes ahead
    (world / "out" / ".DS_Store").write_bytes(b"\0")  # a file browser's, not the user's work
    rc, _, err = run_cli(capsys, *argv)
    assert rc == 0, err


def test_a_replace_sees_entries_added_inside_its_own_folders(world, capsys):
    """A file added inside a folder the command wrote (a prepared split) is the user's too."""
    w = str(world)
    argv = ["prepare", "synthetic", "--out", f"{w}/data", "--size", "8", "--per-class", "4", "--num-classes", "2",
            "--overwrite"]
    rc, _, err = run_cli(capsys, *argv)
    assert rc == 0, err
    (world / "data" / "train" / "jpeg" / "mine.jpg").write_bytes(b"mine")
    before = snapshot(world, dirs=True)
    rc, _, err = run_cli(capsys, *argv)
    assert_one_line_error(rc, err, "holds train/", "more files than inr-bench wrote there")
    assert snapshot(world, dirs=True) == before


def test_folders_marked_without_entries_or_unmarked_are_not_replaced(world, capsys):
    """A marker that lists no entries (and a kind with no layout): every entry counts as foreign; no marker: not ours."""
    w = str(world)
    argv = ["compare", f"{w}/data", "--store", f"{w}/s.inr", "--jpeg-qualities", "50", "--out", f"{w}/cmp"]
    rc, _, err = run_cli(capsys, *argv)
    assert rc == 0, err
    (world / "cmp" / outputs.MARKER).write_text('{"kind": "compare", "written_by": "inr-bench"}\n')
    assert "summary.csv" in outputs.foreign_entries(world / "cmp", "compare")
    before = snapshot(world, dirs=True)
    assert_one_line_error(*run_cli(capsys, *argv)[::2], "which inr-bench did not write")
    (world / "cmp" / outputs.MARKER).unlink()
    assert_one_line_error(*run_cli(capsys, *argv)[::2], "an existing folder that inr-bench did not write")
    assert snapshot(world, dirs=True) == {k: v for k, v in before.items() if k != f"cmp/{outputs.MARKER}"}


def test_atomic_dir_refuses_a_folder_that_got_a_foreign_entry_while_it_ran(tmp_path):
    from bench.atomic import atomic_dir

    final = tmp_path / "cmp"
    with atomic_dir(final, kind="compare", overwrite=True) as tmp:
        (tmp / "summary.csv").write_text("a\n")
    with pytest.raises(InputError, match="holds late.txt, which inr-bench did not write"):
        with atomic_dir(final, kind="compare", overwrite=True) as tmp:
            (final / "late.txt").write_text("mine\n")  # added after claim checked, before the swap
            (tmp / "summary.csv").write_text("b\n")
    assert sorted(p.name for p in final.iterdir()) == [outputs.MARKER, "late.txt", "summary.csv"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cmp"]  # no temp folder left
