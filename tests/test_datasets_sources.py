"""Each file-based source on a fixture written in its exact on-disk format."""

from __future__ import annotations

import numpy as np
import pytest
from fixtures_datasets import (
    CIFAR_NAMES,
    write_cifar10,
    write_flowers102,
    write_imagefolder,
    write_miniimagenet,
)

from bench.datasets.flowers102 import CLASS_NAMES
from bench.datasets.prepare import prepare_dataset
from bench.datasets.prepared import open_prepared, read_source_ids
from bench.datasets.sources import get_source, source_names
from bench.datasets.synthetic import recover_labels


def test_registry_lists_all_six_sources():
    assert source_names() == ["cifar10", "flowers102", "imagefolder", "mini-imagenet", "photos", "synthetic"]
    for n in source_names():
        assert get_source(n).description


@pytest.mark.parametrize("protocol", [2, 5])
def test_cifar10_native(tmp_path, protocol):
    exp = write_cifar10(tmp_path / "cifar-10-batches-py", per_batch=6, n_test=8, protocol=protocol)
    ds = open_prepared(prepare_dataset("cifar10", tmp_path / "out", root=tmp_path / "cifar-10-batches-py"))
    assert ds.classes == CIFAR_NAMES
    assert ds.image_size == (32, 32) and ds.manifest["resize_policy"] == "none"
    assert ds.splits == ["test", "train"]
    for split in ("train", "test"):
        s = ds.split(split, verify=True)
        images, labels = exp[split]
        assert len(s) == (30 if split == "train" else 8)
        # exact pixels: the CHW plane layout was undone correctly, file order kept
        assert np.array_equal(s.images, images)
        assert np.array_equal(s.labels, labels)


def test_cifar10_parent_folder_limit_and_resize(tmp_path):
    exp = write_cifar10(tmp_path / "src" / "cifar-10-batches-py", per_batch=6, n_test=8)
    ds = open_prepared(prepare_dataset("cifar10", tmp_path / "out", root=tmp_path / "src", size=48, limit=5))
    assert ds.image_size == (48, 48) and ds.manifest["resize_policy"] == "resize"
    tr = ds.split("train")
    assert len(tr) == 5 and len(ds.split("test")) == 5
    assert set(tr.labels.tolist()) <= set(exp["train"][1].tolist())
    assert np.array_equal(recover_labels(tr.images, 27), tr.labels)


def test_flowers102_splits_labels_names(tmp_path):
    fx = write_flowers102(tmp_path / "fl", num_classes=4, per_class=6)
    ds = open_prepared(prepare_dataset("flowers102", tmp_path / "out", root=tmp_path / "fl", size=32))
    assert ds.classes == list(CLASS_NAMES[:4]) and ds.classes[0] == "pink primrose"
    assert ds.image_size == (32, 32)
    assert ds.manifest["resize_policy"] == "shorter-side-center-crop"
    for split, key in (("train", "trnid"), ("val", "valid"), ("test", "tstid")):
        s = ds.split(split, verify=True)
        ids = fx["setid"][key]
        assert len(s) == ids.size
        assert np.array_equal(s.labels, fx["labels"][ids - 1] - 1)  # 1..K -> 0..K-1, setid order
        assert np.array_equal(recover_labels(s.images, 27), s.labels)
        ids = read_source_ids(s.root)
        assert ids == [f"jpg/image_{i:05d}.jpg" for i in fx["setid"][key]]
    assert ds.manifest["splits"]["train"]["count"] + ds.manifest["splits"]["val"]["count"] + \
        ds.manifest["splits"]["test"]["count"] == 24


def test_flowers102_official_names_are_102():
    assert len(CLASS_NAMES) == 102 == len(set(CLASS_NAMES))
    assert CLASS_NAMES[-1] == "blackberry lily"


@pytest.mark.parametrize("policy", ["shorter-side-center-crop", "resize"])
def test_imagefolder_single_tree_ratio_split(tmp_path, policy):
    write_imagefolder(tmp_path / "tree", per_class=5)
    out = prepare_dataset("imagefolder", tmp_path / "out", root=tmp_path / "tree", size=24, resize_policy=policy)
    ds = open_prepared(out)
    assert ds.classes == ["cat", "dog", "eel"]
    assert ds.manifest["resize_policy"] == policy
    tr, va = ds.split("train"), ds.split("val")
    # round(0.2 * 5) = 1 image of each class held out
    assert np.bincount(tr.labels).tolist() == [4, 4, 4]
    assert np.bincount(va.labels).tolist() == [1, 1, 1]
    for s in (tr, va):
        assert np.array_equal(recover_labels(s.images, 27), s.labels)
    again = open_prepared(prepare_dataset("imagefolder", tmp_path / "o2", root=tmp_path / "tree", size=24,
                                          resize_policy=policy))
    assert again.manifest["splits"] == ds.manifest["splits"]  # seeded: same split, same pixels


def test_imagefolder_seed_changes_split(tmp_path):
    write_imagefolder(tmp_path / "tree", per_class=6)
    a = open_prepared(prepare_dataset("imagefolder", tmp_path / "a", root=tmp_path / "tree", size=16, val_fraction=0.5))
    b = open_prepared(prepare_dataset("imagefolder", tmp_path / "b", root=tmp_path / "tree", size=16, val_fraction=0.5,
                                      seed=3))
    assert a.manifest["splits"]["val"]["count"] == b.manifest["splits"]["val"]["count"] == 9
    assert a.manifest["splits"]["val"]["pixels_sha256"] != b.manifest["splits"]["val"]["pixels_sha256"]


def test_imagefolder_presplit(tmp_path):
    write_imagefolder(tmp_path / "inet", per_class=4, split=True)
    ds = open_prepared(prepare_dataset("imagefolder", tmp_path / "out", root=tmp_path / "inet", size=16))
    assert ds.classes == ["cat", "dog", "eel"] and ds.splits == ["train", "val"]
    assert np.bincount(ds.split("train").labels).tolist() == [4, 4, 4]
    assert np.bincount(ds.split("val").labels).tolist() == [2, 2, 2]
    val = ds.split("val")
    ids = read_source_ids(val.root)
    assert [ds.classes[c] for c in val.labels] == [i.split("/")[1] for i in ids]  # val/<class>/<file>
    assert np.array_equal(recover_labels(ds.split("val").images, 27), ds.split("val").labels)


def test_miniimagenet_pools_classes_and_splits_each(tmp_path):
    write_miniimagenet(tmp_path / "mini", per_class=9)
    ds = open_prepared(prepare_dataset("mini-imagenet", tmp_path / "out", root=tmp_path / "mini", size=16))
    assert ds.classes == ["n01532829", "n01558993", "n01704323", "n01749939"]
    tr, va = ds.split("train"), ds.split("val")
    # every class (from all three csvs) is in both splits: round(9 * 12/54) = 2 val, 7 train
    assert np.bincount(tr.labels).tolist() == [7, 7, 7, 7]
    assert np.bincount(va.labels).tolist() == [2, 2, 2, 2]
    for s in (tr, va):
        assert np.array_equal(recover_labels(s.images, 27), s.labels)
    assert ds.manifest["source_meta"]["csvs"] == ["train.csv", "val.csv", "test.csv"]
