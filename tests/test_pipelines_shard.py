"""Per-rank sharding of every registered pipeline (``pipelines.shard``; parametrized over ``pipelines.names()``).

Every rank's pipeline is built in this one process with ``rank``/``world_size`` set. Samples are
identified by their label: the ``index`` datasets label image ``k`` with ``k``. Sizes 12 (divisible
by 2 and 3) and 13 (by neither); batch size 2, so ``drop_last`` also drops partial last batches.
The documented last-batch policy (``pipelines/shard.py``, ``pipelines/dali.py``):
``drop_last=False``: every sample at least once per epoch, at most ``world - 1`` twice (none when
``world`` divides the split); ``drop_last=True``: no sample twice, ``world * ((n // world) // b) * b``
samples seen. ``raw``, ``inr``, ``torch-jpeg``, ``torch-nvjpeg`` feed every rank its slice of the same
global permutation (``shard.epoch_shard``), so they agree sample for sample; DALI's reader draws its own.
"""

from __future__ import annotations

import collections
import math

import numpy as np
import pytest
import torch
from torch.utils.data import DistributedSampler

import pipelines
from bench.datasets.prepared import PreparedDataset, SplitData, open_prepared, write_prepared
from pipelines import Augment, PipelineConfig, Unavailable
from pipelines.crops import batch_slices
from pipelines.shard import (
    FIXED_SHARD_KEY,
    augment_generator,
    batch_seeds,
    epoch_generator,
    epoch_order,
    epoch_shard,
    fixed_shard,
    rank_seed,
    shard,
    shard_size,
)

ADAPTERS = pipelines.names()
OWN_ORDER = {"dali"}  # DALI's reader shuffles with its own permutation (pipelines/dali.py docstring)
SIDE, BATCH, EPOCHS, SEED = 16, 2, 2, 7
AUG = Augment(crop="random-resized", size=8, flip=True)


def _ramp_image() -> np.ndarray:
    """uint8 ``[SIDE, SIDE, 3]``: red ramps along x, green along y (crops and flips change the output)."""
    ramp = np.linspace(0, 255, SIDE).astype(np.uint8)
    img = np.zeros((SIDE, SIDE, 3), np.uint8)
    img[..., 0], img[..., 1], img[..., 2] = ramp[None, :], ramp[:, None], 90
    return img


def _write(out, images: np.ndarray) -> PreparedDataset:
    n = images.shape[0]
    split = SplitData(images, np.arange(n, dtype=np.int64))  # label = image index
    meta = {"source": "test-index", "classes": [str(i) for i in range(n)]}
    return open_prepared(write_prepared(out, {"train": split}, meta, jpeg_quality=90))


def _store(data: PreparedDataset, out, same: bool) -> tuple[object, str]:
    """An unfitted INR store for ``data`` (SIREN init weights, 16-bit): labels are what is tested here.

    ``same``: every image gets image 0's weights (identical decoded content)."""
    try:
        from bench.datasets.identity import source_record
        from inr.quantize import QuantConfig, quantize
        from inr.siren import SirenArch, init_weights
        from inr.store import save
    except ImportError as e:
        return None, f"the INR codec is not importable here ({e})"
    split = data.split("train")
    n, arch = len(split), SirenArch(3, 16)
    weights = init_weights(arch, 1 if same else n, seed=1)
    if same:
        weights = [(W.expand(n, -1, -1).clone(), b.expand(n, -1, -1).clone()) for W, b in weights]
    layers = quantize(weights, QuantConfig((16,) * arch.num_linear))
    return save(out, arch, split.image_size, split.labels, layers, meta={"source": source_record(data, "train")}), ""


@pytest.fixture(scope="module")
def index_sets(tmp_path_factory) -> dict:
    """``{n: (dataset, store)}`` for n = 12, 13: random images labelled by index."""
    d = tmp_path_factory.mktemp("shard")
    rng = np.random.default_rng(0)
    out = {}
    for n in (12, 13):
        data = _write(d / f"index{n}", rng.integers(0, 256, (n, SIDE, SIDE, 3), dtype=np.uint8))
        out[n] = (data, _store(data, d / f"index{n}.inr", same=False))
    return out


@pytest.fixture(scope="module")
def same_set(tmp_path_factory) -> tuple:
    """12 identical ramp images (labels 0..11): two outputs differ only by their augmentation."""
    d = tmp_path_factory.mktemp("shard-same")
    data = _write(d / "same", np.repeat(_ramp_image()[None], 12, axis=0))
    return data, _store(data, d / "same.inr", same=True)


def rank_pipes(name: str, data: PreparedDataset, store, world: int, **kw) -> list[pipelines.Pipeline]:
    """The ``world`` ranks' pipelines (skips with the adapter's ``Unavailable`` reason)."""
    out = []
    for r in range(world):
        cfg = PipelineConfig(batch_size=BATCH, augment=AUG, workers=0, seed=SEED, rank=r, world_size=world, **kw)
        try:
            out.append(pipelines.create(name, data, cfg, store=store[0] if pipelines.needs_store(name) else None))
        except Unavailable as e:
            for p in out:
                p.close()
            pytest.skip(f"{name} unavailable here: {store[1] if pipelines.needs_store(name) and store[1] else e}")
    return out


def epochs_of(pipe: pipelines.Pipeline, epochs: int = EPOCHS) -> list[list[list[int]]]:
    """Per epoch, the label lists of its batches (checking each batch's shape on the way)."""
    out = []
    for _ in range(epochs):
        batches = []
        for b in pipe:
            assert 1 <= b.labels.numel() <= BATCH and b.images.shape == (b.labels.numel(), 3, AUG.size, AUG.size)
            batches.append(b.labels.cpu().tolist())
        assert len(batches) == len(pipe)
        out.append(batches)
    return out


# ---------------------------------------------------------------------------------- shard.py itself


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("shuffle", [False, True])
def test_shard_is_distributed_samplers_slice(drop_last, shuffle):
    """``shard`` of DistributedSampler's own permutation is exactly what DistributedSampler yields."""
    for n in range(1, 16):
        for world in range(1, 5):
            for rank in range(world):
                ds = DistributedSampler(range(n), num_replicas=world, rank=rank, shuffle=shuffle, seed=3,
                                        drop_last=drop_last)
                ds.set_epoch(5)
                perm = torch.randperm(n, generator=torch.Generator().manual_seed(3 + 5)) if shuffle else torch.arange(n)
                got = shard(perm, rank, world, drop_last).tolist()
                assert got == list(ds) and len(got) == len(ds) == shard_size(n, world, drop_last), (n, world, rank)


def test_world_of_one_is_the_single_process_epoch():
    g = epoch_generator(SEED, 3)
    order = epoch_order(13, g, True)
    part = epoch_shard(13, SEED, 3, True)
    assert part.indices.tolist() == order.tolist()
    assert torch.equal(torch.rand(5, generator=part.generator), torch.rand(5, generator=g))  # continues the order's
    assert rank_seed(SEED, 0, 1) == SEED
    g1, g2 = torch.Generator().manual_seed(4), torch.Generator().manual_seed(4)
    assert torch.equal(batch_seeds(6, 0, 1, g1), torch.randint(0, 2**62, (6,), generator=g2))


def test_rank_seeds_never_collide():
    for world in (2, 3, 8):
        firsts = {tuple(torch.rand(4, generator=augment_generator(SEED, e, r, world, epoch_generator(SEED, e))).tolist())
                  for e in range(3) for r in range(world)}
        orders = {tuple(torch.rand(4, generator=epoch_generator(SEED, e)).tolist()) for e in range(3)}
        assert len(firsts) == 3 * world and not firsts & orders
        assert sorted(rank_seed(SEED, r, world) % world for r in range(world)) == list(range(world))
        seeds = [batch_seeds(50, r, world, torch.Generator().manual_seed(0)) for r in range(world)]
        assert all(bool((s % world == r).all()) and int(s.max()) < 2**62 for r, s in enumerate(seeds))


# ---------------------------------------------------------------------------------- every adapter


def check_union(per_rank: list, n: int, world: int, drop_last: bool, own_order: bool) -> None:
    """The ranks' samples in every epoch are the split: DistributedSampler's padding, or with ``drop_last``
    no sample twice (``per_rank``: per rank, per epoch, the label lists of its batches)."""
    for e in range(len(per_rank[0])):
        seen = collections.Counter(i for rank in per_rank for batch in rank[e] for i in batch)
        total = sum(seen.values())
        assert set(seen) <= set(range(n))
        if drop_last:
            assert max(seen.values()) == 1
            assert total == world * ((n // world) // BATCH) * BATCH
        else:
            assert set(seen) == set(range(n))  # every sample, at least once
            assert n <= total <= n + world - 1 and total - n == sum(c - 1 for c in seen.values())
            if n % world == 0:
                assert total == n  # nothing padded
            if not own_order:  # DistributedSampler's padding exactly
                assert total == math.ceil(n / world) * world


def check_fixed(per_rank: list, n: int, world: int, drop_last: bool, own_order: bool) -> None:
    """resident="shard": the union of "all", and each rank's samples fixed for the run, reordered per epoch."""
    check_union(per_rank, n, world, drop_last, own_order)
    m = math.ceil(n / world) if own_order else shard_size(n, world, drop_last)  # DALI: never truncated
    for epochs in per_rank:
        orders = [[i for b in batches for i in b] for batches in epochs]
        held = set().union(*map(set, orders))
        assert len(held) <= m  # a fixed shard: never more than one shard's samples over the epochs
        if not drop_last:
            assert all(set(o) == held for o in orders)  # the same samples every epoch
        assert len({tuple(o) for o in orders}) > 1  # in a new order


def shard_epochs(n: int, world: int, drop_last: bool, resident: str, epochs: int) -> list:
    """What a rank of a ``DeviceEpochPipeline`` yields: ``epoch_shard``'s indices cut into batches."""
    out = []
    for r in range(world):
        parts = [epoch_shard(n, SEED, e, True, r, world, drop_last, resident).indices.tolist() for e in range(epochs)]
        out.append([[o[sl] for sl in batch_slices(len(o), BATCH, drop_last)] for o in parts])
    return out


def test_epoch_shards_partition_every_epoch():
    """The shard arithmetic itself, over sizes, worlds and ``drop_last``: the adapters below run one case."""
    for world in (2, 3, 4):
        for n in (12, 13):
            for drop_last in (False, True):
                check_union(shard_epochs(n, world, drop_last, "all", 3), n, world, drop_last, False)
                if world < 4:  # fixed shards of 4 samples or more: a new order every epoch
                    check_fixed(shard_epochs(n, world, drop_last, "shard", 3), n, world, drop_last, False)
                    for r in range(world):
                        held = set(fixed_shard(n, SEED, True, r, world, drop_last).tolist())
                        assert all(set(epoch_shard(n, SEED, e, True, r, world, drop_last, "shard").indices.tolist())
                                   <= held for e in range(3))


# one case per adapter (the arithmetic is tested above); DALI shards with its own reader: an uneven split (13 over
# 3 ranks: padded, a rank's empty last batch) and an even one (12: nothing padded), with and without drop_last
CASES = [(name, 3, 13, dl) for name in ADAPTERS for dl in (False, True)] + [("dali", 3, 12, dl) for dl in (False, True)]


@pytest.mark.parametrize(("name", "world", "n", "drop_last"), CASES)
def test_union_over_ranks_is_the_split(name, world, n, drop_last, index_sets):
    data, store = index_sets[n]
    pipes = rank_pipes(name, data, store, world, drop_last=drop_last)
    try:
        per_rank = [epochs_of(p) for p in pipes]
    finally:
        for p in pipes:
            p.close()
    assert len({len(p) for p in pipes}) == 1  # DDP: every rank the same number of batches
    check_union(per_rank, n, world, drop_last, name in OWN_ORDER)


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("name", ADAPTERS)
def test_ranks_get_their_slice_of_the_global_permutation(name, drop_last, index_sets):
    """Rank r's samples in epoch e are ``epoch_shard``'s, in order: the same for every such adapter."""
    if name in OWN_ORDER:
        pytest.skip(f"{name}: the reader draws its own permutation (the union is tested above)")
    data, store = index_sets[13]
    pipes = rank_pipes(name, data, store, 3, drop_last=drop_last)
    try:
        for r, p in enumerate(pipes):
            got = epochs_of(p)
            for e in range(EPOCHS):
                want = epoch_shard(13, SEED, e, True, r, 3, drop_last).indices.tolist()
                if drop_last:
                    want = want[: (len(want) // BATCH) * BATCH]
                assert [i for b in got[e] for i in b] == want, (r, e)
    finally:
        for p in pipes:
            p.close()


@pytest.mark.parametrize("name", ADAPTERS)
def test_epochs_are_reshuffled_per_rank(name, index_sets):
    data, store = index_sets[13]
    pipes = rank_pipes(name, data, store, 2)
    try:
        for p in pipes:
            e0, e1 = epochs_of(p)
            assert e0 != e1
    finally:
        for p in pipes:
            p.close()


@pytest.mark.parametrize("name", ADAPTERS)
def test_ranks_draw_different_augmentations(name, same_set):
    """All images identical: rank 0's and rank 1's outputs differ only if their crop/flip streams do."""
    data, store = same_set
    pipes = rank_pipes(name, data, store, 2)
    try:
        imgs = [torch.cat([b.images.cpu() for b in p]) for p in pipes]
        again = torch.cat([b.images.cpu() for b in pipes[0]])  # epoch 1 of rank 0
    finally:
        for p in pipes:
            p.close()
    assert imgs[0].shape == imgs[1].shape == (6, 3, AUG.size, AUG.size)
    per_sample = (imgs[0] - imgs[1]).abs().flatten(1).amax(1)
    assert int((per_sample > 0.05).sum()) >= 4  # different crops, sample by sample
    assert int(((imgs[0] - again).abs().flatten(1).amax(1) > 0.05).sum()) >= 4  # and per epoch


# ---------------------------------------------------------------------------------- resident="shard"


@pytest.mark.parametrize(("name", "world", "n", "drop_last"), CASES)
def test_fixed_shards(name, world, n, drop_last, index_sets):
    """resident="shard": the union policy of "all", each rank's samples fixed for the run, reordered per epoch."""
    data, store = index_sets[n]
    pipes = rank_pipes(name, data, store, world, drop_last=drop_last, resident="shard")
    try:
        per_rank = [epochs_of(p, 3) for p in pipes]
    finally:
        for p in pipes:
            p.close()
    check_fixed(per_rank, n, world, drop_last, name in OWN_ORDER)
    if name not in OWN_ORDER:
        assert per_rank == shard_epochs(n, world, drop_last, "shard", 3)


def test_fixed_shard_partitions_one_permutation():
    for n in (1, 5, 12, 13):
        for world in (1, 2, 3, 4):
            for drop_last in (False, True):
                shards = [fixed_shard(n, SEED, True, r, world, drop_last) for r in range(world)]
                assert {len(s) for s in shards} == {shard_size(n, world, drop_last)}
                state = np.random.SeedSequence([SEED], spawn_key=(FIXED_SHARD_KEY,)).generate_state(2, dtype=np.uint32)
                g = torch.Generator().manual_seed(int(state[0]) << 32 | int(state[1]))
                perm0 = torch.randperm(n, generator=g) if world > 1 else torch.arange(n)
                assert [s.tolist() for s in shards] == [shard(perm0, r, world, drop_last).tolist() for r in range(world)]
                held = collections.Counter(i for s in shards for i in s.tolist())
                if drop_last:
                    assert len(held) == (n // world) * world and max(held.values(), default=1) == 1
                else:
                    assert set(held) == set(range(n)) and sum(held.values()) - n == (-n) % world
    for e in range(3):  # one rank: "shard" is "all"
        a, s = epoch_shard(13, SEED, e, True), epoch_shard(13, SEED, e, True, resident="shard")
        assert a.indices.tolist() == s.indices.tolist() == s.positions.tolist()
    with pytest.raises(ValueError, match="resident"):
        PipelineConfig(resident="half")


@pytest.mark.parametrize("name", ADAPTERS)
def test_fixed_shard_holds_one_world_th(name, index_sets, n=13, world=3):
    """A rank's resident bytes with resident="shard" are all/world, to within one image, for every adapter
    that keeps anything resident (``resident_bytes()`` with one rank); the others skip. One image: its
    share of the whole, on the host at most the largest JPEG file (``torch-nvjpeg`` holds the files)."""
    data, store = index_sets[n]
    [whole] = rank_pipes(name, data, store, 1)
    full = whole.resident_bytes()
    whole.close()
    if not any(full.values()):
        pytest.skip(f"{name} keeps nothing resident: resident='shard' changes no memory")
    pipes = rank_pipes(name, data, store, world, resident="shard")
    try:
        parts = [p.resident_bytes() for p in pipes]
    finally:
        for p in pipes:
            p.close()
    one = {"device": full["device"] / n, "host": 0.0}
    if full["host"]:
        one["host"] = max(full["host"] / n, *(p.stat().st_size for p in data.split("train").jpeg_paths))
    for key in ("device", "host"):
        for part in parts:
            assert abs(part[key] - full[key] / world) <= one[key] + 64, (key, part, full)


def test_store_select_is_the_images_weights(tmp_path):
    """``StoredINR.select``: repacked codes (pruned, variable counts, odd bit widths) give the same weights."""
    from inr.quantize import QuantConfig, keep_matrix, quantize
    from inr.siren import SirenArch, init_weights
    from inr.store import load, save

    n, arch = 9, SirenArch(3, 8)
    layers = quantize(init_weights(arch, n, seed=2), QuantConfig((5, 7, 11, 6)[: arch.num_linear]))
    g = torch.Generator().manual_seed(0)
    pruned = []
    for ql in layers:
        mask = torch.rand(ql.codes.shape[0], ql.codes.shape[1] - 1, ql.codes.shape[2], generator=g) > 0.3
        codes = ql.codes * keep_matrix(mask, tuple(ql.codes.shape))
        pruned.append(type(ql)(ql.bits, codes, ql.lo, ql.step, mask))
    for qls in (layers, pruned):
        stored = load(save(tmp_path / "s.inr", arch, (4, 4), np.arange(n), qls), "cpu")
        idx = torch.tensor([7, 2, 2, 8, 0])
        sub = stored.select(idx)
        assert sub.labels.tolist() == idx.tolist() and sub.resident_bytes() < stored.resident_bytes()
        for (w1, b1), (w2, b2) in zip(sub.weights(torch.arange(5)), stored.weights(idx), strict=True):
            assert torch.equal(w1, w2) and torch.equal(b1, b2)


@pytest.mark.parametrize("rows", [None, [5, 0, 3, 3, 9]], ids=["all", "rows"])
def test_raw_loads_the_split_chunk_by_chunk_as_one_transposed_copy(monkeypatch, rows):
    """``raw`` moves the prepared NHWC pixels to NCHW a chunk at a time (the host never holds the
    whole split twice): the same tensor as one whole-split permute, chunk edges included."""
    import numpy as np
    import torch

    import pipelines.raw as raw

    images = np.random.default_rng(0).integers(0, 256, (10, 4, 6, 3), dtype=np.uint8)
    monkeypatch.setattr(raw, "LOAD_CHUNK_BYTES", 3 * 4 * 6 * 3)  # 3 images a chunk: 4 chunks for 10
    got = raw.load_nchw(images, None if rows is None else np.array(rows), torch.device("cpu"))
    want = torch.from_numpy(images if rows is None else images[rows]).permute(0, 3, 1, 2).contiguous()
    assert got.is_contiguous() and got.dtype == torch.uint8 and torch.equal(got, want)
