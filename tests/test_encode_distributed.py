"""``inrbench encode --nproc 2`` (gloo, two CPU processes under torchrun) through the real CLI:
the store is byte-identical to a one-process encode; killing a rank and rerunning resumes to it;
a failing rank is reported in one line by rank 0; bad input is refused before torchrun starts."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from bench.datasets.prepared import SplitData, write_prepared
from tests.cli_helpers import assert_one_line_error, run_cli
from tests.dist_helpers import launch_here, once_per_session
from tests.fixtures_datasets import write_tiny_prepared

REPO = Path(__file__).resolve().parents[1]
N = 18  # 6 shards of 3: rank 0 fits 0, 2, 4 and rank 1 fits 1, 3, 5
ARGS = ["--preset", "demo", "--iterations", "20", "--shard-size", "3", "--no-progress"]


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def encode_cmd(data: Path, out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "bench", "encode", str(data), *ARGS, "--out", str(out), "--dist-timeout", "60", *extra]


def env() -> dict[str, str]:
    """This environment for a launch: one OpenMP thread per rank (torchrun's default; conftest sets 2),
    no torchrun variables of an enclosing run."""
    out = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
                                                            "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID")}
    return {**out, "OMP_NUM_THREADS": "1"}


def run(cmd: list[str], timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=REPO, env=env(), capture_output=True, text=True, timeout=timeout)


def launched_here(monkeypatch, capfd, data: Path, out: Path, *extra: str) -> subprocess.CompletedProcess:
    """``encode_cmd``'s command with its ``--nproc`` launcher in this process (``launch_here``)."""
    rc, stdout, stderr = launch_here(monkeypatch, capfd, *encode_cmd(data, out, *extra)[3:])
    return subprocess.CompletedProcess(encode_cmd(data, out, *extra), rc, stdout, stderr)


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    """The dataset, once per session (``once_per_session``): the shared launches' jobs name its path."""
    with once_per_session(tmp_path_factory, "encode-data") as (tmp, done):
        if not done:
            write_tiny_prepared(tmp / "data", N, 2)
    return tmp / "data"


@pytest.fixture(scope="module")
def single(data, tmp_path_factory) -> str:
    """sha256 of the one-process store ``data.parent / "single.inr"`` (one torch thread, as each torchrun
    rank has), once per session."""
    out = data.parent / "single.inr"
    with once_per_session(tmp_path_factory, "encode-single") as (_, done):
        if not done:
            threads = torch.get_num_threads()
            try:
                from bench import cli

                assert cli.main(["encode", str(data), *ARGS, "--threads", "1", "--out", str(out)]) == 0
            finally:
                torch.set_num_threads(threads)
    return sha256(out)


def _rank_pid(root: subprocess.Popen, rank: str, deadline: float) -> int:
    import psutil

    while time.monotonic() < deadline:
        for p in psutil.Process(root.pid).children(recursive=True):
            try:
                if p.environ().get("RANK") == rank and "bench" in p.cmdline():
                    return p.pid
            except psutil.Error:
                pass
        time.sleep(0.01)
    raise AssertionError(f"no rank {rank} process")


@pytest.fixture(scope="module")
def killed(data, tmp_path_factory) -> tuple[Path, dict[str, int]]:
    """A 2-process encode whose rank 1 was SIGKILLed once its first shard was on disk: (its store path,
    {shard file kept in the work folder: inode}). Once per session (``once_per_session``); its
    ``work.json`` (the job) is also kept as ``job.json`` beside it."""
    with once_per_session(tmp_path_factory, "encode-killed") as (tmp, done):
        out = tmp / "killed.inr"
        work = tmp / ".killed.inr.inrbench-encode.work"
        if not done:
            root = subprocess.Popen(encode_cmd(data, out, "--nproc", "2"), cwd=REPO, env=env(), stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True, start_new_session=True)
            try:
                deadline = time.monotonic() + 90
                while not (work / "shard_00001.inr").exists():  # rank 1's first shard is on disk
                    assert root.poll() is None and time.monotonic() < deadline, "encode ended before a shard was written"
                    time.sleep(0.005)
                os.kill(_rank_pid(root, "1", deadline), signal.SIGKILL)  # rank 1 still has shards 3 and 5 to fit
                _, err = root.communicate(timeout=90)
            finally:
                if root.poll() is None:
                    os.killpg(root.pid, signal.SIGKILL)
                    root.wait()
            assert root.returncode != 0 and not out.exists(), err[-2000:]
            shutil.copy(work / "work.json", tmp / "job.json")
            (tmp / "kept.json").write_text(json.dumps({p.name: p.stat().st_ino for p in work.glob("shard_*.inr")}))
    return out, json.loads((tmp / "kept.json").read_text())


def test_killing_a_rank_leaves_the_finished_shards_and_no_store(killed):
    """Rank 1 SIGKILLed after its first shard (``killed``: the encode failed, no store): what the ranks
    finished is on disk, what rank 1 had left is not."""
    out, kept = killed
    assert not out.exists() and "shard_00001.inr" in kept and len(kept) < 6


def test_rerunning_after_a_killed_rank_resumes_to_the_same_store(data, single, killed, monkeypatch, capfd):
    """After ``killed``, the rerun resumes every shard on disk and writes the store one process writes.
    The rerun through ``--nproc``: its torchrun line (each rank runs one process), exit 0, rank 0's header,
    and each rank's own shards (rank 0: 0, 2, 4; rank 1: 1, 3, 5; 9 images each)."""
    out, kept = killed
    work = out.with_name(".killed.inr.inrbench-encode.work")
    r = launched_here(monkeypatch, capfd, data, out, "--nproc", "2", "--keep-work")
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    assert sha256(out) == single
    assert "torchrun --standalone --nnodes 1 --nproc-per-node 2 -m bench encode" in r.stderr
    assert "--nproc " not in r.stderr.split("-m bench encode", 1)[1].splitlines()[0]  # each rank runs one
    assert "2 processes (gloo)" in r.stdout
    # every shard on disk was kept, none refitted, each by the rank that fits it
    have = {k: sum(f"shard_{i:05d}.inr" in kept for i in range(k, 6, 2)) for k in (0, 1)}
    assert "; ".join(f"rank {k} {3 - have[k]} fitted, {have[k]} resumed (9 images)" for k in (0, 1)) in r.stdout, r.stdout
    # rank 0 says so up front, for every rank's shards, as a one-process rerun does
    assert f"encode: resuming, {len(kept)} of 6 shards already fitted (work folder {work})" in r.stdout
    assert {n: (work / n).stat().st_ino for n in kept} == kept
    assert sorted(p.name for p in work.glob("shard_*.inr")) == [f"shard_{i:05d}.inr" for i in range(6)]


def test_a_failing_rank_is_reported_by_rank_0_in_one_line(data, killed, tmp_path, monkeypatch, capfd):
    out = tmp_path / "fail.inr"
    work = tmp_path / ".fail.inr.inrbench-encode.work"
    work.mkdir()
    shutil.copy(killed[0].with_name("job.json"), work / "work.json")  # the same job
    (work / "shard_00001.inr").mkdir()  # rank 1 cannot write its first shard there
    r = launched_here(monkeypatch, capfd, data, out, "--nproc", "2")
    assert r.returncode == 2 and not out.exists()  # the ranks' class through --nproc, not torchrun's 1
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("inrbench: error:")]
    assert len(lines) == 1 and "1 of 2 ranks failed (rank 1: " in lines[0], r.stderr[-3000:]
    assert ".fail.inr.inrbench-encode.work: rerun to resume" in lines[0]
    assert {p.name for p in work.glob("shard_*.inr") if p.is_file()} == {"shard_00000.inr", "shard_00002.inr",
                                                                         "shard_00004.inr"}


def test_bad_input_is_refused_before_torchrun_starts(data, single, capsys, tmp_path):
    existing = data.parent / "single.inr"
    rc, _, err = run_cli(capsys, "encode", data, *ARGS, "--out", existing, "--nproc", "2")
    assert_one_line_error(rc, err, "already exists (pass --overwrite")
    rc, _, err = run_cli(capsys, "encode", data, *ARGS, "--out", tmp_path / "x.inr", "--nproc", "2", "--bits", "3")
    assert_one_line_error(rc, err, "--bits '3': widths must be 4..16 or 32")
    native = tmp_path / "native"
    ims = [np.full((h, w, 3), 9, np.uint8) for h, w in ((8, 8), (8, 12))]
    write_prepared(native, {"train": SplitData(ims, np.array([0, 1]), ids=["0", "1"])}, {"source": "x", "classes": ["a", "b"]})
    rc, _, err = run_cli(capsys, "encode", native, *ARGS, "--out", tmp_path / "n.inr", "--nproc", "2")
    assert_one_line_error(rc, err, "native-size dataset", "is encoded by one process")
    assert not list(tmp_path.glob("*.inr*"))


@pytest.mark.parametrize("bad", ["device", "split"])
def test_a_refusal_under_the_users_own_torchrun_is_one_line(data, tmp_path, bad):
    """Under a plain ``torchrun`` (no ``--nproc`` pre-check), a refusal every rank of a node finds alike is said
    once, by local rank 0, which exits 2; torchrun then stops the other rank, which waited silently
    (``bench.dist.said_once_per_node``). Before, each rank printed the same line."""
    if bad == "device" and torch.cuda.is_available():
        pytest.skip("needs a machine without CUDA: --device cuda:1 must be refused")
    extra = ["--device", "cuda:1"] if bad == "device" else ["--split", "nope"]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1", "--nproc-per-node", "2",
           *encode_cmd(data, tmp_path / "t.inr", *extra)[1:]]  # torchrun ... -m bench encode ...
    t0 = time.monotonic()
    r = run(cmd)
    lines = [ln for ln in r.stderr.splitlines() if "inrbench: error:" in ln]
    expect = "--device cuda:1: no CUDA device here" if bad == "device" else "'nope'"
    assert len(lines) == 1 and expect in lines[0], r.stderr[-3000:]
    root = r.stderr[r.stderr.index("Root Cause"):]  # torchrun's summary: rank 0 failed first, with status 2
    assert r.returncode != 0 and "rank      : 0" in root and "exitcode  : 2" in root, r.stderr[-3000:]
    assert time.monotonic() - t0 < 25  # rank 1 was stopped by torchrun, not after its 30 s wait
    assert not (tmp_path / "t.inr").exists()
