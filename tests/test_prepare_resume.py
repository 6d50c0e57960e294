"""`inrbench prepare` resumes an interrupted decode of image files (``bench.datasets.resume``).

A run is stopped after N decoded images by the test hook ``INRBENCH_TEST_PREPARE_STOP`` (a
Ctrl-C, or with ``N:kill`` a SIGKILL in a fresh process); the rerun must decode only the files
of the chunks that were not committed and write exactly what an uninterrupted run writes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

import numpy as np
import pytest
from cli_helpers import assert_one_line_error, snapshot
from fixtures_datasets import truncate, write_flowers102, write_imagefolder, write_miniimagenet

import bench.datasets.decode as decode
import bench.datasets.resume as resume
from bench import outputs
from bench.datasets.prepared import open_prepared

MINE = {"datasets": "bench.commands.datasets", "prepare": "bench.commands.prepare"}
STOP = decode.STOP_ENV
CHUNK = 4
WRITERS = {"imagefolder": write_imagefolder, "flowers102": write_flowers102, "mini-imagenet": write_miniimagenet}



@pytest.fixture
def reads(monkeypatch):
    """Small chunks, and the files decoded (``read_image`` calls) since the last ``reads.clear()``."""
    monkeypatch.setattr(resume, "CHUNK_IMAGES", CHUNK)
    seen: list = []
    lock = threading.Lock()
    real = decode.read_image

    def counted(path, *a, **k):
        with lock:
            seen.append(path)
        return real(path, *a, **k)

    monkeypatch.setattr(decode, "read_image", counted)
    return seen


def _work(out):
    return out.with_name(f".{out.name}.inrbench-prepare.work")


def _same(a, b) -> None:
    """Two prepared folders hold the same arrays, labels, ids, JPEGs and manifest."""
    assert json.loads((a / "manifest.json").read_text()) == json.loads((b / "manifest.json").read_text())
    sa, sb = snapshot(a), snapshot(b)
    sa.pop(".inrbench.json"), sb.pop(".inrbench.json")  # the marker holds its creation time
    assert sa == sb


def _prepare(run, source, root, out, *extra):
    return run("prepare", source, "--root", root, "--out", out, "--size", 16, *extra)


def _stopped(run, monkeypatch, after, *args):
    monkeypatch.setenv(STOP, str(after))
    rc, out, err = _prepare(run, *args)
    monkeypatch.delenv(STOP)
    assert rc == 130 and "interrupted" in err, err
    return out


@pytest.mark.parametrize("source", sorted(WRITERS))
def test_resume_decodes_only_the_rest_and_matches_an_uninterrupted_run(source, run, reads, monkeypatch, tmp_path):
    WRITERS[source](tmp_path / "src")
    rc, _, err = _prepare(run, source, tmp_path / "src", tmp_path / "whole")
    assert rc == 0, err
    total = len(reads)

    stdout = _stopped(run, monkeypatch, 5, source, tmp_path / "src", tmp_path / "out")
    work = _work(tmp_path / "out")
    assert not (tmp_path / "out").exists()
    names = sorted(p.name for p in work.iterdir())
    assert names == ["split0.chunk00000.json", "split0.json", "split0.pixels.npy", "work.json"]
    assert f"{CHUNK} decoded images are kept in {work}" in stdout  # 1 chunk committed; the one holding image 5 is lost

    reads.clear()
    rc, stdout, err = _prepare(run, source, tmp_path / "src", tmp_path / "out")
    assert rc == 0, err
    assert len(reads) == total - CHUNK  # only the rest was decoded
    assert f"prepare: resuming train, {CHUNK} of " in stdout and f"(work folder {work})" in stdout
    assert not work.exists()  # removed once the prepared folder is written
    _same(tmp_path / "whole", tmp_path / "out")


def test_native_sizes_resume(run, reads, monkeypatch, tmp_path):
    write_imagefolder(tmp_path / "src", per_class=6)
    args = ("prepare", "imagefolder", "--root", tmp_path / "src", "--size", "native", "--max-side", 40)
    assert run(*args, "--out", tmp_path / "whole")[0] == 0
    total = len(reads)
    monkeypatch.setenv(STOP, "6")
    assert run(*args, "--out", tmp_path / "out")[0] == 130
    monkeypatch.delenv(STOP)
    assert (_work(tmp_path / "out") / "split0.chunk00000.npy").is_file()
    reads.clear()
    assert run(*args, "--out", tmp_path / "out")[0] == 0
    assert len(reads) == total - CHUNK
    _same(tmp_path / "whole", tmp_path / "out")


def test_other_settings_or_changed_files_are_refused_not_mixed(run, reads, monkeypatch, tmp_path):
    write_imagefolder(tmp_path / "src", per_class=6)
    assert _prepare(run, "imagefolder", tmp_path / "src", tmp_path / "whole")[0] == 0
    total = len(reads)
    _stopped(run, monkeypatch, 9, "imagefolder", tmp_path / "src", tmp_path / "out")
    work = _work(tmp_path / "out")
    before = snapshot(tmp_path)

    reads.clear()
    rc, _, err = run("prepare", "imagefolder", "--root", tmp_path / "src", "--out", tmp_path / "out", "--size", 24)
    assert_one_line_error(rc, err, str(work), "other settings", "config.size differs", "delete it to start over")
    assert reads == [] and snapshot(tmp_path) == before  # nothing decoded, nothing removed

    # a file of a committed chunk changed since (here its mtime): refused, naming it
    rec = json.loads((work / "split0.chunk00001.json").read_text())
    rel, _, mtime = rec["files"][2]
    os.utime(tmp_path / "src" / rel, ns=(1, 1))
    rc, stdout, err = _prepare(run, "imagefolder", tmp_path / "src", tmp_path / "out")
    assert_one_line_error(rc, err, str(work), repr(rel), "changed since", "restore the file to resume")
    assert reads == [] and snapshot(tmp_path) == before and "rerun the same command" not in stdout

    # restored; --workers and --jpeg-quality change no decoded pixel: the chunks are reused
    os.utime(tmp_path / "src" / rel, ns=(mtime, mtime))
    rc, _, err = _prepare(run, "imagefolder", tmp_path / "src", tmp_path / "out", "--workers", 1,
                          "--jpeg-quality", 80)
    assert rc == 0, err
    assert len(reads) == total - 2 * CHUNK
    a, b = open_prepared(tmp_path / "whole"), open_prepared(tmp_path / "out")
    for name in a.splits:
        assert np.array_equal(a.split(name).images, b.split(name).images)
    assert b.manifest["jpeg"]["quality"] == 80 and b.manifest["config"]["workers"] == 1


def test_skipped_files_survive_a_resume(run, reads, monkeypatch, tmp_path):
    write_imagefolder(tmp_path / "src", per_class=6)
    assert _prepare(run, "imagefolder", tmp_path / "src", tmp_path / "probe")[0] == 0
    order = list(reads)  # decode order, chunk by chunk (within a chunk: as threads ran)
    truncate(order[1], 0.5)  # in the first chunk: its skip record must come back from the work folder
    truncate(order[-1], 0.5)  # in the last chunk of the last split: decoded after the resume
    skip = ("--on-error", "skip")
    assert _prepare(run, "imagefolder", tmp_path / "src", tmp_path / "whole", *skip)[0] == 0
    whole = json.loads((tmp_path / "whole" / "manifest.json").read_text())
    assert len(whole["skipped"]) == 2

    _stopped(run, monkeypatch, 10, "imagefolder", tmp_path / "src", tmp_path / "out", *skip)
    recs = [json.loads(p.read_text()) for p in sorted(_work(tmp_path / "out").glob("split0.chunk*.json"))]
    assert len(recs) == 2 and [r["file"] for r in recs[0]["skipped"]] == [str(order[1])]
    assert _prepare(run, "imagefolder", tmp_path / "src", tmp_path / "out", *skip)[0] == 0
    resumed = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert resumed["skipped"] == whole["skipped"]
    _same(tmp_path / "whole", tmp_path / "out")


def test_a_run_stopped_by_a_broken_file_resumes_with_skip(run, reads, tmp_path):
    """--on-error fail stops at a broken file; its committed chunks hold no skipped file, so a rerun
    with --on-error skip reuses them (from then on the work folder is a `skip` one)."""
    write_imagefolder(tmp_path / "src", per_class=6)
    assert _prepare(run, "imagefolder", tmp_path / "src", tmp_path / "probe")[0] == 0
    order = list(reads)
    late = order[2 * CHUNK + 1]  # a file of the first split's third chunk
    truncate(late, 0.5)
    rc, stdout, err = _prepare(run, "imagefolder", tmp_path / "src", tmp_path / "out")
    assert_one_line_error(rc, err, str(late), "cannot read image")
    assert f"{2 * CHUNK} decoded images are kept" in stdout
    assert _prepare(run, "imagefolder", tmp_path / "src", tmp_path / "whole", "--on-error", "skip")[0] == 0
    reads.clear()
    rc, stdout, err = _prepare(run, "imagefolder", tmp_path / "src", tmp_path / "out", "--on-error", "skip")
    assert rc == 0, err
    assert len(reads) == len(order) - 2 * CHUNK and "resuming train" in stdout
    _same(tmp_path / "whole", tmp_path / "out")


def test_a_foreign_work_folder_is_neither_used_nor_removed(run, reads, tmp_path):
    write_imagefolder(tmp_path / "src", per_class=3)
    work = _work(tmp_path / "out")
    work.mkdir()
    (work / "notes.txt").write_text("precious\n")
    before = snapshot(tmp_path, dirs=True)
    rc, _, err = _prepare(run, "imagefolder", tmp_path / "src", tmp_path / "out")
    assert_one_line_error(rc, err, str(work), "not a prepare work folder", "refusing to use or remove it")
    assert snapshot(tmp_path, dirs=True) == before and reads == []


def test_a_failure_before_any_chunk_leaves_nothing(run, reads, tmp_path):
    write_imagefolder(tmp_path / "src", per_class=6)
    truncate(tmp_path / "src" / "cat" / "000.png", 0.3)
    before = snapshot(tmp_path, dirs=True)
    rc, _, err = run("prepare", "imagefolder", "--root", tmp_path / "src", "--out", tmp_path / "out", "--size", 16)
    assert rc == 2, err  # the broken file is in the first chunk: nothing committed, nothing kept
    assert snapshot(tmp_path, dirs=True) == before


def test_killed_process_resumes(tmp_path):
    """A real SIGKILL in a fresh process (``N:kill``); the rerun prints the resume line and finishes."""
    write_imagefolder(tmp_path / "src", per_class=8)
    code = ("import sys; from bench import cli; import bench.datasets.resume as r; "
            f"r.CHUNK_IMAGES = {CHUNK}; cli.COMMANDS = {MINE!r}; sys.exit(cli.main(sys.argv[1:]))")
    argv = [sys.executable, "-c", code, "prepare", "imagefolder", "--root", str(tmp_path / "src"),
            "--out", str(tmp_path / "out"), "--size", "16"]
    env = {**os.environ, STOP: "7:kill"}
    p = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env)
    assert p.returncode == -9, p.stderr
    work = _work(tmp_path / "out")
    assert not (tmp_path / "out").exists() and (work / "split0.chunk00000.json").is_file()
    env.pop(STOP)
    p = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env)
    assert p.returncode == 0, p.stderr
    assert f"prepare: resuming train, 4 of 18 images already decoded (work folder {work})" in p.stdout
    assert not work.exists()
    ds = open_prepared(tmp_path / "out")
    assert sum(ds.manifest["splits"][n]["count"] for n in ds.splits) == 24
    assert np.asarray(ds.split("train").images).shape == (18, 16, 16, 3)


def test_a_stop_in_a_later_split_resumes_there(run, reads, monkeypatch, tmp_path):
    """The hook counts over the splits in turn (it used to restart at every split, so a stop could never
    land past the first): stopped inside val, the rerun restores all of train and val's first chunk."""
    write_imagefolder(tmp_path / "src", per_class=8, split=True)  # train 24, val 12
    assert _prepare(run, "imagefolder", tmp_path / "src", tmp_path / "whole")[0] == 0
    total = len(reads)
    _stopped(run, monkeypatch, 24 + CHUNK + 1, "imagefolder", tmp_path / "src", tmp_path / "out")
    assert (_work(tmp_path / "out") / "split1.chunk00000.json").is_file()
    reads.clear()
    rc, stdout, err = _prepare(run, "imagefolder", tmp_path / "src", tmp_path / "out")
    assert rc == 0, err
    assert "resuming train, 24 of 24" in stdout and f"resuming val, {CHUNK} of 12" in stdout
    assert len(reads) == total - 24 - CHUNK
    _same(tmp_path / "whole", tmp_path / "out")


def test_prepare_cells_keep_the_work_folder_prepare_resumes_from(tmp_path):
    from bench.sweep.cells import Cell

    class Ctx:
        def cell_dir(self, cell_id):
            return tmp_path / cell_id

    cell = Cell(id="prep", kind="prepare", fields={"source": "imagefolder", "name": "ds"})
    assert cell.resume_state(Ctx()) == (resume.work_path(cell.output(Ctx())),)


def test_a_killed_sweep_prepare_cell_resumes_from_its_work_folder(tmp_path, monkeypatch):
    """The sweep used to clear the killed cell's folder, work folder included: the rerun decoded it all again."""
    import yaml
    from PIL import Image

    from bench.sweep import runner
    from bench.sweep.runner import run_sweep
    from bench.sweep.spec import load_sweep

    ident = runner.code_identity()
    monkeypatch.setattr(runner, "code_identity", lambda: ident)
    src = tmp_path / "src"  # a flat folder (one class), one chunk and a bit (the cell's process keeps 1024)
    src.mkdir()
    rng = np.random.default_rng(0)
    for i in range(resume.CHUNK_IMAGES + 6):
        Image.fromarray(rng.integers(0, 255, (6, 6, 3), dtype=np.uint8)).save(src / f"{i:05d}.png")
    doc = {"name": "ps", "report": False, "device": "cpu", "cells": [
        {"kind": "prepare", "id": "prep", "source": "imagefolder", "name": "ds", "root": str(src), "size": 8}]}
    y = tmp_path / "ps.yaml"
    y.write_text(yaml.safe_dump(doc))
    cell = tmp_path / "run" / "cells" / "prep"
    monkeypatch.setenv(STOP, f"{resume.CHUNK_IMAGES + 2}:kill")
    assert run_sweep(load_sweep(str(y)), tmp_path / "run", progress=False).status == {"prep": "error"}
    assert (_work(cell / "ds") / "split0.chunk00000.json").is_file()
    monkeypatch.delenv(STOP)
    assert run_sweep(load_sweep(str(y)), tmp_path / "run", progress=False).status == {"prep": "ok"}
    assert f"prepare: resuming train, {resume.CHUNK_IMAGES:,} of " in (cell / "stdout.log").read_text()
    assert not _work(cell / "ds").exists()


def test_a_killed_creation_leaves_only_its_temp_folder_and_an_empty_folder_is_not_ours(run, reads, tmp_path):
    """The work folder appears with its work.json in one rename: a run killed while creating it leaves
    only its own temp folder, which the next run removes; an empty folder someone made at the work
    folder's name is not the run's (it used to be taken and then removed), so it is refused and kept."""
    write_imagefolder(tmp_path / "src", per_class=3)
    work = _work(tmp_path / "out")
    work.mkdir()
    before = snapshot(tmp_path, dirs=True)
    rc, _, err = _prepare(run, "imagefolder", tmp_path / "src", tmp_path / "out")
    assert_one_line_error(rc, err, str(work), "not a prepare work folder", "refusing to use or remove it")
    assert snapshot(tmp_path, dirs=True) == before and work.is_dir() and reads == []
    work.rmdir()
    killed = tmp_path / (outputs.temp_name(work, ".partial") + "k2j4x9ab.partial")
    killed.mkdir()
    (killed / "work.json").write_text('{"kind": "prep')
    rc, _, err = _prepare(run, "imagefolder", tmp_path / "src", tmp_path / "out")
    assert rc == 0, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "src"] and open_prepared(tmp_path / "out").splits
