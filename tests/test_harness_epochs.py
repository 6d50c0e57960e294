"""The harness refuses epochs that load more images than the split provides (``bench.harness.epochs``).

An adapter that ignores ``config.rank`` loads the whole split on every rank: a data-parallel run
would report ``world_size`` times its real images/s. The ranks are run in this one process (each
rank's repeat through the runner with a local ``Sync``, then rank 0's ``merge``), so no process
group is launched; fake adapters sit in the registry for one test only (``monkeypatch.setitem``).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from fixtures_datasets import write_tiny_prepared

import pipelines.base as base
from bench import results as R
from bench.datasets.prepared import open_prepared
from bench.harness import runner
from bench.harness.epochs import EpochBound
from bench.harness.ranks import DistConfig, RankResult, merge
from bench.harness.timing import DeviceClock
from pipelines.base import Augment, Batch, Pipeline, PipelineConfig
from pipelines.crops import batch_slices
from pipelines.shard import epoch_shard

N_TRAIN, BS = 48, 16

pytestmark = pytest.mark.usefixtures("one_torch_thread")


class Honest(Pipeline):
    """This rank's share of each epoch (``shard.epoch_shard``), the pixels as they are."""

    def __init__(self, data, config, store=None):
        super().__init__(data, config, store)
        split = data.split(config.split)
        self.x = torch.from_numpy(np.array(split.images)).permute(0, 3, 1, 2).float() / 255
        self.y = torch.from_numpy(split.labels)
        self.epoch = 0

    def indices(self, epoch: int) -> torch.Tensor:
        c = self.config
        return epoch_shard(len(self.y), c.seed, epoch, c.shuffle, c.rank, c.world_size, c.drop_last).indices

    def __len__(self):
        return len(batch_slices(len(self.indices(0)), self.config.batch_size, self.config.drop_last))

    def __iter__(self):
        idx = self.indices(self.epoch)
        self.epoch += 1
        for sl in batch_slices(len(idx), self.config.batch_size, self.config.drop_last):
            yield Batch(images=self.x[idx[sl]], labels=self.y[idx[sl]])

    def close(self):
        pass

    def resident_bytes(self):
        return {"device": 0, "host": 0}


class IgnoresRank(Honest):
    """The whole split on every rank: the old minimal adapter of docs/adding-a-pipeline.md."""

    def indices(self, epoch: int) -> torch.Tensor:
        return torch.arange(len(self.y))


class Twice(Honest):
    """Every sample twice per epoch: wrong in one process too."""

    def indices(self, epoch: int) -> torch.Tensor:
        return torch.arange(len(self.y)).repeat(2)


@pytest.fixture(autouse=True)
def fakes(monkeypatch):
    for name, cls in (("test-honest", Honest), ("test-ignores-rank", IgnoresRank), ("test-twice", Twice)):
        monkeypatch.setitem(base._REGISTRY, name, cls)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_tiny_prepared(tmp_path_factory.mktemp("ds") / "tiny8", N_TRAIN, 8)


def _cfg(data, pipeline: str, world: int = 1, rank: int = 0, **kw) -> runner.BenchConfig:
    pipe = PipelineConfig(batch_size=kw.pop("batch_size", BS), augment=Augment(crop="center", size=8, flip=False),
                          workers=0, rank=rank, world_size=world)
    dist = None if world == 1 else DistConfig(world, "gloo", 1, world, ("h",) * world, tuple(range(world)), 60.0)
    d = dict(pipeline=pipeline, data=str(data), mode="loader", epochs=2, warmup=1, repeats=1, pipe=pipe,
             monitor_period_s=0.02, dist=dist)
    return runner.BenchConfig(**{**d, **kw})


def _ranks_in_process(data, pipeline: str, world: int) -> tuple[R.RunRows, int]:
    """Every rank's repeat through the runner in this process, then rank 0's merge with the bound."""
    results = []
    for rank in range(world):
        cfg = _cfg(data, pipeline, world, rank)
        rows = R.RunRows("r", pipeline, "tiny8", "loader", cfg.to_dict(), rank=rank)
        runner._repeat(cfg, open_prepared(cfg.data), rows, 0, DeviceClock())
        results.append(RankResult.of(rank, rows, 0))
    cfg = _cfg(data, pipeline, world)
    run = R.RunRows("r", pipeline, "tiny8", "loader", cfg.to_dict())
    code, bad_input = merge(run, results, bound=EpochBound.of(pipeline, N_TRAIN, cfg.pipe))
    assert bad_input is None
    return run, code


def test_bound_is_what_the_sharding_rules_give_out():
    """``EpochBound.images`` = the images of ``shard.epoch_shard`` over the ranks, batches cut as
    ``batch_slices`` cuts them (padding without ``drop_last``; the ``n % world`` cut and the partial
    last batches with it)."""
    for n in range(1, 14):
        for world in range(1, 5):
            for bs in (1, 2, 3, 5):
                for drop_last in (False, True):
                    got = sum(s.stop - s.start for r in range(world)
                              for s in batch_slices(len(epoch_shard(n, 0, 0, True, r, world, drop_last).indices),
                                                    bs, drop_last))
                    bound = EpochBound("p", n, world, bs, drop_last)
                    assert bound.images == got == world * bound.per_rank, (n, world, bs, drop_last)
    assert EpochBound("p", 320, 2, 256).images == 320 and EpochBound("p", 13, 3, 2).images == 15


def test_rank_ignoring_adapter_is_an_error_run_not_a_throughput(data):
    run, code = _ranks_in_process(data, "test-ignores-rank", 2)
    df = R.to_frame(run.rows())
    assert code == 1 and run.status == "error" and df.metric.tolist() == ["run"] and df["rank"].isna().all()
    assert df.reason.item() == (
        "pipeline test-ignores-rank: ranks loaded 96 images in epoch 1 (repeat 0) of a 48-image split "
        "(at most 48 over 2 ranks); an adapter must shard by config.rank/world_size (docs/adding-a-pipeline.md)")
    assert not run.rank_rows and "images_per_s" not in set(df.metric)


def test_sharding_adapter_merges_as_before(data):
    run, code = _ranks_in_process(data, "test-honest", 2)
    df = R.to_frame(run.rows())
    assert code == 0 and run.status == "ok"
    assert df.loc[(df.metric == "images") & df["rank"].isna(), "value"].tolist() == [N_TRAIN, N_TRAIN]
    assert len(df[(df.metric == "images_per_s") & df["rank"].isna()]) == 2  # the aggregate rows of the two measured epochs


def test_one_process_loading_more_than_the_split_is_an_error_row(data, tmp_path):
    out = runner.run_bench(_cfg(data, "test-twice"), tmp_path)
    df = R.read_results(tmp_path)
    assert out.exit_code == runner.EXIT_ERROR and out.status == "error" and len(df) == 1
    assert df.reason.item().startswith(
        "pipeline test-twice: loaded 96 images in epoch 1 (repeat 0) of a 48-image split (at most 48); ")
    ok = runner.run_bench(_cfg(data, "test-honest"), tmp_path / "ok")
    assert ok.status == "ok" and ok.exit_code == runner.EXIT_OK


def test_replay_cycling_full_batches_is_not_flagged(data, tmp_path):
    """replay repeats cached full batches (20 + 20 + 20 images for a 20 + 20 + 8 epoch): nothing is loaded."""
    cfg = _cfg(data, "test-honest", mode="replay", batch_size=20, replay_batches=1, epochs=1, warmup=0)
    out = runner.run_bench(cfg, tmp_path)
    df = R.read_results(tmp_path)
    assert out.status == "ok", df.reason.tolist()
    assert df.loc[df.metric == "images", "value"].tolist() == [60]


def test_bound_counts_per_epoch_images_only():
    def row(metric, epoch, value, status="ok"):
        return {"metric": metric, "repeat": 0, "epoch": epoch, "value": value, "status": status}

    rows = [row("images", None, 1e6), row("steps", 1, 1e6), row("images", 1, 48.0), row("images", 2, 1e6, "skip")]
    assert EpochBound("p", 48).check([rows]) is None
    assert "loaded 49 images in epoch 1" in EpochBound("p", 48).check([[*rows, row("images", 1, 1.0)]])
