"""The harness autorange (``min_seconds``) and the per-image test predictions of train mode."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from fixtures_datasets import write_tiny_prepared

import pipelines.base as base
from bench import results as R
from bench.harness.runner import EXIT_OK, BenchConfig, run_bench
from bench.harness.timing import DeviceClock
from pipelines.base import Augment, Batch, Pipeline, PipelineConfig

pytestmark = pytest.mark.usefixtures("one_torch_thread")

N_TRAIN, N_TEST, BS = 32, 12, 16  # 2 batches per epoch
TICK_NS = 10_000_000  # the fake clock advances 10 ms per read


class Fixed(Pipeline):
    """The same two batches every epoch (deterministic): pixels encode the label."""

    def __init__(self, data, config, store=None):
        super().__init__(data, config, store)
        split = data.split(config.split)
        self.x = torch.from_numpy(np.array(split.images)).permute(0, 3, 1, 2).float() / 255 - 0.5
        self.y = torch.from_numpy(split.labels)

    def __len__(self):
        return (len(self.y) + self.config.batch_size - 1) // self.config.batch_size

    def __iter__(self):
        for i in range(0, len(self.y), self.config.batch_size):
            yield Batch(images=self.x[i:i + self.config.batch_size], labels=self.y[i:i + self.config.batch_size])

    def close(self):
        pass

    def resident_bytes(self):
        return {"device": 0, "host": 0}


@pytest.fixture(autouse=True)
def fake(monkeypatch):
    monkeypatch.setitem(base._REGISTRY, "test-fixed", Fixed)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_tiny_prepared(tmp_path_factory.mktemp("ds") / "tiny8", N_TRAIN, N_TEST, num_classes=3, base=40, step=60)


def _cfg(data, mode, **kw) -> BenchConfig:
    pipe = PipelineConfig(batch_size=BS, augment=Augment(crop="center", size=8, flip=False), workers=0)
    d = dict(pipeline="test-fixed", data=str(data), mode=mode, epochs=2, warmup=1, repeats=2, pipe=pipe,
             backbone="small-cnn", monitor_period_s=0.02)
    d.update(kw)
    return BenchConfig(**d)


def _fake_clock() -> DeviceClock:
    t = [0]

    def now() -> int:
        t[0] += TICK_NS
        return t[0]

    return DeviceClock(now_ns=now)


def _ok(df, metric):
    return df[(df.metric == metric) & (df.status == "ok")]


def test_autorange_adds_epochs_until_min_seconds(data, tmp_path):
    # a loader epoch of 2 batches reads the clock 1 + 2*2 + 1 = 6 times: 5 ticks = 50 ms measured
    out = run_bench(_cfg(data, "loader", min_seconds=0.32), tmp_path, clock=_fake_clock())
    assert out.exit_code == EXIT_OK
    df = R.read_results(tmp_path)
    ep = _ok(df, "epoch_s")
    assert np.allclose(ep.value, 0.05)
    # 0.32 s needs ceil(0.32 / 0.05) = 7 epochs per repeat (more than --epochs 2), indices after warm-up
    assert _ok(df, "measured_epochs").value.tolist() == [7, 7]
    assert _ok(df, "measured_s").value.to_numpy() == pytest.approx([0.35, 0.35])
    for r in (0, 1):
        assert sorted(ep[ep.repeat == r].epoch.tolist()) == list(range(1, 8))
    assert df["cfg.min_seconds"].iloc[0] == 0.32


def test_autorange_never_measures_fewer_than_epochs(data, tmp_path):
    out = run_bench(_cfg(data, "loader", epochs=3, min_seconds=0.0), tmp_path, clock=_fake_clock())
    df = R.read_results(out.run_dir.parent.parent)
    assert _ok(df, "measured_epochs").value.tolist() == [3, 3] and len(_ok(df, "epoch_s")) == 6
    with pytest.raises(ValueError, match="min_seconds must be >= 0"):
        _cfg(data, "loader", min_seconds=-1.0)


def test_train_autorange_does_not_change_the_trained_model(data, tmp_path):
    """Extra epochs are timed but discarded: accuracy, loss and every prediction are those of
    the scheduled epochs, whatever min_seconds is."""
    res = {}
    for ms in (0.0, 0.6):
        out = tmp_path / f"ms{ms}"
        o = run_bench(_cfg(data, "train", repeats=1, min_seconds=ms), out, clock=_fake_clock())
        assert o.exit_code == EXIT_OK
        df = R.read_results(out)
        preds = pd.read_csv(o.run_dir / R.PREDICTIONS_FILE)
        res[ms] = (df, preds)
    (d0, p0), (d1, p1) = res[0.0], res[0.6]
    assert _ok(d0, "measured_epochs").value.tolist() == [2]
    assert _ok(d1, "measured_epochs").value.item() > 2  # more epochs were timed
    for m in ("test_acc", "test_loss"):
        assert _ok(d1, m).value.item() == _ok(d0, m).value.item(), m
    assert _ok(d1, "test_acc").epoch.item() == 2  # evaluated after warm-up 1 + 2 scheduled epochs
    assert _ok(d1, "test_images").value.item() == N_TEST
    assert list(p1.columns) == ["repeat", "image", "label", "prediction"]
    assert p1.equals(p0) and len(p1) == N_TEST and p1["image"].tolist() == list(range(N_TEST))
    acc = (p1["label"] == p1["prediction"]).mean()
    assert acc == pytest.approx(_ok(d1, "test_acc").value.item())


def test_failed_run_writes_no_predictions(data, tmp_path, monkeypatch):
    def boom(*a, **k):
        raise RuntimeError("eval exploded")

    monkeypatch.setattr("bench.harness.runner.evaluate", boom)
    o = run_bench(_cfg(data, "train", repeats=1), tmp_path, clock=_fake_clock())
    assert o.status == "error" and not (o.run_dir / R.PREDICTIONS_FILE).exists()


def test_threads_left_to_torch_are_recorded_as_used(data, tmp_path):
    """``--threads`` left out is saved as the count torch ran with, not None: the report then
    tells a run at torch's default from one at an explicit other count (never pooled)."""
    prev = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        run_bench(_cfg(data, "loader", repeats=1), tmp_path / "a", clock=_fake_clock())
        run_bench(_cfg(data, "loader", repeats=1, torch_threads=1), tmp_path / "a", clock=_fake_clock())
    finally:
        torch.set_num_threads(prev)
    df = R.read_results(tmp_path / "a")
    assert sorted(df.groupby("run_id")["cfg.torch_threads"].first().tolist()) == [1, 2]
    from bench.report.load import load

    assert set(load(tmp_path / "a").rows["dataset"]) == {"tiny8 [torch_threads=1]", "tiny8 [torch_threads=2]"}
