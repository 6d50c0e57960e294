"""``scripts/gpu-check OUT_DIR``: the one command to run when a GPU machine is lent, for minutes.

Runs every check the project needs a GPU for, continuing past failures, within an overall time
budget (default 8 minutes; each step also has its own timeout), and writes ``OUT_DIR/gpu-check.md``
and ``OUT_DIR/gpu-check.json`` after every step, so a run cut short still leaves its report. Each
step reports ``ok`` / ``fail`` / ``skip``, its seconds, key figures and the error's last line.
Work files (datasets, stores, results, the mini sweep) go under ``OUT_DIR/work``.

Every step runs in a subprocess of its own (own process group: a timeout kills it and all it
started; a crashed CUDA context or a sync-debug mode never leaks into the next step). Steps that
loop over pipelines take them from the registry (``pipelines.names()``), so a new adapter is
checked without anyone editing this file. ``STEPS`` lists them with what each asserts.

Without CUDA it exits 2 with one line. ``--cpu`` (alias ``--dry-run``) runs the same steps with
device ``cpu`` where that means something (comparisons become determinism checks: CPU against
CPU must agree) and reports the CUDA-only ones as ``skip`` with the reason: the step plumbing is
tested in CI without a GPU (``tests/test_gpucheck.py``).

Exit status: 0 every selected step ok or skipped; 1 a step failed; 2 bad usage, no CUDA, or an
``OUT_DIR`` that is not a gpu-check output (``bench.outputs.claim``: replaced only when it is one).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.errors import InputError

REPO = Path(__file__).resolve().parent.parent
SCHEMA_VERSION = 1
BUDGET_S = 480.0  # 8 minutes on one GPU, all steps together
RESERVE_S = 5.0  # kept back from the budget to write the report
PSNR_MIN_DB = 30.0  # CPU vs device output of a pipeline: agreement floor (8-bit levels)
QAT_TOL_DB = 0.5  # prune + 8-bit + QAT encode: CUDA within this of the CPU encode


class Skip(Exception):
    """A step (or part of one) that cannot run here; the message says why."""


@dataclass(frozen=True)
class Step:
    name: str
    asserts: str  # what an ``ok`` means, for the report
    timeout_s: float
    fn: Callable[[dict[str, Any]], dict[str, Any]]
    needs_setup: bool = True


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


def _run(argv: list[str], timeout: float, cwd: Path | None = None,
         env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run a command in its own process group (``env``: extra variables); on timeout kill the group and
    raise ``TimedOut`` (one line)."""
    p = subprocess.Popen(argv, cwd=cwd or REPO, env={**_env(), **(env or {})}, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = p.communicate(timeout=max(timeout, 1.0))
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGKILL)
        p.communicate()
        raise TimedOut(f"timed out after {timeout:.0f} s: {' '.join(argv[2:6])} ...", timeout) from None
    return subprocess.CompletedProcess(argv, p.returncode, out, err)


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


def _store_arg(ctx: dict[str, Any]) -> list[str]:
    return ["--store", ctx["store"]] if ctx.get("store") else []


def _open(ctx: dict[str, Any], key: str = "data"):
    from bench.datasets.prepared import open_prepared

    return open_prepared(ctx[key])


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


def _per_pipeline(ctx: dict[str, Any], check: Callable[[str], dict[str, Any]]) -> dict[str, Any]:
    """Run ``check(name)`` for every selected pipeline; one failure does not stop the others.

    On CUDA a pipeline that is ``Unavailable`` fails the step (every adapter must run on a GPU
    machine); on the CPU it is noted and skipped.
    """
    from pipelines import Unavailable

    figures: dict[str, Any] = {}
    failed, skipped = [], []
    for name in ctx["pipelines"]:
        try:
            for k, v in check(name).items():
                figures[f"{name}.{k}"] = v
        except (Unavailable, Skip) as e:
            (failed if ctx["device"] != "cpu" and isinstance(e, Unavailable) else skipped).append(name)
            figures[f"{name}.unavailable"] = last_line(str(e))
        except Exception as e:  # noqa: BLE001 - a check: report it and go on
            failed.append(name)
            figures[f"{name}.error"] = last_line(f"{type(e).__name__}: {e}")
    if failed:
        raise StepFailed(f"failed: {', '.join(failed)} ({figures.get(f'{failed[0]}.error') or figures.get(f'{failed[0]}.unavailable')})", figures)
    if skipped and len(skipped) == len(ctx["pipelines"]):
        raise Skip(f"no pipeline could run: {figures[f'{skipped[0]}.unavailable']}")
    return figures


class StepFailed(Exception):
    """A step failed but still has figures to report."""

    def __init__(self, message: str, figures: dict[str, Any]):
        super().__init__(message)
        self.figures = figures


# -------------------------------------------------------------------------------- steps


def step_setup(ctx: dict[str, Any]) -> dict[str, Any]:
    """Prepare the synthetic 32x32 set and a small INR store of it (CPU encode)."""
    work = Path(ctx["work"])
    t = lambda cap: _remaining(ctx, cap)  # noqa: E731
    _checked(inrbench(["prepare", "synthetic", "--out", str(work / "syn32"), "--size", "32",
                       "--per-class", "5", "--num-classes", "8"], t(60)), "prepare")
    _checked(inrbench(["encode", str(work / "syn32"), "--preset", "demo", "--iterations", "30", "--bits", "16:8:16",
                       "--device", "cpu", "--no-progress", "--out", str(work / "syn32.inr")], t(90)), "encode")
    from inr.store import load

    data = _open({"data": str(work / "syn32")})
    return {"train_images": len(data.split("train")), "store_psnr_db": round(float(load(work / "syn32.inr").psnr.mean()), 2)}


def _pytest(ctx: dict[str, Any], name: str, args: list[str], cap: float) -> dict[str, Any]:
    """``pytest ARGS`` in a subprocess capped at ``cap`` s, each test's outcome streamed to ``work/NAME.jsonl``
    (``bench.pytest_log``) as it finishes: a pytest killed by the cap still reports the tests it finished,
    the one it was running and how many it never reached."""
    from bench import pytest_log

    log = Path(ctx["work"]) / f"{name}.jsonl"
    log.unlink(missing_ok=True)
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "bench.pytest_log", *args]
    try:
        r = _run(argv, _remaining(ctx, cap), env={pytest_log.ENV: str(log)})
    except TimedOut as e:
        res = pytest_log.read_log(log)
        raise StepFailed(f"pytest timed out after {e.timeout_s:.0f} s, {_progress(res)}", _figures(res)) from None
    res = pytest_log.read_log(log)
    if res["collected"] is None and not res["failed"]:
        raise RuntimeError(f"pytest exit {r.returncode}: {last_line(r.stdout) or last_line(r.stderr)}")
    return _outcome(res, r.returncode, last_line(r.stdout))


def _progress(res: dict[str, Any]) -> str:
    """How far a pytest got, in words (for a run cut short)."""
    from bench.pytest_log import short

    if res["collected"] is None:
        return "killed while collecting: no test started"
    at = f"while running {short(res['running'])}" if res["running"] else "between tests"
    return (f"{at}; before it {res['passed']} passed, {res['failed']} failed, {res['skipped']} skipped; "
            f"{len(res['not_reached'])} not reached")


def _figures(res: dict[str, Any]) -> dict[str, Any]:
    from bench.pytest_log import short

    figures: dict[str, Any] = {k: res[k] for k in ("passed", "failed", "skipped")}
    if res["failures"]:
        figures["failures"] = res["failures"][:10]
    if res["running"]:
        figures["running"] = short(res["running"])
    if res["not_reached"]:
        figures["not_reached"] = len(res["not_reached"])
        figures["not_reached_tests"] = [short(n) for n in res["not_reached"][:10]]
    return figures


def _outcome(res: dict[str, Any], returncode: int = 0, tail: str = "") -> dict[str, Any]:
    """A finished pytest's (or its log's selected tests') step result: fail on a failed test or a bad exit
    (a crash names the test it was running), skip when nothing passed."""
    figures = _figures(res)
    if res["failed"] or returncode not in (0, 5):
        crash = f" ({_progress(res)})" if res["running"] else ""
        raise StepFailed(res["failures"][0] if res["failures"] else f"pytest exit {returncode}{crash}: {tail}", figures)
    if res["passed"] == 0:
        raise Skip(f"{res['skipped']} collected, all skipped: {res['skip_reason'] or 'none collected'}")
    return figures


def step_pytest_gpu(ctx: dict[str, Any]) -> dict[str, Any]:
    return _pytest(ctx, "pytest-gpu", ["-m", "gpu"], 200)


def step_cpu_vs_device(ctx: dict[str, Any]) -> dict[str, Any]:
    import torch

    from pipelines import Augment

    data, store = _open(ctx), ctx["store"]
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


def step_sync_debug(ctx: dict[str, Any]) -> dict[str, Any]:
    import warnings

    import torch

    import pipelines
    from pipelines import PipelineConfig

    if ctx["device"] == "cpu":
        raise Skip("torch.cuda.set_sync_debug_mode needs CUDA")
    data, store = _open(ctx), Path(ctx["store"])

    def check(name: str) -> dict[str, Any]:
        p = pipelines.create(name, data, PipelineConfig(batch_size=8, device=ctx["device"], workers=2, seed=1), store=store)
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


def step_bench_smoke(ctx: dict[str, Any]) -> dict[str, Any]:
    from bench.results import read_results

    work, dev = Path(ctx["work"]) / "bench", ctx["device"]
    gpu_metrics = ("gpu_mem_used_peak_bytes", "torch_peak_allocated_bytes")
    runs = (("loader", []), ("train", []), ("train", ["--no-step-sync"]))
    per = max(20.0, (ctx["deadline"] - time.time()) / max(1, len(ctx["pipelines"]) * len(runs)))

    def check(name: str) -> dict[str, Any]:
        fig: dict[str, Any] = {}
        for mode, extra in runs:
            label = mode + ("-nosync" if extra else "")
            out = work / f"{name}-{label}"
            r = inrbench(["bench", "--pipeline", name, "--data", ctx["data"], *_store_arg(ctx), "--mode", mode,
                          "--epochs", "1", "--warmup", "1", "--repeats", "1", "--min-seconds", "0", "--batch-size", "16",
                          "--workers", "2", "--device", dev, "--backbone", "small-cnn", *extra, "--out", str(out)],
                         _remaining(ctx, per))
            _checked(r, f"bench {label}")
            df = read_results(out)
            bad = df[(df.metric == "run") & (df.status != "ok")]
            if len(bad):
                raise AssertionError(f"{label}: {bad.status.iloc[0]} row: {bad.reason.iloc[0]}")
            ok = df[df.status == "ok"]
            if dev != "cpu":
                missing = [m for m in gpu_metrics if not ((ok.metric == m) & (ok.value > 0)).any()]
                if missing:
                    why = df[df.metric.isin(missing)].reason
                    raise AssertionError(f"{label}: GPU metrics missing: {', '.join(missing)} "
                                         f"({why.iloc[0] if len(why) else 'no row'})")
                peak = ok[ok.metric == "gpu_mem_used_peak_bytes"].value.max()
                fig[f"{label}.gpu_mem_peak_MiB"] = round(float(peak) / 2**20, 1)
            ips = ok[ok.metric == "images_per_s"].value
            fig[f"{label}.img_per_s"] = round(float(ips.median()), 1)
        return fig

    return _per_pipeline(ctx, check)


def step_compile(ctx: dict[str, Any]) -> dict[str, Any]:
    import torch._dynamo.utils as dyn

    data, store = _open(ctx), ctx["store"]

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
    k = "(dali and (distribution or uniform or per_image)) or agree_across"
    if ctx["device"] == "cpu":  # DALI's CPU decode: its own statistics (tests/test_pipelines.py), no cross-adapter test
        return _pytest(ctx, "dali-crops", ["tests/test_pipelines.py", "-k", "dali and (distribution or uniform or per_image)"], 150)
    ran = Path(ctx["work"]) / "pytest-gpu.jsonl"
    if ran.is_file():  # the gpu tests ran them already (tests/test_pipelines_gpu.py): read their outcomes

        def select(n: str) -> bool:
            return "test_pipelines_gpu" in n and (("dali" in n and any(w in n for w in ("distribution", "uniform",
                                                                                        "per_image"))) or "agree_across" in n)

        from bench.pytest_log import read_log

        res = read_log(ran, select)
        if res["passed"] + res["failed"] and not res["not_reached"] and not res["running"]:
            return {"from": "pytest-gpu", **_outcome(res)}
    return _pytest(ctx, "dali-crops", ["tests/test_pipelines_gpu.py", "-m", "gpu", "-k", k], 150)


def step_perf_encode(ctx: dict[str, Any]) -> dict[str, Any]:
    # cifar10's preset (5x13, 32 px, lr 1e-3) at a GPU-sized batch, eager and compiled step: the estimate of the
    # whole CIFAR-10 encode reuses these runs (one compilation); the goal is under 15 minutes on an H200
    cuda = ctx["device"] != "cpu"
    r = _checked(inrbench(["perf", "encode", "--device", ctx["device"], "--json", "--synthetic", "--size", "32",
                           "--layers", "5", "--hidden", "13", "--lr", "1e-3", "--iterations", "100" if cuda else "20",
                           "--batch", "8192" if cuda else "64", "--loop-images", "2", "--step", "both",
                           "--estimate", "cifar10"], _remaining(ctx, 150)),
                 "perf encode")
    doc = _json_doc(r.stdout)
    figs = _numbers({k: v for k, v in doc.items() if k not in ("config", "env", "estimate")})
    for s, e in ((doc.get("estimate") or {}).get("steps") or {}).items():
        figs[f"estimate.cifar10.{s}.projected_minutes"] = round(e["projected_seconds"] / 60.0, 2)
        figs[f"estimate.cifar10.{s}.image_iterations_per_s"] = round(e["image_iterations_per_s"], 1)
    return figs


def _key_figure(key: str) -> bool:
    k = key.lower()
    return any(s in k for s in ("per_s", "flop", "pct", "speedup", "ratio")) or k.startswith("peak") or k == "mean_psnr"


def _numbers(d: Any, prefix: str = "") -> dict[str, Any]:
    """The key figures among the numeric leaves of a nested dict (rates, FLOP/s, % of peak, ratios, peak
    memory, mean PSNR), rounded, keyed by their dotted path."""
    out: dict[str, Any] = {}
    for k, v in (d.items() if isinstance(d, dict) else ()):
        if isinstance(v, dict):
            out.update(_numbers(v, f"{prefix}{k}."))
        elif isinstance(v, (int, float)) and not isinstance(v, bool) and _key_figure(str(k)):
            out[f"{prefix}{k}"] = round(float(v), 3)
    return out


def step_perf_decode(ctx: dict[str, Any]) -> dict[str, Any]:
    # no torch.compile variants: their cold-cache builds (two dtypes, two sizes) do not fit the step's cap.
    # On a GPU, DALI's mixed decoder gets every core for its CPU stage (Huffman decoding of what the
    # hardware decoder does not take): one thread would make it CPU-bound and flatter the INR decoder
    threads = ["--threads", str(os.cpu_count() or 1)] if ctx["device"] != "cpu" else []
    r = _checked(inrbench(["perf", "decode", "--json", "--device", ctx["device"], "--sizes", "32", "224",
                           "--seconds", "0.1", "--repeats", "2", "--no-compile", *threads], _remaining(ctx, 120)),
                 "perf decode")
    return decode_figures(_json_doc(r.stdout), ctx["device"])


def decode_figures(doc: dict[str, Any], device: str) -> dict[str, Any]:
    """Key figures of ``perf decode --json``: per size the best INR row (img/s, % of the device's matmul
    peak, its variant), the best JPEG row (img/s, its method) and INR/JPEG; rows skipped, with the reason.
    INR/JPEG is the best of N INR variants' medians over the best of M JPEG methods', all in one process,
    with no interval: a check that both ran, not a speed claim (``inr_over_jpeg_note`` says so).

    On CUDA a skipped JPEG row fails the step (the GPU decoders the ``torch-nvjpeg`` and ``dali`` adapters
    use must run on a GPU machine); on the CPU it is noted. No INR row with % of peak: a failure.
    """
    if doc.get("device", "cpu") != device:
        raise AssertionError(f"perf decode measured on {doc.get('device', 'cpu')!r}, not {device!r}")
    fig: dict[str, Any] = {"device": doc.get("device", "cpu")}
    fig.update({f"matmul_peak_gflops.{k}": round(v, 1) for k, v in doc.get("matmul_peak_gflops", {}).items()})
    rows = doc.get("rows", [])
    skipped: list[str] = []
    for size in sorted({r.get("size") for r in rows if r.get("size") is not None}):
        at = [r for r in rows if r.get("size") == size]
        if str(size) in doc.get("inr_batch", {}):
            fig[f"{size}px.inr_batch"] = doc["inr_batch"][str(size)]  # on CUDA every row's batch
        inr_rows = [r for r in at if "pct_peak" in r]
        jpeg_rows = [r for r in at if "pct_peak" not in r and isinstance(r.get("rate"), dict)]
        skipped += [f"{size}px {r['method']}: {r['skipped']}" for r in at if "skipped" in r]
        if inr_rows:
            best = max(inr_rows, key=lambda r: r["rate"]["median"])
            fig[f"{size}px.inr_img_per_s"] = round(best["rate"]["median"], 1)
            fig[f"{size}px.inr_pct_peak"] = round(best["pct_peak"], 2)
            fig[f"{size}px.inr_variant"] = best["variant"]
        if jpeg_rows:
            top = max(jpeg_rows, key=lambda r: r["rate"]["median"])
            fig[f"{size}px.jpeg_img_per_s"] = round(top["rate"]["median"], 1)
            fig[f"{size}px.jpeg_method"] = top["method"]
        if inr_rows and jpeg_rows:
            fig[f"{size}px.inr_over_jpeg"] = round(best["rate"]["median"] / top["rate"]["median"], 2)
            fig[f"{size}px.inr_over_jpeg_note"] = (f"not a result (one process, best of {len(inr_rows)} INR variants "
                                                   f"over best of {len(jpeg_rows)} JPEG methods, no interval)")
    if skipped:
        fig["skipped"] = skipped
    if not any(k.endswith("inr_pct_peak") for k in fig):
        raise StepFailed("perf decode printed no INR row with % of peak", fig)
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
    """The ``paper`` sweep in miniature: synthetic 32 and 224, tiny counts, every cell kind."""
    # every feed gets the store (pipelines that read none ignore it): no per-adapter branch here
    feeds = [{"pipeline": n, "store": "encode-{size}-pruned-8bit"} for n in pipeline_names]
    pruned8 = {"name": "pruned-8bit", "prune": 0.15, "bits": "16:8:16", "args": {"prune_rounds": 1, "prune_finetune": 10}}
    cells: list[dict[str, Any]] = []
    # like `paper`: per size prepare, encode variants, compare, loader-only and train runs of every pipeline
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
    import pandas as pd

    try:
        df = pd.read_csv(out / "results.csv", low_memory=False)
    except (OSError, ValueError):
        return {"cells_done": 0}
    st = df[df.metric == "cell_s"].status.value_counts()
    return {"cells_done": int(st.sum()), **{f"cells_{k}": int(v) for k, v in st.items()}}


def step_sweep(ctx: dict[str, Any]) -> dict[str, Any]:
    import re

    import yaml

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
    bad = [ln.strip() for ln in r.stdout.splitlines() if re.search(r"\b(skip|error)\b", ln) and "cells (" not in ln]
    if r.returncode != 0 or not m or fig["skip"] or fig["error"]:
        fig["not_ok"] = bad[:8]
        raise StepFailed(f"sweep exit {r.returncode}: " + (bad[0] if bad else last_line(r.stderr) or last_line(r.stdout)), fig)
    return fig


# In order of what a short device lease must not miss: does everything run (the gpu tests, every pipeline on the
# device, bench), then the figures the issues wait for (the fit step's and the INR decoder's speed on the GPU), then
# the rest. Step caps add up to more than the budget: a slow first run skips the last steps, and says so.
STEPS: tuple[Step, ...] = (
    Step("setup", "`inrbench prepare synthetic` (32x32) and `inrbench encode` of it (CPU) succeed: the inputs "
         "of the other steps", 150, step_setup, needs_setup=False),
    Step("pytest-gpu", "`pytest -m gpu` (a subprocess): every gpu-marked test passes; on a CPU they are "
         "collected and skipped (status skip). Outcomes stream to work/pytest-gpu.jsonl as tests finish: cut "
         "short by the cap, the step still reports them, the test running and those not reached", 200,
         step_pytest_gpu, needs_setup=False),
    Step("cpu-vs-device", "every registered pipeline, centre crop, no flip, no shuffle: the same labels on cpu and "
         f"the device and images within {PSNR_MIN_DB:.0f} dB PSNR (max abs difference reported); on a CPU, two CPU "
         "runs (determinism)", 90, step_cpu_vs_device),
    Step("sync-debug", "every pipeline: after a warm-up epoch, the next epoch past its first batch runs under "
         "`torch.cuda.set_sync_debug_mode(\"error\")` without a host sync (first-batch syncs counted)",
         90, step_sync_debug),
    Step("bench-smoke", "`inrbench bench` loader, train and train --no-step-sync of every pipeline: exit 0, no "
         "skip/error row, GPU metrics (NVML peak, torch allocator peak) present on CUDA", 150, step_bench_smoke),
    Step("perf-encode", "`inrbench perf encode --device D --json --step both --estimate cifar10` (5x13, 32 px) runs; "
         "img-it/s of the eager and compiled fit step, batched/loop ratio, TFLOP/s / % of peak, and the projected "
         "minutes of the whole CIFAR-10 encode (goal: under 15 on an H200)", 150, step_perf_encode, needs_setup=False),
    Step("perf-decode", "`inrbench perf decode --device D --json --no-compile` (32 and 224 px) runs: the best INR "
         "decode img/s with % of the device's matmul peak, the best JPEG decoder's img/s (on CUDA: TorchCodec "
         "nvJPEG batched and DALI mixed, same batch; both must run) and INR/JPEG", 120, step_perf_decode,
         needs_setup=False),
    Step("compile", "every pipeline with compile=True: graphs compiled in epoch 1 (torch._dynamo counters), none "
         "new in epochs 2-3 (no steady-state recompiles)", 120, step_compile),
    Step("dali-crops", "DALI crop statistics (random-resized vs torchvision KS, random-pad uniform, per-image "
         "crops, agreement across adapters): mixed decode on CUDA, CPU decode on a CPU", 150, step_dali_crops,
         needs_setup=False),
    Step("encode-qat", f"encode with prune 0.15 + 8-bit + QAT on the device within {QAT_TOL_DB} dB mean PSNR of "
         "the same encode on the CPU (16 images)", 150, step_encode_qat),
    Step("sweep-mini", "the `paper` sweep in miniature (synthetic 32 and 224; prepare, encode, compare, bench "
         "loader and train of every pipeline, inrbench and python cells): every cell ok", 240, step_sweep,
         needs_setup=False),
)
STEP_NAMES = tuple(s.name for s in STEPS)


# ------------------------------------------------------------------------------ the child


def run_step_child(name: str, ctx_path: str) -> int:
    """In the step's own subprocess: run it, write its result JSON next to the context file."""
    ctx = json.loads(Path(ctx_path).read_text())
    step = next(s for s in STEPS if s.name == name)
    res: dict[str, Any] = {"status": "ok", "figures": {}, "error": ""}
    try:
        res["figures"] = step.fn(ctx)
    except Skip as e:
        res.update(status="skip", error=last_line(str(e)))
    except StepFailed as e:
        res.update(status="fail", figures=e.figures, error=last_line(str(e)))
    except Exception as e:  # noqa: BLE001 - reported, with the traceback on stderr
        traceback.print_exc()
        res.update(status="fail", error=last_line(f"{type(e).__name__}: {e}"))
    Path(ctx["work"], "steps", f"{name}.json").write_text(json.dumps(res, default=str))
    return 0


# ----------------------------------------------------------------------------- the parent


def _run_step(step: Step, ctx: dict[str, Any], timeout: float) -> dict[str, Any]:
    steps_dir = Path(ctx["work"]) / "steps"
    ctx_path = steps_dir / f"{step.name}.ctx.json"
    ctx_path.write_text(json.dumps(ctx))
    result_path = steps_dir / f"{step.name}.json"
    with contextlib.suppress(FileNotFoundError):
        result_path.unlink()
    try:
        r = _run([sys.executable, "-m", "bench.gpucheck", "_step", step.name, str(ctx_path)], timeout + 5)
    except RuntimeError as e:
        return {"status": "fail", "figures": {}, "error": f"step {e}"}
    (steps_dir / f"{step.name}.log").write_text(r.stdout + "\n--- stderr ---\n" + r.stderr)
    if not result_path.is_file():
        return {"status": "fail", "figures": {}, "error": f"step process died (exit {r.returncode}): {last_line(r.stderr)}"}
    return json.loads(result_path.read_text())


def _fmt(v: Any) -> str:
    if isinstance(v, list):
        return "; ".join(map(str, v))
    return str(v)


def render_md(doc: dict[str, Any]) -> str:
    env = doc["env"]
    lines = [
        "# inr-bench gpu-check",
        "",
        f"device **{doc['device']}** ({env.get('device_name', '')}); torch {env.get('torch')} "
        f"(CUDA {env.get('torch_cuda')}), DALI {env.get('dali')}, torch-nvjpeg decoder "
        f"{env.get('torch_nvjpeg_decoder')}; git {env.get('git_sha')}"
        f"{' (dirty)' if env.get('git_dirty') else ''}; started {doc['started_utc']}; "
        f"{'complete' if doc['complete'] else 'INCOMPLETE (still running or cut short)'}, "
        f"{doc['elapsed_s']:.0f} s of a {doc['budget_s']:.0f} s budget.",
        "",
        f"Summary: {doc['summary']}",
        "",
        "| step | status | seconds | key figures | error (last line) |",
        "|---|---|---:|---|---|",
    ]
    for s in doc["steps"]:
        figs = ", ".join(f"{k}={_fmt(v)}" for k, v in s["figures"].items())
        err = s["error"].replace("|", "\\|")
        lines.append(f"| {s['name']} | {s['status']} | {s['seconds']:.1f} | {figs.replace('|', chr(92) + '|')} | {err} |")
    lines += ["", "## What each step asserts", ""]
    lines += [f"- **{s.name}**: {s.asserts}" for s in STEPS]
    lines += ["", "Work files (datasets, stores, results, step logs) are under `work/`.", ""]
    return "\n".join(lines)


def _env_summary() -> dict[str, Any]:
    import torch

    from bench.envinfo import git_info, library_versions, torch_nvjpeg_decoder

    git = git_info()
    cuda = torch.cuda.is_available()
    nvjpeg = torch_nvjpeg_decoder()
    return {"torch": torch.__version__, "torch_cuda": torch.version.cuda, "dali": library_versions()["nvidia-dali"],
            "torch_nvjpeg_decoder": f"{nvjpeg['library']} {nvjpeg['version']}" if nvjpeg["library"] else "none",
            "device_name": torch.cuda.get_device_name(0) if cuda else "no CUDA device",
            "git_sha": (git.get("sha") or "")[:12], "git_dirty": git.get("dirty"), "python": sys.version.split()[0]}


def _fresh_output(out: Path) -> None:
    """Replace an earlier gpu-check output (already checked by ``claim``) with an empty marked folder."""
    from bench import outputs

    if out.exists():
        old = outputs.make_temp_dir(out, ".old")
        os.replace(out, old)
        shutil.rmtree(old, ignore_errors=True)
    out.mkdir(parents=True)
    outputs.write_marker(out, "gpu-check", entries=False)  # filled later: its kind's layout is what it writes


def _parse_list(value: str | None, known: list[str] | tuple[str, ...], what: str) -> list[str]:
    if value is None:
        return list(known)
    items = [v.strip() for v in value.split(",") if v.strip()]
    unknown = [v for v in items if v not in known]
    if unknown or not items:
        raise InputError(f"gpu-check: unknown {what} {', '.join(unknown) or '(none given)'}; known: {', '.join(known)}")
    return items


def build_parser() -> argparse.ArgumentParser:
    from bench.argtypes import positive_float
    from bench.cli import OneLineParser

    p = OneLineParser(prog="gpu-check", description=__doc__.split("\n\n")[0],
                      formatter_class=argparse.RawDescriptionHelpFormatter,
                      epilog="steps: " + ", ".join(STEP_NAMES))
    p.add_argument("out", metavar="OUT_DIR", help="where gpu-check.md, gpu-check.json and work/ go (new, or an "
                   "earlier gpu-check output, which is replaced)")
    p.add_argument("--cpu", "--dry-run", dest="cpu", action="store_true",
                   help="no GPU needed: the same steps on the CPU where meaningful, CUDA-only ones skipped")
    p.add_argument("--steps", help="comma list of steps to run (default: all); the others are reported as skip")
    p.add_argument("--pipelines", help="comma list of registered pipelines (default: every registered one)")
    p.add_argument("--budget", type=positive_float, default=BUDGET_S,
                   help=f"overall time budget in seconds (default {BUDGET_S:.0f})")
    return p


def run(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    import torch

    import pipelines
    from bench.outputs import claim

    if not args.cpu and not torch.cuda.is_available():
        raise InputError("gpu-check: no CUDA device here (torch.cuda.is_available() is False); "
                         "`scripts/gpu-check OUT_DIR --cpu` checks the step plumbing on the CPU")
    selected = _parse_list(args.steps, STEP_NAMES, "step")
    names = _parse_list(args.pipelines, pipelines.names(), "pipeline")
    device = "cpu" if args.cpu else "cuda"
    t0 = time.time()
    with claim(args.out, "gpu-check", mode="replace", option="OUT_DIR") as out:
        _fresh_output(out)
        work = out / "work"
        (work / "steps").mkdir(parents=True)
        ctx: dict[str, Any] = {"device": device, "work": str(work), "repo": str(REPO), "pipelines": names,
                               "data": str(work / "syn32"), "store": str(work / "syn32.inr"),
                               "deadline": t0 + args.budget - RESERVE_S}
        doc: dict[str, Any] = {
            "schema_version": SCHEMA_VERSION, "kind": "gpu-check", "device": device,
            "mode": "cpu plumbing (--cpu)" if args.cpu else "cuda", "pipelines": names,
            "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t0)), "budget_s": args.budget,
            "env": _env_summary(), "complete": False, "elapsed_s": 0.0, "summary": "", "steps": [],
        }

        def write() -> None:
            from bench.atomic import atomic_write_json, atomic_write_text

            doc["elapsed_s"] = round(time.time() - t0, 1)
            counts = {k: sum(s["status"] == k for s in doc["steps"]) for k in ("ok", "fail", "skip")}
            doc["summary"] = f"{counts['ok']} ok, {counts['fail']} fail, {counts['skip']} skip"
            atomic_write_json(out / "gpu-check.json", doc)
            atomic_write_text(out / "gpu-check.md", render_md(doc))

        setup_ok = False  # the output folder is fresh: the steps' inputs exist only once setup has run
        for step in STEPS:
            start = time.time()
            left = ctx["deadline"] - start
            if step.name not in selected:
                res = {"status": "skip", "figures": {}, "error": "not selected (--steps)"}
            elif left < 10:
                res = {"status": "skip", "figures": {}, "error": f"overall budget of {args.budget:.0f} s spent"}
            elif step.needs_setup and not setup_ok:
                res = {"status": "skip", "figures": {}, "error": "needs the setup step's dataset and store"}
            else:
                print(f"gpu-check: {step.name} ...", flush=True)
                res = _run_step(step, ctx, min(step.timeout_s, left))
                if step.name == "setup":
                    setup_ok = res["status"] == "ok"
            doc["steps"].append({"name": step.name, "status": res["status"], "seconds": round(time.time() - start, 1),
                                 "figures": res["figures"], "error": res["error"], "asserts": step.asserts})
            s = doc["steps"][-1]
            print(f"gpu-check: {s['name']:<14} {s['status']:<4} {s['seconds']:6.1f} s  {s['error']}", flush=True)
            write()
        doc["complete"] = True
        write()
    print(f"gpu-check: {doc['summary']} in {doc['elapsed_s']:.0f} s; wrote {out / 'gpu-check.md'} and gpu-check.json")
    return 1 if any(s["status"] == "fail" for s in doc["steps"]) else 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["_step"]:
        return run_step_child(argv[1], argv[2])
    from bench.cli import guarded

    return guarded(lambda: run(argv))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
