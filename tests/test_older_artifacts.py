"""No compatibility code before 1.0: an artifact of an older schema is refused in one line, nothing changed."""

from __future__ import annotations

import json
import shutil
import struct

import pytest

from bench import results as R
from bench.workdir import work_path
from tests.cli_helpers import assert_one_line_error, run_cli, snapshot
from tests.fixtures_datasets import write_tiny_prepared

FIT = ("--iterations", "2", "--layers", "2", "--hidden", "4", "--no-progress")


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    w = tmp_path_factory.mktemp("older")
    write_tiny_prepared(w / "data", 4, 2)
    from bench import cli

    assert cli.main(["encode", str(w / "data"), "--out", str(w / "s.inr"), *FIT]) == 0
    return w


def _store(w):
    data = bytearray((w / "s.inr").read_bytes())
    struct.pack_into("<I", data, 8, 2)  # the prefix's format version
    (w / "old.inr").write_bytes(bytes(data))
    return w / "old.inr", 2, ["inspect", w / "old.inr"], "encode"


def _prepared(w):
    shutil.copytree(w / "data", w / "old")
    m = json.loads((w / "old" / "manifest.json").read_text())
    (w / "old" / "manifest.json").write_text(json.dumps({**m, "schema_version": 1}))
    return w / "old" / "manifest.json", 1, ["encode", w / "old", "--out", w / "o.inr", *FIT], "prepare"


def _results(w):
    run = R.RunRows("r1", "raw", "data", "loader")
    run.add("epoch_s", 1.0, "s", 0, 0)
    rows = R.write_run(w / "res", run) / R.ROWS_FILE
    rows.write_text(rows.read_text().replace("\n3,", "\n2,"))
    return rows, 2, ["report", w / "res", "--out", w / "rep"], "bench"


def _work_folder(w):
    work = work_path(w / "o.inr", "encode")
    work.mkdir()
    (work / "work.json").write_text(json.dumps({"kind": "encode-work", "schema_version": 2, "job": {}}))
    return work, 2, ["encode", w / "data", "--out", w / "o.inr", *FIT], "encode"


def _meta_init(w):
    import torch

    torch.save({"format": "inr-bench meta-init v1"}, w / "init.pt")
    return w / "init.pt", 1, ["encode", w / "data", "--init", w / "init.pt", "--out", w / "o.inr", *FIT], "meta-init"


@pytest.mark.parametrize("make", [_store, _prepared, _results, _work_folder, _meta_init],
                         ids=["store", "prepared", "results", "work-folder", "meta-init"])
def test_an_older_artifact_is_refused_in_one_line(world, tmp_path, capsys, make):
    w = tmp_path / "w"
    shutil.copytree(world, w, ignore=shutil.ignore_patterns(".*.inrbench-*"))
    path, schema, argv, command = make(w)
    before = snapshot(w, dirs=True)
    rc, stdout, err = run_cli(capsys, *argv)
    assert_one_line_error(rc, err, f"{path}: written by an older inr-bench (schema {schema}); ",
                          f"rerun `inrbench {command}`")
    assert stdout == "" and snapshot(w, dirs=True) == before
