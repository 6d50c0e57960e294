"""The sweep engine on fake cells (tiny python commands): statuses, dependencies, resume, kills."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml

from bench.errors import InputError
from bench.sweep import layout
from bench.sweep.runner import run_sweep
from bench.sweep.spec import load_sweep

REPO = Path(__file__).resolve().parent.parent

# A cell that appends its id to a shared counter file, then optionally waits for a "go" file.
COUNT = "import pathlib,sys; open(sys.argv[1], 'a').write(sys.argv[2] + '\\n')"
WAIT = (COUNT + "; import time; pathlib.Path(sys.argv[3]).write_text('1')"
        "\nwhile not pathlib.Path(sys.argv[4]).exists(): time.sleep(0.05)"
        "\npathlib.Path('out.txt').write_text('done')")
FAIL = COUNT + "; print('Traceback ...', file=sys.stderr); print('ValueError: boom in cell', file=sys.stderr); sys.exit(3)"


def _yaml(tmp: Path, counter: Path, started: Path, go: Path) -> Path:
    doc = {
        "name": "fake",
        "cells": [
            {"kind": "python", "id": "a-{n}", "matrix": {"n": [1, 2]}, "command": ["-c", COUNT, str(counter), "a"]},
            {"kind": "python", "id": "fail", "command": ["-c", FAIL, str(counter), "fail"]},
            {"kind": "python", "id": "after-fail", "needs": ["fail"], "command": ["-c", COUNT, str(counter), "x"]},
            {"kind": "python", "id": "wait", "needs": ["a-1"],
             "command": ["-c", WAIT, str(counter), "wait", str(started), str(go)]},
            {"kind": "python", "id": "last", "needs": ["wait", "a-2"], "command": ["-c", COUNT, str(counter), "last"]},
        ],
    }
    p = tmp / "fake.yaml"
    p.write_text(yaml.safe_dump(doc))
    return p


def _counts(counter: Path) -> dict[str, int]:
    lines = counter.read_text().split() if counter.exists() else []
    return {k: lines.count(k) for k in set(lines)}


def _sweep_proc(yaml_path: Path, out: Path) -> subprocess.Popen:
    """``inrbench sweep`` (the real CLI) in a subprocess."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen([sys.executable, "-m", "bench", "sweep", str(yaml_path), "--out", str(out),
                             "--no-report", "--no-progress"], cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _wait_for(path: Path, proc: subprocess.Popen, timeout: float = 60.0) -> None:
    t0 = time.monotonic()
    while not path.exists():
        if proc.poll() is not None:
            raise AssertionError(f"sweep exited early: {proc.communicate()}")
        if time.monotonic() - t0 > timeout:
            raise AssertionError(f"{path} never appeared")
        time.sleep(0.05)


def test_statuses_errors_and_dependencies(tmp_path):
    counter, started, go = tmp_path / "count", tmp_path / "started", tmp_path / "go"
    go.write_text("1")
    cfg = load_sweep(str(_yaml(tmp_path, counter, started, go)))
    assert [c.id for c in cfg.cells] == ["a-1", "a-2", "fail", "after-fail", "wait", "last"]
    out = tmp_path / "out"
    s = run_sweep(cfg, out, progress=False)
    assert s.status == {"a-1": "ok", "a-2": "ok", "fail": "error", "after-fail": "skip", "wait": "ok", "last": "ok"}
    df = pd.read_csv(out / "results.csv", keep_default_na=False)
    rows = df.set_index("run_id")
    # the failure's reason is the tail of its stderr; the dependent skip names the failed dependency
    assert "ValueError: boom in cell" in rows.loc["sweep:fail", "reason"]
    assert rows.loc["sweep:fail", "value"] == ""  # NaN, never a zero that could be averaged
    assert rows.loc["sweep:after-fail", "status"] == "skip"
    assert rows.loc["sweep:after-fail", "reason"].startswith("dependency fail error")
    assert _counts(counter) == {"a": 2, "fail": 1, "wait": 1, "last": 1}  # 'x' never ran
    saved = json.loads((out / "sweep.json").read_text())
    assert [c["id"] for c in saved["cells"]] == [c.id for c in cfg.cells]
    assert saved["cells"][4]["deps"] == ["a-1"] and saved["cells"][4]["argv"][0] == "-c"

    # a plain rerun keeps every finished cell and retries only the failed one (and its dependent)
    s2 = run_sweep(cfg, out, progress=False)
    assert sorted(s2.kept) == ["a-1", "a-2", "last", "wait"] and s2.ran == ["fail", "after-fail"]
    assert _counts(counter) == {"a": 2, "fail": 2, "wait": 1, "last": 1}
    df2 = pd.read_csv(out / "results.csv")
    assert len(df2) == 6 and not df2["run_id"].duplicated().any()


def _sweep_in_wait_cell(tmp_path: Path):
    """The fake sweep started as ``inrbench sweep`` into ``tmp_path / "out"``, once its 'wait' cell runs
    (it finishes when ``go`` is written) -> (yaml, out, counter, go, process, the sweep's child pids)."""
    counter, started, go = tmp_path / "count", tmp_path / "started", tmp_path / "go"
    y = _yaml(tmp_path, counter, started, go)
    out = tmp_path / "out"
    proc = _sweep_proc(y, out)
    _wait_for(started, proc)
    child_pids = _children(proc.pid)
    assert child_pids, "the waiting cell should be a child process of the sweep"
    return y, out, counter, go, proc, child_pids


def test_kill_mid_cell_then_rerun_keeps_every_finished_cell_once(tmp_path, run):
    y, out, counter, go, proc, child_pids = _sweep_in_wait_cell(tmp_path)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    _assert_gone(child_pids)  # the cell died with its parent
    # the killed cell left a partial folder without a marker; finished cells have theirs
    assert (out / "cells" / "wait").is_dir() and not (out / "cells" / "wait" / "cell.json").exists()
    assert {m["id"] for _, m in layout.finished_cells(out)} == {"a-1", "a-2", "fail", "after-fail"}
    assert _counts(counter) == {"a": 2, "fail": 1, "wait": 1}

    go.write_text("1")
    rc, _, err = run("sweep", y, "--out", out, "--no-report", "--no-progress")  # the rerun: in-process
    assert rc == 1, err  # 'fail' fails again: a non-zero exit, after every cell ran
    # the killed cell was redone once; ok cells were never re-run; the failed one was retried
    assert _counts(counter) == {"a": 2, "fail": 2, "wait": 2, "last": 1}
    df = pd.read_csv(out / "results.csv")
    assert not df["run_id"].duplicated().any() and len(df) == 6
    assert set(df.loc[df.status == "ok", "run_id"]) == {"sweep:a-1", "sweep:a-2", "sweep:wait", "sweep:last"}
    assert (out / "cells" / "wait" / "out.txt").read_text() == "done"


def test_sigint_mid_cell_exits_130_and_resume_completes(tmp_path):
    y, out, counter, go, proc, child_pids = _sweep_in_wait_cell(tmp_path)
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=60)
    assert proc.returncode == 130
    _assert_gone(child_pids)
    assert not (out / "cells" / "wait" / "cell.json").exists()
    go.write_text("1")
    s = run_sweep(load_sweep(str(y)), out, resume=True, progress=False)
    assert sorted(s.kept) == ["a-1", "a-2"] and s.ran == ["fail", "after-fail", "wait", "last"]
    assert _counts(counter) == {"a": 2, "fail": 2, "wait": 2, "last": 1}


def test_changed_cell_is_redone_with_its_dependents(tmp_path):
    counter, started, go = tmp_path / "count", tmp_path / "started", tmp_path / "go"
    go.write_text("1")
    y = _yaml(tmp_path, counter, started, go)
    out = tmp_path / "out"
    run_sweep(load_sweep(str(y)), out, progress=False)
    y.write_text(y.read_text().replace("- wait\n", "- WAIT\n", 1))  # change cell wait's argv
    s = run_sweep(load_sweep(str(y)), out, progress=False)
    assert sorted(s.kept) == ["a-1", "a-2"] and sorted(s.ran) == ["after-fail", "fail", "last", "wait"]
    # --redo re-runs a finished cell and everything downstream of it
    s = run_sweep(load_sweep(str(y)), out, progress=False, redo=("wai?",))
    assert sorted(s.kept) == ["a-1", "a-2"] and sorted(s.ran) == ["after-fail", "fail", "last", "wait"]
    with pytest.raises(InputError, match="--redo 'nope' matches no cell"):
        run_sweep(load_sweep(str(y)), out, progress=False, redo=("nope",))
    # a cell removed from the sweep leaves its folder on disk but no rows in the results
    doc = yaml.safe_load(y.read_text())
    doc["cells"] = [c for c in doc["cells"] if c["id"] != "last"]
    y.write_text(yaml.safe_dump(doc))
    s = run_sweep(load_sweep(str(y)), out, progress=False)
    assert "last" not in s.status and (out / "cells" / "last" / "cell.json").exists()
    assert "sweep:last" not in set(pd.read_csv(out / "results.csv")["run_id"])


def test_resume_without_previous_run_is_an_input_error(tmp_path):
    counter, started, go = tmp_path / "count", tmp_path / "started", tmp_path / "go"
    with pytest.raises(InputError, match="nothing to resume"):
        run_sweep(load_sweep(str(_yaml(tmp_path, counter, started, go))), tmp_path / "none", resume=True,
                  progress=False)


@pytest.mark.parametrize("body, message", [
    ("cells: [{kind: nope, id: x}]", "unknown kind 'nope'"),
    ("cells: [{kind: python, id: x, colour: red}]", "unknown fields ['colour']"),
    ("cells: [{kind: bench, id: b, pipeline: raw, data: later}]", "data='later' names no earlier cell"),
    ("cells: [{kind: python, id: p}, {kind: bench, id: b, pipeline: raw, data: p}]", "is a python cell, expected prepare"),
    ("cells: [{kind: prepare, id: p, source: photos, size: big}]", "argument --size: invalid int value: 'big'"),
    ("cells: [{kind: python, id: 'a b'}]", "id must match"),
    ("cells: [{kind: python, id: a}, {kind: python, id: a}]", "duplicate cell id 'a'"),
    ("cells: [{kind: prepare, id: p, source: photos}, {kind: bench, id: b, pipeline: raw, data: p, mode: fast}]",
     "argument --mode: invalid choice: 'fast'"),
    # a name is a file name inside the cell folder: it never climbs out of the sweep folder (audit)
    ("cells: [{kind: prepare, id: p, source: photos, name: ../../../../esc_out}]",
     "cell 'p': name '../../../../esc_out' must be a plain file name"),
    ("cells: [{kind: prepare, id: p, source: photos, name: ..}]", "cell 'p': name '..' must be a plain file name"),
    ("cells: [{kind: prepare, id: p, source: photos}, {kind: encode, id: e, data: p, name: /tmp/abs}]",
     "cell 'e': name '/tmp/abs' must be a plain file name"),
])
def test_bad_sweep_files_name_the_file_and_the_problem(tmp_path, body, message):
    p = tmp_path / "bad.yaml"
    p.write_text(textwrap.dedent(body))
    with pytest.raises(InputError) as e:
        load_sweep(str(p))
    assert str(p) in str(e.value) and message in str(e.value)


def _children(pid: int) -> list[int]:
    import psutil

    return [c.pid for c in psutil.Process(pid).children(recursive=True)]


def _assert_gone(pids: list[int], timeout: float = 10.0) -> None:
    import psutil

    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        alive = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
        if not alive:
            return
        time.sleep(0.05)
    raise AssertionError(f"cell processes {alive} outlived the sweep")


def test_builtin_sweeps_are_valid_and_cover_every_stage(capsys):
    from bench.cli import main as cli_main
    from bench.sweep.spec import builtin_names

    assert {"demo", "paper", "design-space"} <= set(builtin_names())
    demo = load_sweep("demo")
    kinds = {c.kind for c in demo.cells}
    assert kinds == {"prepare", "meta-init", "encode", "compare", "bench"} and demo.device == "cpu" and demo.report
    bench = {(c.pipeline, c.mode) for c in demo.cells if c.kind == "bench"}
    import pipelines

    # the demo times every registered pipeline in every mode
    assert bench == {(p, m) for p in pipelines.names() for m in ("loader", "replay", "train")}
    assert all(c.store for c in demo.cells if c.kind == "bench" and c.pipeline == "inr")
    enc = {c.name: c for c in demo.cells if c.kind == "encode"}
    assert enc["pruned-8bit"].prune and enc["pruned-8bit"].bits and enc["8bit"].bits and not enc["fp32"].bits
    from bench.sweep.runner import SweepContext

    ctx = SweepContext(out=Path("/o"), data_root=None, cells=demo.by_id())
    argv = enc["8bit"].argv(ctx)  # one float32 fit shared by every variant of the demo
    assert argv[argv.index("--fit-cache") + 1] == "/o/shared/fit-cache"
    assert argv[argv.index("--out") + 1] == "/o/cells/encode-8bit/8bit.inr"

    paper = load_sweep("paper", device="cpu")  # --device overrides the file's cuda
    assert paper.device == "cpu" and all(c.device == "cpu" for c in paper.cells if c.kind != "prepare" and c.kind != "compare")
    roots = {c.root for c in paper.cells if c.kind == "prepare"}
    assert roots == {"cifar-10-batches-py", "flowers102", "mini-imagenet"}

    ds = load_sweep("design-space")
    axes = {k for c in ds.cells if c.kind == "encode" for k in ("layers", "hidden", "w0", "lr", "iterations")
            if len({getattr(e, k) for e in ds.cells if e.kind == "encode"}) > 1}
    assert axes == {"layers", "hidden", "w0", "lr", "iterations"}

    assert cli_main(["sweep", "paper", "--list", "--data-root", "/data/sets"]) == 0
    listing = capsys.readouterr().out
    assert "inrbench prepare cifar10 --root /data/sets/cifar-10-batches-py" in listing
    # paper's learned inits are the best of 4 Reptile seeds, chosen on train images (meta-init --candidates)
    meta = [line for line in listing.splitlines() if "inrbench meta-init" in line]
    assert len(meta) == 3 and all("--candidates 4" in line for line in meta), meta


def test_cli_bad_sweep_names(tmp_path, capsys):
    from bench.cli import main as cli_main

    assert cli_main(["sweep", "no-such-sweep", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "unknown sweep 'no-such-sweep'; built-in: " in err and "Traceback" not in err
    assert cli_main(["sweep", str(tmp_path / "missing.yaml")]) == 2
    assert "missing.yaml: no such sweep file" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["demo", "paper"])
def test_builtin_sweeps_time_every_comparison_in_several_processes(name):
    """The report's speedups count each process (bench run) once: a pipeline timed in one process
    gets no interval. Every timed (pipeline, mode, method) of the built-in sweeps runs in at least
    two cells of identical settings, and those cells are interleaved with the others. The training
    seed is no timed setting (``cfg.pipe.seed`` splits no comparison: ``bench.report.settings.IGNORED``),
    so cells that differ only in ``seed`` are processes of the same thing."""
    import collections

    from bench.report.settings import IGNORED

    assert "cfg.pipe.seed" in IGNORED
    cfg = load_sweep(name, device="cpu")
    bench = [c for c in cfg.cells if c.kind == "bench"]
    groups = collections.defaultdict(list)
    for i, c in enumerate(bench):
        key = {k: v for k, v in c.to_dict().items() if k not in ("id", "seed")}
        groups[repr(sorted(key.items(), key=lambda kv: kv[0]))].append(i)
    assert groups and all(len(ix) >= 2 for ix in groups.values()), \
        [bench[ix[0]].id for ix in groups.values() if len(ix) < 2]
    # interleaved: another cell runs between two processes of the same thing
    assert all(all(b - a > 1 for a, b in zip(ix, ix[1:], strict=False)) for ix in groups.values())
    expand = [c for c in bench if "-expand-" in c.id]
    assert expand and all(c.method == "expand" and c.schedule for c in expand)
    assert all(c.method is None for c in bench if "-dense-" in c.id)


@pytest.mark.parametrize("name, n_seeds", [("demo", 3), ("paper", 2)])
def test_builtin_train_cells_sample_training_seeds(name, n_seeds):
    """Every pipeline's train cells run at seeds 1..n (``--seed k``), interleaved seed by seed, and
    differ in nothing but the seed (and the id): at seed k every pipeline trains from the same
    permutation, augmentation and initial weights, so the report pairs their accuracies by seed.
    The loader/replay and method cells keep bench's default seed."""
    import collections

    from bench.sweep.runner import SweepContext

    cfg = load_sweep(name, device="cpu")
    train = [c for c in cfg.cells if c.kind == "bench" and c.id.startswith("train-")]
    assert train
    groups = collections.defaultdict(list)
    for c in train:
        key = {k: v for k, v in c.to_dict().items() if k not in ("id", "seed")}
        groups[repr(sorted(key.items()))].append(c)
        assert c.id.endswith(f"-{c.seed}") and c.mode == "train"
    for cells in groups.values():
        assert [c.seed for c in cells] == list(range(1, n_seeds + 1)), [c.id for c in cells]
    # every pipeline of a dataset at every seed, seed by seed (the seed key first, then the feed)
    for ds in {c.data for c in train}:
        seeds = [c.seed for c in train if c.data == ds]
        assert seeds == sorted(seeds) and len(seeds) == n_seeds * len(set(c.pipeline for c in train if c.data == ds))
    ctx = SweepContext(out=Path("runs") / name, data_root=None, cells={c.id: c for c in cfg.cells})
    argv = train[0].argv(ctx)
    assert argv[argv.index("--seed") + 1] == "1"
    assert all(c.seed is None for c in cfg.cells if c.kind == "bench" and not c.id.startswith("train-"))
    # unset, a seed stays out of the cell's hash (cells without one keep theirs)
    other = next(c for c in cfg.cells if c.kind == "bench" and c.seed is None)
    assert "--seed" not in other.identity(ctx)["argv"] and "--seed" in train[0].identity(ctx)["argv"]


def test_bench_cell_refuses_a_seed_out_of_range(tmp_path):
    """The command's own parser checks the cell's options (``bench --seed``: 0..2**32-1)."""
    p = tmp_path / "s.yaml"
    cells = "cells: [{kind: prepare, id: p, source: photos}, {kind: bench, id: b, data: p, pipeline: raw, seed: SEED}]"
    p.write_text(cells.replace("SEED", "-1"))
    with pytest.raises(InputError, match="cell 'b': inrbench bench: argument --seed: a seed must be an integer in"):
        load_sweep(str(p))
    p.write_text(cells.replace("SEED", "0"))
    assert load_sweep(str(p)).by_id()["b"].seed == 0


def test_matrix_dict_item_may_carry_a_label_for_the_id(tmp_path):
    """A dict item's reserved ``label`` only names the combination (the id template uses it); any
    other unknown key is refused, even when the id names it: a typo'd field never drops silently."""
    p = tmp_path / "s.yaml"
    p.write_text(textwrap.dedent("""
        cells:
          - {kind: prepare, id: p, source: photos}
          - kind: bench
            id: "m-{label}-{process}"
            data: p
            pipeline: raw
            mode: train
            matrix:
              process: [1, 2]
              method:
                - {label: dense}
                - {label: expand, args: {method: expand}}
    """))
    ids = {c.id: c for c in load_sweep(str(p)).cells}
    assert list(ids) == ["p", "m-dense-1", "m-expand-1", "m-dense-2", "m-expand-2"]
    assert ids["m-expand-2"].method == "expand" and ids["m-dense-1"].method is None
    text = p.read_text().replace('id: "m-{label}-{process}"', 'id: "m-{label}-{process}-e{epoch}"')
    p.write_text(text.replace("{label: expand,", "{label: expand, epoch: 3,").replace("{label: dense}",
                                                                                   "{label: dense, epoch: 3}"))
    with pytest.raises(InputError, match=r"field 'epoch': inrbench bench has no option --epoch"):  # a typo of epochs
        load_sweep(str(p))


def test_the_merged_view_is_written_once_per_run_and_on_an_interrupt(tmp_path, monkeypatch):
    """Not after every cell (it reads every finished cell's rows: quadratic in the cells), and on an
    interrupt the cells finished so far are in it."""
    from bench.sweep import runner

    calls = []
    real = layout.write_merged
    monkeypatch.setattr(layout, "write_merged", lambda out: (calls.append(out), real(out)))
    y = tmp_path / "s.yaml"
    y.write_text(yaml.safe_dump({"name": "s", "cells": [
        {"kind": "python", "id": f"c{i}", "command": ["-c", "print(1)"]} for i in range(3)]}))
    assert run_sweep(load_sweep(str(y)), tmp_path / "out", progress=False).status == {f"c{i}": "ok" for i in range(3)}
    assert len(calls) == 1
    real_run = runner._run_cell

    def interrupted(cell, *a, **kw):
        if cell.id == "c1":
            raise KeyboardInterrupt
        return real_run(cell, *a, **kw)

    monkeypatch.setattr(runner, "_run_cell", interrupted)
    with pytest.raises(KeyboardInterrupt):
        run_sweep(load_sweep(str(y)), tmp_path / "out", progress=False, redo=("c*",))
    assert len(calls) == 2
    rows = pd.read_csv(tmp_path / "out" / "results.csv")
    assert list(rows["run_id"]) == ["sweep:c0", "sweep:c2"]  # c0 ran again; c1 left no marker; c2 not reached
