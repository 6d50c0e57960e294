"""Data-parallel ``inrbench bench`` (issue #13, harness side): gloo, 2 processes on the CPU.

Real 2-process launches, small and fast. Two launches of 2 ranks in torchrun's environment join the
group once and run, in it, ``bench.cli.main`` per run: every pipeline in loader and train mode; then
the DDP checks (gradient agreement, the all-reduced evaluation against one process), replay, refusals
and a failure injected on rank 1 (``INRBENCH_TEST_FAIL_RANK``). One goes through ``inrbench bench
--nproc 2`` (torchrun) and SIGKILLs rank 1. The aggregation rules and the schema are tested in-process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from dist_helpers import launch_here, once_per_session
from fixtures_datasets import write_tiny_prepared

from bench import results as R
from bench.harness.ranks import RankResult, aggregate, merge

REPO = Path(__file__).resolve().parent.parent
N_TRAIN, N_TEST, BS = 32, 11, 8  # 4 batches per rank per epoch; 11 test images split 6 + 5
PIPELINES = ("raw", "torch-jpeg", "dali", "inr", "torch-nvjpeg")
IN_GROUP = ("dali",)  # run in ``group``'s launch: the two launches take about as long
# a test that reads a shared launch may pay for it: 12 s alone, 20-25 s beside another test on 2 cores
LAUNCH = pytest.mark.slow


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR",
                                                            "MASTER_PORT", "TORCHELASTIC_RUN_ID")}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=str(REPO) + os.pathsep + env.get("PYTHONPATH", ""), **extra)
    return env


def _two_ranks(script: Path, *args: str, timeout: float = 300) -> tuple[int, str]:
    """``script`` as ranks 0 and 1 of a 2-process group on this machine, in torchrun's environment
    (``RANK``, ``WORLD_SIZE``, ``MASTER_PORT``...) without torchrun (its own torch import first, then its
    monitoring: seconds per launch; the launches of ``bench --nproc`` and the user's own torchrun are
    tested on their own): (the first failing rank's exit status or 0, both ranks' stderr)."""
    import socket

    with socket.socket() as s:  # a free port for rank 0's store, as torchrun --standalone picks one
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    world = {"WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    procs = [subprocess.Popen([sys.executable, str(script), *args], cwd=REPO, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True, env=_env(**world, RANK=str(k), LOCAL_RANK=str(k)))
             for k in (0, 1)]
    try:
        errs = [p.communicate(timeout=timeout)[1] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return next((p.returncode for p in procs if p.returncode), 0), "".join(errs)


def _bench_args(data: Path, out: Path, pipeline: str, mode: str, store: Path | None = None) -> list[str]:
    return ["bench", "--pipeline", pipeline, "--data", str(data), "--mode", mode, "--epochs", "2", "--warmup", "1",
            "--repeats", "1", "--min-seconds", "0", "--batch-size", str(BS), "--workers", "1", "--device", "cpu",
            "--backbone", "small-cnn", "--crop", "random-pad", "--size", "8", "--pad", "2", "--out", str(out),
            "--dist-timeout", "120", *(["--store", str(store)] if store else [])]


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return write_tiny_prepared(tmp_path_factory.mktemp("ddp") / "tiny", N_TRAIN, N_TEST)


def _store(data: Path, out: Path) -> Path:
    from bench.datasets.prepared import open_prepared
    from tests.store_helpers import fit_store_for_tests

    return fit_store_for_tests(open_prepared(data), out, iterations=20)


# ----------------------------------------------------------------------------- one launch, many runs

DRIVER = """
import contextlib, io, json, os, sys, time
from bench import cli, dist
shutdown, dist.shutdown = dist.shutdown, lambda: None  # one process group for every run of this driver
world = dist.init("cpu")  # joined here: each run's rank returns its status (bench.dist.run_rank) instead of exiting
exec(DDP_SCRIPT)  # the DDP checks first, on a fresh group
said = []
for job in json.loads(open(sys.argv[1]).read()):  # [{key, argv, env}]
    saved = {k: os.environ.get(k) for k in job["env"]}
    os.environ.update(job["env"])
    out, err = io.StringIO(), io.StringIO()
    t0 = time.perf_counter()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(job["argv"])
    said.append({"code": code, "out": out.getvalue(), "err": err.getvalue(), "s": time.perf_counter() - t0})
    for k, v in saved.items():
        os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
open(f"{sys.argv[2]}.rank{world.rank}", "w").write(json.dumps(said))
shutdown()
exec(DDP_ALONE)
"""


def _in_one_group(tmp_path_factory, name: str, jobs, ddp: bool = False) -> dict:
    """One launch of 2 gloo ranks (``_two_ranks``) that joins the group once and runs, in it, the DDP checks
    (``ddp``: ``DDP_SCRIPT``, then ``DDP_ALONE`` at the end) and the jobs, each through ``bench.cli.main``.
    ``jobs(folder)``: {name: (argv, env)}. Once per session (``once_per_session``): {name: (its --out,
    [rank 0's, rank 1's] {code, out, err, s})}, the DDP results under ``"ddp"``."""
    with once_per_session(tmp_path_factory, name) as (tmp, done):
        if not done:
            todo = jobs(tmp)
            (tmp / "jobs.json").write_text(json.dumps([{"key": k, "argv": a, "env": e} for k, (a, e) in todo.items()]))
            (tmp / "driver.py").write_text(f"DDP_SCRIPT = {DDP_SCRIPT if ddp else ''!r}\n"
                                           f"DDP_ALONE = {DDP_ALONE if ddp else ''!r}\n{DRIVER}")
            t0 = time.perf_counter()
            code, err = _two_ranks(tmp / "driver.py", str(tmp / "jobs.json"), str(tmp / "got.json"),
                                   str(tmp / "ddp.json"), timeout=600)
            assert code == 0, err[-3000:]
            print(f"{len(todo)} runs on 2 ranks in {time.perf_counter() - t0:.1f} s")
    ranks = [json.loads((tmp / f"got.json.rank{k}").read_text()) for k in (0, 1)]
    got = {tuple(j["key"]): (Path(j["argv"][j["argv"].index("--out") + 1]), [r[i] for r in ranks])
           for i, j in enumerate(json.loads((tmp / "jobs.json").read_text()))}
    if ddp:
        got["ddp"] = json.loads((tmp / "ddp.json").read_text())
    return got


@pytest.fixture(scope="module")
def every_pipeline(data, tmp_path_factory):
    """Every pipeline but ``IN_GROUP``'s x loader/train, and inr with ``--resident shard``, on 2 gloo ranks in
    one launch."""
    def jobs(tmp: Path) -> dict:
        store = _store(data, tmp / "train.inr")
        got = {(p, m): (_bench_args(data, tmp / f"{p}-{m}", p, m, store if p == "inr" else None), {})
               for p in PIPELINES if p not in IN_GROUP for m in ("loader", "train")}
        got["inr", "shard"] = (_bench_args(data, tmp / "inr-shard", "inr", "loader", store) + ["--resident", "shard"], {})
        return got

    return _in_one_group(tmp_path_factory, "bench-every-pipeline", jobs)


@pytest.fixture(scope="module")
def group(data, tmp_path_factory):
    """The DDP checks, then raw replay, ``IN_GROUP`` x loader/train, a device and a config every rank refuses,
    and rank 1 raising (``INRBENCH_TEST_FAIL_RANK``, last), on 2 gloo ranks in one launch."""
    def jobs(tmp: Path) -> dict:
        got = {("raw", "replay"): (_bench_args(data, tmp / "raw-replay", "raw", "replay"), {})}
        got.update({(p, m): (_bench_args(data, tmp / f"{p}-{m}", p, m), {}) for p in IN_GROUP
                    for m in ("loader", "train")})
        if not torch.cuda.is_available():  # --device cuda:1 refused: needs a machine without CUDA
            device = _bench_args(data, tmp / "device", "raw", "loader")
            device[device.index("--device") + 1] = "cuda:1"
            got["refused", "device"] = (device, {})
        got["refused", "config"] = (_bench_args(data, tmp / "config", "raw", "train") + ["--eval-split", "nope"], {})
        got["raw", "fail"] = (_bench_args(data, tmp / "raw-fail", "raw", "train"), {"INRBENCH_TEST_FAIL_RANK": "1"})
        return got

    return _in_one_group(tmp_path_factory, "bench-group", jobs, ddp=True)


def _one_run(out: Path) -> tuple[pd.DataFrame, Path]:
    df = R.read_results(out)
    assert df["run_id"].nunique() == 1  # one run id shared by the ranks
    return df, next((out / R.RUNS_DIR).iterdir())


def _ok(df: pd.DataFrame, metric: str, rank=None, epoch=None) -> pd.DataFrame:
    d = df[(df.metric == metric) & (df.status == "ok")]
    if epoch is not None:
        d = d[d["epoch"] == epoch]
    return d[d["rank"].isna()] if rank is None else d[d["rank"] == rank]


def _code(ranks: list[dict]) -> int:
    """The run's exit status: every rank's own (each returned it to the driver)."""
    assert ranks[0]["code"] == ranks[1]["code"], ranks
    return ranks[0]["code"]


@LAUNCH
def test_resident_shard_holds_half_the_store_per_rank(every_pipeline):
    """``--resident shard``: saved in cfg.*, and each rank holds half the store (within one image)."""
    (shard_out, ranks), (all_out, _) = every_pipeline["inr", "shard"], every_pipeline["inr", "loader"]
    df, _ = _one_run(shard_out)
    whole = R.read_results(all_out)
    assert _code(ranks) == 0 and (df.status != "error").all() and (df["cfg.pipe.resident"] == "shard").all()
    assert (whole["cfg.pipe.resident"] == "all").all()
    for k in (0, 1):
        held = _ok(df, "resident_device_bytes", k).value.max()
        full = _ok(whole, "resident_device_bytes", k).value.max()
        assert abs(held - full / 2) <= full / N_TRAIN + 64


@LAUNCH
@pytest.mark.parametrize("mode", ["loader", "train"])
@pytest.mark.parametrize("pipeline", PIPELINES)
def test_every_pipeline_two_gloo_ranks(request, pipeline, mode):
    out, ranks = request.getfixturevalue("group" if pipeline in IN_GROUP else "every_pipeline")[(pipeline, mode)]
    code = _code(ranks)
    df, run_dir = _one_run(out)
    if df.iloc[0].status == "skip":  # torch-nvjpeg (no CUDA), dali without its CPU backend: one skip row
        assert code == 0 and len(df) == 1 and pd.isna(df.iloc[0]["rank"]) and df.iloc[0].reason
        pytest.skip(f"{pipeline} unavailable here (one skip row): {df.iloc[0].reason}")
    assert code == 0, df[df.status != "ok"].reason.tolist()
    assert ranks[0]["out"].count("img/s by rank") == 1 and ranks[1]["out"] == ""  # rank 0 alone prints
    assert set(df["rank"].dropna().astype(int)) == {0, 1}
    assert (df.loc[df["rank"] == 1, "cfg.pipe.rank"] == 1).all() and (df["cfg.pipe.world_size"] == 2).all()
    assert (df["cfg.dist.world_size"] == 2).all() and (df["cfg.dist.backend"] == "gloo").all()
    env = json.loads((run_dir / R.ENV_FILE).read_text())["distributed"]
    assert env["world_size"] == 2 and env["backend"] == "gloo" and env["nnodes"] == 1
    assert [r["local_rank"] for r in env["ranks"]] == [0, 1] and all(r["hostname"] for r in env["ranks"])
    for epoch in (1, 2):  # the measured epochs: global img/s = all ranks' images / the slowest epoch
        secs = [_ok(df, "epoch_s", k, epoch).value.item() for k in (0, 1)]
        imgs = [_ok(df, "images", k, epoch).value.item() for k in (0, 1)]
        agg = _ok(df, "images_per_s", epoch=epoch).value.item()
        assert agg == pytest.approx(sum(imgs) / max(secs), rel=1e-9)
        assert _ok(df, "epoch_s", epoch=epoch).value.item() == pytest.approx(max(secs))
        assert _ok(df, "images", epoch=epoch).value.item() == sum(imgs)
    ttfb = [_ok(df, "time_to_first_batch_s", k).value.item() for k in (0, 1)]
    assert _ok(df, "time_to_first_batch_s").value.item() == pytest.approx(max(ttfb))
    steps = pd.read_csv(run_dir / R.STEPS_FILE)
    assert set(steps["rank"]) == {0, 1}
    if mode == "train":
        acc = [_ok(df, "test_acc", k).value.item() for k in (None, 0, 1)]
        assert acc[0] == acc[1] == acc[2]  # all-reduced: the same on every rank
        assert _ok(df, "test_images").value.item() == N_TEST
        preds = pd.read_csv(run_dir / R.PREDICTIONS_FILE)
        assert preds["image"].tolist() == list(range(N_TEST))  # gathered: complete, in order
        assert (preds.label == preds.prediction).mean() == pytest.approx(acc[0])


@LAUNCH
def test_replay_trains_on_every_rank(group):
    """``--mode replay`` on 2 ranks: exit 0, one run of 2 ranks, rank 0 alone prints the summary.
    (``--nproc``'s torchrun line: ``test_rank_killed_outright_still_leaves_one_error_row``.)"""
    out, ranks = group["raw", "replay"]
    assert _code(ranks) == 0, ranks
    assert ranks[0]["out"].count("img/s by rank") == 1 and ranks[1]["out"] == ""
    df, _ = _one_run(out)
    assert len(_ok(df, "train_loss", 0)) == len(_ok(df, "train_loss", 1)) == 3  # replay trains on every rank
    assert _ok(df, "pipeline_batches").value.sum() == 0  # nothing decoded while replay is timed


@LAUNCH
def test_failure_on_one_rank_is_an_error_row_naming_it_no_hang(group):
    """Rank 1 raises mid-run (the test hook): rank 0 writes one error row naming rank 1, both end with a
    crash's status (1), neither waits for the collective timeout."""
    out, ranks = group["raw", "fail"]
    assert [r["code"] for r in ranks] == [1, 1]  # a crash on a rank: its class, on every rank
    elapsed = max(r["s"] for r in ranks)
    assert elapsed < 100, f"took {elapsed:.0f} s: a rank waited for the collective timeout (120 s)"
    df, _ = _one_run(out)
    assert df.metric.tolist() == ["run"] and df.status.tolist() == ["error"]
    assert df["rank"].tolist() == [1]
    assert df.reason.item().startswith("rank 1: RuntimeError: injected failure on rank 1")
    assert "ERROR: rank 1: RuntimeError" in ranks[0]["out"] and ranks[1]["out"] == ""


def _error_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if "inrbench: error:" in line]


@LAUNCH
@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_device_refused_by_every_rank_is_one_line_under_torchrun(group):
    """``--device cuda:1`` without CUDA under the user's torchrun: before, each rank printed the same error,
    run together on one line (``...(torch.cuda.is_available() is False)inrbench: error: --device cuda:1: ...``).
    Now rank 0 alone says it, once, and every rank ends with exit 2. (``--nproc``: refused before torchrun,
    ``test_dist_console.test_device_refused_before_torchrun_is_one_line``.)"""
    out, ranks = group["refused", "device"]
    assert [r["code"] for r in ranks] == [2, 2], ranks
    assert _error_lines(ranks[0]["err"] + ranks[1]["err"]) == [
        "inrbench: error: --device cuda:1: no CUDA device here (torch.cuda.is_available() is False)"], ranks
    assert ranks[0]["err"].endswith("\n")
    assert not out.exists()


@LAUNCH
def test_config_refused_by_every_rank_is_one_line_under_torchrun(group):
    """An error every rank finds in its config (here ``--eval-split`` naming no split, in train mode) is
    rank 0's one line, once, exit 2 from every rank (each ends itself, none is stopped)."""
    _, ranks = group["refused", "config"]
    assert [r["code"] for r in ranks] == [2, 2], ranks
    lines = _error_lines(ranks[0]["err"] + ranks[1]["err"])
    assert len(lines) == 1 and lines[0].startswith("inrbench: error: --eval-split 'nope'"), ranks


def test_rank_killed_outright_still_leaves_one_error_row(data, tmp_path, monkeypatch, capfd):
    """``inrbench bench --nproc 2`` builds the torchrun line (each rank runs one process) and runs it. Rank 1
    is SIGKILLed: torchrun stops rank 0 too. Rank 0 records the run first (stopped, through
    ``bench.harness.left``, or its collective failed first and its merge names rank 1), so ``--nproc``'s
    launcher, which writes its own row only where no rank did, adds nothing: error rows only, naming
    what happened, in a run folder with env.json and config.json. (Before, under the user's own torchrun:
    no runs/ at all, only the folder's marker.)"""
    out = tmp_path / "res"
    rc, _, err = launch_here(monkeypatch, capfd, *_bench_args(data, out, "raw", "loader"), "--nproc", "2",
                             INRBENCH_TEST_FAIL_RANK="1:kill")
    assert "launching torchrun --standalone --nnodes 1 --nproc-per-node 2 -m bench bench" in err
    assert "--nproc " not in err.split("-m bench bench", 1)[1].splitlines()[0]  # each rank runs one
    assert rc != 0
    df, run_dir = _one_run(out)
    assert set(df.metric) == {"run"} and set(df.status) == {"error"}
    _names_the_broken_group(df)
    assert not df.reason.str.contains("before rank 0 wrote this run").any()
    assert (run_dir / "env.json").exists() and (run_dir / "config.json").exists()


def _names_the_broken_group(df):
    """Rank 1 was killed. Either rank 0 was stopped first and recorded itself (``rank 0: ...``, its SIGTERM
    record or its own collective failure), or its collective failed first and its merge recorded rank 1
    (``rank 1: no result: the process group failed (...)``): which one comes first is a race between
    gloo and torchrun; both name what happened."""
    reasons = df.reason.tolist()
    by_rank = {int(r): why for r, why in zip(df["rank"], reasons, strict=True) if r == r}
    assert (0 in by_rank and by_rank[0].startswith("rank 0: ")) or \
        (1 in by_rank and by_rank[1].startswith("rank 1: no result: the process group failed")), reasons
    # gloo says "Connection closed by peer" or "Connection reset by peer", as the peer's socket went
    assert any("by peer" in r or "stopped by the launcher (SIGTERM)" in r or "process group failed" in r
               for r in reasons), reasons


def _rows(run_id: str = "r1") -> R.RunRows:
    return R.RunRows(run_id, "raw", "tiny", "train", {"pipe": {"rank": 1}})


def test_left_records_every_leaving_rank_and_never_replaces_rank_0s_write(tmp_path):
    from bench.harness import left

    out = tmp_path / "res"
    left.record(out, _rows(), 1, 2, "bad input: x.jpg: truncated")
    run_dir = left.record(out, _rows(), 3, 1, "RuntimeError: NCCL error")
    assert json.loads((run_dir / "rank1.left.json").read_text()) == {"rank": 1, "exit_code": 2,
                                                                   "reason": "bad input: x.jpg: truncated"}
    df = R.read_results(out)
    assert df["rank"].tolist() == [1, 3] and set(df.status) == {"error"}
    assert df.reason.tolist() == ["rank 1: bad input: x.jpg: truncated", "rank 3: RuntimeError: NCCL error"]
    assert (run_dir / "env.json").is_file()
    merged = R.RunRows("r1", "raw", "tiny", "train", {})  # rank 0 writes the run after all: its rows stand
    merged.fail_ranks("error", {1: "rank 1: bad input: x.jpg: truncated", 2: "rank 2: no result"})
    with left.rank0_writes(run_dir):
        R.write_run(out, merged)
    left.record(out, _rows(), 2, 143, "stopped by the launcher (SIGTERM): another rank exited first")
    assert R.read_results(out)["rank"].tolist() == [1, 2]  # rank 0's record, not replaced
    assert (run_dir / "rank2.left.json").is_file()


def test_a_rank_0_write_that_fails_before_its_rows_keeps_the_left_records_in_charge(tmp_path):
    from bench.harness import left

    out = tmp_path / "res"
    run_dir = left.record(out, _rows(), 1, 2, "bad input: x.jpg: truncated")
    with pytest.raises(OSError), left.rank0_writes(run_dir):  # e.g. a full disk before rows.csv
        raise OSError(28, "No space left on device")
    left.record(out, _rows(), 2, 143, "stopped by the launcher (SIGTERM): another rank exited first")
    assert R.read_results(out)["rank"].tolist() == [1, 2]  # rank 2's reason still reaches the rows


def test_sigterm_records_the_rank_with_its_failure_so_far(tmp_path):
    import signal

    from bench.harness import left

    class Left(BaseException):
        pass

    def leave(code):
        raise Left(code)

    out, rows = tmp_path / "res", _rows()
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(Left) as got, left.on_sigterm(out, rows, 1, lambda: "Connection closed by peer", leave):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the handler runs at once; never reached
    assert got.value.args == (128 + signal.SIGTERM,) and signal.getsignal(signal.SIGTERM) is before
    df = R.read_results(out)
    assert df.reason.tolist() == ["rank 1: stopped by the launcher (SIGTERM): another rank exited first; "
                                  "before that: the process group failed: Connection closed by peer"]


# ----------------------------------------------------------------------------- DDP and evaluation

DDP_SCRIPT = """
import json, sys
import numpy as np, torch
from bench import dist
from bench.train.backbones import create_backbone
from bench.train.evaluate import evaluate
from bench.train.expand import ExpandConfig, ExpandTrainer
from bench.train.loop import Trainer, TrainConfig
from pipelines.base import Augment, Batch

world = dist.init("cpu")  # joined by the driver already
cfg = TrainConfig(lr=0.1, momentum=0.9, weight_decay=5e-4)

def batch(rank):
    g = torch.Generator().manual_seed(100 + rank)
    return Batch(images=torch.randn(6, 3, 8, 8, generator=g), labels=torch.randint(0, 4, (6,), generator=g))

def params(model):
    return [p.detach().clone().numpy().tolist() for p in model.parameters()]

torch.manual_seed(0)
init = create_backbone("small-cnn", 4)
torch.manual_seed(world.rank + 7)  # the ranks' own random state differs; DDP broadcasts rank 0's weights
tr = Trainer(create_backbone("small-cnn", 4) if world.rank else init, cfg, "cpu", total_steps=10, ddp=True)
start = params(tr.model)
tr.step(batch(world.rank))
after = params(tr.model)

# network expansion: growth re-wraps DDP on every rank at the same step
torch.manual_seed(0)
ex = ExpandTrainer(create_backbone("small-cnn", 4), cfg, "cpu", 4, ExpandConfig.parse("0.5:-:1,1:-:1"), ddp=True)
ex.step(batch(world.rank)); ex.end_epoch(); ex.step(batch(world.rank))
grown = params(ex.model)

rng = np.random.default_rng(3)
labels = rng.integers(0, 4, 11)
images = (rng.integers(0, 255, (11, 8, 8, 3))).astype(np.uint8)
aug = Augment(crop="random-pad", size=8, pad=2)
ev = evaluate(tr.model, images, labels, aug, "cpu")
got = dist.all_gather_object({"start": start, "after": after, "grown": grown,
                              "eval": [ev.accuracy, ev.loss, ev.images, ev.predictions.tolist()]})
"""

# after the driver's other runs, out of the group (bench.dist.shutdown undone): one process, on rank 0
DDP_ALONE = """
if world.rank == 0:
    # one process, rank 0's model after the DDP step (buffers as evaluate broadcast them)
    one = evaluate(tr.model, images, labels, aug, "cpu")
    # one process from the averaged gradients: the same init (seed 0), each rank's batch, one step
    torch.manual_seed(0)
    ref = Trainer(create_backbone("small-cnn", 4), cfg, "cpu", total_steps=10)
    grads = []
    for r in range(world.world_size):
        ref.model.train(); ref.opt.zero_grad()
        b = batch(r)
        ref.loss_fn(ref.model(b.images).float(), b.labels).backward()
        grads.append([p.grad.clone() for p in ref.model.parameters()])
    for p, *g in zip(ref.model.parameters(), *grads):
        p.grad = sum(g) / len(g)
    ref.opt.step()
    json.dump({"ranks": got, "reference": params(ref.model),
               "one": [one.accuracy, one.loss, one.images, one.predictions.tolist()]}, open(sys.argv[3], "w"))
"""


@LAUNCH
def test_ddp_parameters_agree_and_equal_the_averaged_gradient_step(group):
    """After one DDP step every rank's parameters are identical, and equal to one process applying
    the gradients averaged over the ranks' batches; a grown (expand) model is re-wrapped and stays
    identical; evaluation over 2 ranks returns what one process gets for the whole split."""
    got = group["ddp"]
    r0, r1 = got["ranks"]
    flat = lambda ps: np.concatenate([np.ravel(np.asarray(p, dtype=np.float64)) for p in ps])  # noqa: E731
    assert np.array_equal(flat(r0["start"]), flat(r1["start"]))  # DDP broadcast rank 0's init
    assert np.array_equal(flat(r0["after"]), flat(r1["after"]))  # identical after the step
    assert not np.array_equal(flat(r0["after"]), flat(r0["start"]))  # and it did move
    np.testing.assert_allclose(flat(r0["after"]), flat(got["reference"]), rtol=1e-5, atol=1e-6)
    assert np.array_equal(flat(r0["grown"]), flat(r1["grown"]))
    assert r0["eval"] == r1["eval"]  # all-reduced and gathered: the same on both ranks
    acc, loss, n, preds = r0["eval"]
    one_acc, one_loss, one_n, one_preds = got["one"]
    assert n == one_n == 11 and preds == one_preds and acc == one_acc
    assert loss == pytest.approx(one_loss, rel=1e-6)


# ----------------------------------------------------------------------------- rows, in-process

def _rank_rows(rank: int, epoch_s: float, images: int, wait: float, cpu_s: float, gpu: float | None,
               run_id: str = "r") -> list[dict]:
    run = R.RunRows(run_id, "raw", "d", "train", {"pipe": {"rank": rank}}, rank=rank)
    run.add("epoch_s", epoch_s, "s", repeat=0, epoch=1)
    run.add("images_per_s", images / epoch_s, "img/s", repeat=0, epoch=1)
    run.add("images", images, "1", repeat=0, epoch=1)
    run.add("data_wait_s", wait, "s", repeat=0, epoch=1)
    run.add("compute_s", epoch_s - wait, "s", repeat=0, epoch=1)
    run.add("train_loss", 1.0 + rank, "1", repeat=0, epoch=1)
    run.add("cpu_seconds", cpu_s, "s", repeat=0)
    run.add("images_per_cpu_s", images / cpu_s, "img/cpu-s", repeat=0)
    run.add("test_acc", 0.5, "1", repeat=0, epoch=1)
    run.add("some_new_metric", 7.0, "1", repeat=0)
    if gpu is None:
        run.unavailable("gpu_mem_used_peak_bytes", "bytes", "no NVML here", repeat=0)
    else:
        run.add("gpu_mem_used_peak_bytes", gpu, "bytes", repeat=0)
    return run.rows()


def test_aggregate_rules_with_real_numbers():
    """Global img/s = all images / the slowest epoch; the slowest rank's split; CPU per image over
    the job; train loss the mean; all-reduced values once; GPU memory the largest device's; a metric
    skipped on one rank is a skip row naming it; a metric without a rule stays per rank."""
    a = {(r["metric"], r["epoch"]): r for r in aggregate([_rank_rows(0, 2.0, 64, 0.5, 4.0, 100.0),
                                                          _rank_rows(1, 4.0, 60, 1.5, 2.0, 300.0)])}
    assert a[("images_per_s", 1)]["value"] == pytest.approx(124 / 4.0)
    assert a[("epoch_s", 1)]["value"] == 4.0 and a[("images", 1)]["value"] == 124
    assert a[("data_wait_s", 1)]["value"] == 1.5 and a[("compute_s", 1)]["value"] == 2.5  # rank 1's: the slowest
    assert a[("images_per_cpu_s", None)]["value"] == pytest.approx(124 / 6.0)
    assert a[("train_loss", 1)]["value"] == 1.5 and a[("test_acc", 1)]["value"] == 0.5
    assert a[("gpu_mem_used_peak_bytes", None)]["value"] == 300.0
    assert ("some_new_metric", None) not in a
    b = {r["metric"]: r for r in aggregate([_rank_rows(0, 2.0, 64, 0.5, 4.0, None), _rank_rows(1, 4.0, 60, 1.5, 2.0, 9.0)])}
    assert b["gpu_mem_used_peak_bytes"]["status"] == "skip" and b["gpu_mem_used_peak_bytes"]["reason"] == "rank 0: no NVML here"


def test_merge_failed_rank_is_one_error_row_and_exit_class():
    ok = RankResult(0, "ok", 0, rows=_rank_rows(0, 2.0, 64, 0.5, 4.0, 1.0))
    bad = RankResult(1, "error", 3, "out of memory: CUDA out of memory")
    run = R.RunRows("r", "raw", "d", "train", {"x": 1})
    assert merge(run, [ok, bad]) == (3, None)
    df = R.to_frame(run.rows())
    assert df.metric.tolist() == ["run"] and df["rank"].tolist() == [1]
    assert df.reason.item() == "rank 1: out of memory: CUDA out of memory" and run.status == "error"
    run = R.RunRows("r", "raw", "d", "train", {"x": 1})  # a rank unheard of when the group broke
    assert merge(run, [ok, None], broken="timeout")[0] == 1
    assert R.to_frame(run.rows()).reason.item() == "rank 1: no result: the process group failed (timeout)"
    run = R.RunRows("r", "torch-nvjpeg", "d", "loader", {})  # skipped everywhere alike: one skip row
    assert merge(run, [RankResult(k, "skip", 0, "unavailable: no CUDA") for k in (0, 1)]) == (0, None)
    df = R.to_frame(run.rows())
    assert len(df) == 1 and df.status.item() == "skip" and pd.isna(df["rank"].item())


def test_report_never_pools_world_sizes(tmp_path):
    """A dataset run by 1 and by 2 processes: the report reads two datasets, ``d`` and ``d (2 processes)``."""
    from bench.report.load import load

    for run_id, world, ips in (("one", 1, 10.0), ("two", 2, 18.0)):
        run = R.RunRows(run_id, "raw", "d", "loader", {"pipe": {"world_size": world}})
        run.add("images_per_s", ips, "img/s", repeat=0, epoch=1)
        R.write_run(tmp_path / "res", run)
    rows = load(tmp_path / "res").rows
    got = rows[rows.metric == "images_per_s"].set_index("dataset")["value"].to_dict()
    assert got == {"d": 10.0, "d (2 processes)": 18.0}
