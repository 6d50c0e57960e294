"""The minimal adapter of docs/adding-a-pipeline.md passes the shared tests the doc says it passes.

The ``python`` block of the doc's "A minimal adapter" section is written to ``tmp_path`` as a
module and imported; its ``@register("memmap")`` lands in a copy of the registry that stands in
for ``pipelines.base._REGISTRY`` during this module only, so the repository's ``pipelines``
package is never touched and no other test sees the adapter. The registry-parametrized tests of
``tests/test_pipelines.py`` and ``tests/test_pipelines_shard.py`` are then called on it by name:
the batch contract and ``len`` after ``close``, the bytes per image it states, one visit per epoch, per-image seeded crops (the
same with 0 and 2 workers) and their distribution, the ranks' shares of an epoch, fixed shards.
Besides: ``ruff`` on the block as if it were ``pipelines/memmap.py``, and its host-to-device copies
on a faked CUDA device (``tests/test_pipelines_sync.py``'s rule: ``crops.to_device``, pinned and
non-blocking).
Tiny datasets, no INR store: seconds.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import test_pipelines as tp
import test_pipelines_shard as ts
import torch

import pipelines
import pipelines.base as base
import pipelines.crops as crops
from pipelines import Augment, PipelineConfig

REPO = Path(__file__).resolve().parent.parent
DOC = REPO / "docs" / "adding-a-pipeline.md"
NAME = "memmap"
NO_STORE = (None, "")  # the shared tests' (store, reason) for an adapter without a store
STORES = {"labels": NO_STORE, "coords": NO_STORE}  # test_pipelines' ``stores``: none fitted


def example_code() -> str:
    """The ``python`` block(s) of the doc's "A minimal adapter" section."""
    section = DOC.read_text().split("\n## A minimal adapter", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"^```python\n(.*?)^```", section, flags=re.M | re.S)
    assert blocks, f"{DOC.name}: no python block under 'A minimal adapter'"
    return "\n".join(blocks)


@pytest.fixture(scope="module", autouse=True)
def example(tmp_path_factory):
    """The example, imported from a file in tmp and registered in a private copy of the registry."""
    path = tmp_path_factory.mktemp("doc") / f"{NAME}_doc_example.py"
    path.write_text(example_code())
    before = pipelines.names()  # memmap included, should one be pasted in as the doc says
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(base, "_REGISTRY", {k: v for k, v in base._REGISTRY.items() if k != NAME})
        spec = importlib.util.spec_from_file_location(path.stem, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        assert NAME in pipelines.names(), f"the example does not @register({NAME!r})"
        yield module
    assert pipelines.names() == before, "the example's registration leaked into the real registry"


# ------------------------------------------------------------- the shared tests' own datasets


@pytest.fixture(scope="module")
def labels_data(tmp_path_factory):
    return tp.labels_data.__wrapped__(tmp_path_factory)


@pytest.fixture(scope="module")
def coords_data(tmp_path_factory):
    return tp.coords_data.__wrapped__(tmp_path_factory)


@pytest.fixture(scope="module")
def index_sets(tmp_path_factory) -> dict:
    """``test_pipelines_shard``'s 12- and 13-image sets labelled by index (no store)."""
    d = tmp_path_factory.mktemp("shard")
    rng = np.random.default_rng(0)
    return {n: (ts._write(d / f"index{n}", rng.integers(0, 256, (n, ts.SIDE, ts.SIDE, 3), dtype=np.uint8)), NO_STORE)
            for n in (12, 13)}


@pytest.fixture(scope="module")
def same_set(tmp_path_factory) -> tuple:
    """Twelve identical ramp images: outputs differ only by their augmentation."""
    return ts._write(tmp_path_factory.mktemp("same") / "same", np.repeat(ts._ramp_image()[None], 12, axis=0)), NO_STORE


@pytest.fixture(scope="module")
def measured(coords_data) -> dict:
    """``test_pipelines.measured`` for this adapter only: crops read back from 8 epochs."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(tp, "ADAPTERS", [NAME])
        return tp.measured.__wrapped__(coords_data, STORES)


# ------------------------------------------------------------------------------ the tests


def test_example_passes_ruff():
    """``ruff check`` (the project's config) on the block, as ``pipelines/memmap.py``."""
    got = subprocess.run([sys.executable, "-m", "ruff", "check", "--output-format", "concise",
                          "--stdin-filename", "pipelines/memmap.py", "-"],
                         input=example_code(), cwd=REPO, capture_output=True, text=True)
    if "No module named ruff" in got.stderr:
        pytest.skip("ruff is not installed here")
    assert got.returncode == 0, got.stdout + got.stderr


def test_batch_contract_and_len_after_close(labels_data):
    tp.test_batch_contract_and_normalization(NAME, labels_data, STORES)


def test_labels_match_pixels(labels_data):
    tp.test_labels_match_pixels(NAME, labels_data, STORES)


@pytest.mark.parametrize("drop_last", [False, True])
def test_epoch_visits_every_sample_once(drop_last, coords_data):
    tp.test_epoch_visits_every_sample_once(NAME, drop_last, coords_data, STORES)


def test_crops_are_per_image_and_seeded(coords_data):
    tp.test_crops_are_per_image_and_seeded(NAME, coords_data, STORES)


def test_epochs_do_not_depend_on_the_worker_count(coords_data):
    tp.test_epochs_do_not_depend_on_the_worker_count(NAME, coords_data, STORES)


def test_crop_distributions_match_torchvision(measured):
    tp.test_random_resized_crop_distribution_matches_torchvision(NAME, measured)
    tp.test_random_pad_offsets_uniform(NAME, measured)


def test_close_releases_everything(coords_data):
    tp.test_close_releases_everything(NAME, coords_data, STORES)


def test_dataset_bytes_per_image_and_libraries(labels_data):
    tp.test_dataset_bytes_per_image_is_what_it_reads(NAME, labels_data, STORES)
    tp.test_libraries_are_named_with_versions(NAME)


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("n", [12, 13])
@pytest.mark.parametrize("world", [2, 3])
def test_ranks_partition_the_epoch(world, n, drop_last, index_sets):
    """The ranks' batches together are the split (DistributedSampler's padding / drop_last), each
    rank's are its slice of the global permutation, in order; the same with fixed shards."""
    ts.test_union_over_ranks_is_the_split(NAME, world, n, drop_last, index_sets)
    ts.test_fixed_shards(NAME, world, n, drop_last, index_sets)
    if world == 3 and n == 13:
        ts.test_ranks_get_their_slice_of_the_global_permutation(NAME, drop_last, index_sets)


def test_ranks_reshuffle_and_draw_their_own_crops(index_sets, same_set):
    ts.test_epochs_are_reshuffled_per_rank(NAME, index_sets)
    ts.test_ranks_draw_different_augmentations(NAME, same_set)


def test_host_to_device_copies_are_pinned_and_non_blocking(coords_data, monkeypatch):
    """On a CUDA device (faked: no GPU needed) every copy to it in a steady-state epoch is
    ``crops.to_device``'s, ``pin_memory()`` then ``.to(cuda, non_blocking=True)``; never a pageable ``.to``."""
    calls: list[tuple] = []
    real_to = torch.Tensor.to

    def fake_to(self, *a, **k):
        target = k.get("device", a[0] if a else None)
        if isinstance(target, (str, torch.device)) and torch.device(target).type == "cuda":
            calls.append(("to", k.get("non_blocking") is True))
            a, k = (a, {**k, "device": "cpu"}) if "device" in k else (("cpu", *a[1:]), k)
        return real_to(self, *a, **k)

    monkeypatch.setattr(crops, "_NORM_CACHE", {})  # the fake device's constants die with the test
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda self, *a, **k: calls.append(("pin",)) or self)
    monkeypatch.setattr(torch.Tensor, "to", fake_to)
    p = pipelines.create(NAME, coords_data, PipelineConfig(batch_size=12, device="cuda:0", workers=0,
                                                           augment=Augment(crop="random-resized")))
    list(p)  # epoch 0 builds the normalization constants (one documented copy)
    calls.clear()
    batches = list(p)
    p.close()
    assert len(calls) >= 2 * len(batches), f"no copies to the device seen: {calls}"
    assert set(zip(calls[::2], calls[1::2], strict=True)) == {(("pin",), ("to", True))}, calls
