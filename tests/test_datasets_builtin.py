"""The built-in sources: ``photos`` (real photographs from scikit-image) and ``synthetic``."""

from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from bench.datasets.photos import photo_list
from bench.datasets.prepare import prepare_dataset
from bench.datasets.prepared import open_prepared
from bench.datasets.synthetic import MAX_DEVIATION, palette, recover_labels


def _checksums(path):
    m = json.loads((path / "manifest.json").read_text())
    return {n: (s["pixels_sha256"], s["labels_sha256"]) for n, s in m["splits"].items()}


def test_photos_counts_classes_and_labels(tmp_path):
    out = prepare_dataset("photos", tmp_path / "p", size=32, per_class=5)
    ds = open_prepared(out)
    names = [p.name for p in photo_list()]
    assert ds.classes == names and len(names) >= 8
    assert ds.image_size == (32, 32)
    assert ds.manifest["resize_policy"] == "seeded-square-crop"
    train, test = ds.split("train", verify=True), ds.split("test", verify=True)
    # 5 per class: round(0.2 * 5) = 1 test image per class.
    assert len(train) == 4 * len(names) and len(test) == len(names)
    assert np.bincount(train.labels, minlength=len(names)).tolist() == [4] * len(names)
    assert sorted(test.labels.tolist()) == list(range(len(names)))
    # classes are mixed, not sorted blocks
    assert (np.diff(train.labels) != 0).sum() > len(names)
    # the JPEG tree holds real images of the same content
    j = np.asarray(Image.open(train.jpeg_paths[3]))
    assert j.shape == (32, 32, 3)
    assert np.abs(j.astype(int) - train.images[3].astype(int)).mean() < 12


def test_photos_deterministic_and_seeded(tmp_path):
    a = prepare_dataset("photos", tmp_path / "a", size=32, per_class=3)
    b = prepare_dataset("photos", tmp_path / "b", size=32, per_class=3)
    c = prepare_dataset("photos", tmp_path / "c", size=32, per_class=3, seed=1)
    assert _checksums(a) == _checksums(b)
    assert _checksums(a)["train"][0] != _checksums(c)["train"][0]


def test_photos_224_same_crops_as_32(tmp_path):
    small = open_prepared(prepare_dataset("photos", tmp_path / "s", size=32, per_class=2)).split("train")
    big = open_prepared(prepare_dataset("photos", tmp_path / "b", size=224, per_class=2)).split("train")
    again = open_prepared(prepare_dataset("photos", tmp_path / "b2", size=224, per_class=2)).split("train")
    assert big.images.shape[1:] == (224, 224, 3)
    assert np.array_equal(big.images, again.images)
    assert np.array_equal(small.labels, big.labels)
    # Same boxes at both sizes: the 224 image shrunk to 32 is close to the 32 image.
    down = np.stack([np.asarray(Image.fromarray(im).resize((32, 32), Image.Resampling.BICUBIC)) for im in big.images])
    err = np.abs(down.astype(int) - small.images.astype(int)).mean()
    assert err < 4, err
    # ... and far from a different image (crops are not all the same).
    assert np.abs(down[0].astype(int) - small.images[1].astype(int)).mean() > 4 * err


def test_photos_limit(tmp_path):
    ds = open_prepared(prepare_dataset("photos", tmp_path / "p", size=16, per_class=5, limit=7))
    assert ds.manifest["splits"]["train"]["count"] == 7
    assert ds.manifest["splits"]["test"]["count"] == 7


def test_synthetic_labels_recoverable_from_pixels_and_jpeg(tmp_path):
    out = prepare_dataset("synthetic", tmp_path / "s", size=24, num_classes=12, per_class=6, jpeg_quality=75)
    ds = open_prepared(out)
    assert ds.num_classes == 12 and ds.image_size == (24, 24)
    tr = ds.split("train")
    assert len(tr) == 12 * 5 and len(ds.split("test")) == 12
    assert np.bincount(tr.labels).tolist() == [5] * 12
    assert np.array_equal(recover_labels(tr.images, 12), tr.labels)
    jpegs = np.stack([np.asarray(Image.open(p)) for p in tr.jpeg_paths])
    assert np.array_equal(recover_labels(jpegs, 12), tr.labels)
    # the documented per-pixel bound, and real texture inside it
    dev = np.abs(tr.images.astype(int) - palette(12)[tr.labels][:, None, None, :].astype(int))
    assert dev.max() <= MAX_DEVIATION
    assert tr.images.reshape(len(tr), -1).std(1).min() > 2
    # a flipped crop and float [0, 1] input still give the label
    crop = tr.images[:, 4:16, ::-1]
    assert np.array_equal(recover_labels(crop.astype(np.float32) / 255.0, 12), tr.labels)


def test_synthetic_deterministic(tmp_path):
    a = prepare_dataset("synthetic", tmp_path / "a", per_class=4)
    b = prepare_dataset("synthetic", tmp_path / "b", per_class=4)
    assert _checksums(a) == _checksums(b)


def test_interrupted_prepare_leaves_no_output(tmp_path, monkeypatch):
    import bench.datasets.prepared as prepared

    calls = {"n": 0}
    real = prepared.encode_jpeg

    def flaky(*a, **k):
        calls["n"] += 1
        if calls["n"] == 10:
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(prepared, "encode_jpeg", flaky)
    with pytest.raises(KeyboardInterrupt):
        prepare_dataset("synthetic", tmp_path / "out", per_class=4)
    assert calls["n"] == 10
    assert list(tmp_path.iterdir()) == []  # no output, no leftover temp folder
