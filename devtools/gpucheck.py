"""``scripts/gpu-check OUT_DIR``: the one command to run when a GPU machine is lent, for minutes.

Runs the checks that need a GPU in the order of their value (``STEPS``) within one time budget, each step
in a process group of its own under its own cap, and writes ``gpu-check.json``, ``gpu-check.md`` and the
logs' tarball after every step, so a run cut short still reports. Plan, statuses and exit codes:
docs/gpu-check.md. ``--cpu`` runs the same plumbing without a GPU (``tests/test_gpucheck*.py``).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib
import json
import math
import os
import pkgutil
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import time
import traceback
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import yaml

from bench import outputs
from bench.argtypes import positive_float
from bench.atomic import atomic_open, atomic_write_json, atomic_write_text
from bench.cli import OneLineParser, guarded
from bench.datasets.prepared import open_prepared
from bench.envinfo import git_info, library_versions, torch_nvjpeg_decoder
from bench.errors import InputError
from bench.outputs import claim
from bench.perf.decode import decoder_variants
from bench.results import read_results
from devtools import pytest_log
from devtools.pytest_log import short

REPO = Path(__file__).resolve().parent.parent
SCHEMA_VERSION = 2
CALL_S = 540.0  # the lent machine's command: at most 9 minutes (its tool allows 10), so a rerun still fits
BUDGET_S = 510.0  # every step together, within CALL_S with room for start-up and the last writes
RESERVE_S = 5.0  # kept back from the budget to write the report
PSNR_MIN_DB = 30.0  # CPU vs device output of a pipeline: agreement floor (8-bit levels)
QAT_TOL_DB = 0.5  # prune + 8-bit + QAT encode: CUDA within this of the CPU encode
CPU_CAP_FACTOR = 3.0  # --cpu: a 2-core CI machine runs each step's small CPU work slower than a GPU machine
LOGS = "gpu-check-logs.tar.gz"
STATUSES = ("ok", "fail", "skip", "not installed", "killed")
CHILD = [sys.executable, "-m", "devtools.gpucheck"]  # how a step's subprocess starts (tests start another)
GRACE_S = 5.0  # a step's process is killed this long after its deadline (tests of the caps set less)


class Skip(Exception):
    """A step (or part of one) that cannot run here; the message says why."""


class NotInstalled(Skip):
    """A library the step needs is not installed here (DALI, TorchCodec): reported, never a failure."""


class StepFailed(Exception):
    """A step failed but still has figures to report."""

    def __init__(self, message: str, figures: dict[str, Any]):
        super().__init__(message)
        self.figures = figures


class Interrupted(BaseException):
    """SIGTERM or SIGINT reached gpu-check; ``result``: the running step's, once its processes are killed."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum
        self.result: dict[str, Any] | None = None


@dataclass(frozen=True)
class Step:
    name: str
    asserts: str  # what an ``ok`` means, for the report
    timeout_s: float  # its cap
    estimate_s: float  # expected seconds on one H100 with a cold cache (the plan; docs/gpu-check.md)
    fn: Callable[[dict[str, Any]], dict[str, Any]]
    needs_setup: bool = True
    per_pipeline: bool = False  # one subprocess per selected adapter, figures keyed by the adapter's name


# ------------------------------------------------------------------------------- helpers


def last_line(text: str) -> str:
    lines = [ln.strip() for ln in str(text).strip().splitlines() if ln.strip()]
    return lines[-1][:400] if lines else ""


def _env() -> dict[str, str]:
    pp = os.environ.get("PYTHONPATH", "")
    return {**os.environ, "PYTHONPATH": str(REPO) + (os.pathsep + pp if pp else "")}


class TimedOut(RuntimeError):
    """A command ran past its cap (``timeout_s``) and was killed (with everything it started)."""

    def __init__(self, message: str, timeout_s: float):
        super().__init__(message)
        self.timeout_s = timeout_s


def _kill(p: subprocess.Popen, group: bool) -> None:
    """SIGKILL ``p``, its process group if it leads one, and every live descendant (own sessions included)."""
    try:
        kids = psutil.Process(p.pid).children(recursive=True)
    except psutil.Error:
        kids = []
    if group:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(p.pid, signal.SIGKILL)
    for k in kids:
        with contextlib.suppress(psutil.Error):
            k.kill()
    with contextlib.suppress(ProcessLookupError):
        p.kill()
    p.communicate()


def _run(argv: list[str], timeout: float, cwd: Path | None = None, env: dict[str, str] | None = None,
         group: bool = False, log: Path | None = None) -> subprocess.CompletedProcess:
    """Run a command (``group``: in a process group of its own; ``log``: output to this file, else captured),
    killed with all it started at its cap (``TimedOut``) or when the wait is interrupted."""
    sink = open(log, "w") if log else None  # noqa: SIM115 - closed below, after the process ends
    try:
        p = subprocess.Popen(argv, cwd=cwd or REPO, env={**_env(), **(env or {})}, text=True,
                             stdout=sink or subprocess.PIPE, stderr=subprocess.STDOUT if sink else subprocess.PIPE,
                             start_new_session=group)
        try:
            out, err = p.communicate(timeout=max(timeout, 1.0))
        except subprocess.TimeoutExpired:
            _kill(p, group)
            raise TimedOut(f"timed out after {timeout:.0f} s: {' '.join(argv[2:6])} ...", timeout) from None
        except BaseException:
            _kill(p, group)
            raise
    finally:
        if sink:
            sink.close()
    return subprocess.CompletedProcess(argv, p.returncode, out or "", err or "")


def inrbench(args: list[str], timeout: float) -> subprocess.CompletedProcess:
    return _run([sys.executable, "-m", "bench", *args], timeout)


def _checked(r: subprocess.CompletedProcess, what: str) -> subprocess.CompletedProcess:
    if r.returncode != 0:
        raise RuntimeError(f"{what}: exit {r.returncode}: {last_line(r.stderr) or last_line(r.stdout)}")
    return r


def _json_doc(text: str) -> Any:
    """The JSON document a ``--json`` command printed (anything before its first ``{`` ignored)."""
    i = text.find("{")
    if i < 0:
        raise RuntimeError(f"no JSON in the output: {last_line(text)!r}")
    return json.loads(text[i:])


def _remaining(ctx: dict[str, Any], cap: float) -> float:
    return max(1.0, min(cap, ctx["deadline"] - time.time()))


def partial(ctx: dict[str, Any], figures: dict[str, Any]) -> None:
    """The figures a step has so far, written as it goes: what the report shows if it is killed."""
    if ctx.get("partial"):
        atomic_write_json(Path(ctx["partial"]), figures)


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _store_arg(ctx: dict[str, Any]) -> list[str]:
    return ["--store", ctx["store"]] if ctx.get("store") else []


def _epoch(name: str, data: Any, store: str | None, **cfg: Any) -> tuple[Any, Any]:
    """One epoch of ``name`` -> (images float32 [N,3,s,s] on the CPU, labels [N] on the CPU)."""
    import torch

    import pipelines
    from pipelines import PipelineConfig

    p = pipelines.create(name, data, PipelineConfig(**cfg), store=Path(store) if store else None)
    try:
        batches = [(b.images.float().cpu(), b.labels.cpu()) for b in p]
    finally:
        p.close()
    return torch.cat([b[0] for b in batches]), torch.cat([b[1] for b in batches])


def missing_library(e: BaseException) -> bool:
    """An ``Unavailable`` (or any error) caused by a module that is not installed, not by one that fails."""
    return isinstance(e, ModuleNotFoundError) or isinstance(e.__cause__ or e.__context__, ModuleNotFoundError)


def _per_pipeline(ctx: dict[str, Any], check: Callable[[str], dict[str, Any]]) -> dict[str, Any]:
    """``check(name)`` for this subprocess's one adapter once it builds on the device: a missing library is
    *not installed*; any other ``Unavailable`` fails on a GPU and skips on the CPU."""
    import pipelines
    from pipelines import PipelineConfig, Unavailable

    (name,) = ctx["pipelines"]
    try:
        pipelines.create(name, open_prepared(ctx["data"]), PipelineConfig(batch_size=8, device=ctx["device"], workers=0),
                         store=Path(ctx["store"])).close()
    except Unavailable as e:
        if missing_library(e):
            raise NotInstalled(f"not installed here: {last_line(str(e))}") from None
        if ctx["device"] == "cpu":
            raise Skip(last_line(str(e))) from None
        raise StepFailed(f"cannot run on {ctx['device']}: {last_line(str(e))}", {}) from None
    return check(name)


# -------------------------------------------------------------------------------- steps


def step_env(ctx: dict[str, Any]) -> dict[str, Any]:
    """Every module of the project imports with this Python and torch; the device and the optional libraries."""
    import torch

    failed, n = [], 0
    for pkg in ("bench", "pipelines", "inr"):
        for info in pkgutil.walk_packages(importlib.import_module(pkg).__path__, pkg + "."):
            if info.name.endswith("__main__"):
                continue
            n += 1
            try:
                importlib.import_module(info.name)
            except Exception as e:  # noqa: BLE001 - reported, all of them
                failed.append(f"{info.name}: {type(e).__name__}: {last_line(str(e))}")
    versions = library_versions()
    fig: dict[str, Any] = {"python": sys.version.split()[0], "torch": torch.__version__,
                           "torchvision": versions.get("torchvision"), "modules_imported": n - len(failed)}
    for lib, module in (("nvidia-dali", "nvidia.dali"), ("torchcodec", "torchcodec")):
        try:
            importlib.import_module(module)
            fig[lib] = versions.get(lib) or "installed"
        except ModuleNotFoundError:
            fig[lib] = "not installed here"
        except Exception as e:  # noqa: BLE001 - installed but broken: the steps that need it say more
            fig[lib] = f"installed, fails to import: {type(e).__name__}: {last_line(str(e))}"
    if ctx["device"] != "cpu":
        props = torch.cuda.get_device_properties(0)
        fig.update(device_name=props.name, device_memory_GiB=round(props.total_memory / 2**30, 1),
                   capability=f"{props.major}.{props.minor}", torch_cuda=torch.version.cuda)
    if failed:
        raise StepFailed(f"{len(failed)} module(s) do not import: {failed[0]}", {**fig, "import_failures": failed[:10]})
    return fig


def step_setup(ctx: dict[str, Any]) -> dict[str, Any]:
    """Prepare a small CIFAR-sized synthetic set (32x32, 10 classes) and an INR store of it."""
    work = Path(ctx["work"])
    cuda = ctx["device"] != "cpu"
    t = lambda cap: _remaining(ctx, cap)  # noqa: E731
    _checked(inrbench(["prepare", "synthetic", "--out", str(work / "syn32"), "--size", "32",
                       "--per-class", "50" if cuda else "4", "--num-classes", "10"], t(60)), "prepare")
    _checked(inrbench(["encode", str(work / "syn32"), "--preset", "demo", "--iterations", "30" if cuda else "10",
                       "--bits", "16:8:16",
                       "--device", ctx["device"], "--no-progress", "--out", str(work / "syn32.inr")], t(90)), "encode")
    from inr.store import load

    data = open_prepared(work / "syn32")
    return {"train_images": len(data.split("train")), "store_psnr_db": round(float(load(work / "syn32.inr").psnr.mean()), 2)}


def _pytest(ctx: dict[str, Any], name: str, args: list[str], cap: float) -> dict[str, Any]:
    """``pytest ARGS`` capped at ``cap`` s, outcomes streamed to ``work/NAME.jsonl`` (``devtools.pytest_log``), so a
    killed pytest still reports what it finished, was running and never reached."""
    log = Path(ctx["work"]) / f"{name}.jsonl"
    log.unlink(missing_ok=True)
    # one process (no xdist workers, tests/xdist_default.py), so the plugin sees every test itself
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:xdist", "-p", "no:cacheprovider", "-p", "devtools.pytest_log", *args]
    try:
        r = _run(argv, _remaining(ctx, cap), env={pytest_log.ENV: str(log)})
    except TimedOut as e:
        res = read_pytest_log(log)
        raise StepFailed(f"pytest timed out after {e.timeout_s:.0f} s, {_progress(res)}", _figures(res)) from None
    res = read_pytest_log(log)
    if res["collected"] is None and not res["failed"]:
        raise RuntimeError(f"pytest exit {r.returncode}: {last_line(r.stdout) or last_line(r.stderr)}")
    return _outcome(res, r.returncode, last_line(r.stdout))


def read_pytest_log(log: Path, select: Any = None) -> dict[str, Any]:
    """``devtools.pytest_log.read_log`` plus ``not_installed``: adapters whose tests skipped saying so."""
    res = pytest_log.read_log(log, select)
    names: set[str] = set()
    with contextlib.suppress(OSError):
        for line in log.read_text(encoding="utf-8", errors="replace").splitlines():
            with contextlib.suppress(ValueError, AttributeError):
                rec = json.loads(line)
                if rec.get("outcome") == "skipped" and (select is None or select(rec.get("nodeid", ""))):
                    names.update(re.findall(r"(\S+) not installed here", rec.get("message", "")))
    res["not_installed"] = sorted(names)
    return res


def _progress(res: dict[str, Any]) -> str:
    """How far a pytest got, in words (for a run cut short)."""
    if res["collected"] is None:
        return "killed while collecting: no test started"
    at = f"while running {short(res['running'])}" if res["running"] else "between tests"
    return (f"{at}; before it {res['passed']} passed, {res['failed']} failed, {res['skipped']} skipped; "
            f"{len(res['not_reached'])} not reached")


def _figures(res: dict[str, Any]) -> dict[str, Any]:
    figures: dict[str, Any] = {k: res[k] for k in ("passed", "failed", "skipped")}
    if res["failures"]:
        figures["failures"] = res["failures"][:10]
    if res["running"]:
        figures["running"] = short(res["running"])
    if res.get("not_installed"):
        figures["not_installed"] = res["not_installed"]
    if res["not_reached"]:
        figures["not_reached"] = len(res["not_reached"])
        figures["not_reached_tests"] = [short(n) for n in res["not_reached"][:10]]
    return figures


def _outcome(res: dict[str, Any], returncode: int = 0, tail: str = "") -> dict[str, Any]:
    """A finished pytest's step result: fail on a failed test or bad exit, skip when nothing passed."""
    figures = _figures(res)
    if res["failed"] or returncode not in (0, 5):
        crash = f" ({_progress(res)})" if res["running"] else ""
        raise StepFailed(res["failures"][0] if res["failures"] else f"pytest exit {returncode}{crash}: {tail}", figures)
    if res["passed"] == 0 and res.get("not_installed"):
        raise NotInstalled(f"{', '.join(res['not_installed'])} not installed here: {res['skipped']} test(s) skipped")
    if res["passed"] == 0:
        raise Skip(f"{res['skipped']} collected, all skipped: {res['skip_reason'] or 'none collected'}")
    return figures


PIPELINE_TESTS = ["tests/test_pipelines_gpu.py", "tests/test_pipelines_nvjpeg.py", "tests/test_pipelines_sync.py"]


def step_pytest_pipelines(ctx: dict[str, Any]) -> dict[str, Any]:
    return _pytest(ctx, "pytest-pipelines", ["-m", "gpu", *PIPELINE_TESTS], 120)


def step_pytest_rest(ctx: dict[str, Any]) -> dict[str, Any]:
    return _pytest(ctx, "pytest-rest", ["-m", "gpu", *(f"--ignore={t}" for t in PIPELINE_TESTS)], 300)


def step_sync_debug(ctx: dict[str, Any]) -> dict[str, Any]:
    if ctx["device"] == "cpu":  # before the imports: a skip need not load torch
        raise Skip("torch.cuda.set_sync_debug_mode needs CUDA")
    import torch

    import pipelines
    from pipelines import PipelineConfig

    data, store = open_prepared(ctx["data"]), Path(ctx["store"])

    def check(name: str) -> dict[str, Any]:
        p = pipelines.create(name, data, PipelineConfig(batch_size=64, device=ctx["device"], workers=2, seed=1), store=store)
        n, first = 0, 0
        try:
            for _ in p:  # warm-up epoch: allocations, workers, compilation
                pass
            torch.cuda.synchronize()
            it = iter(p)
            with warnings.catch_warnings(record=True) as w:  # the epoch's first batch: counted, allowed
                warnings.simplefilter("always")
                torch.cuda.set_sync_debug_mode("warn")
                next(it)
                torch.cuda.set_sync_debug_mode(0)
                first = sum("synchroniz" in str(x.message) for x in w)
            torch.cuda.set_sync_debug_mode("error")  # the steady state: any sync raises
            for _ in it:
                n += 1
        finally:
            torch.cuda.set_sync_debug_mode(0)
            p.close()
        if n == 0:
            raise AssertionError("the epoch has one batch: no steady state to check (more images needed)")
        return {"steady_batches": n, "first_batch_syncs": first}

    return _per_pipeline(ctx, check)


def _spread(values: Any) -> dict[str, Any]:
    """Median and [min, max] of per-repeat figures."""
    v = np.asarray(values, dtype=float)
    return {"median": round(float(np.median(v)), 1), "range": [round(float(v.min()), 1), round(float(v.max()), 1)],
            "n": int(v.size)}


def step_bench_smoke(ctx: dict[str, Any]) -> dict[str, Any]:
    work, dev = Path(ctx["work"]) / "bench", ctx["device"]
    cuda = dev != "cpu"
    gpu_metrics = ("gpu_mem_used_peak_bytes", "torch_peak_allocated_bytes")
    modes = ("loader", "train")

    def check(name: str) -> dict[str, Any]:
        fig: dict[str, Any] = {}
        for i, mode in enumerate(modes):
            out = work / f"{name}-{mode}"
            per = (ctx["deadline"] - time.time()) / (len(modes) - i)  # this adapter's time, shared by its runs
            r = inrbench(["bench", "--pipeline", name, "--data", ctx["data"], *_store_arg(ctx), "--mode", mode,
                          "--epochs", "1", "--warmup", "1", "--repeats", "3" if cuda else "2", "--min-seconds", "0",
                          "--batch-size", "128" if cuda else "16", "--workers", "4" if cuda else "1", "--device", dev,
                          "--backbone", "resnet18-cifar" if cuda else "small-cnn", "--out", str(out)],
                         max(1.0, per))
            _checked(r, f"bench {mode}")
            df = read_results(out)
            bad = df[(df.metric == "run") & (df.status != "ok")]
            if len(bad):
                raise AssertionError(f"{mode}: {bad.status.iloc[0]} row: {bad.reason.iloc[0]}")
            ok = df[df.status == "ok"]
            fig[f"{mode}.img_per_s"] = _spread(ok[ok.metric == "images_per_s"].value)
            if cuda:
                missing = [m for m in gpu_metrics if not ((ok.metric == m) & (ok.value > 0)).any()]
                if missing:
                    why = df[df.metric.isin(missing)].reason
                    raise AssertionError(f"{mode}: GPU metrics missing: {', '.join(missing)} "
                                         f"({why.iloc[0] if len(why) else 'no row'})")
                over = ok[ok.metric == "gpu_mem_over_idle_peak_bytes"].value
                if len(over):
                    fig[f"{mode}.gpu_mem_over_idle_MiB"] = round(float(over.max()) / 2**20, 1)
                torch_peak = ok[ok.metric == "torch_peak_allocated_bytes"].value
                fig[f"{mode}.torch_peak_MiB"] = round(float(torch_peak.max()) / 2**20, 1)
            partial(ctx, fig)  # a kill in the next run keeps this one's figures
        return fig

    return _per_pipeline(ctx, check)


def step_cpu_vs_device(ctx: dict[str, Any]) -> dict[str, Any]:
    import torch

    from pipelines import Augment

    data, store = open_prepared(ctx["data"]), ctx["store"]
    aug = Augment(crop="center", flip=False)
    std = torch.tensor(aug.std).view(1, 3, 1, 1)

    def check(name: str) -> dict[str, Any]:
        kw = dict(batch_size=8, augment=aug, shuffle=False, workers=1)
        a, la = _epoch(name, data, store, device="cpu", **kw)
        b, lb = _epoch(name, data, store, device=ctx["device"], **kw)
        if not torch.equal(la, lb):
            raise AssertionError("labels differ between cpu and the device")
        levels = ((a - b) * std * 255.0).abs()  # 8-bit levels
        mse = float((levels**2).mean())
        psnr = math.inf if mse == 0 else 10 * math.log10(255.0**2 / mse)
        fig = {"max_abs_diff": round(float((a - b).abs().max()), 6), "max_abs_levels": round(float(levels.max()), 3),
               "psnr_db": "inf" if math.isinf(psnr) else round(psnr, 2)}
        if psnr < PSNR_MIN_DB:
            raise AssertionError(f"outputs differ: PSNR {psnr:.1f} dB < {PSNR_MIN_DB} (max {float(levels.max()):.1f} levels)")
        return fig

    return _per_pipeline(ctx, check)


def step_compile(ctx: dict[str, Any]) -> dict[str, Any]:
    import torch._dynamo.utils as dyn

    data, store = open_prepared(ctx["data"]), ctx["store"]

    def graphs() -> tuple[int, int]:
        return int(dyn.counters["stats"]["unique_graphs"]), int(dyn.counters["frames"]["total"])

    def check(name: str) -> dict[str, Any]:
        import pipelines
        from pipelines import PipelineConfig

        p = pipelines.create(name, data, PipelineConfig(batch_size=16, device=ctx["device"], workers=1, compile=True),
                             store=Path(store))
        try:
            g0 = graphs()
            for _ in p:
                pass
            g1 = graphs()
            for _ in range(2):
                for _ in p:
                    pass
            g2 = graphs()
        finally:
            p.close()
        fig = {"graphs_epoch1": g1[0] - g0[0], "frames_epoch1": g1[1] - g0[1], "recompiles_after_epoch1": g2[0] - g1[0]}
        if g2[0] > g1[0]:
            raise AssertionError(f"{g2[0] - g1[0]} new graph(s) compiled after the first epoch (steady-state recompiles)")
        return fig

    return _per_pipeline(ctx, check)


def step_dali_crops(ctx: dict[str, Any]) -> dict[str, Any]:
    try:
        import nvidia.dali  # noqa: F401
    except ModuleNotFoundError as e:
        raise NotInstalled(f"nvidia.dali is not installed here ({e})") from None
    k = "(dali and (distribution or uniform or per_image)) or agree_across"
    if ctx["device"] == "cpu":  # DALI's CPU decode: its own statistics only
        return _pytest(ctx, "dali-crops", ["tests/test_pipelines.py", "-k", "dali and (distribution or uniform or per_image)"], 150)
    ran = Path(ctx["work"]) / "pytest-pipelines.jsonl"
    if ran.is_file():  # the pipeline tests ran them already: read their outcomes

        def select(n: str) -> bool:
            return "test_pipelines_gpu" in n and (("dali" in n and any(w in n for w in ("distribution", "uniform",
                                                                                        "per_image"))) or "agree_across" in n)

        res = read_pytest_log(ran, select)
        if res["passed"] + res["failed"] and not res["not_reached"] and not res["running"]:
            return {"from": "pytest-pipelines", **_outcome(res)}
    return _pytest(ctx, "dali-crops", ["tests/test_pipelines_gpu.py", "-m", "gpu", "-k", k], 150)


def step_perf_encode(ctx: dict[str, Any]) -> dict[str, Any]:
    # cifar10's preset at a GPU-sized batch, eager then compiled, each with its CIFAR-10 estimate; the eager
    # figures are kept (``partial``) if the compiled run's cold compile meets the cap
    cuda = ctx["device"] != "cpu"
    figs: dict[str, Any] = {}
    for i, step in enumerate(("eager", "compiled")):
        r = _checked(inrbench(["perf", "encode", "--device", ctx["device"], "--json", "--synthetic", "--size", "32",
                               "--layers", "5", "--hidden", "13", "--lr", "1e-3", "--iterations", "100" if cuda else "20",
                               "--batch", "8192" if cuda else "64", "--loop-images", "1", "--step", step,
                               "--estimate", "cifar10"], (ctx["deadline"] - time.time()) / (2 - i)),
                     f"perf encode --step {step}")
        doc = _json_doc(r.stdout)
        figs.update({f"{step}.{k}": v for k, v in _numbers({k: v for k, v in doc.items()
                                                             if k not in ("config", "env", "estimate")}).items()})
        for s, e in ((doc.get("estimate") or {}).get("steps") or {}).items():
            figs[f"estimate.cifar10.{s}.projected_minutes"] = round(e["projected_seconds"] / 60.0, 2)
            figs[f"estimate.cifar10.{s}.image_iterations_per_s"] = round(e["image_iterations_per_s"], 1)
        partial(ctx, figs)
    return figs


def _key_figure(key: str) -> bool:
    k = key.lower()
    return any(s in k for s in ("per_s", "flop", "pct", "speedup", "ratio")) or k.startswith("peak") or k == "mean_psnr"


def _numbers(d: Any, prefix: str = "") -> dict[str, Any]:
    """The key figures (``_key_figure``) among a nested dict's numeric leaves, rounded, by dotted path."""
    out: dict[str, Any] = {}
    for k, v in (d.items() if isinstance(d, dict) else ()):
        if isinstance(v, dict):
            out.update(_numbers(v, f"{prefix}{k}."))
        elif isinstance(v, (int, float)) and not isinstance(v, bool) and _key_figure(str(k)):
            out[f"{prefix}{k}"] = round(float(v), 3)
    return out


def step_perf_subsample(ctx: dict[str, Any]) -> dict[str, Any]:
    """The fit on 1/8 of the pixels per step against all of them (cifar10 preset) and the CIFAR-10 encode
    time each projects to."""
    import torch

    from inr.fit import fit, preset

    cuda = ctx["device"] != "cpu"
    n, iters = (8192, 100) if cuda else (16, 10)
    imgs = np.random.default_rng(0).integers(0, 256, size=(n, 32, 32, 3), dtype=np.uint8)
    cifar = preset("cifar10")
    base = preset("cifar10", iterations=iters, step="compiled" if cuda else "eager")
    fig: dict[str, Any] = {"images": n, "iterations": iters, "step": base.step}
    for label, frac in (("eighth_pixels", 1 / 8), ("all_pixels", 1.0)):  # the figure people wait for first
        cfg = dataclasses.replace(base, pixel_fraction=frac)
        fit(imgs, dataclasses.replace(cfg, iterations=2), device=ctx["device"])  # compiles for these shapes, untimed
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fit(imgs, cfg, device=ctx["device"])
        if cuda:
            torch.cuda.synchronize()
        rate = n * iters / (time.perf_counter() - t0)
        fig[f"{label}.image_iterations_per_s"] = round(rate, 1)
        fig[f"{label}.cifar10_projected_minutes"] = round(50_000 * cifar.iterations / rate / 60, 2)
        partial(ctx, fig)
    fig["eighth_over_all"] = round(fig["eighth_pixels.image_iterations_per_s"] / fig["all_pixels.image_iterations_per_s"], 2)
    return fig


def step_perf_decode(ctx: dict[str, Any]) -> dict[str, Any]:
    # no torch.compile variants (their cold builds do not fit the cap); DALI gets every core for its CPU stage
    cuda = ctx["device"] != "cpu"
    threads = ["--threads", str(os.cpu_count() or 1)] if cuda else []
    sizes = ["32", "224"] if cuda else ["32"]  # a CPU's 224 px bf16 rows take minutes: the plumbing needs one size
    r = _checked(inrbench(["perf", "decode", "--json", "--device", ctx["device"], "--sizes", *sizes,
                           "--seconds", "0.2" if cuda else "0.1", "--repeats", "3" if cuda else "2",
                           "--no-compile", *threads], _remaining(ctx, math.inf)), "perf decode")
    return decode_figures(_json_doc(r.stdout), ctx["device"])


# perf decode's JPEG rows by their method's first words -> the short name of their figures
JPEG_ROWS = (("PIL", "pil"), ("decode_jpeg (torch-nvjpeg)", "nvjpeg"), ("DALI", "dali"),
             ("torchvision.io", "torchvision_cpu"), ("torchcodec", "torchcodec_cpu"))


def adapter_variant(size: int, device: str) -> str:
    """The perf decode variant that is the ``inr`` adapter's own decoder (fp32, eager, whole batch)."""
    return decoder_variants(size, device, True)[0][0]


def decode_figures(doc: dict[str, Any], device: str) -> dict[str, Any]:
    """Key figures of ``perf decode --json`` per size: the ``inr`` adapter's decoder (img/s, % of matmul peak),
    the fastest variant, each JPEG decoder's img/s and INR over nvJPEG / PIL (a check, no interval). A JPEG row
    skipped for a missing library is ``not_installed``; any other skip fails on CUDA. No inr row: a failure."""
    if doc.get("device", "cpu") != device:
        raise AssertionError(f"perf decode measured on {doc.get('device', 'cpu')!r}, not {device!r}")
    fig: dict[str, Any] = {"device": doc.get("device", "cpu")}
    fig.update({f"matmul_peak_gflops.{k}": round(v, 1) for k, v in doc.get("matmul_peak_gflops", {}).items()})
    rows = doc.get("rows", [])
    skipped: list[str] = []
    missing: list[str] = []
    for size in sorted({r.get("size") for r in rows if r.get("size") is not None}):
        at = [r for r in rows if r.get("size") == size]
        if str(size) in doc.get("inr_batch", {}):
            fig[f"{size}px.inr_batch"] = doc["inr_batch"][str(size)]  # on CUDA every row's batch
        inr_rows = [r for r in at if "pct_peak" in r]
        own = next((r for r in inr_rows if r["variant"] == adapter_variant(size, device)), None)
        if own:
            fig[f"{size}px.inr_img_per_s"] = round(own["rate"]["median"], 1)
            fig[f"{size}px.inr_pct_peak"] = round(own["pct_peak"], 2)
            fig[f"{size}px.inr_variant"] = own["variant"]
        if inr_rows:
            best = max(inr_rows, key=lambda r: r["rate"]["median"])
            fig[f"{size}px.inr_fastest_img_per_s"] = round(best["rate"]["median"], 1)
            fig[f"{size}px.inr_fastest_variant"] = best["variant"]
        for r in at:
            key = next((k for prefix, k in JPEG_ROWS if r.get("method", "").startswith(prefix)), None)
            if key is None or "pct_peak" in r:
                continue
            if "skipped" in r:
                (missing if "No module named" in r["skipped"] else skipped).append(f"{size}px {r['method']}: {r['skipped']}")
            elif isinstance(r.get("rate"), dict):
                fig[f"{size}px.{key}_img_per_s"] = round(r["rate"]["median"], 1)
        for key in ("nvjpeg", "pil"):
            if own and f"{size}px.{key}_img_per_s" in fig:
                fig[f"{size}px.inr_over_{key}"] = round(own["rate"]["median"] / fig[f"{size}px.{key}_img_per_s"], 2)
    fig["ratio_note"] = "INR over JPEG: medians in one process, no interval: a check that both ran, not a result"
    if missing:
        fig["not_installed"] = missing
    if skipped:
        fig["skipped"] = skipped
    if not any(k.endswith(".inr_img_per_s") for k in fig):
        raise StepFailed("perf decode printed no row of the inr adapter's own decoder", fig)
    if skipped and device != "cpu":
        raise StepFailed(f"a JPEG decoder could not run on {device}: {skipped[0]}", fig)
    return fig


def step_encode_qat(ctx: dict[str, Any]) -> dict[str, Any]:
    from inr.store import load

    work = Path(ctx["work"])
    psnr = {}
    for label, dev in (("cpu", "cpu"), ("device", ctx["device"])):
        out = work / f"qat-{label}.inr"
        _checked(inrbench(["encode", ctx["data"], "--preset", "demo", "--iterations", "150", "--prune", "0.15",
                           "--prune-rounds", "1", "--prune-finetune", "40", "--bits", "8", "--qat", "40", "--limit", "16",
                           "--device", dev, "--no-progress", "--out", str(out)], _remaining(ctx, 90)), f"encode on {dev}")
        psnr[label] = float(load(out).psnr.astype("float64").mean())
    diff = psnr["device"] - psnr["cpu"]
    fig = {"cpu_psnr_db": round(psnr["cpu"], 3), "device": ctx["device"], "device_psnr_db": round(psnr["device"], 3),
           "diff_db": round(diff, 3)}
    if abs(diff) > QAT_TOL_DB:
        raise StepFailed(f"{ctx['device']} encode is {diff:+.2f} dB from the cpu encode (> {QAT_TOL_DB} dB)", fig)
    return fig


def mini_sweep(device: str, pipeline_names: list[str]) -> dict[str, Any]:
    """The ``paper`` sweep in miniature: synthetic 32 and 224, tiny counts, every cell kind (every feed gets
    the store; pipelines that read none ignore it)."""
    feeds = [{"pipeline": n, "store": "encode-{size}-pruned-8bit"} for n in pipeline_names]
    pruned8 = {"name": "pruned-8bit", "prune": 0.15, "bits": "16:8:16", "args": {"prune_rounds": 1, "prune_finetune": 10}}
    cells: list[dict[str, Any]] = []
    learned = {"name": "learned-init", "init": "meta-init-s32", "bits": "16:8:16"}
    for size, per_class, backbone, variants in ((32, 4, "resnet18-cifar", [{"name": "fp32"}, pruned8, learned]),
                                                (224, 2, "resnet18", [pruned8])):
        s = f"s{size}"
        cells += [
            {"kind": "prepare", "id": f"prepare-{s}", "source": "synthetic", "name": f"syn{size}", "size": size,
             "args": {"per_class": per_class, "num_classes": 4}},
            *([{"kind": "meta-init", "id": "meta-init-s32", "data": "prepare-s32", "preset": "cifar10",
                "outer_steps": 5, "device": device}] if size == 32 else []),
            {"kind": "encode", "id": f"encode-{s}-{{name}}", "data": f"prepare-{s}", "matrix": {"variant": variants}},
            {"kind": "compare", "id": f"compare-{s}", "data": f"prepare-{s}", "stores": [f"encode-{s}-*"],
             "jpeg_qualities": [30, 90]},
            {"kind": "bench", "id": f"{{mode}}-{s}-{{pipeline}}", "data": f"prepare-{s}",
             "backbone": backbone if device != "cpu" else "small-cnn",
             "matrix": {"mode": ["loader", "train"],
                        "feed": [{k: v.format(size=s) for k, v in f.items()} for f in feeds]}},
        ]
    cells += [{"kind": "inrbench", "id": "env", "command": ["env", "--out", "{out}"]},
              {"kind": "python", "id": "python", "command": ["-c", "print('python cell ok')"]}]
    return {
        "name": "gpu-check-mini",
        "description": "gpu-check: the paper sweep in miniature (synthetic 32 and 224, tiny counts), every cell kind",
        "device": device, "report": True,
        "defaults": {"encode": {"preset": "demo", "iterations": 20, "fit_cache": True},
                     "bench": {"epochs": 1, "warmup": 1, "repeats": 1, "batch_size": 8, "workers": 2,
                               "args": {"min_seconds": 0}}},
        "cells": cells,
    }


def _cells_done(out: Path) -> dict[str, Any]:
    """Cell statuses recorded so far in a sweep results folder (``cell_s`` rows)."""
    import pandas as pd  # here: a step's process that reads no results need not load it

    try:
        df = pd.read_csv(out / "results.csv", low_memory=False)
    except (OSError, ValueError):
        return {"cells_done": 0}
    st = df[df.metric == "cell_s"].status.value_counts()
    return {"cells_done": int(st.sum()), **{f"cells_{k}": int(v) for k, v in st.items()}}


def step_sweep(ctx: dict[str, Any]) -> dict[str, Any]:

    work = Path(ctx["work"])
    spec = work / "mini-paper.yaml"
    spec.write_text(yaml.safe_dump(mini_sweep(ctx["device"], ctx["pipelines"]), sort_keys=False))
    try:
        r = inrbench(["sweep", str(spec), "--out", str(work / "sweep"), "--report", str(work / "sweep-report"),
                      "--device", ctx["device"], "--no-progress"], _remaining(ctx, 240))
    except RuntimeError as e:  # timed out: say how far it got
        raise StepFailed(str(e), _cells_done(work / "sweep")) from None
    m = re.search(r"(\d+) cells \((\d+) ok, (\d+) skip, (\d+) error", r.stdout)
    fig: dict[str, Any] = {}
    if m:
        fig = dict(zip(("cells", "ok", "skip", "error"), map(int, m.groups()), strict=True))
    lines = [ln.strip() for ln in r.stdout.splitlines() if re.search(r"\b(skip|error)\b", ln) and "cells (" not in ln]
    missing = [ln for ln in lines if "No module named" in ln]  # a cell of an adapter whose library is not here
    bad = [ln for ln in lines if ln not in missing]
    if missing:
        fig["not_installed"] = missing[:8]
    if not m or bad or fig["error"] or fig["skip"] > len(missing) or (r.returncode != 0 and not missing):
        fig["not_ok"] = bad[:8]
        raise StepFailed(f"sweep exit {r.returncode}: " + (bad[0] if bad else last_line(r.stderr) or last_line(r.stdout)), fig)
    return fig


# In the order of their value to a short lease: the caps up to bench-smoke fit the default budget
# (``valuable_caps_s``); later steps run in what is left.
STEPS: tuple[Step, ...] = (
    Step("env", "every module of bench, pipelines and inr imports with this Python and torch; the device, and "
         "whether DALI and TorchCodec are installed", 20, 12, step_env, needs_setup=False),
    Step("pytest-pipelines", "`pytest -m gpu` of the pipeline tests (every adapter's contract on the device, CPU vs "
         "device, nvJPEG vs PIL, no host sync): every one passes; an adapter whose library is missing is listed "
         "as not installed. Outcomes stream to work/pytest-pipelines.jsonl: cut short, the step still reports "
         "them, the test running and those not reached", 90, 70, step_pytest_pipelines, needs_setup=False),
    Step("perf-decode", "`inrbench perf decode --json --no-compile` at 32 and 224 px: the inr adapter's decoder "
         "img/s and % of matmul peak, against PIL and torch-nvjpeg's nvJPEG (and DALI where installed)",
         60, 40, step_perf_decode, needs_setup=False),
    Step("perf-encode", "`inrbench perf encode --step eager`, then `--step compiled`, each `--estimate cifar10` "
         "(5x13, 32 px): img-it/s of the eager and compiled fit step, TFLOP/s, % of peak, and the projected "
         "CIFAR-10 encode minutes", 100, 80, step_perf_encode, needs_setup=False),
    Step("perf-subsample", "the fit on 1/8 of the pixels per step against all of them (one `fit` call each, "
         "compiled step): img-it/s and the projected CIFAR-10 encode minutes", 60, 45, step_perf_subsample,
         needs_setup=False),
    Step("setup", "`inrbench prepare synthetic` (32x32, 500 images) and `inrbench encode` of it: the inputs of the "
         "later steps", 35, 15, step_setup, needs_setup=False),
    Step("bench-smoke", "`inrbench bench` loader and train of every pipeline (one process each, 3 repeats): exit 0, "
         "no skip/error row; img/s median and range, NVML memory over idle and torch's peak on CUDA",
         140, 120, step_bench_smoke, per_pipeline=True),
    Step("sync-debug", "every pipeline: after a warm-up epoch, the next epoch past its first batch runs under "
         "`torch.cuda.set_sync_debug_mode(\"error\")` without a host sync (first-batch syncs counted)",
         60, 40, step_sync_debug, per_pipeline=True),
    Step("cpu-vs-device", "every pipeline, centre crop, no flip, no shuffle: the same labels on cpu and the device "
         f"and images within {PSNR_MIN_DB:.0f} dB PSNR (max abs difference reported); on a CPU, two CPU runs "
         "(determinism)", 60, 40, step_cpu_vs_device, per_pipeline=True),
    Step("pytest-rest", "`pytest -m gpu` of every other test (the codec on CUDA: compiled fit steps, early stop, "
         "no host syncs; many cold compiles)", 240, 200, step_pytest_rest, needs_setup=False),
    Step("compile", "every pipeline with compile=True: graphs compiled in epoch 1 (torch._dynamo counters), none "
         "new in epochs 2-3 (no steady-state recompiles)", 120, 60, step_compile, per_pipeline=True),
    Step("dali-crops", "DALI crop statistics (random-resized vs torchvision KS, random-pad uniform, per-image "
         "crops, agreement across adapters): mixed decode on CUDA, CPU decode on a CPU", 150, 30, step_dali_crops,
         needs_setup=False),
    Step("encode-qat", f"encode with prune 0.15 + 8-bit + QAT on the device within {QAT_TOL_DB} dB mean PSNR of "
         "the same encode on the CPU (16 images)", 150, 60, step_encode_qat),
    Step("sweep-mini", "the `paper` sweep in miniature (synthetic 32 and 224; prepare, encode, compare, bench "
         "loader and train of every pipeline, inrbench and python cells): every cell ok", 240, 200, step_sweep,
         needs_setup=False),
)
STEP_NAMES = tuple(s.name for s in STEPS)
VALUABLE = STEP_NAMES[: STEP_NAMES.index("bench-smoke") + 1]


def valuable_caps_s() -> float:
    return sum(s.timeout_s for s in STEPS if s.name in VALUABLE)


# ------------------------------------------------------------------------------ the child


def run_step_child(name: str, ctx_path: str) -> int:
    """In the step's own subprocess: run it, write its result JSON where the context says."""
    ctx = json.loads(Path(ctx_path).read_text())
    step = next(s for s in STEPS if s.name == name)
    res: dict[str, Any] = {"status": "ok", "figures": {}, "error": ""}
    try:
        res["figures"] = step.fn(ctx)
    except NotInstalled as e:
        res.update(status="not installed", error=last_line(str(e)))
    except Skip as e:
        res.update(status="skip", error=last_line(str(e)))
    except StepFailed as e:
        res.update(status="fail", figures=e.figures or _read_json(Path(ctx["partial"])) or {}, error=last_line(str(e)))
    except Exception as e:  # noqa: BLE001 - reported, with the traceback in the step's log
        traceback.print_exc()
        res.update(status="fail", figures=_read_json(Path(ctx["partial"])) or {},
                   error=last_line(f"{type(e).__name__}: {e}"))
    Path(ctx["result"]).write_text(json.dumps(res, default=str))
    return 0


# ----------------------------------------------------------------------------- the parent


def _so_far(step: Step, ctx: dict[str, Any], partial_path: Path) -> dict[str, Any]:
    """A killed step's partial figures, or its pytest log's outcomes."""
    got = _read_json(partial_path)
    if got:
        return got
    log = Path(ctx["work"]) / f"{step.name}.jsonl"
    return _figures(read_pytest_log(log)) if log.is_file() else {}


def _run_unit(step: Step, ctx: dict[str, Any], timeout: float, pipeline: str | None = None) -> dict[str, Any]:
    """One subprocess of ``step`` (for ``pipeline`` alone, when given), capped at ``timeout`` s."""
    steps_dir = Path(ctx["work"]) / "steps"
    tag = step.name + (f".{pipeline}" if pipeline else "")
    paths = {k: steps_dir / f"{tag}.{k}.json" for k in ("ctx", "result", "partial")}
    for p in paths.values():
        p.unlink(missing_ok=True)
    uctx = {**ctx, "deadline": time.time() + timeout, "pipelines": [pipeline] if pipeline else ctx["pipelines"],
            "result": str(paths["result"]), "partial": str(paths["partial"])}
    paths["ctx"].write_text(json.dumps(uctx))
    try:  # GRACE_S past the step's own deadline: its nested commands stop at the deadline and it reports
        r = _run([*CHILD, "_step", step.name, str(paths["ctx"])], timeout + GRACE_S, group=True,
                 log=steps_dir / f"{tag}.log")
    except TimedOut:
        return {"status": "fail", "figures": _so_far(step, ctx, paths["partial"]),
                "error": f"timed out after {timeout:.0f} s: killed with all it started; figures so far kept"}
    except Interrupted as e:
        e.result = {"status": "killed", "figures": _so_far(step, ctx, paths["partial"]),
                    "error": f"killed by {e} with all it started; figures so far kept"}
        raise
    got = _read_json(paths["result"])
    if not isinstance(got, dict):
        log = (steps_dir / f"{tag}.log").read_text(errors="replace")
        return {"status": "fail", "figures": _so_far(step, ctx, paths["partial"]),
                "error": f"step process died (exit {r.returncode}): {last_line(log)}"}
    return got


def merge(results: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """One step's result from its adapters' (``{name: result}``): figures keyed ``NAME.figure``; killed,
    failed or ok if any adapter was, else not installed / skip."""
    figures: dict[str, Any] = {}
    for n, r in results.items():
        figures[f"{n}.status"] = r["status"]
        figures.update({f"{n}.{k}": v for k, v in r["figures"].items()})
    st = [r["status"] for r in results.values()]
    status = next((s for s in ("killed", "fail", "ok") if s in st), None)
    status = status or ("not installed" if st and all(s == "not installed" for s in st) else "skip")
    order = ("killed", "fail", "skip", "not installed")
    errs = [f"{n}: {r['error']}" for s in order for n, r in results.items() if r["status"] == s and r["error"]]
    return {"status": status, "figures": figures, "error": "; ".join(errs)[:400]}


def _run_step(step: Step, ctx: dict[str, Any], timeout: float) -> dict[str, Any]:
    """A step: one subprocess, or one per selected adapter sharing the step's time."""
    if not step.per_pipeline:
        return _run_unit(step, ctx, timeout)
    end, names, done = time.time() + timeout, ctx["pipelines"], {}
    for i, name in enumerate(names):
        share = (end - time.time()) / (len(names) - i)
        if share < 1:
            done[name] = {"status": "fail", "figures": {}, "error": f"the step's cap of {timeout:.0f} s was spent"}
            continue
        try:
            done[name] = _run_unit(step, ctx, share, name)
        except Interrupted as e:
            e.result = merge({**done, name: e.result})
            raise
    return merge(done)


def _fmt(v: Any) -> str:
    if isinstance(v, dict) and "median" in v:
        return f"{v['median']} [{v['range'][0]}, {v['range'][1]}] (n={v['n']})"
    if isinstance(v, list):
        return "; ".join(map(str, v))
    return str(v)


def render_md(doc: dict[str, Any]) -> str:
    env = doc["env"]
    lines = [
        "# inr-bench gpu-check",
        "",
        f"device **{doc['device']}** ({env.get('device_name', '')}); python {env.get('python')}, torch "
        f"{env.get('torch')} (CUDA {env.get('torch_cuda')}), DALI {env.get('dali')}, torch-nvjpeg decoder "
        f"{env.get('torch_nvjpeg_decoder')}; git {env.get('git_sha')}{' (dirty)' if env.get('git_dirty') else ''}; "
        f"started {doc['started_utc']}; {doc['state']}, {doc['elapsed_s']:.0f} s of a {doc['budget_s']:.0f} s budget.",
        "",
        f"Summary: {doc['summary']}",
        "",
        "| step | status | seconds | cap | estimate | key figures | error (last line) |",
        "|---|---|---:|---:|---:|---|---|",
    ]
    plan = {p["name"]: p for p in doc["plan"]}
    for s in doc["steps"]:
        figs = ", ".join(f"{k}={_fmt(v)}" for k, v in s["figures"].items()).replace("|", "\\|")
        err = s["error"].replace("|", "\\|")
        p = plan[s["name"]]
        lines.append(f"| {s['name']} | {s['status']} | {s['seconds']:.1f} | {p['cap_s']:.0f} | {p['estimate_s']:.0f} "
                     f"| {figs} | {err} |")
    lines += ["", "## What each step asserts", ""]
    lines += [f"- **{s.name}**: {s.asserts}" for s in STEPS]
    lines += ["", f"Step logs: `{LOGS}`; work files (datasets, stores, results): `{doc['work']}`.", ""]
    return "\n".join(lines)


def _env_summary() -> dict[str, Any]:
    """What the parent knows without touching the device."""
    import torch

    git = git_info()
    nvjpeg = torch_nvjpeg_decoder()
    return {"torch": torch.__version__, "torch_cuda": torch.version.cuda,
            "dali": library_versions()["nvidia-dali"] or "not installed",
            "torch_nvjpeg_decoder": f"{nvjpeg['library']} {nvjpeg['version']}" if nvjpeg["library"] else "none",
            "git_sha": (git.get("sha") or "")[:12], "git_dirty": git.get("dirty"), "python": sys.version.split()[0]}


OWN = ("gpu-check.json", "gpu-check.md", LOGS, "work")  # what gpu-check writes in OUT_DIR (bench.outputs layout)


def _fresh_output(out: Path) -> None:
    """An empty marked ``out``: new, empty (a mount point, used as is) or an earlier output emptied of ``OWN``."""
    out.mkdir(parents=True, exist_ok=True)
    for name in OWN:
        p = out / name
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        else:
            p.unlink(missing_ok=True)
    outputs.write_marker(out, "gpu-check", entries=False)  # filled later: its kind's layout is what it writes


def _work_dir(out: Path, work: str | None) -> Path:
    """``--work``: a new or empty folder; default ``OUT_DIR/work``."""
    if work is None:
        return out / "work"
    w = Path(work).resolve()
    if w.exists() and (not w.is_dir() or any(w.iterdir())):
        raise InputError(f"--work {w}: not a new or empty folder")
    return w


def _write_logs(out: Path, work: Path) -> None:
    """``OUT_DIR/gpu-check-logs.tar.gz``: every step's log and result, and the pytest outcome logs."""
    with atomic_open(out / LOGS) as f, tarfile.open(fileobj=f, mode="w:gz") as tar:
        for p in sorted([*(work / "steps").glob("*"), *work.glob("*.jsonl")]):
            if p.is_file():
                tar.add(p, arcname=f"gpu-check-logs/{p.relative_to(work)}")


def _parse_list(value: str | None, known: list[str] | tuple[str, ...], what: str) -> list[str]:
    if value is None:
        return list(known)
    items = [v.strip() for v in value.split(",") if v.strip()]
    unknown = [v for v in items if v not in known]
    if unknown or not items:
        raise InputError(f"gpu-check: unknown {what} {', '.join(unknown) or '(none given)'}; known: {', '.join(known)}")
    return items


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="gpu-check", description=__doc__.split("\n\n")[0],
                      formatter_class=argparse.RawDescriptionHelpFormatter,
                      epilog="steps, in the order they run: " + ", ".join(STEP_NAMES))
    p.add_argument("out", metavar="OUT_DIR", help="where gpu-check.json, gpu-check.md and the logs' tarball go (new, "
                   "empty, or an earlier gpu-check output, whose files are replaced)")
    p.add_argument("--cpu", "--dry-run", dest="cpu", action="store_true",
                   help="no GPU needed: the same steps on the CPU where meaningful, CUDA-only ones skipped")
    p.add_argument("--steps", help="comma list of steps to run (default: all); the others are reported as skip")
    p.add_argument("--pipelines", help="comma list of registered pipelines (default: every registered one)")
    p.add_argument("--budget", type=positive_float, default=BUDGET_S,
                   help=f"overall time budget in seconds (default {BUDGET_S:.0f})")
    p.add_argument("--work", help="work folder (datasets, stores, results, Inductor's cache), new or empty "
                   "(default OUT_DIR/work)")
    return p


def _plan(selected: list[str]) -> list[dict[str, Any]]:
    return [{"name": s.name, "cap_s": s.timeout_s, "estimate_s": s.estimate_s, "selected": s.name in selected}
            for s in STEPS]


def run(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    import torch

    import pipelines

    if not args.cpu and not torch.cuda.is_available():
        raise InputError("gpu-check: no CUDA device here (torch.cuda.is_available() is False); "
                         "`scripts/gpu-check OUT_DIR --cpu` checks the step plumbing on the CPU")
    selected = _parse_list(args.steps, STEP_NAMES, "step")
    names = _parse_list(args.pipelines, pipelines.names(), "pipeline")
    device = "cpu" if args.cpu else "cuda"
    t0 = time.time()
    out_arg = Path(args.out)
    empty = out_arg.is_dir() and not any(out_arg.iterdir())  # used as is: no lock file beside a mount point
    with claim(args.out, "gpu-check", mode="replace", option="OUT_DIR", lock=not empty) as out:
        work = _work_dir(out, args.work)
        _fresh_output(out)
        (work / "steps").mkdir(parents=True, exist_ok=True)
        # compiled kernels go under the work folder: nothing written to the machine's home or /tmp caches
        os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(work / "inductor"))
        os.environ.setdefault("TRITON_CACHE_DIR", str(work / "triton"))
        ctx: dict[str, Any] = {"device": device, "work": str(work), "repo": str(REPO), "pipelines": names,
                               "data": str(work / "syn32"), "store": str(work / "syn32.inr")}
        deadline = t0 + args.budget - RESERVE_S
        doc: dict[str, Any] = {
            "schema_version": SCHEMA_VERSION, "kind": "gpu-check", "device": device,
            "mode": "cpu plumbing (--cpu)" if args.cpu else "cuda", "pipelines": names, "work": str(work),
            "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t0)), "budget_s": args.budget,
            "plan": _plan(selected), "valuable_caps_s": valuable_caps_s(),
            "env": _env_summary(), "complete": False, "state": "running", "elapsed_s": 0.0, "summary": "", "steps": [],
        }
        print(f"gpu-check: plan, budget {args.budget:.0f} s (one call of at most {CALL_S:.0f} s); the caps of "
              f"{', '.join(VALUABLE)} sum to {valuable_caps_s():.0f} s; estimates on one H100:", flush=True)
        for p in doc["plan"]:
            print(f"gpu-check:   {p['name']:<16} cap {p['cap_s']:4.0f} s  about {p['estimate_s']:4.0f} s"
                  f"{'' if p['selected'] else '  (not selected)'}", flush=True)

        def write() -> None:
            doc["elapsed_s"] = round(time.time() - t0, 1)
            counts = {k: sum(s["status"] == k for s in doc["steps"]) for k in STATUSES}
            doc["summary"] = ", ".join(f"{v} {k}" for k, v in counts.items())
            atomic_write_json(out / "gpu-check.json", doc)
            atomic_write_text(out / "gpu-check.md", render_md(doc))
            _write_logs(out, work)

        def record(step: Step, res: dict[str, Any], start: float) -> None:
            doc["steps"].append({"name": step.name, "status": res["status"], "seconds": round(time.time() - start, 1),
                                 "figures": res["figures"], "error": res["error"], "asserts": step.asserts})
            if step.name == "env" and res["status"] == "ok":  # what imports there, not what pip's records say
                f = res["figures"]
                doc["env"].update({k: f[k] for k in ("device_name", "torch_cuda") if k in f}, dali=f["nvidia-dali"])
            s = doc["steps"][-1]
            print(f"gpu-check: {s['name']:<16} {s['status']:<13} {s['seconds']:6.1f} s  {s['error']}", flush=True)
            write()

        def stop(signum: int, _frame: Any) -> None:
            raise Interrupted(signum)

        old = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)}
        killed: Interrupted | None = None
        setup_ok = False  # the output folder is fresh: the steps' inputs exist only once setup has run
        try:
            for step in STEPS:
                start = time.time()
                left = deadline - start
                if killed:
                    res = {"status": "skip", "figures": {}, "error": f"not reached: gpu-check was killed by {killed}"}
                elif step.name not in selected:
                    res = {"status": "skip", "figures": {}, "error": "not selected (--steps)"}
                elif left < 10:
                    res = {"status": "skip", "figures": {}, "error": f"overall budget of {args.budget:.0f} s spent"}
                elif step.needs_setup and not setup_ok:
                    res = {"status": "skip", "figures": {}, "error": "needs the setup step's dataset and store"}
                else:
                    print(f"gpu-check: {step.name} ...", flush=True)
                    try:
                        cap = step.timeout_s * (CPU_CAP_FACTOR if args.cpu else 1.0)
                        res = _run_step(step, {**ctx}, min(cap, left))
                    except Interrupted as e:
                        killed, res = e, e.result or {"status": "killed", "figures": {}, "error": f"killed by {e}"}
                    setup_ok = setup_ok or (step.name == "setup" and res["status"] == "ok")
                record(step, res, start)
        except Interrupted as e:  # between steps, or while writing: the document says so
            killed = killed or e
        finally:
            for sig, h in old.items():
                signal.signal(sig, h)
        doc["complete"] = killed is None
        doc["state"] = "complete" if killed is None else f"KILLED by {killed} (steps after it not reached)"
        write()
    print(f"gpu-check: {doc['summary']} in {doc['elapsed_s']:.0f} s; wrote {out / 'gpu-check.md'}, gpu-check.json "
          f"and {LOGS}")
    if killed:
        return 128 + killed.signum
    return 1 if any(s["status"] in ("fail", "killed") for s in doc["steps"]) else 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["_step"]:
        return run_step_child(argv[1], argv[2])
    return guarded(lambda: run(argv))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
