"""The runner: one protocol for loader/replay/train, replay decodes nothing, skip/error rows.

A tiny fake ``Pipeline`` is put in the registry for the duration of each test only
(``monkeypatch.setitem``), so registry-parametrized tests elsewhere never see it.
"""

from __future__ import annotations

import argparse
import json

import numpy as np
import pandas as pd
import pytest
import torch
from fixtures_datasets import write_tiny_prepared

import pipelines.base as base
from bench import results as R
from bench.harness.ranks import Sync, _Point
from bench.harness.runner import EXIT_ERROR, EXIT_INPUT, EXIT_OK, EXIT_OOM, BenchConfig, run_bench
from pipelines.base import Augment, Batch, Pipeline, PipelineConfig, Unavailable

N_TRAIN, BS = 48, 16  # 3 batches per epoch

pytestmark = pytest.mark.usefixtures("one_torch_thread")



class CountingFake(Pipeline):
    """Centre 'decode' of the original pixels; counts every batch it decodes (class-wide)."""

    decoded = 0
    fail_after: int | None = None  # raise after this many decoded batches
    fail_with: type[BaseException] = RuntimeError

    def __init__(self, data, config, store=None):
        super().__init__(data, config, store)
        split = data.split(config.split)
        self.x = torch.from_numpy(np.array(split.images)).permute(0, 3, 1, 2).float() / 255 - 0.5
        self.y = torch.from_numpy(split.labels)
        self.closed = False

    def __len__(self):
        return (len(self.y) + self.config.batch_size - 1) // self.config.batch_size

    def __iter__(self):
        if self.closed:
            raise RuntimeError("closed")
        for i in range(0, len(self.y), self.config.batch_size):
            if CountingFake.fail_after is not None and CountingFake.decoded >= CountingFake.fail_after:
                raise CountingFake.fail_with("CUDA out of memory. Tried to allocate 1 GiB"
                                             if CountingFake.fail_with is torch.OutOfMemoryError
                                             else "decoder exploded")
            CountingFake.decoded += 1
            sl = slice(i, i + self.config.batch_size)
            yield Batch(images=self.x[sl].clone(), labels=self.y[sl])

    def close(self):
        self.closed = True

    def resident_bytes(self):
        return {"device": 0, "host": self.x.numel() * 4}


class Unavail(Pipeline):
    def __init__(self, data, config, store=None):
        raise Unavailable("needs a GPU with nvJPEG (none here)")

    def __iter__(self):  # pragma: no cover
        yield from ()

    def __len__(self):  # pragma: no cover
        return 0

    def close(self):  # pragma: no cover
        pass

    def resident_bytes(self):  # pragma: no cover
        return {}


@pytest.fixture(autouse=True)
def fakes(monkeypatch):
    monkeypatch.setitem(base._REGISTRY, "test-counting", CountingFake)
    monkeypatch.setitem(base._REGISTRY, "test-unavailable", Unavail)
    CountingFake.decoded, CountingFake.fail_after, CountingFake.fail_with = 0, None, RuntimeError
    yield


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_tiny_prepared(tmp_path_factory.mktemp("ds") / "tiny8", N_TRAIN, 20)


def _cfg(data, mode, **kw) -> BenchConfig:
    pipe = PipelineConfig(batch_size=BS, augment=Augment(crop="center", size=8, flip=False), workers=0)
    base_kw = dict(pipeline="test-counting", data=str(data), mode=mode, epochs=2, warmup=1, repeats=2,
                   pipe=pipe, backbone="small-cnn", monitor_period_s=0.02)
    base_kw.update(kw)
    return BenchConfig(**base_kw)


def _ok(df, metric):
    return df[(df.metric == metric) & (df.status == "ok")]


def test_loader_rows_protocol(data, tmp_path):
    out = run_bench(_cfg(data, "loader"), tmp_path)
    assert out.exit_code == EXIT_OK and out.status == "ok"
    df = R.read_results(tmp_path)
    # 2 repeats x 2 measured epochs (epochs 1, 2; epoch 0 is the warm-up)
    ips = _ok(df, "images_per_s")
    assert sorted(zip(ips.repeat, ips.epoch, strict=True)) == [(0, 1), (0, 2), (1, 1), (1, 2)]
    assert (ips.value > 0).all()
    assert (_ok(df, "images").value == N_TRAIN).all() and (_ok(df, "steps").value == 3).all()
    assert (_ok(df, "pipeline_batches").value == 3).all()
    warm = _ok(df, "warmup_epoch_s")
    assert warm.epoch.tolist() == [0, 0] and warm.repeat.tolist() == [0, 1]
    assert len(_ok(df, "ttfb_s")) == 2 and len(_ok(df, "build_s")) == 2
    for m in ("cpu_cores_busy", "host_rss_peak_bytes"):
        assert len(_ok(df, m)) == 2
    # a region this short may see no CPU tick: then a skip row with the reason, never a 0 or inf
    per_cpu = df[df.metric == "images_per_cpu_s"]
    assert len(per_cpu) == 2 and ((per_cpu.status == "ok") & (per_cpu.value > 0) | (per_cpu.status == "skip")).all()
    # per-step split sums to at most the epoch
    e = _ok(df, "epoch_s").set_index(["repeat", "epoch"]).value
    w = _ok(df, "data_wait_s").set_index(["repeat", "epoch"]).value
    c = _ok(df, "compute_s").set_index(["repeat", "epoch"]).value
    assert ((w + c) <= e + 1e-9).all()
    # no GPU here: GPU metrics are skip rows with a reason, never zeros
    gpu = df[df.metric == "gpu_mem_used_peak_bytes"]
    assert (gpu.status == "skip").all() and gpu.value.isna().all() and (gpu.reason != "").all()
    # 1 warm-up + 2 measured epochs + ... per repeat, no more decoding than that
    assert CountingFake.decoded == 2 * 3 * 3
    saved = json.loads((out.run_dir / "config.json").read_text())
    assert saved["pipe"]["batch_size"] == BS and saved["mode"] == "loader"
    assert json.loads((out.run_dir / "env.json").read_text())["schema_version"] >= 1
    assert (df["cfg.pipe.batch_size"] == BS).all()
    # per-step samples: 2 repeats x 2 measured epochs x 3 steps, summing to the per-epoch rows
    steps = pd.read_csv(out.run_dir / "steps.csv")
    assert len(steps) == 12 and steps.groupby(["repeat", "epoch"]).images.sum().eq(N_TRAIN).all()
    assert steps.groupby(["repeat", "epoch"]).wait_s.sum().values == pytest.approx(w.sort_index().values)
    mon = pd.read_csv(out.run_dir / "monitor.csv")
    assert set(mon.repeat) == {0, 1} and (mon.rss_bytes > 0).all() and mon.gpu_mem_used_bytes.isna().all()


def test_replay_does_no_decoding(data, tmp_path):
    cfg = _cfg(data, "replay", replay_batches=2, epochs=3, warmup=1, repeats=2)
    out = run_bench(cfg, tmp_path)
    assert out.exit_code == EXIT_OK
    df = R.read_results(tmp_path)
    # the pipeline decoded exactly one epoch per repeat (the caching pass), nothing while timed
    assert CountingFake.decoded == 2 * 3
    assert (_ok(df, "pipeline_batches").value == 0).all() and len(_ok(df, "pipeline_batches")) == 6
    assert (_ok(df, "steps").value == 3).all()  # an epoch still has a pipeline epoch's steps
    assert (_ok(df, "replay_cached_batches").value == 2).all()
    # cycled cached batches: 16 + 16 + 16
    assert (_ok(df, "images").value == 48).all()
    assert len(_ok(df, "train_loss")) == 2 * 4
    assert not len(_ok(df, "test_acc"))  # eval only in train mode


def test_train_mode_evaluates_on_original_pixels(data, tmp_path):
    out = run_bench(_cfg(data, "train", repeats=1, epochs=2, warmup=0), tmp_path)
    assert out.exit_code == EXIT_OK
    df = R.read_results(tmp_path)
    acc = _ok(df, "test_acc")
    assert len(acc) == 1 and 0.0 <= acc.value.iloc[0] <= 1.0 and acc.epoch.iloc[0] == 1
    assert len(_ok(df, "ttfb_s")) == 1  # no warm-up: taken from the first measured epoch
    assert CountingFake.decoded == 2 * 3


def test_unavailable_is_a_skip_row_exit_0(data, tmp_path, capsys):
    from bench.commands import bench as cmd

    p = argparse.ArgumentParser()
    cmd.add_arguments(p)
    args = p.parse_args(["--pipeline", "test-unavailable", "--data", str(data), "--device", "cpu",
                         "--repeats", "1", "--out", str(tmp_path)])
    assert cmd.run(args) == 0
    df = R.read_results(tmp_path)
    assert len(df) == 1
    row = df.iloc[0]
    assert row.status == "skip" and row.metric == "run" and "nvJPEG" in row.reason
    assert "SKIP" in capsys.readouterr().out


def test_cli_ok_run_prints_summary(data, tmp_path, capsys):
    from bench.commands import bench as cmd

    p = argparse.ArgumentParser()
    cmd.add_arguments(p)
    args = p.parse_args(["--pipeline", "test-counting", "--data", str(data), "--device", "cpu",
                         "--mode", "train", "--backbone", "small-cnn", "--crop", "random-pad",
                         "--repeats", "1", "--epochs", "1", "--warmup", "0", "--batch-size", "16",
                         "--workers", "0", "--threads", "1", "--out", str(tmp_path)])
    assert cmd.run(args) == 0
    text = capsys.readouterr().out
    assert "test-counting train on tiny8" in text and "img/s" in text and "test acc" in text
    cfg = json.loads(next((tmp_path / "runs").glob("*/config.json")).read_text())
    assert cfg["pipe"]["augment"]["crop"] == "random-pad" and cfg["pipe"]["augment"]["size"] == 8
    assert cfg["backbone"] == "small-cnn" and cfg["torch_threads"] == 1


def test_cuda_requested_without_cuda_is_a_skip_row(data, tmp_path):
    if torch.cuda.is_available():
        pytest.skip("CUDA is available here: the no-CUDA path cannot be exercised")
    cfg = _cfg(data, "loader")
    cfg = BenchConfig(**{**cfg.__dict__, "pipe": PipelineConfig(batch_size=BS, device="cuda", workers=0)})
    out = run_bench(cfg, tmp_path)
    df = R.read_results(tmp_path)
    assert out.exit_code == EXIT_OK and out.status == "skip" and len(df) == 1
    assert "cuda" in df.iloc[0].reason and CountingFake.decoded == 0


@pytest.mark.parametrize("exc, code", [(RuntimeError, EXIT_ERROR), (torch.OutOfMemoryError, EXIT_OOM)])
def test_crash_mid_run_is_one_error_row_nonzero_exit(data, tmp_path, exc, code):
    CountingFake.fail_after = 7  # warm-up (3) and measured epoch 1 (3) give rows, then it fails
    CountingFake.fail_with = exc
    out = run_bench(_cfg(data, "loader"), tmp_path)
    assert out.exit_code == code != 0 and out.status == "error"
    df = R.read_results(tmp_path)
    assert len(df) == 1  # the rows measured before the crash are NOT kept
    assert not (out.run_dir / "steps.csv").exists() and not (out.run_dir / "monitor.csv").exists()
    assert df.iloc[0].status == "error" and df.iloc[0].metric == "run"
    assert ("out of memory" in df.iloc[0].reason) == (code == EXIT_OOM)


def test_bad_input_is_one_line_input_error(tmp_path):
    """`bench.cli` turns an InputError into one line on stderr and exit 2."""
    from bench.commands import bench as cmd
    from bench.errors import InputError

    p = argparse.ArgumentParser()
    cmd.add_arguments(p)
    for argv, needle in (
        (["--pipeline", "test-counting", "--data", str(tmp_path / "nope")], "nope"),
        (["--pipeline", "no-such-pipeline", "--data", str(tmp_path)], "known:"),
    ):
        args = p.parse_args([*argv, "--out", str(tmp_path / "o")])
        with pytest.raises(InputError) as ei:
            cmd.run(args)
        assert "\n" not in str(ei.value) and needle in str(ei.value)
    assert not (tmp_path / "o").exists()  # nothing ran, nothing written


@pytest.mark.parametrize("name", base.names())
def test_every_registered_pipeline_runs_through_the_harness(name, data, tmp_path):
    """Each built-in adapter, loader mode, one short repeat: ok rows, or one skip row (exit 0).
    An adapter that needs a store (``inr``) gets one fitted briefly (quality is irrelevant here)."""
    from bench.datasets.prepared import open_prepared

    store = None
    if base.needs_store(name):
        from tests.store_helpers import fit_store_for_tests

        store = str(fit_store_for_tests(open_prepared(data), tmp_path / "train.inr", iterations=20))
    cfg = _cfg(data, "loader", pipeline=name, epochs=1, warmup=0, repeats=1, store=store)
    cfg = BenchConfig(**{**cfg.__dict__, "pipe": PipelineConfig(
        batch_size=BS, augment=Augment(crop="random-pad", size=8, pad=2), workers=1)})
    out = run_bench(cfg, tmp_path / "res")
    df = R.read_results(tmp_path / "res")
    if out.status == "skip":
        assert out.exit_code == EXIT_OK and len(df) == 1 and df.iloc[0].reason
        pytest.skip(f"{name} is unavailable here (skip row written): {df.iloc[0].reason}")
    assert out.exit_code == EXIT_OK, df.iloc[0].reason
    assert _ok(df, "images").value.tolist() == [N_TRAIN]
    assert _ok(df, "pipeline_batches").value.tolist() == [3]
    # the row carries what the adapter states it reads per image (the report's bytes/image)
    with base.create(name, open_prepared(data), PipelineConfig(workers=0), store=store) as p:
        assert _ok(df, "dataset_bytes_per_image").value.tolist() == [p.dataset_bytes_per_image()]


@pytest.mark.parametrize(("stated", "reason"), [(12.5, None), (None, "does not state"), (float("nan"), "nan"),
                                                (0.0, "not a positive")])
def test_dataset_bytes_per_image_row(data, tmp_path, monkeypatch, stated, reason):
    """One ``dataset_bytes_per_image`` row per repeat: the adapter's number, or a skip row saying why not."""
    monkeypatch.setattr(CountingFake, "dataset_bytes_per_image", lambda self: stated)
    assert run_bench(_cfg(data, "loader", epochs=1, warmup=0), tmp_path).exit_code == EXIT_OK
    rows = R.read_results(tmp_path).query("metric == 'dataset_bytes_per_image'")
    assert rows.repeat.tolist() == [0, 1] and (rows.unit == "bytes").all()
    if reason is None:
        assert (rows.status == "ok").all() and (rows.value == stated).all()
    else:
        assert (rows.status == "skip").all() and rows.value.isna().all() and rows.reason.str.contains(reason).all()


def test_cleanup_failing_after_a_sticky_cuda_error_keeps_the_error_row(data, tmp_path, monkeypatch, capsys):
    """After a sticky CUDA error the cleanup's ``empty_cache`` raises the same error again: the run
    still writes its one error row, with the run's own reason, not the cleanup's."""
    from bench.harness import runner

    def sticky(device):  # the device is broken once the pipeline has failed
        if CountingFake.decoded >= 7:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(runner, "_free_device_memory", sticky)
    CountingFake.fail_after = 7
    out = run_bench(_cfg(data, "loader"), tmp_path)
    assert out.exit_code == EXIT_ERROR and out.status == "error"
    df = R.read_results(tmp_path)
    assert df.metric.tolist() == ["run"] and df.status.tolist() == ["error"]
    assert "decoder exploded" in df.iloc[0].reason
    assert "illegal memory access" in capsys.readouterr().err  # said, not lost


class _OnDevice:
    """Stands for a parameter tensor on a GPU: ``clone`` stays on the GPU, ``to("cpu")`` copies it off."""

    device = torch.device("cuda", 0)

    def __init__(self, value):
        self.value = value

    def detach(self):
        return self

    def clone(self):
        return _OnDevice(self.value.clone())

    def to(self, device, *args, copy=False, **kw):
        return self.value.clone() if torch.device(device).type == "cpu" else _OnDevice(self.value.clone())

    def cpu(self):
        return self.value.clone()


class _DeviceModelTrainer:
    """A trainer whose model is on a (faked) GPU; each step adds 1 to its one weight."""

    def __init__(self):
        from types import SimpleNamespace

        self.w = torch.zeros(2)
        self.restored = None
        self.model = SimpleNamespace(state_dict=lambda: {"w": _OnDevice(self.w)}, load_state_dict=self._load)

    def _load(self, state):
        self.restored = state

    def step(self, batch):
        self.w += 1

    def epoch_metrics(self):
        return []

    def end_epoch(self):
        return 0.0


def test_autorange_keeps_the_scheduled_model_on_the_cpu(data):
    """Past the schedule (autorange), the model's state is kept on the CPU, not as a second copy in
    device memory inside the measured region, and the model is restored from that copy."""
    from bench.harness import runner
    from bench.harness.replay import CountingSource
    from bench.harness.timing import DeviceClock

    ticks = iter(range(0, 10**13, 10**8))  # 0.1 s per clock read: ~0.8 s per epoch
    cfg = _cfg(data, "train", epochs=1, warmup=0, repeats=1, min_seconds=3.0)
    counted = CountingSource([Batch(images=torch.zeros(BS, 3, 8, 8), labels=torch.zeros(BS, dtype=torch.long))] * 3)
    trainer = _DeviceModelTrainer()
    rows = R.RunRows("run", cfg.pipeline, "tiny8", cfg.mode, cfg.to_dict())
    runner._measure(cfg, counted, counted, trainer.step, trainer, DeviceClock(now_ns=lambda: next(ticks)), rows, 0)
    epochs = next(r["value"] for r in rows._rows if r["metric"] == "measured_epochs")
    assert epochs > 1 and trainer.w[0] == 3 * epochs  # the autorange trained on
    (w,) = trainer.restored.values()
    assert isinstance(w, torch.Tensor) and w.device.type == "cpu"
    assert torch.equal(w, torch.full((2,), 3.0))  # the state after the one scheduled epoch (3 steps)


class _Left(BaseException):
    """Raised by the test's stand-in for ``os._exit``: the rank left."""


class _TwoRanks(Sync):
    """Rank 0 of a two-rank group, in this one process: the peer meets every sync point with the same
    value; ``sent`` records what this rank gathered (a ``RankResult`` is the final gather, the one
    that would meet an NCCL peer's all-reduce)."""

    def __init__(self):
        super().__init__(0, 2)
        self.sent = []

    def _gather(self, obj):
        self.sent.append(obj)
        return [obj, obj] if isinstance(obj, _Point) else [obj, None]

    def announce(self, outcome):
        return outcome


@pytest.mark.parametrize("backend, mode, leaves", [("nccl", "train", True), ("gloo", "train", False),
                                                   ("nccl", "loader", False)])
def test_rank_failing_mid_epoch_on_nccl_with_ddp_leaves_without_the_final_gather(
        data, tmp_path, monkeypatch, backend, mode, leaves):
    """Rank 0 of two runs out of memory in the middle of a measured epoch. With a DDP model on NCCL
    its peer may be inside the gradient all-reduce: it records its exit status for ``--nproc`` and
    leaves (os._exit) without gathering. gloo, or no DDP model (loader: the peer can only be at the
    next sync point), keeps the final gather and rank 0's error row."""
    import dataclasses

    from bench import dist
    from bench.harness import runner
    from bench.harness.ranks import DistConfig, RankResult

    sync = _TwoRanks()
    monkeypatch.setattr(runner, "_sync_for", lambda cfg: sync)
    monkeypatch.setattr(dist, "broadcast_object", lambda obj: obj)
    plain = runner._trainer  # DDP needs a process group: the same trainer without it
    monkeypatch.setattr(runner, "_trainer", lambda cfg, data, steps: plain(
        dataclasses.replace(cfg, dist=None, pipe=dataclasses.replace(cfg.pipe, world_size=1)), data, steps))

    def leave(code):
        raise _Left(code)

    monkeypatch.setattr(runner, "_exit", leave)
    status = tmp_path / "status"
    status.mkdir()
    monkeypatch.setenv(dist.STATUS_DIR_ENV, str(status))
    CountingFake.fail_after = 5  # warm-up's 3 batches, 2 of the first measured epoch, then the failure
    CountingFake.fail_with = torch.OutOfMemoryError
    pipe = PipelineConfig(batch_size=BS, augment=Augment(crop="center", size=8, flip=False), workers=0, world_size=2)
    cfg = _cfg(data, mode, repeats=1, pipe=pipe, dist=DistConfig(
        world_size=2, backend=backend, nnodes=1, local_world_size=2, hosts=("h", "h"), local_ranks=(0, 1),
        timeout_s=60.0))
    out_dir = tmp_path / "res"
    if leaves:
        with pytest.raises(_Left) as left:
            run_bench(cfg, out_dir)
        assert left.value.args == (EXIT_OOM,)
        assert (status / "rank0").read_text() == str(EXIT_OOM)  # --nproc exits 3, as one process would
        assert not any(isinstance(s, RankResult) for s in sync.sent)  # no gather after the failure
        # under any launcher (the user's own torchrun too) the leaving rank records why in the run folder
        (run_dir,) = out_dir.glob("runs/*")
        assert json.loads((run_dir / "rank0.left.json").read_text())["exit_code"] == EXIT_OOM
        df = R.read_results(out_dir)
        assert df.metric.tolist() == ["run"] and df.status.tolist() == ["error"] and df["rank"].tolist() == [0]
        assert df.reason.item().startswith("rank 0: out of memory")
        assert (run_dir / "env.json").is_file()
    else:
        out = run_bench(cfg, out_dir)
        assert out.exit_code == EXIT_OOM and out.status == "error"
        assert isinstance(sync.sent[-1], RankResult) and not list(status.iterdir())
        df = R.read_results(out_dir)
        assert df.metric.tolist() == ["run"] and df.reason.item().startswith("rank 0: out of memory")


def test_a_rank_leaving_on_nccl_with_bad_input_says_which_file(data, tmp_path, monkeypatch, capsys):
    """The rank that leaves at once is the only one that knows the reason, and no row carries it:
    its stderr names the file (the launcher's row only says a rank exited with 2)."""
    import dataclasses

    from bench import dist
    from bench.harness import runner
    from bench.harness.ranks import DistConfig

    monkeypatch.setattr(runner, "_sync_for", lambda cfg: _TwoRanks())
    monkeypatch.setattr(dist, "broadcast_object", lambda obj: obj)
    plain = runner._trainer
    monkeypatch.setattr(runner, "_trainer", lambda cfg, data, steps: plain(
        dataclasses.replace(cfg, dist=None, pipe=dataclasses.replace(cfg.pipe, world_size=1)), data, steps))

    def leave(code):
        raise _Left(code)

    monkeypatch.setattr(runner, "_exit", leave)
    CountingFake.fail_after = 5
    from bench.errors import InputError

    CountingFake.fail_with = InputError
    pipe = PipelineConfig(batch_size=BS, augment=Augment(crop="center", size=8, flip=False), workers=0, world_size=2)
    cfg = _cfg(data, "train", repeats=1, pipe=pipe, dist=DistConfig(
        world_size=2, backend="nccl", nnodes=1, local_world_size=2, hosts=("h", "h"), local_ranks=(0, 1),
        timeout_s=60.0))
    with pytest.raises(_Left) as left:
        run_bench(cfg, tmp_path / "res")
    assert left.value.args == (EXIT_INPUT,)
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "inrbench: error: decoder exploded"  # the reason, before the leaving line
    assert "leaving now" in err[1] and "why is recorded in " in err[1]
    assert R.read_results(tmp_path / "res").reason.item() == "rank 0: bad input: decoder exploded"


def test_device_memory_is_freed_without_touching_cuda_before_it_starts(monkeypatch):
    """``bench --device cuda:N`` frees cached memory before each repeat: before CUDA is initialised in the
    process there is nothing to free, and torch's peak reset would raise (an error row instead of a run)."""
    from bench.harness import runner

    calls = []

    def reset(device):
        if not state["initialized"]:
            raise RuntimeError("Invalid device argument : did you call init?")
        calls.append(device)

    state = {"initialized": False}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: state["initialized"])
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: calls.append("empty"))
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", reset)
    runner._free_device_memory("cuda:1")
    assert calls == []
    state["initialized"] = True
    runner._free_device_memory("cuda:1")
    assert calls == ["empty", torch.device("cuda", 1)]
    runner._free_device_memory("cpu")
    assert len(calls) == 2
