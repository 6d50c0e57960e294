"""``prepare imagefolder --val-fraction`` on a tree that is split already (``train/`` + ``val/`` or ``test/``):
the fraction would be unused yet recorded in the manifest as if applied, so it is refused (one line naming
the root, exit 2, nothing written); where the source splits by ratio it is used and recorded."""

from __future__ import annotations

import json

import pytest

from tests.cli_helpers import assert_one_line_error, run_cli, snapshot
from tests.fixtures_datasets import write_imagefolder


@pytest.mark.parametrize("held", ["val", "test"])
def test_a_split_tree_refuses_val_fraction(tmp_path, capsys, held):
    root = tmp_path / "tree"
    write_imagefolder(root, per_class=3, split=True)
    if held == "test":
        (root / "val").rename(root / "test")
    before = snapshot(tmp_path, dirs=True)
    rc, out, err = run_cli(capsys, "prepare", "imagefolder", "--root", root, "--out", tmp_path / "out", "--size", "16",
                           "--val-fraction", "0.5")
    assert_one_line_error(rc, err, str(root), f"--val-fraction 0.5 does not apply: this tree is split already "
                                              f"(train/ + {held}/); leave it out")
    assert snapshot(tmp_path, dirs=True) == before  # no output, no work folder, no lock left behind
    rc, _, err = run_cli(capsys, "prepare", "imagefolder", "--root", root, "--out", tmp_path / "out", "--size", "16")
    assert rc == 0, err
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["config"]["val_fraction"] is None
    assert manifest["source_meta"]["split_rule"] == f"folders: train/ + {held}/"


def test_one_tree_uses_and_records_val_fraction(tmp_path, capsys):
    write_imagefolder(tmp_path / "tree", per_class=4)
    rc, _, err = run_cli(capsys, "prepare", "imagefolder", "--root", tmp_path / "tree", "--out", tmp_path / "out",
                         "--size", "16", "--val-fraction", "0.5")
    assert rc == 0, err
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["config"]["val_fraction"] == 0.5
    assert manifest["source_meta"]["split_rule"].startswith("seeded per-class ratio: val_fraction 0.5")


@pytest.mark.parametrize("source", ["cifar10", "flowers102"])
def test_a_source_with_official_splits_refuses_val_fraction(tmp_path, capsys, source):
    """CIFAR-10 and Flowers102 keep their official splits: the fraction would be recorded, unused."""
    from tests.fixtures_datasets import write_cifar10, write_flowers102

    (write_cifar10 if source == "cifar10" else write_flowers102)(tmp_path / "src")
    before = snapshot(tmp_path, dirs=True)
    rc, _, err = run_cli(capsys, "prepare", source, "--root", tmp_path / "src", "--out", tmp_path / "out",
                         "--val-fraction", "0.3")
    assert_one_line_error(rc, err, f"--val-fraction 0.3 does not apply to {source}: it has its own fixed splits")
    assert snapshot(tmp_path, dirs=True) == before
