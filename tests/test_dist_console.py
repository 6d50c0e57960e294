"""What a data-parallel ``inrbench bench`` (2 gloo processes on the CPU) says on the console: the run's
reason once, with its exit class, whoever launched it (``--nproc`` or the user's own torchrun)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from fixtures_datasets import write_tiny_prepared

from bench import results as R

REPO = Path(__file__).resolve().parent.parent

# an adapter that ignores its rank: every rank iterates the whole split (``__len__`` = the whole split),
# registered in every process of the launch through ``sitecustomize`` on PYTHONPATH
IGNORES_RANK = """
import torch
from pipelines.base import Batch, register
from pipelines.crops import normalize_, sample_crops, warp
from pipelines.raw import RawPipeline


@register("test-ignores-rank")
class IgnoresRank(RawPipeline):
    def __len__(self):
        return -(-self.n // self.config.batch_size)

    def __iter__(self):
        aug, g = self.config.augment, torch.Generator().manual_seed(0)
        order = torch.randperm(self.n)
        for s in range(0, self.n, self.config.batch_size):
            idx = order[s:s + self.config.batch_size]
            crops = sample_crops(aug, idx.numel(), self.height, self.width, g)
            yield Batch(images=normalize_(warp(self.images[idx].float(), crops, aug), aug), labels=self.labels[idx])
"""


def _env(*paths: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR",
                                                            "MASTER_PORT", "TORCHELASTIC_RUN_ID")}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join([*map(str, paths), str(REPO), env.get("PYTHONPATH", "")]),
               **extra)
    return env


def _args(data: Path, out: Path, pipeline: str = "raw", mode: str = "loader") -> list[str]:
    return ["bench", "--pipeline", pipeline, "--data", str(data), "--mode", mode, "--epochs", "1", "--warmup", "1",
            "--repeats", "1", "--min-seconds", "0", "--batch-size", "8", "--workers", "1", "--device", "cpu",
            "--backbone", "small-cnn", "--crop", "random-pad", "--size", "8", "--pad", "2", "--out", str(out),
            "--dist-timeout", "120"]


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return write_tiny_prepared(tmp_path_factory.mktemp("ddp") / "tiny", 32, 11)


@pytest.fixture(scope="module")
def plugin(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("plugin")
    (d / "sitecustomize.py").write_text(IGNORES_RANK)
    return d


REASON = "ranks loaded 64 images in epoch 1 (repeat 0) of a 32-image split"


def test_rank_ignoring_adapter_reason_reaches_the_console_once(data, plugin, tmp_path):
    """Before: rank 1 returned at once, torchrun stopped rank 0 (SIGTERM) before it printed, and the
    console said only ``torchrun: rank 0 exited with signal SIGTERM; rank 1 exited with status 1``.
    Through ``--nproc``, whose launcher adds a line for every rank that did not record its status (rank 0
    records it after it printed): no such line, so rank 0 said why itself, as under the user's own torchrun."""
    out = tmp_path / "res"
    cmd = [sys.executable, "-m", "bench", *_args(data, out, "test-ignores-rank"), "--nproc", "2"]
    proc = subprocess.run(cmd, cwd=REPO, env=_env(plugin), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert proc.stdout.count(REASON) == 1, (proc.stdout, proc.stderr[-3000:])
    assert "an adapter must shard by config.rank/world_size" in proc.stdout
    assert proc.stdout.count("rows: ") == 1
    df = R.read_results(out)
    assert df.reason.item().startswith(f"pipeline test-ignores-rank: {REASON}")
    # every rank said why (rank 0 for both): no line of torchrun's
    assert "torchrun: rank" not in proc.stderr and "SIGTERM" not in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


def test_launcher_prints_the_recorded_reason_when_rank_0_was_stopped(data, tmp_path, capsys, monkeypatch):
    """Rank 0 stopped by torchrun before it printed (it recorded no status): ``--nproc``'s launcher prints
    the run's status lines from the rows the ranks recorded (``bench.harness.left``), once, exit the ranks'."""
    from bench import cli, dist
    from bench.harness import left

    out = tmp_path / "res"

    def ranks_stopped(args, command, argv=None):
        from bench.harness.runner import RUN_ID_ENV

        (out / R.RUNS_DIR).mkdir(parents=True)
        run = R.RunRows(os.environ[RUN_ID_ENV], "raw", "tiny", "loader", {})
        left.record(out, run, 0, 143, "stopped by the launcher (SIGTERM): another rank exited first")
        left.record(out, run, 1, 1, "RuntimeError: boom")
        return 1, {1: 1}  # rank 1 said why; rank 0 did not

    monkeypatch.setattr(dist, "launch_ranks", ranks_stopped)
    rc = cli.main(_args(data, out) + ["--nproc", "2"])
    got = capsys.readouterr().out
    assert rc == 1
    assert got.count("raw loader (rank 0): ERROR: rank 0: stopped by the launcher (SIGTERM)") == 1, got
    assert got.count("raw loader (rank 1): ERROR: rank 1: RuntimeError: boom") == 1, got
    assert f"rows: {out / R.RUNS_DIR}" in got


# ----------------------------------------------------------------------------- Ctrl-C


def _interrupt(cmd: list[str], tmp: Path, ready, timeout: float = 120) -> tuple[int, str]:
    """Start ``cmd`` in a process group of its own, wait until ``ready(stderr so far)``, then SIGINT the
    group (the terminal's Ctrl-C); (exit status, stderr)."""
    import signal
    import time

    err = tmp / "stderr.txt"
    with open(err, "w") as f:
        proc = subprocess.Popen(cmd, cwd=REPO, env=_env(), stdout=subprocess.DEVNULL, stderr=f, start_new_session=True)
    try:
        t0 = time.monotonic()
        while not ready(err.read_text()) and proc.poll() is None:
            assert time.monotonic() - t0 < timeout, err.read_text()
            time.sleep(0.1)
        assert proc.poll() is None, f"finished before it was interrupted: {err.read_text()}"
        os.killpg(proc.pid, signal.SIGINT)
        rc = proc.wait(timeout=90)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    return rc, err.read_text()


def _assert_one_interrupted(rc: int, err: str) -> None:
    assert rc == 130, err
    assert err.count("inrbench: interrupted") == 1, err
    assert "Traceback" not in err and "SignalException" not in err and "KeyboardInterrupt" not in err, err
    assert "inrbench: error" not in err, err


@pytest.mark.parametrize("when", ["starting", "running"])
def test_ctrl_c_on_bench_nproc_is_one_line_exit_130(data, tmp_path, when):
    """Before: torchrun's ``SignalException: Process N got signal: 2`` traceback and ``inrbench: interrupted``
    from the launcher and every rank. ``starting``: the ranks are still importing; ``running``: measuring."""
    import time

    out = tmp_path / "res"
    argv = _args(data, out, "raw", "train")
    argv[argv.index("--min-seconds") + 1] = "600"
    seen: dict[str, float] = {}

    def ready(err: str) -> bool:
        if when == "running" and out.exists():  # rank 0 claimed --out: the ranks are in run_bench
            seen.setdefault("t", time.monotonic())
            return time.monotonic() - seen["t"] > 3.0
        if when == "starting" and "inrbench: launching" in err:
            seen.setdefault("t", time.monotonic())
            return time.monotonic() - seen["t"] > 1.0
        return False

    rc, err = _interrupt([sys.executable, "-m", "bench", *argv, "--nproc", "2"], tmp_path, ready)
    _assert_one_interrupted(rc, err)


def test_ctrl_c_on_encode_nproc_is_one_line_exit_130(data, tmp_path):
    import time

    out = tmp_path / "s.inr"
    cmd = [sys.executable, "-m", "bench", "encode", str(data), "--preset", "demo", "--iterations", "100000",
           "--shard-size", "4", "--no-progress", "--out", str(out), "--dist-timeout", "60", "--nproc", "2"]
    work = tmp_path / ".s.inr.inrbench-encode.work"
    seen: dict[str, float] = {}

    def ready(err: str) -> bool:
        if work.is_dir():  # rank 0 opened the work folder: the ranks are encoding
            seen.setdefault("t", time.monotonic())
            return time.monotonic() - seen["t"] > 1.0
        return False

    rc, err = _interrupt(cmd, tmp_path, ready)
    _assert_one_interrupted(rc, err)


# ----------------------------------------------------------------------------- one error line


def _error_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if "inrbench: error:" in line]


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="needs a machine without CUDA")
def test_device_refused_before_torchrun_is_one_line(data, tmp_path, capsys):
    """``--device cuda:1 --nproc 2`` without CUDA: refused before torchrun, as one process refuses it: one line,
    exit 2. (Under the user's own torchrun, every rank refusing it: ``test_bench_distributed.
    test_device_refused_by_every_rank_is_one_line_under_torchrun``.)"""
    from bench import cli

    argv = _args(data, tmp_path / "res")
    argv[argv.index("--device") + 1] = "cuda:1"
    rc = cli.main([*argv, "--nproc", "2"])
    err = capsys.readouterr().err
    assert _error_lines(err) == ["inrbench: error: --device cuda:1: no CUDA device here (torch.cuda.is_available() is False)"], err
    assert err.endswith("\n")
    assert rc == 2 and "launching" not in err, err
    assert not (tmp_path / "res").exists()


def test_launcher_error_row_records_data_and_store_absolute(data, tmp_path, monkeypatch):
    """No rank wrote the run: ``--nproc``'s own error row records ``cfg.data`` and ``cfg.store`` as absolute
    paths (as every other row does), not as typed (relative to wherever the command ran)."""
    from bench import cli, dist
    from bench.outputs import claim

    out = tmp_path / "res"

    def killed(args, command, argv=None):
        with claim(out, "results", mode="append", lock=False):  # rank 0 claimed --out, then died
            pass
        return 1, {}

    monkeypatch.setattr(dist, "launch_ranks", killed)
    monkeypatch.chdir(data.parent)
    rc = cli.main(_args(Path(data.name), Path("..") / tmp_path.name / "res") + ["--nproc", "2"])
    assert rc == 1
    df = R.read_results(out)
    assert df.reason.item().startswith("torchrun exited with status 1 before rank 0 wrote this run")
    assert df["cfg.data"].item() == str(data) and Path(df["cfg.data"].item()).is_absolute()
