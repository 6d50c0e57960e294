"""`inrbench prepare` / `inrbench datasets` through the real CLI dispatcher: summaries and error paths.

Every bad input must give exit code 2 and ONE line on stderr that names the file and the
problem, with no traceback; an interrupted or failed run leaves no output folder.
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import scipy.io
from cli_helpers import assert_one_line_error
from fixtures_datasets import (
    truncate,
    write_cifar10,
    write_flowers102,
    write_imagefolder,
    write_miniimagenet,
)

from bench.datasets.prepared import read_source_ids

MINE = {"datasets": "bench.commands.datasets", "prepare": "bench.commands.prepare"}



def test_datasets_lists_every_source(run):
    rc, out, _ = run("datasets")
    assert rc == 0
    names = [line.split()[0] for line in out.strip().splitlines()]
    assert names == ["cifar10", "flowers102", "imagefolder", "mini-imagenet", "photos", "synthetic"]


def test_prepare_summary(run, tmp_path):
    rc, out, err = run("prepare", "synthetic", "--out", tmp_path / "s", "--per-class", "5", "--num-classes", "3")
    assert rc == 0, err
    assert "train 12" in out and "test 3" in out and "3 classes" in out and "32x32" in out
    assert "wall time" in out and "MB" in out
    m = json.loads((tmp_path / "s" / "manifest.json").read_text())
    assert m["config"]["num_classes"] == 3 and m["jpeg"]["quality"] == 90


def test_missing_root(run, tmp_path):
    rc, _, err = run("prepare", "cifar10", "--root", tmp_path / "nope", "--out", tmp_path / "o")
    assert_one_line_error(rc, err, tmp_path / "nope", "no such file or folder")
    assert not (tmp_path / "o").exists()


def test_root_is_a_file(run, tmp_path):
    (tmp_path / "cifar.tar.gz").write_bytes(b"x")
    rc, _, err = run("prepare", "cifar10", "--root", tmp_path / "cifar.tar.gz", "--out", tmp_path / "o")
    assert_one_line_error(rc, err, tmp_path / "cifar.tar.gz", "not a folder")


def test_root_required_and_refused(run, tmp_path):
    rc, _, err = run("prepare", "flowers102", "--out", tmp_path / "o")
    assert_one_line_error(rc, err, "needs --root")
    rc, _, err = run("prepare", "photos", "--root", tmp_path, "--out", tmp_path / "o")
    assert_one_line_error(rc, err, "takes no --root")


def test_unknown_source(run, tmp_path):
    rc, _, err = run("prepare", "imagenet-21k", "--out", tmp_path / "o")
    assert_one_line_error(rc, err, "imagenet-21k", "cifar10", "photos")


def test_cifar_wrong_layout(run, tmp_path):
    write_cifar10(tmp_path / "c")
    (tmp_path / "c" / "data_batch_1").unlink()
    rc, _, err = run("prepare", "cifar10", "--root", tmp_path / "c", "--out", tmp_path / "o")
    assert_one_line_error(rc, err, tmp_path / "c" / "data_batch_1", "missing data_batch_1")
    assert not (tmp_path / "o").exists()


def test_cifar_truncated_batch(run, tmp_path):
    write_cifar10(tmp_path / "c")
    truncate(tmp_path / "c" / "data_batch_3", 0.6)
    rc, _, err = run("prepare", "cifar10", "--root", tmp_path / "c", "--out", tmp_path / "o")
    assert_one_line_error(rc, err, tmp_path / "c" / "data_batch_3", "not a CIFAR-10 python batch")


def test_cifar_hostile_pickle_refused(run, tmp_path):
    import pickle

    write_cifar10(tmp_path / "c")

    class Evil:
        def __reduce__(self):
            return (print, ("pwned",))

    (tmp_path / "c" / "test_batch").write_bytes(pickle.dumps({b"data": Evil()}))
    rc, out, err = run("prepare", "cifar10", "--root", tmp_path / "c", "--out", tmp_path / "o")
    assert_one_line_error(rc, err, "test_batch", "refusing to load global builtins.print")
    assert "pwned" not in out


def test_flowers_labels_do_not_match_images(run, tmp_path):
    write_flowers102(tmp_path / "f", num_classes=3, per_class=4)
    labels = scipy.io.loadmat(tmp_path / "f" / "imagelabels.mat")["labels"]
    scipy.io.savemat(tmp_path / "f" / "imagelabels.mat", {"labels": labels[:, :-2]})
    rc, _, err = run("prepare", "flowers102", "--root", tmp_path / "f", "--out", tmp_path / "o")
    assert_one_line_error(rc, err, tmp_path / "f" / "imagelabels.mat", "has 10 labels but", "holds 12 .jpg images")


def test_flowers_missing_setid(run, tmp_path):
    write_flowers102(tmp_path / "f", num_classes=3, per_class=4)
    (tmp_path / "f" / "setid.mat").unlink()
    rc, _, err = run("prepare", "flowers102", "--root", tmp_path / "f", "--out", tmp_path / "o")
    assert_one_line_error(rc, err, tmp_path / "f" / "setid.mat", "missing file")


def test_flowers_setid_names_missing_image(run, tmp_path):
    fx = write_flowers102(tmp_path / "f", num_classes=3, per_class=4)
    victim = int(fx["setid"]["tstid"][0])
    (tmp_path / "f" / "jpg" / f"image_{victim:05d}.jpg").rename(tmp_path / "f" / "jpg" / "renamed.jpg")
    rc, _, err = run("prepare", "flowers102", "--root", tmp_path / "f", "--out", tmp_path / "o")
    assert_one_line_error(rc, err, f"image_{victim:05d}.jpg", "missing")


def test_miniimagenet_csv_names_missing_file(run, tmp_path):
    write_miniimagenet(tmp_path / "m", per_class=3)
    victim = sorted((tmp_path / "m" / "images").iterdir())[4]
    victim.unlink()
    rc, _, err = run("prepare", "mini-imagenet", "--root", tmp_path / "m", "--out", tmp_path / "o")
    assert_one_line_error(rc, err, ".csv", victim.name, "not in")


def test_miniimagenet_malformed_row(run, tmp_path):
    write_miniimagenet(tmp_path / "m", per_class=3)
    with open(tmp_path / "m" / "val.csv", "a") as f:
        f.write("just-one-column\n")
    rc, _, err = run("prepare", "mini-imagenet", "--root", tmp_path / "m", "--out", tmp_path / "o")
    assert_one_line_error(rc, err, tmp_path / "m" / "val.csv", "line 5", "filename,label")


def test_imagefolder_no_classes(run, tmp_path):
    (tmp_path / "empty").mkdir()
    rc, _, err = run("prepare", "imagefolder", "--root", tmp_path / "empty", "--out", tmp_path / "o")
    assert_one_line_error(rc, err, tmp_path / "empty", "no class folders")


@pytest.mark.parametrize("damage", ["truncated", "garbage"])
def test_corrupt_image_fails_by_default(run, tmp_path, damage):
    write_imagefolder(tmp_path / "t", per_class=4)
    bad = tmp_path / "t" / "dog" / "002.jpeg"
    if damage == "truncated":
        truncate(bad, 0.5)
    else:
        bad.write_bytes(b"this is not an image at all")
    rc, _, err = run("prepare", "imagefolder", "--root", tmp_path / "t", "--out", tmp_path / "o", "--size", "16")
    assert_one_line_error(rc, err, bad, "cannot read image")
    assert not (tmp_path / "o").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["t"]  # no temp folder left behind


def test_corrupt_image_skipped_and_listed(run, tmp_path):
    write_imagefolder(tmp_path / "t", per_class=4, split=True)
    bad = tmp_path / "t" / "train" / "eel" / "002.jpeg"
    truncate(bad, 0.4)
    rc, out, err = run("prepare", "imagefolder", "--root", tmp_path / "t", "--out", tmp_path / "o", "--size", "16",
                       "--on-error", "skip")
    assert rc == 0, err
    assert "skipped: 1" in out
    m = json.loads((tmp_path / "o" / "manifest.json").read_text())
    assert [s["file"] for s in m["skipped"]] == [str(bad)]
    assert m["skipped"][0]["error"].lower().startswith("cannot read image (truncated")
    assert m["splits"]["train"]["count"] == 11 and m["splits"]["val"]["count"] == 6
    labels = np.load(tmp_path / "o" / "train" / "labels.npy")
    assert np.bincount(labels).tolist() == [4, 4, 3]
    ids = read_source_ids(tmp_path / "o" / "train")
    assert len(ids) == 11 and "train/eel/002.jpeg" not in ids and "train/eel/001.PNG" in ids


def test_existing_output_needs_overwrite(run, tmp_path):
    args = ("prepare", "synthetic", "--out", tmp_path / "s", "--per-class", "2", "--num-classes", "2")
    assert run(*args)[0] == 0
    before = (tmp_path / "s" / "manifest.json").read_text()
    rc, _, err = run(*args, "--seed", "5")
    assert_one_line_error(rc, err, tmp_path / "s", "already exists", "--overwrite")
    assert (tmp_path / "s" / "manifest.json").read_text() == before
    rc, _, err = run(*args, "--seed", "5", "--overwrite")
    assert rc == 0, err
    assert (tmp_path / "s" / "manifest.json").read_text() != before


def test_bad_option_values(run, tmp_path):
    rc, _, err = run("prepare", "photos", "--out", tmp_path / "o", "--jpeg-quality", "0")
    assert_one_line_error(rc, err, "--jpeg-quality")
    rc, _, err = run("prepare", "synthetic", "--out", tmp_path / "o", "--num-classes", "99")
    assert_one_line_error(rc, err, "at most 27 classes")
    rc, _, err = run("prepare", "photos", "--out", tmp_path / "o", "--resize-policy", "resize")
    assert_one_line_error(rc, err, "--resize-policy does not apply")


def test_interrupted_cli_run_leaves_no_output(run, tmp_path, monkeypatch):
    import bench.datasets.prepared as prepared

    def boom(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(prepared, "encode_jpeg", boom)
    rc, _, err = run("prepare", "synthetic", "--out", tmp_path / "s", "--per-class", "2")
    assert rc == 130 and "interrupted" in err
    assert list(tmp_path.iterdir()) == []


def test_error_in_a_fresh_process(tmp_path):
    """One case end to end in a subprocess: exit status 2, one line, no traceback."""
    code = (
        "import sys; from bench import cli; "
        f"cli.COMMANDS = {MINE!r}; "
        "sys.exit(cli.main(sys.argv[1:]))"
    )
    write_cifar10(tmp_path / "c")
    (tmp_path / "c" / "batches.meta").unlink()
    p = subprocess.run([sys.executable, "-c", code, "prepare", "cifar10", "--root", str(tmp_path / "c"),
                        "--out", str(tmp_path / "o")], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2
    assert p.stderr.strip() == (
        f"inrbench: error: {tmp_path / 'c' / 'batches.meta'}: missing batches.meta: not a CIFAR-10 "
        "python-version folder (expected data_batch_1..5, test_batch, batches.meta)"
    )


def test_big_splits_go_through_a_memmap_scratch(run, tmp_path, monkeypatch):
    """With the memmap threshold at 0 every split is decoded into a scratch file: same result, no leftovers."""
    import bench.datasets.decode as decode

    write_imagefolder(tmp_path / "t", per_class=4)
    truncate(tmp_path / "t" / "cat" / "001.PNG", 0.5)
    args = ("prepare", "imagefolder", "--root", tmp_path / "t", "--size", "16", "--on-error", "skip")
    assert run(*args, "--out", tmp_path / "ram")[0] == 0
    monkeypatch.setattr(decode, "MEMMAP_BYTES", 0)
    assert run(*args, "--out", tmp_path / "mm")[0] == 0
    a = json.loads((tmp_path / "ram" / "manifest.json").read_text())
    b = json.loads((tmp_path / "mm" / "manifest.json").read_text())
    assert a["splits"] == b["splits"] and len(b["skipped"]) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mm", "ram", "t"]  # scratch removed
