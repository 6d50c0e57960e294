"""Fairness of the protocol on the device (issue 11, section 1), as far as the CPU can show it.

* ``time_to_first_batch_s`` = ``build_s + ttfb_s`` for every mode (an adapter that makes its
  first batch in its constructor, like DALI, is charged the same as one that makes it in ``iter``);
* the monitors run before the pipeline is built (nothing they do at start overlaps a pipeline
  working ahead) and report only the measured region (``Monitor.mark``);
* the NVML idle baseline / over-idle peak are skip rows with a reason on the CPU (never 0);
* ``--no-step-sync`` works in train mode;
* between repeats the CUDA caching allocator is emptied and its peaks reset (faked CUDA).
"""

from __future__ import annotations

import argparse
import threading
import time

import numpy as np
import pytest
import torch
from fixtures_datasets import write_tiny_prepared

import pipelines.base as base
from bench import results as R
from bench.harness import runner
from bench.harness.monitors import Monitor
from bench.harness.runner import EXIT_OK, BenchConfig, run_bench
from pipelines.base import Augment, Batch, Pipeline, PipelineConfig

pytestmark = pytest.mark.usefixtures("one_torch_thread")
N, BS = 32, 16


class SlowBuild(Pipeline):
    """Makes its first batch in its constructor (as DALI does) and records whether the monitor ran."""

    monitor_alive_at_build: list[bool] = []

    def __init__(self, data, config, store=None):
        super().__init__(data, config, store)
        SlowBuild.monitor_alive_at_build.append(any(t.name == "inrbench-monitor" for t in threading.enumerate()))
        split = data.split(config.split)
        self.x = torch.from_numpy(np.array(split.images)).permute(0, 3, 1, 2).float() / 255
        self.y = torch.from_numpy(split.labels)
        time.sleep(0.05)  # "the first batch", made ahead

    def __len__(self):
        return -(-len(self.y) // self.config.batch_size)

    def __iter__(self):
        for i in range(0, len(self.y), self.config.batch_size):
            yield Batch(images=self.x[i:i + self.config.batch_size].clone(), labels=self.y[i:i + self.config.batch_size])

    def close(self):
        pass

    def resident_bytes(self):
        return {"device": 0, "host": 0}


@pytest.fixture(autouse=True)
def fake(monkeypatch):
    monkeypatch.setitem(base._REGISTRY, "test-slow-build", SlowBuild)
    SlowBuild.monitor_alive_at_build = []


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_tiny_prepared(tmp_path_factory.mktemp("ds") / "tiny8", N, 8)


def _cfg(data, mode, **kw) -> BenchConfig:
    pipe = PipelineConfig(batch_size=BS, augment=Augment(crop="center", size=8, flip=False), workers=0)
    base_kw = dict(pipeline="test-slow-build", data=str(data), mode=mode, epochs=1, warmup=1, repeats=2,
                   pipe=pipe, backbone="small-cnn", monitor_period_s=0.02)
    base_kw.update(kw)
    return BenchConfig(**base_kw)


def _ok(df, metric):
    return df[(df.metric == metric) & (df.status == "ok")].set_index("repeat").value.sort_index()


@pytest.mark.parametrize("mode", ["loader", "replay", "train"])
def test_time_to_first_batch_is_build_plus_first_batch(mode, data, tmp_path):
    out = run_bench(_cfg(data, mode), tmp_path)
    assert out.exit_code == EXIT_OK, out.rows
    df = R.read_results(tmp_path)
    total, build, ttfb = _ok(df, "time_to_first_batch_s"), _ok(df, "build_s"), _ok(df, "ttfb_s")
    assert list(total.index) == [0, 1]
    assert np.allclose(total.values, (build + ttfb).values)
    assert (build >= 0.05).all()  # the batch made ahead is in build_s, hence in time_to_first_batch_s
    assert SlowBuild.monitor_alive_at_build == [True, True]  # monitors up before every build
    for metric in ("gpu_mem_idle_bytes", "gpu_mem_over_idle_peak_bytes"):
        rows = df[df.metric == metric]
        assert len(rows) == 2 and (rows.status == "skip").all() and rows.value.isna().all()
        assert (rows.reason.str.len() > 0).all()


def test_no_step_sync_in_train_mode(data, tmp_path):
    from bench.commands import bench as cmd

    p = argparse.ArgumentParser()
    cmd.add_arguments(p)
    args = p.parse_args(["--pipeline", "test-slow-build", "--data", str(data), "--device", "cpu", "--mode", "train",
                         "--epochs", "2", "--warmup", "0", "--repeats", "1", "--batch-size", str(BS),
                         "--no-step-sync", "--out", str(tmp_path / "res")])
    assert cmd.run(args) == 0
    df = R.read_results(tmp_path / "res")
    assert (df["cfg.step_sync"] == False).all()  # noqa: E712 - a pandas column
    assert len(_ok(df, "test_acc")) == 1 and len(_ok(df, "ttfb_s")) == 1
    assert not len(df[df.metric.isin(["data_wait_s", "compute_s"])])  # no per-step split without syncs
    e = df[(df.metric == "epoch_s") & (df.status == "ok")]
    assert len(e) >= 2 and (e.value > 0).all()  # --epochs 2, then the autorange
    steps = df[(df.metric == "steps") & (df.status == "ok")]
    assert (steps.value == N // BS).all()


def test_monitor_mark_reports_only_the_measured_region():
    mon = Monitor(device="cpu", period_s=0.02).start()
    t_start = time.perf_counter()
    end = time.process_time() + 0.4
    while time.process_time() < end:  # busy before the mark: not the measured region's
        pass
    t_mark = time.perf_counter()
    mon.mark()
    time.sleep(0.3)
    deadline = time.monotonic() + 30
    while len(mon._samples) < 3 and time.monotonic() < deadline:  # a busy machine starves the sampling thread
        time.sleep(0.02)
    waited = time.perf_counter() - t_mark
    res = mon.stop()
    # from the mark to the stop: at least the sleep, at most this thread's own clock around the region (stop() may
    # return late on a busy machine), and short of the busy time before the mark (>= 0.4 s, longer under load) plus
    # the wait, which a region counted from start() would reach
    assert 0.3 <= res.wall_s <= time.perf_counter() - t_mark, res.wall_s
    assert res.wall_s < (t_mark - t_start) + waited, (res.wall_s, t_mark - t_start, waited)
    assert res.cpu_seconds < 0.2, res.cpu_seconds
    assert all(s[0] >= 0 for s in res.samples) and len(res.samples) >= 3
    mon.close()  # idempotent after stop
    closed = Monitor(device="cpu", period_s=0.02).start()
    closed.close()  # a failed region: the thread stops, no result
    assert not any(t.name == "inrbench-monitor" and t.is_alive() for t in threading.enumerate())


def test_cuda_cache_is_emptied_and_peaks_reset_before_each_repeat(monkeypatch):
    calls: list[str] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: calls.append("empty_cache"))
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda d=None: calls.append("reset_peak"))
    runner._free_device_memory("cuda:0")
    assert calls == ["empty_cache", "reset_peak"]
    calls.clear()
    runner._free_device_memory("cpu")
    assert calls == []


def test_split_checksums_are_not_inside_the_timed_build(data, tmp_path, monkeypatch):
    """pixels.npy is verified (sha256, cached per process) before repeat 0's clock starts, so the
    first repeat's build_s does not carry a hash the later repeats skip."""
    import bench.datasets.prepared as P
    import pipelines

    monkeypatch.setattr(P, "_VERIFIED", {})
    hashed_during_build = []
    real_hash, real_create = P.sha256_array, pipelines.create
    building = threading.local()

    def hash_(a, *k, **kw):
        if getattr(building, "on", False):
            hashed_during_build.append(a.shape)
        return real_hash(a, *k, **kw)

    def create(*a, **kw):
        building.on = True
        try:
            return real_create(*a, **kw)
        finally:
            building.on = False

    monkeypatch.setattr(P, "sha256_array", hash_)
    monkeypatch.setattr(pipelines, "create", create)
    outcome = run_bench(_cfg(data, "loader", pipeline="raw", repeats=2), tmp_path / "r")
    assert outcome.exit_code == EXIT_OK and outcome.status == "ok"
    assert len(P._VERIFIED) >= 2  # pixels and labels of the train split were verified ...
    assert hashed_during_build == []  # ... and never inside a timed build
