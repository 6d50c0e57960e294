"""Results tied to code: a cell finished under another code identity is stale (recomputed, or kept
with keep_stale); the code version itself follows the package files, committed or not."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from bench import envinfo
from bench.cli import main as cli_main
from bench.sweep import layout
from bench.sweep import runner as sweep_runner
from bench.sweep.runner import run_sweep
from bench.sweep.spec import load_sweep

COUNT = "import sys; open(sys.argv[1], 'a').write(sys.argv[2] + '\\n')"


def _sweep(tmp: Path, counter: Path, tag: str = "x") -> Path:
    doc = {"name": "fake", "cells": [
        {"kind": "python", "id": "a", "command": ["-c", COUNT, str(counter), "a"]},
        {"kind": "python", "id": "b", "needs": ["a"], "command": ["-c", COUNT, str(counter), "b" + tag]},
    ]}
    p = tmp / "fake.yaml"
    p.write_text(yaml.safe_dump(doc))
    return p


@pytest.fixture
def code(monkeypatch):
    """The code identity the sweep sees, set by the test (``code["id"] = ...``)."""
    ident = {"id": "code-A", "code": {"id": "A", "label": "commit A (clean)"}, "libraries": {"torch": "1"}}
    monkeypatch.setattr(sweep_runner, "code_identity", lambda: dict(ident))
    return ident


def _lines(counter: Path) -> list[str]:
    return counter.read_text().split() if counter.exists() else []


def test_same_code_resumes_other_code_is_stale_and_recomputed(tmp_path, code):
    counter, out = tmp_path / "count", tmp_path / "out"
    y = _sweep(tmp_path, counter)
    s = run_sweep(load_sweep(str(y)), out, progress=False)
    assert s.ran == ["a", "b"] and s.stale == []
    m = layout.read_marker(out / "cells" / "a")
    assert m["code"]["id"] == "code-A" and m["config_hash"] != m["hash"]
    assert json.loads((out / "sweep.json").read_text())["code"]["id"] == "code-A"

    s = run_sweep(load_sweep(str(y)), out, progress=False)  # nothing edited: everything resumes
    assert s.kept == ["a", "b"] and s.ran == [] and s.stale == [] and _lines(counter) == ["a", "bx"]

    code["id"] = "code-B"  # a code change: both cells are stale and run again
    s = run_sweep(load_sweep(str(y)), out, progress=False)
    assert s.stale == ["a", "b"] and s.ran == ["a", "b"] and s.kept == [] and s.kept_stale == []
    assert layout.read_marker(out / "cells" / "b")["code"]["id"] == "code-B"
    assert _lines(counter) == ["a", "bx", "a", "bx"]


def test_keep_stale_keeps_finished_cells_and_says_so(tmp_path, code):
    counter, out = tmp_path / "count", tmp_path / "out"
    y = _sweep(tmp_path, counter)
    run_sweep(load_sweep(str(y)), out, progress=False)
    code["id"] = "code-B"
    s = run_sweep(load_sweep(str(y)), out, progress=False, keep_stale=True)
    assert s.kept == ["a", "b"] and s.kept_stale == ["a", "b"] and s.ran == [] and s.stale == []
    assert layout.read_marker(out / "cells" / "a")["code"]["id"] == "code-A"  # untouched
    assert _lines(counter) == ["a", "bx"]
    # a config change is not staleness: b runs again even with keep_stale (a stays kept, stale)
    y = _sweep(tmp_path, counter, tag="y")
    s = run_sweep(load_sweep(str(y)), out, progress=False, keep_stale=True)
    assert s.kept_stale == ["a"] and s.ran == ["b"] and s.stale == []


def test_cli_reports_stale_cells(tmp_path, code, capsys):
    counter, out = tmp_path / "count", tmp_path / "out"
    y = _sweep(tmp_path, counter)
    argv = ["sweep", str(y), "--out", str(out), "--no-report", "--no-progress"]
    assert cli_main(argv) == 0
    code["id"] = "code-B"
    capsys.readouterr()
    assert cli_main(argv + ["--keep-stale"]) == 0
    assert "2 stale cells kept (--keep-stale; marked in the report): a, b" in capsys.readouterr().out
    assert cli_main(argv) == 0
    assert "2 stale cells (finished under another code version) recomputed: a, b" in capsys.readouterr().out


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=repo, check=True,
                          capture_output=True, text=True).stdout.strip()


def _tree(root: Path) -> None:
    for d in envinfo.PACKAGE_DIRS:
        (root / d).mkdir(parents=True)
        (root / d / "__init__.py").write_text(f"# {d}\n")
    (root / "README.md").write_text("readme\n")


def test_code_version_follows_package_files_in_git(tmp_path):
    repo = tmp_path / "repo"
    _tree(repo)
    _git(repo, "init", "-q")
    _git(repo, "add", ".")
    _git(repo, "commit", "-qm", "one")
    v0 = envinfo.code_version(repo)
    assert v0["source"] == "git" and v0["dirty"] is False and v0["commit"] == _git(repo, "rev-parse", "HEAD")
    assert v0["label"] == f"{v0['commit'][:10]} (clean)"

    (repo / "README.md").write_text("docs only\n")  # not package code: same version
    _git(repo, "commit", "-qam", "docs")
    v1 = envinfo.code_version(repo)
    assert v1["id"] == v0["id"] and v1["commit"] != v0["commit"]

    (repo / "inr" / "__init__.py").write_text("# changed\n")  # uncommitted package change
    v2 = envinfo.code_version(repo)
    assert v2["dirty"] is True and v2["id"] != v0["id"] and "uncommitted" in v2["label"]
    (repo / "inr" / "__init__.py").write_text("# inr\n")  # reverted: the clean version again
    assert envinfo.code_version(repo)["id"] == v0["id"]
    (repo / "bench" / "new.py").write_text("x = 1\n")  # an untracked package file counts
    v3 = envinfo.code_version(repo)
    assert v3["dirty"] is True and v3["id"] != v0["id"]
    (repo / "bench" / "new.py").write_text("x = 2\n")
    assert envinfo.code_version(repo)["id"] != v3["id"]


def test_code_version_without_git_hashes_the_package_files(tmp_path):
    root = tmp_path / "plain"
    _tree(root)
    v0 = envinfo.code_version(root)
    assert v0["source"] == "files" and v0["commit"] is None and v0["label"].startswith("package files ")
    (root / "README.md").write_text("other\n")
    assert envinfo.code_version(root)["id"] == v0["id"]
    (root / "pipelines" / "__init__.py").write_text("# changed\n")
    assert envinfo.code_version(root)["id"] != v0["id"]


def test_code_identity_includes_library_versions(monkeypatch):
    a = envinfo.code_identity()
    assert set(a["libraries"]) == {"torch", "torchvision", "torchcodec", "nvidia-dali", "PIL"}
    assert a["libraries"]["torch"] and a["libraries"]["PIL"].split()[0] in ("Pillow", "pillow-simd")
    monkeypatch.setattr(envinfo, "library_versions", lambda: {**a["libraries"], "torch": "0.0.1"})
    b = envinfo.code_identity()
    assert b["code"]["id"] == a["code"]["id"] and b["id"] != a["id"]
