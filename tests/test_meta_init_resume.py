"""``inrbench meta-init`` resumes where it stopped (``inr.meta_work``): a run stopped at any outer step, or
during a candidate's validation fit, and rerun writes the weights an uninterrupted run writes, bit for bit;
another job's work folder is refused, never mixed; the folder is gone after success; a sweep cell resumes
through the same folder."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml

from bench import outputs
from bench.datasets.prepare import prepare_dataset
from inr import meta_work
from inr.meta import load_init
from inr.meta_work import work_path
from tests.cli_helpers import assert_one_line_error, run_cli, snapshot

pytestmark = pytest.mark.usefixtures("one_torch_thread")

TINY = ("--layers", "2", "--hidden", "6", "--outer-steps", "4", "--inner-steps", "2", "--meta-batch", "3",
        "--pixels", "40", "--images", "8")


def cands(k: int) -> tuple:
    """``--candidates k``, with 2 validation images set aside when there is a choice (meta-init refuses
    ``--validation`` with one candidate)."""
    return ("--candidates", k, *(("--validation", 2) if k > 1 else ()))


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return prepare_dataset("synthetic", tmp_path_factory.mktemp("d") / "syn", size=8, num_classes=2, per_class=5,
                           jpeg_quality=75)


@pytest.fixture
def every_step(monkeypatch):
    """A checkpoint after every outer step (the default is every 30 s): a stop at step k resumes at step k."""
    monkeypatch.setattr(meta_work, "CHECKPOINT_EVERY_S", 0.0)


def _weights(path: Path) -> list[torch.Tensor]:
    return [t for W, b in load_init(path).weights for t in (W, b)]


def _same(a: Path, b: Path) -> bool:
    return all(torch.equal(x, y) for x, y in zip(_weights(a), _weights(b), strict=True))


_REFERENCE: dict[int, Path] = {}


def _reference(data, tmp_path_factory, capsys, candidates: int) -> Path:
    """The uninterrupted run's init file (once per candidate count); its work folder is gone after it."""
    if candidates not in _REFERENCE:
        out = tmp_path_factory.mktemp("ref") / "init.pt"
        rc, _, err = run_cli(capsys, "meta-init", data, *TINY, *cands(candidates), "--out", out)
        assert rc == 0, err
        assert not work_path(out).exists() and sorted(p.name for p in out.parent.iterdir()) == ["init.pt"]
        _REFERENCE[candidates] = out
    return _REFERENCE[candidates]


@pytest.mark.parametrize("candidates, stop, where", [
    (1, "1:3", "candidate 1 of 1 at outer step 3 of 4"),
    (2, "2:2", "candidate 2 of 2 at outer step 2 of 4"),
    (2, "2:validation", "candidate 2 of 2 at its validation fit"),
])
def test_a_stopped_run_resumes_to_the_same_weights(data, tmp_path, tmp_path_factory, capsys, monkeypatch,
                                                   every_step, candidates, stop, where):
    ref = _reference(data, tmp_path_factory, capsys, candidates)
    out = tmp_path / "init.pt"
    argv = ("meta-init", data, *TINY, *cands(candidates), "--out", out)
    monkeypatch.setenv("INRBENCH_TEST_META_KILL", stop)
    rc, _, err = run_cli(capsys, *argv)
    assert rc == 130 and not out.exists(), err
    assert (work_path(out) / "work.json").is_file()
    monkeypatch.delenv("INRBENCH_TEST_META_KILL")
    rc, stdout, err = run_cli(capsys, *argv)
    assert rc == 0, err
    assert stdout.splitlines()[0] == f"meta-init: resuming {where} (work folder {work_path(out)})"
    assert _same(out, ref)
    assert not work_path(out).exists() and sorted(p.name for p in tmp_path.iterdir()) == ["init.pt"]
    if candidates > 1:  # the choice and its record are the uninterrupted run's (but for the seconds)
        sel, ref_sel = ({**s, "candidates": [{k: v for k, v in c.items() if k != "seconds"} for c in s["candidates"]]}
                        for s in (load_init(out).meta["selection"], load_init(ref).meta["selection"]))
        assert sel == ref_sel


def test_a_kept_candidate_resumes_without_state_checkpoints(data, tmp_path, tmp_path_factory, capsys, monkeypatch):
    """At the default cadence (every 30 s) a tiny run keeps only finished candidates: a stop in candidate 2
    retrains candidate 2 from its start and reuses candidate 1."""
    ref = _reference(data, tmp_path_factory, capsys, 2)
    out = tmp_path / "init.pt"
    argv = ("meta-init", data, *TINY, *cands(2), "--out", out)
    monkeypatch.setenv("INRBENCH_TEST_META_KILL", "2:3")
    assert run_cli(capsys, *argv)[0] == 130
    assert sorted(p.name for p in work_path(out).iterdir()) == [
        "candidate_0.trained.pt", "candidate_0.validation.json", "validation_random.pt", "work.json"]
    monkeypatch.delenv("INRBENCH_TEST_META_KILL")
    rc, stdout, err = run_cli(capsys, *argv)
    assert rc == 0 and "meta-init: resuming candidate 2 of 2 at outer step 0 of 4" in stdout, err
    assert _same(out, ref)


def test_other_settings_never_reuse_the_checkpoints(data, tmp_path, tmp_path_factory, capsys, monkeypatch,
                                                    every_step):
    out = tmp_path / "init.pt"
    monkeypatch.setenv("INRBENCH_TEST_META_KILL", "1:2")
    assert run_cli(capsys, "meta-init", data, *TINY, "--out", out)[0] == 130
    monkeypatch.delenv("INRBENCH_TEST_META_KILL")
    before = snapshot(tmp_path)
    changed = [a if a != "4" else "5" for a in TINY]  # --outer-steps 5
    rc, _, err = run_cli(capsys, "meta-init", data, *changed, "--out", out)
    assert_one_line_error(rc, err, work_path(out).name, "other settings", "(config.outer_steps differs)")
    rc, _, err = run_cli(capsys, "meta-init", data, *TINY, "--seed", "3", "--out", out)
    assert_one_line_error(rc, err, "(config.seed differs)")
    assert snapshot(tmp_path) == before  # refused before anything was touched
    rc, stdout, err = run_cli(capsys, "meta-init", data, *TINY, "--out", out)  # the same settings resume
    assert rc == 0 and "resuming candidate 1 of 1 at outer step 2 of 4" in stdout, err
    assert _same(out, _reference(data, tmp_path_factory, capsys, 1))


def test_a_folder_without_the_marker_is_neither_used_nor_removed(data, tmp_path, capsys):
    out = tmp_path / "init.pt"
    work = work_path(out)
    work.mkdir()
    (work / "notes.txt").write_text("mine")
    before = snapshot(tmp_path)
    rc, _, err = run_cli(capsys, "meta-init", data, *TINY, "--out", out)
    assert_one_line_error(rc, err, "not a meta-init work folder", "refusing to use or remove it")
    assert snapshot(tmp_path) == before
    meta_work.remove_work(work)
    assert (work / "notes.txt").read_text() == "mine"


def test_a_failure_before_any_checkpoint_leaves_no_work_folder(data, tmp_path, capsys, monkeypatch):
    """Nothing kept yet (stopped at step 1, before the first 30 s): nothing to trip over on the next run."""
    out = tmp_path / "init.pt"
    monkeypatch.setenv("INRBENCH_TEST_META_KILL", "1:1")
    assert run_cli(capsys, "meta-init", data, *TINY, "--out", out)[0] == 130
    assert list(tmp_path.iterdir()) == []


def test_a_killed_sweep_cell_resumes_from_its_work_folder(tmp_path, tmp_path_factory, capsys, monkeypatch):
    """The meta-init cell dies (SIGKILL) in candidate 2; the sweep's rerun keeps its work folder
    (``Cell.resume_state``) and the command resumes from it to the uninterrupted run's weights."""
    from bench.sweep import runner
    from bench.sweep.runner import run_sweep
    from bench.sweep.spec import load_sweep

    ident = runner.code_identity()  # fixed: others editing this checkout meanwhile would make the cell stale
    monkeypatch.setattr(runner, "code_identity", lambda: ident)
    args = {"layers": 2, "hidden": 6, "inner_steps": 2, "meta_batch": 3, "pixels": 40, "validation": 2}
    doc = {"name": "mi", "report": False, "device": "cpu", "cells": [
        {"kind": "prepare", "id": "prep", "source": "synthetic", "name": "syn", "size": 8, "jpeg_quality": 75,
         "args": {"per_class": 5, "num_classes": 2}},
        {"kind": "meta-init", "id": "mi", "data": "prep", "outer_steps": 4, "images": 8, "candidates": 2,
         "args": args},
    ]}
    y = tmp_path / "mi.yaml"
    y.write_text(yaml.safe_dump(doc))
    out = tmp_path / "run"
    cell = out / "cells" / "mi"
    monkeypatch.setenv("INRBENCH_TEST_META_KILL", "2:2:kill")
    assert run_sweep(load_sweep(str(y)), out, progress=False).status == {"prep": "ok", "mi": "error"}
    assert (work_path(cell / "init.pt") / "candidate_0.trained.pt").is_file()
    monkeypatch.delenv("INRBENCH_TEST_META_KILL")
    assert run_sweep(load_sweep(str(y)), out, progress=False).status == {"prep": "ok", "mi": "ok"}
    log = (cell / "stdout.log").read_text()
    assert f"meta-init: resuming candidate 2 of 2 at outer step 0 of 4 (work folder {work_path(cell / 'init.pt')})" \
        in log
    assert not work_path(cell / "init.pt").exists()
    ref = tmp_path / "ref.pt"
    rc, _, err = run_cli(capsys, "meta-init", cell.parent / "prep" / "syn", *TINY, *cands(2), "--out", ref)
    assert rc == 0, err
    assert _same(cell / "init.pt", ref)


def test_meta_init_cells_keep_the_work_folder_inr_meta_work_resumes_from(tmp_path):
    from bench.sweep.cells import Cell

    class Ctx:
        def cell_dir(self, cell_id):
            return tmp_path / cell_id

    cell = Cell(id="mi", kind="meta-init", fields={"data": "prep"})
    assert cell.resume_state(Ctx()) == (work_path(cell.output(Ctx())),)


@pytest.mark.parametrize("candidates", [1, 2])
def test_a_stop_after_any_outer_step_resumes_to_the_same_weights(data, tmp_path, monkeypatch, every_step, candidates):
    """The library call, stopped after every outer step of every candidate in turn."""
    from bench.datasets.prepared import open_prepared
    from inr.meta import MetaConfig, meta_init_dataset
    from inr.siren import SirenArch

    ds, arch = open_prepared(data), SirenArch(2, 6)
    cfg = MetaConfig(outer_steps=3, inner_steps=2, meta_batch=3, images=8, pixels=40, candidates=candidates,
                     validation=2)
    ref, _ = meta_init_dataset(ds, arch, 1e-2, cfg, iterations=20)
    for j in range(1, candidates + 1):
        for k in range(1, cfg.outer_steps + 1):
            work, lines = tmp_path / f"w{j}_{k}", []
            monkeypatch.setenv("INRBENCH_TEST_META_KILL", f"{j}:{k}")
            with pytest.raises(KeyboardInterrupt):
                meta_init_dataset(ds, arch, 1e-2, cfg, iterations=20, work=work)
            monkeypatch.delenv("INRBENCH_TEST_META_KILL")
            got, _ = meta_init_dataset(ds, arch, 1e-2, cfg, iterations=20, work=work, on_resume=lines.append)
            assert lines == [f"meta-init: resuming candidate {j} of {candidates} at outer step {k} of 3 "
                             f"(work folder {work})"]
            assert all(torch.equal(x, y) for (W1, b1), (W2, b2) in zip(got, ref, strict=True)
                       for x, y in ((W1, W2), (b1, b2)))


def test_a_killed_creation_leaves_only_its_temp_folder_and_an_empty_folder_is_not_ours(data, tmp_path, capsys):
    """The work folder appears with its work.json in one rename: a killed creation leaves only its own
    temp folder, which the next run removes; an empty folder someone made at that name is refused and kept."""
    out = tmp_path / "init.pt"
    work_path(out).mkdir()
    rc, _, err = run_cli(capsys, "meta-init", data, *TINY, "--out", out)
    assert rc == 2 and str(work_path(out)) in err and "not a meta-init work folder" in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == [work_path(out).name]
    work_path(out).rmdir()
    killed = tmp_path / (outputs.temp_name(work_path(out), ".partial") + "k2j4x9ab.partial")
    killed.mkdir()
    (killed / "work.json").write_text('{"kind": "meta')
    rc, _, err = run_cli(capsys, "meta-init", data, *TINY, "--out", out)
    assert rc == 0, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["init.pt"]


def test_damaged_checkpoints_are_redone_and_the_resume_line_says_so(data, tmp_path, tmp_path_factory, capsys,
                                                                    monkeypatch, every_step):
    """A truncated finished candidate and a state without its generator keys (a damaged disk, a
    hand-edited file): the resume line names the candidate that is really redone, nothing raises,
    and the weights are still the uninterrupted run's."""
    ref = _reference(data, tmp_path_factory, capsys, 2)
    out = tmp_path / "init.pt"
    argv = ("meta-init", data, *TINY, *cands(2), "--out", out)
    monkeypatch.setenv("INRBENCH_TEST_META_KILL", "2:2")
    assert run_cli(capsys, *argv)[0] == 130
    monkeypatch.delenv("INRBENCH_TEST_META_KILL")
    work = work_path(out)
    trained = work / "candidate_0.trained.pt"
    trained.write_bytes(trained.read_bytes()[:40])  # truncated
    torch.save({"step": 2, "theta": []}, work / "candidate_1.state.pt")  # keys missing
    rc, stdout, err = run_cli(capsys, *argv)
    assert rc == 0, err
    assert stdout.splitlines()[0] == f"meta-init: resuming candidate 1 of 2 at outer step 0 of 4 (work folder {work})"
    assert _same(out, ref)
