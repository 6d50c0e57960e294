"""`inrbench prepare` stores pixels as they lie in the file and records EXIF orientation tags.

A phone photo may carry an EXIF orientation (tag 0x0112: 6 = rotate 90 degrees to display).
torchvision's ``ImageFolder`` (``PIL.Image.open``) does not apply it, and neither does
``prepare`` (every pipeline reads the prepared pixels, so all see the same image), but the
files that carry one are counted and listed in the manifest and named on the command line.
"""

from __future__ import annotations

import numpy as np
from PIL import Image

from bench.datasets.decode import ORIENTATION_EXAMPLES
from bench.datasets.prepared import open_prepared

MINE = {"prepare": "bench.commands.prepare"}


def _tree(root, orient: dict[str, int]) -> None:
    """``cls/NAME.jpg`` for two classes, 6 images each, 24x40 (not square): gradients whose
    rotation would show; ``orient``: file name -> EXIF orientation written into it."""
    rng = np.random.default_rng(0)
    for c in ("a", "b"):
        (root / c).mkdir(parents=True)
        for i in range(6):
            im = (rng.integers(0, 255, (24, 40, 3)) // 4 + np.linspace(0, 180, 40)[None, :, None]).astype(np.uint8)
            name = f"{c}{i}.jpg"
            exif = Image.Exif()
            if name in orient:
                exif[0x0112] = orient[name]
            Image.fromarray(im).save(root / c / name, quality=95, exif=exif.tobytes())


def _prepare(run, root, out, rc_want: int = 0):
    rc, text, err = run("prepare", "imagefolder", "--root", root, "--out", out, "--size", "16", "--val-fraction",
                        "0.5")
    assert rc == rc_want, err
    return text, open_prepared(out) if rc == 0 else None


def test_orientation_is_recorded_not_applied(run, tmp_path):
    tagged, plain = tmp_path / "tagged", tmp_path / "plain"
    _tree(tagged, {"a1.jpg": 6, "b4.jpg": 3, "b5.jpg": 1})
    _tree(plain, {})
    text, ds = _prepare(run, tagged, tmp_path / "p1")
    _, ref = _prepare(run, plain, tmp_path / "p2")
    meta = ds.manifest["source_meta"]["exif_orientation"]
    # tag 1 means "as stored": only the two others count
    assert meta["applied"] is False and meta["files"] == 2
    assert sorted(meta["examples"]) == ["a/a1.jpg", "b/b4.jpg"]
    assert "note: 2 images carry an EXIF orientation" in text and "not rotated" in text
    # the pixels are the file's, as without the tag (a rotated 24x40 crop would differ)
    for split in ds.splits:
        np.testing.assert_array_equal(ds.split(split).labels, ref.split(split).labels)
        np.testing.assert_array_equal(ds.split(split).images, ref.split(split).images)
    assert ref.manifest["source_meta"]["exif_orientation"] == {"applied": False, "files": 0, "examples": []}
    text2, _ = _prepare(run, plain, tmp_path / "p3")
    assert "EXIF" not in text2  # nothing to say


def test_orientation_survives_a_resume_and_lists_a_bounded_number(run, tmp_path, monkeypatch):
    import bench.datasets.resume as resume

    root = tmp_path / "tree"
    _tree(root, {f"{c}{i}.jpg": 8 for c in "ab" for i in range(6)})
    _, whole = _prepare(run, root, tmp_path / "whole")
    monkeypatch.setattr(resume, "CHUNK_IMAGES", 2)
    monkeypatch.setenv("INRBENCH_TEST_PREPARE_STOP", "3")
    _prepare(run, root, tmp_path / "resumed", rc_want=130)  # stopped as by Ctrl-C
    monkeypatch.delenv("INRBENCH_TEST_PREPARE_STOP")
    text, resumed = _prepare(run, root, tmp_path / "resumed")
    assert "resuming" in text
    want = whole.manifest["source_meta"]["exif_orientation"]
    assert want["files"] == 12 and len(want["examples"]) == min(12, ORIENTATION_EXAMPLES)
    assert resumed.manifest["source_meta"]["exif_orientation"] == want
