"""`inrbench perf encode`: the batched encoder vs the one-image-at-a-time reference loop, same images and
settings, each side in its own subprocess (docs/inr-codec.md, "What perf encode measures")."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

from bench import jsontext
from bench.argtypes import nonnegative_int, positive_float, positive_int
from bench.cli import quiet_cuda_home_note

HELP = "image-iterations/s of the batched INR encoder vs a one-image-at-a-time loop, ratio, peak memory"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--layers", type=positive_int, default=5, help="SIREN sine layers (the cifar10 preset's)")
    p.add_argument("--hidden", type=positive_int, default=13, help="SIREN hidden width (the cifar10 preset's)")
    p.add_argument("--size", type=positive_int, default=32, help="image side (default 32)")
    p.add_argument("--iterations", type=positive_int, default=200, help="iterations per image, both methods (default 200)")
    p.add_argument("--lr", type=positive_float, default=1e-3,
                   help="Adam peak learning rate (default 1e-3: the cifar10 preset's, like --layers and --hidden; "
                        "the demo preset uses 3e-3)")
    p.add_argument("--batch", type=positive_int, default=256, help="images fitted by the batched encoder (default 256)")
    p.add_argument("--chunk", type=nonnegative_int, default=0, help="batched chunk size (default: FitConfig auto)")
    p.add_argument("--loop-images", type=positive_int, default=4, help="images fitted by the reference loop (default 4)")
    p.add_argument("--threads", type=nonnegative_int, default=0, help="torch CPU threads (default: torch's default)")
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (default cpu)")
    p.add_argument("--autocast", choices=["none", "bf16"], default="none",
                   help="batched encoder's matmul precision (default none = fp32)")
    p.add_argument("--synthetic", action="store_true", help="random images instead of photos")
    p.add_argument("--step", choices=["eager", "compiled", "both"], default="eager",
                   help="batched fit step: eager (reference), compiled (inr.loop) or both side by side (default eager)")
    p.add_argument("--repeats", type=positive_int, default=1,
                   help="measurements per step and of the reference loop, each in its own process, interleaved; "
                        "the median is reported, with intervals on batched/loop and compiled/eager (default 1: "
                        "ratios without an interval, not results; use >= 3)")
    p.add_argument("--estimate-iterations", type=positive_int, default=0,
                   help="iterations per estimate measurement (default: 200 at 32 px; at 224 px 20 on a CPU, 50 on a GPU)")
    p.add_argument("--estimate", choices=sorted(ESTIMATE),
                   help="also project the paper preset's encode time of this whole dataset on this device")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--_worker", choices=["batched", "loop"], help=argparse.SUPPRESS)
    p.add_argument("--_step", default="eager", help=argparse.SUPPRESS)
    p.add_argument("--_images", help=argparse.SUPPRESS)


# dataset -> (images encoded, image side, preset): CIFAR-10's train split; every image of the others
ESTIMATE = {"cifar10": (50_000, 32, "cifar10"), "flowers102": (8_189, 224, "flowers102"),
            "mini-imagenet": (60_000, 224, "mini-imagenet")}


def _images(args: argparse.Namespace, n: int, workdir: Path):
    import numpy as np

    if args.synthetic:
        return np.random.default_rng(0).integers(0, 256, (n, args.size, args.size, 3), dtype=np.uint8)
    from bench.datasets.prepare import prepare_dataset
    from bench.datasets.prepared import open_prepared

    out = prepare_dataset("photos", workdir / "photos", size=args.size, per_class=max(5, n // 8 + 5), jpeg_quality=90)
    imgs = np.asarray(open_prepared(out).split("train").images)
    reps = -(-n // imgs.shape[0])
    return np.concatenate([imgs] * reps)[:n]


def _rss() -> int:
    import psutil

    return psutil.Process().memory_info().rss


def _reset_peak(cuda: bool) -> int:
    """Start of the measured region: reset CUDA peak stats; on CPU return the RSS now (after warm-up)."""
    import torch

    if cuda:
        torch.cuda.reset_peak_memory_stats()
        return 0
    return _rss()


def _worker(args: argparse.Namespace) -> dict[str, Any]:
    """Runs in a subprocess: one method, timed, with its own peak memory."""
    import time

    import numpy as np
    import torch

    from bench.perf.rss import peak_rss
    from inr.fit import FitConfig, auto_batch, cpu_workers, images_to_targets, optimize
    from inr.loop import Loop
    from inr.siren import SirenArch, coord_grid, init_weights

    if args.threads:
        torch.set_num_threads(args.threads)
    dev = torch.device(args.device)
    imgs = np.load(args._images)
    arch = SirenArch(args.layers, args.hidden)
    cuda = dev.type == "cuda"

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    psnrs = []
    if args._worker == "batched":
        step = args._step
        if step == "compiled":
            quiet_cuda_home_note()
        cfg = FitConfig(arch=arch, iterations=args.iterations, lr=args.lr, batch=args.chunk, step=step)
        chunk = auto_batch(cfg, imgs.shape[0], args.size * args.size, dev)
        coords = coord_grid(args.size, args.size, device=dev)
        workers = cpu_workers() if not cuda else 1
        loop = Loop(args.iterations, args.lr, step=step, autocast=args.autocast, chunk=chunk, workers=workers)
        w = init_weights(arch, imgs.shape[0], device=dev)
        tg = images_to_targets(imgs, dev)
        # warm-up (allocator, kernels; compilation of the compiled step for these chunk shapes), not timed
        tc = time.perf_counter()
        optimize(w, tg, coords, arch, replace(loop, iterations=1))
        sync()
        compile_s = time.perf_counter() - tc
        base = _reset_peak(cuda)
        t0 = time.perf_counter()
        _, p, _ = optimize(w, tg, coords, arch, loop)
        psnrs.append(p.cpu().numpy())
        sync()
        dt = time.perf_counter() - t0
        extra = {"chunk": chunk, "workers": workers, "autocast": args.autocast, "step": step, "warmup_seconds": compile_s,
                 **_flops(arch, args.size * args.size, imgs.shape[0] * args.iterations / dt, dev, args.autocast)}
    else:
        fit_one(imgs[0], arch, 3, args.lr, args.device)
        sync()
        base = _reset_peak(cuda)
        t0 = time.perf_counter()
        for i in range(imgs.shape[0]):
            torch.manual_seed(i)  # the reference initializes from the global RNG
            psnrs.append(np.array([fit_one(imgs[i], arch, args.iterations, args.lr, args.device)]))
        sync()
        dt = time.perf_counter() - t0
        extra = {}
    peak = torch.cuda.max_memory_allocated() if cuda else peak_rss() - base  # VmHWM: ru_maxrss survives exec
    return {
        "method": args._worker,
        "images": int(imgs.shape[0]),
        "iterations": args.iterations,
        "seconds": dt,
        "image_iterations_per_s": imgs.shape[0] * args.iterations / dt,
        "peak_memory_bytes": int(max(peak, 0)),
        "memory_kind": "cuda max_memory_allocated" if cuda else "peak RSS growth after warm-up",
        "mean_psnr": float(np.concatenate(psnrs).mean()),
        "mean_psnr_first": {str(k): float(np.concatenate(psnrs)[:k].mean()) for k in (1, 2, 4, 8)},
        "threads": torch.get_num_threads(),
        **extra,
    }


def fit_one(image: Any, arch: Any, iterations: int, lr: float, device: str = "cpu") -> float:
    """The reference design (Rapid-INR / COIN): one uint8 ``[H, W, 3]`` image, its own parameters, autograd through
    ``inr.siren.net``, ``torch.optim.Adam`` with ``CosineAnnealingLR``, best PSNR kept. Returns that PSNR."""
    import math

    import torch

    from inr.siren import coord_grid, first_layer_input, fold_theta, net, psnr8

    h, w, _ = image.shape
    a0 = first_layer_input(coords=coord_grid(h, w, device=device))
    t01 = torch.as_tensor(image, device=device).reshape(1, -1, 3).permute(0, 2, 1).float() / 255.0
    bound = [1.0 / i if li == 0 else math.sqrt(6.0 / i) / arch.w0 for li, (i, _) in enumerate(arch.shapes)]
    params = [torch.empty(1, o, i + 1, device=device).uniform_(-b, b).requires_grad_()
              for (i, o), b in zip(arch.shapes, bound, strict=True)]
    opt = torch.optim.Adam(params, lr=lr)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=iterations)
    best = -math.inf
    for _ in range(iterations):
        rgb = net(fold_theta(params, arch.scales), a0)[0]
        best = max(best, float(psnr8(rgb.detach(), t01)))
        opt.zero_grad()
        (rgb - t01).pow(2).mean().backward()
        opt.step()
        sched.step()
    return best


def flops_per_image_iteration(arch: Any, pixels: int) -> int:
    """``6 * P * sum(in * out)``: forward + both backward products of every linear layer."""
    return 6 * pixels * sum(i * o for i, o in arch.shapes)


def _flops(arch: Any, pixels: int, img_it_per_s: float, dev: Any, autocast: str) -> dict[str, Any]:
    """Achieved TFLOP/s of the batched fit and the device's dense matmul peak, measured now."""
    import torch

    from bench.perf.decode import matmul_peak

    dtype = torch.bfloat16 if autocast == "bf16" else torch.float32
    peak = matmul_peak(0.2, 3, dtype=dtype, device=dev) / 1e3
    achieved = img_it_per_s * flops_per_image_iteration(arch, pixels) / 1e12
    return {"flops_per_image_iteration": flops_per_image_iteration(arch, pixels), "achieved_tflops": achieved,
            "peak_tflops": peak, "peak_dtype": str(dtype).replace("torch.", ""),
            "pct_of_peak": 100.0 * achieved / peak if peak > 0 else float("nan"), "achieved_gflops": achieved * 1e3}


def _spawn(args: argparse.Namespace, method: str, images_path: Path, step: str = "eager", **over) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "bench.cli", "perf", "encode", "--_worker", method, "--_images", str(images_path),
           "--_step", step]
    for k in ("layers", "hidden", "size", "iterations", "lr", "chunk", "threads", "device", "autocast"):
        cmd += [f"--{k}", str(over.get(k, getattr(args, k)))]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"perf encode worker {method} failed:\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def run(args: argparse.Namespace) -> int:
    from bench.devices import resolve_device

    args.device = resolve_device(args.device)  # a malformed or absent device: exit 2, not a worker traceback
    if args._worker:
        print(json.dumps(_worker(args)))
        return 0
    import numpy as np

    from bench import envinfo

    with tempfile.TemporaryDirectory(prefix="perf-encode-") as td:
        td = Path(td)
        imgs = _images(args, max(args.batch, args.loop_images), td)
        np.save(td / "batched.npy", imgs[: args.batch])
        np.save(td / "loop.npy", imgs[: args.loop_images])
        steps = ["eager", "compiled"] if args.step == "both" else [args.step]
        by_step = _repeated(args, steps, td / "batched.npy", loop=td / "loop.npy")
        loop = by_step.pop("loop")
        estimate = _estimate(args, steps, td, by_step) if args.estimate else None
    peak = _run_peak(by_step, estimate)
    batched = by_step[steps[0]]
    speedup = _batched_over_loop(batched, loop)
    ratio = speedup["value"]
    ce = _compiled_over_eager(by_step)
    result = {
        "steps": by_step,
        "compiled_over_eager": ce["value"] if ce else None,
        "compiled_over_eager_ci": ce,
        "estimate": estimate,
        "matmul_peak": peak,
        "config": {**{k: getattr(args, k) for k in ("layers", "hidden", "size", "iterations", "lr", "batch", "chunk", "loop_images", "threads", "device", "synthetic", "autocast", "step", "estimate", "repeats")},
                   "preset": _matching_preset(args)},
        "loop": loop,
        "batched": batched,
        "speedup": ratio,
        "speedup_ci": speedup,
        "env": {k: v for k, v in envinfo.collect().items() if k in ("git", "torch", "cpu", "gpu", "versions")},
    }
    if args.json:
        print(jsontext.dumps(result, indent=2, sort_keys=True, default=str))
        return 0
    preset = result["config"]["preset"]
    print(f"perf encode: SIREN {args.layers}x{args.hidden}, {args.size}x{args.size}, {args.iterations} iterations/image, "
          f"lr {args.lr} ({f'the {preset} preset' if preset else 'no preset'}'s architecture and lr), "
          f"device {args.device}, threads {batched['threads']}")
    print(f"{'method':<44} {'images':>6} {'img-it/s':>10} {'seconds':>8} {'peak mem':>10} {'PSNR dB':>8}")
    for name, r in (("one image at a time (reference loop)", loop), (f"batched ({batched['chunk']}-image chunks x {batched['workers']} workers)", batched)):
        print(f"{name:<44} {r['images']:>6} {r['image_iterations_per_s']:>10.0f} {r['seconds']:>8.2f} {r['peak_memory_bytes'] / 2**20:>8.1f}MB {r['mean_psnr']:>8.2f}")
    k = str(min(args.loop_images, 8)) if str(min(args.loop_images, 8)) in batched["mean_psnr_first"] else "1"
    print(f"same {k} images: PSNR loop {loop['mean_psnr_first'][k]:.2f} dB, batched {batched['mean_psnr_first'][k]:.2f} dB (same fit, same iterations)")
    print(f"speedup (batched / loop image-iterations per second): {_fmt_ratio(speedup)}   "
          f"[memory: {loop['memory_kind']}]")
    print(_peak_line(peak, args.device))
    for s, b in by_step.items():
        print(f"batched {s:<8} on {args.device}: {b['image_iterations_per_s']:>8.0f} img-it/s{_spread(b['rates'])} "
              f"(chunks of {b['chunk']} x {b['workers']} workers), "
              f"{b['achieved_gflops']:.1f} GFLOP/s = {b['pct_of_peak']:.1f}% of peak; PSNR {b['mean_psnr']:.3f} dB; "
              f"warm-up/compile {b['warmup_seconds']:.1f} s")
    if ce:
        print(f"compiled / eager batched img-it/s: {_fmt_ratio(ce, 2)}  (same images, same iterations; "
              f"{args.repeats} interleaved process(es) per step)")
    if estimate:
        e = estimate
        print(f"estimate {e['dataset']}: {e['images']} images {e['size']}x{e['size']}, preset {e['preset']} "
              f"(SIREN {e['arch']}, {e['iterations']} iterations), measured here on {args.device} "
              f"({e['measured_iterations']} iterations x {e['measured_images']} images per measurement"
              f"{': the runs above' if e['reused_main_measurement'] else ''}):")
        for s, r in e["steps"].items():
            rng = r["projected_seconds_range"]
            span = f" [{_hms(rng[0])} - {_hms(rng[1])}]" if len(r["rates"]) > 1 else ""
            print(f"  {s:<8} {r['image_iterations_per_s']:>9.1f} img-it/s{_spread(r['rates'])} ({r['achieved_gflops']:.1f} GFLOP/s) -> "
                  f"{_hms(r['projected_seconds'])}{span} for the whole encode (fit only)")
        if e.get("compiled_over_eager_ci"):
            print(f"  compiled / eager: {_fmt_ratio(e['compiled_over_eager_ci'], 2)}")
    return 0


def _repeated(args: argparse.Namespace, steps: list[str], images: Path, loop: Path | None = None,
              **over) -> dict[str, dict[str, Any]]:
    """``args.repeats`` batched workers per step, interleaved (``ABBA...``): per step the median run's
    figures, with ``rates`` (every run's img-it/s) and ``image_iterations_per_s`` the median run's.
    ``loop``: the reference loop's images; it then runs as often, interleaved with the steps (key
    ``"loop"``), so batched / loop has as many processes a side."""
    kinds = (["loop"] if loop is not None else []) + list(steps)
    runs: dict[str, list[dict[str, Any]]] = {s: [] for s in kinds}
    for r in range(args.repeats):
        for s in (kinds if r % 2 == 0 else kinds[::-1]):
            runs[s].append(_spawn(args, "loop", loop) if s == "loop" else _spawn(args, "batched", images, s, **over))
    out = {}
    for s, rs in runs.items():
        rates = [x["image_iterations_per_s"] for x in rs]
        med = sorted(rs, key=lambda x: x["image_iterations_per_s"])[(len(rs) - 1) // 2]  # lower median: a real run
        out[s] = {**med, "rates": rates}
        if s != "loop":
            out[s]["peak_tflops_runs"] = [x["peak_tflops"] for x in rs]
    return out


RATIO_METHOD = "ratio of geometric means, Welch's 95% t interval"


def _process_ratio(top: list[float], bottom: list[float]) -> dict[str, Any]:
    """``top`` / ``bottom`` image-iterations per second (one rate per worker process) with processes as
    the units, as the report's speedups (``bench.stats.unit_ratio_ci``: each process's rate counts once;
    ratio of geometric means, Welch's 95% t interval on the logs). Every ratio ``perf encode`` prints
    takes this one method. One process a side: the ratio, no interval (null bounds)."""
    from bench.stats import unit_ratio_ci

    iv = unit_ratio_ci([[r] for r in top], [[r] for r in bottom])
    lo, hi = _bounds(iv)
    return {"value": iv.value, "lo": lo, "hi": hi, "n": iv.n, "why": iv.why or None, "method": RATIO_METHOD}


def _batched_over_loop(batched: dict[str, Any], loop: dict[str, Any]) -> dict[str, Any]:
    """Batched / loop image-iterations per second (``_process_ratio``)."""
    return _process_ratio(batched["rates"], loop["rates"])


def _bounds(iv: Any) -> tuple[float | None, float | None]:
    """An interval's bounds for ``--json``: both None where there is no interval (JSON has no NaN)."""
    import math

    return (iv.lo, iv.hi) if math.isfinite(iv.lo) and math.isfinite(iv.hi) else (None, None)


def _fmt_ratio(r: dict[str, Any], digits: int = 1) -> str:
    """A ``_process_ratio``: ``5.21x [4.80-5.65] (2 processes a side; ratio of geometric means, ...)``, or,
    with one process a side, the ratio said to be no result, as the report says it."""
    from bench.stats import Interval, fmt_ratio

    if r["n"] >= 2 and r["lo"] is None:  # processes a side, every rate equal: no spread (``_bounds``)
        return f"{r['value']:.{digits}f}x ({r.get('why') or 'no spread'}: no interval, not a result)"
    if r["n"] < 2 or r["lo"] is None:  # one process a side: no interval
        return (f"{r['value']:.{digits}f}x (one process a side: no interval, not a result; --repeats N >= 2 "
                "runs each side in N processes)")
    return f"{fmt_ratio(Interval(r['value'], r['lo'], r['hi'], r['n']))} ({r['n']} processes a side; {RATIO_METHOD})"


def _run_peak(by_step: dict[str, dict[str, Any]], estimate: dict[str, Any] | None) -> dict[str, Any]:
    """The run's dense matmul peak, the best of every batched worker's measurement (main runs and the
    estimate's), and every step's ``pct_of_peak`` against it (the worker's own measurement stays in
    ``worker_peak_tflops``), so that the steps' percentages compare. Returns how the peak was taken."""
    runs = list(by_step.values())
    if estimate and not estimate["reused_main_measurement"]:
        runs += list(estimate["steps"].values())
    measured = [t for r in runs for t in r["peak_tflops_runs"]]
    peak = max(measured)
    for r in [*by_step.values(), *((estimate or {}).get("steps") or {}).values()]:
        r.setdefault("worker_peak_tflops", r.get("peak_tflops"))
        r["peak_tflops"] = peak
        r["pct_of_peak"] = 100.0 * r["achieved_gflops"] / (peak * 1e3) if peak > 0 else float("nan")
    dtypes = {r["peak_dtype"] for r in by_step.values()}
    return {"tflops": peak, "dtype": "/".join(sorted(dtypes)), "measurements": len(measured),
            "min_tflops": min(measured), "how": "best of every batched worker's dense torch.mm measurement in this "
            "run (bench.perf.decode.matmul_peak, right after its fit)"}


def _peak_line(peak: dict[str, Any], device: str) -> str:
    n = peak["measurements"]
    which = (f"the best of the {n} batched workers' measurements ({peak['min_tflops'] * 1e3:.1f}-"
             f"{peak['tflops'] * 1e3:.1f}, each right after its fit)" if n > 1
             else "the batched worker's measurement, right after its fit")
    return (f"matmul peak: {peak['tflops'] * 1e3:.1f} GFLOP/s dense {peak['dtype']} torch.mm on {device}, {which}; "
            "every % of peak below is against it")


def _matching_preset(args: argparse.Namespace) -> str | None:
    """The fit preset whose architecture and lr this run uses (the defaults: cifar10's), or None."""
    from inr.fit import PRESETS

    return next((name for name, c in PRESETS.items()
                 if (c.arch.layers, c.arch.hidden, c.lr) == (args.layers, args.hidden, args.lr)), None)


def _compiled_over_eager(by_step: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    """Compiled / eager batched image-iterations per second (``_process_ratio``; None unless both ran)."""
    if set(by_step) != {"eager", "compiled"}:
        return None
    return _process_ratio(by_step["compiled"]["rates"], by_step["eager"]["rates"])


def _spread(rates: list[float]) -> str:
    return f" [{min(rates):.0f}-{max(rates):.0f} over {len(rates)}]" if len(rates) > 1 else ""


def _hms(sec: float) -> str:
    h, rem = divmod(int(round(sec)), 3600)
    return f"{h} h {rem // 60:02d} min" if h else f"{rem // 60} min {rem % 60:02d} s"


def _estimate(args: argparse.Namespace, steps: list[str], td: Path,
              measured: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Measure the batched fit at the named dataset's preset and project the whole encode (fit only);
    reuses the main measurement's runs when they already match the preset and iterations."""
    import numpy as np

    from inr.fit import preset

    n, size, pname = ESTIMATE[args.estimate]
    cfg = preset(pname)
    same = ((args.layers, args.hidden, args.size, args.lr) == (cfg.arch.layers, cfg.arch.hidden, size, cfg.lr)
            and args.estimate_iterations in (0, args.iterations))
    if same:
        runs, k, its = measured, args.batch, args.iterations
    else:
        small = size <= 64
        cuda = args.device.startswith("cuda")
        # 224 px: 4 images x 20 iterations on a CPU: a few iterations are too few to be stable
        # (docs/encoding-cost.md, section 1)
        k = (max(args.batch, 32) if not cuda else 8192) if small else (64 if cuda else 4)
        its = args.estimate_iterations or (200 if small else (50 if cuda else 20))
        path = td / f"estimate{size}.npy"
        np.save(path, np.random.default_rng(0).integers(0, 256, (k, size, size, 3), dtype=np.uint8))
        runs = _repeated(args, steps, path, layers=cfg.arch.layers, hidden=cfg.arch.hidden, size=size, iterations=its,
                         lr=cfg.lr)
    out = {}
    for s, r in runs.items():
        out[s] = {k2: r[k2] for k2 in ("image_iterations_per_s", "achieved_gflops", "pct_of_peak", "chunk", "workers",
                                       "images", "iterations", "rates", "peak_tflops", "peak_tflops_runs")}
        out[s]["projected_seconds"] = n * cfg.iterations / r["image_iterations_per_s"]
        out[s]["projected_seconds_range"] = [n * cfg.iterations / max(r["rates"]), n * cfg.iterations / min(r["rates"])]
    return {"dataset": args.estimate, "images": n, "size": size, "preset": pname,
            "arch": f"{cfg.arch.layers}x{cfg.arch.hidden}", "iterations": cfg.iterations, "steps": out,
            "measured_iterations": its, "measured_images": k, "reused_main_measurement": same,
            "compiled_over_eager_ci": _compiled_over_eager(runs)}
