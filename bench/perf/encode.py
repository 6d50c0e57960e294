"""`inrbench perf encode`: the batched encoder vs the one-image-at-a-time reference loop.

Both fit the same ``photos`` images (or synthetic ones with ``--synthetic``) with the same
architecture, learning rate, schedule and number of iterations, on the same machine, in one
run. The reference is ``inr.reference.fit_one`` (a fresh ``nn.Sequential`` and Adam per image,
keep-best state dict, as in the Rapid-INR code); the batched encoder is ``inr.fit.optimize``
on ``--batch`` images (chunks of ``--chunk``, fitted concurrently by one worker thread per
torch thread). ``--threads`` sets torch's thread count for both. Each is measured in its own subprocess
so that peak memory is its own: peak RSS minus the RSS after a small warm-up fit (libraries
loaded, data in memory) on CPU, or ``torch.cuda.max_memory_allocated`` (CUDA). Reported: image-iterations
per second of each, their ratio, peak memory, mean PSNR reached (a sanity check that both
did the same work).

The batched encoder's achieved TFLOP/s is ``6 * P * sum(in * out)`` per image-iteration (2 FLOPs
per multiply-add; forward plus the two backward products of every linear layer; sines, Adam and
keep-best evaluations not counted), shown as a percentage of the dense ``torch.mm`` rate of the
same device in the matmul dtype (fp32, or bf16 with ``--autocast bf16``), measured in the same
worker right after the fit (``bench.perf.decode.matmul_peak``): a GPU's, or on the CPU the CPU's.

``--step both`` measures the eager step (``inr.engine``, the reference) and the compiled step
(``inr.fast_step``) side by side in one run, each in its own worker (compile time reported apart,
not in the rate). ``--estimate DATASET`` measures the batched fit at that dataset's paper preset
(architecture and image size, synthetic pixels: the rate does not depend on them) and projects
the encode time of the whole dataset at the preset's iterations on this device, for each step.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HELP = "image-iterations/s of the batched INR encoder vs a one-image-at-a-time loop, ratio, peak memory"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--layers", type=int, default=5)
    p.add_argument("--hidden", type=int, default=13)
    p.add_argument("--size", type=int, default=32, help="image side (default 32)")
    p.add_argument("--iterations", type=int, default=200, help="iterations per image, both methods (default 200)")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--batch", type=int, default=256, help="images fitted by the batched encoder (default 256)")
    p.add_argument("--chunk", type=int, default=0, help="batched chunk size (default: FitConfig auto)")
    p.add_argument("--loop-images", type=int, default=4, help="images fitted by the reference loop (default 4)")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (default: torch's default)")
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (default cpu)")
    p.add_argument("--autocast", choices=["none", "bf16"], default="none",
                   help="batched encoder's matmul precision (default none = fp32)")
    p.add_argument("--synthetic", action="store_true", help="random images instead of photos")
    p.add_argument("--step", choices=["eager", "compiled", "both"], default="eager",
                   help="batched fit step: eager (reference), compiled (inr.fast_step) or both side by side (default eager)")
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
        cfg = FitConfig(arch=arch, iterations=args.iterations, lr=args.lr, batch=args.chunk, step=step)
        chunk = auto_batch(cfg, imgs.shape[0], args.size * args.size, dev)
        coords = coord_grid(args.size, args.size, device=dev)
        workers = cpu_workers() if not cuda else 1
        w = init_weights(arch, imgs.shape[0], device=dev)
        tg = images_to_targets(imgs, dev)
        # warm-up (allocator, kernels; compilation of the compiled step for these chunk shapes), not timed
        tc = time.perf_counter()
        optimize(init_weights(arch, min(2, imgs.shape[0]), device=dev), tg[:2], coords, arch, 3, args.lr)
        if step == "compiled":
            optimize(w, tg, coords, arch, 1, args.lr, chunk=chunk, workers=workers, step=step)
        sync()
        compile_s = time.perf_counter() - tc
        base = _reset_peak(cuda)
        t0 = time.perf_counter()
        _, p = optimize(w, tg, coords, arch, args.iterations, args.lr, chunk=chunk, workers=workers,
                        autocast=args.autocast, step=step)
        psnrs.append(p.cpu().numpy())
        sync()
        dt = time.perf_counter() - t0
        extra = {"chunk": chunk, "workers": workers, "autocast": args.autocast, "step": step, "warmup_seconds": compile_s,
                 **_flops(arch, args.size * args.size, imgs.shape[0] * args.iterations / dt, dev, args.autocast)}
    else:
        from inr.reference import fit_one

        fit_one(imgs[0], arch, 3, args.lr, args.device)
        sync()
        base = _reset_peak(cuda)
        t0 = time.perf_counter()
        for i in range(imgs.shape[0]):
            torch.manual_seed(i)  # the reference initializes from the global RNG
            psnrs.append(np.array([fit_one(imgs[i], arch, args.iterations, args.lr, args.device)[1]]))
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
        loop = _spawn(args, "loop", td / "loop.npy")
        by_step = {s: _spawn(args, "batched", td / "batched.npy", s) for s in steps}
        estimate = _estimate(args, steps, td) if args.estimate else None
    batched = by_step[steps[0]]
    ratio = batched["image_iterations_per_s"] / loop["image_iterations_per_s"]
    result = {
        "steps": by_step,
        "compiled_over_eager": (by_step["compiled"]["image_iterations_per_s"] / by_step["eager"]["image_iterations_per_s"]
                                if len(by_step) == 2 else None),
        "estimate": estimate,
        "config": {k: getattr(args, k) for k in ("layers", "hidden", "size", "iterations", "lr", "batch", "chunk", "loop_images", "threads", "device", "synthetic", "autocast", "step", "estimate")},
        "loop": loop,
        "batched": batched,
        "speedup": ratio,
        "env": {k: v for k, v in envinfo.collect().items() if k in ("git", "torch", "cpu", "gpu", "versions")},
    }
    if args.json:
        print(json.dumps(result, indent=2, sort_keys=True, default=str))
        return 0
    print(f"perf encode: SIREN {args.layers}x{args.hidden}, {args.size}x{args.size}, {args.iterations} iterations/image, lr {args.lr}, device {args.device}, threads {batched['threads']}")
    print(f"{'method':<44} {'images':>6} {'img-it/s':>10} {'seconds':>8} {'peak mem':>10} {'PSNR dB':>8}")
    for name, r in (("one image at a time (reference loop)", loop), (f"batched ({batched['chunk']}-image chunks x {batched['workers']} workers)", batched)):
        print(f"{name:<44} {r['images']:>6} {r['image_iterations_per_s']:>10.0f} {r['seconds']:>8.2f} {r['peak_memory_bytes'] / 2**20:>8.1f}MB {r['mean_psnr']:>8.2f}")
    k = str(min(args.loop_images, 8)) if str(min(args.loop_images, 8)) in batched["mean_psnr_first"] else "1"
    print(f"same {k} images: PSNR loop {loop['mean_psnr_first'][k]:.2f} dB, batched {batched['mean_psnr_first'][k]:.2f} dB (same fit, same iterations)")
    print(f"speedup (batched / loop image-iterations per second): {ratio:.1f}x   [memory: {loop['memory_kind']}]")
    for s, b in by_step.items():
        print(f"batched {s:<8} on {args.device}: {b['image_iterations_per_s']:>8.0f} img-it/s (chunks of {b['chunk']} x {b['workers']} workers), "
              f"{b['achieved_gflops']:.1f} GFLOP/s = {b['pct_of_peak']:.1f}% of this run's dense {b['peak_dtype']} matmul peak "
              f"({b['peak_tflops'] * 1e3:.1f} GFLOP/s); PSNR {b['mean_psnr']:.3f} dB; warm-up/compile {b['warmup_seconds']:.1f} s")
    if result["compiled_over_eager"]:
        print(f"compiled / eager batched img-it/s: {result['compiled_over_eager']:.2f}x  (same images, same iterations, one run)")
    if estimate:
        e = estimate
        print(f"estimate {e['dataset']}: {e['images']} images {e['size']}x{e['size']}, preset {e['preset']} "
              f"(SIREN {e['arch']}, {e['iterations']} iterations), measured here on {args.device}:")
        for s, r in e["steps"].items():
            print(f"  {s:<8} {r['image_iterations_per_s']:>9.1f} img-it/s ({r['achieved_gflops']:.1f} GFLOP/s) -> "
                  f"{_hms(r['projected_seconds'])} for the whole encode (fit only)")
    return 0


def _hms(sec: float) -> str:
    h, rem = divmod(int(round(sec)), 3600)
    return f"{h} h {rem // 60:02d} min" if h else f"{rem // 60} min {rem % 60:02d} s"


def _estimate(args: argparse.Namespace, steps: list[str], td: Path) -> dict[str, Any]:
    """Measure the batched fit at the named dataset's preset and project the whole encode (fit only)."""
    import numpy as np

    from inr.fit import preset

    n, size, pname = ESTIMATE[args.estimate]
    cfg = preset(pname)
    small = size <= 64
    k = max(args.batch, 32) if small else (16 if args.device.startswith("cuda") else 2)
    its = 50 if small else 3
    path = td / f"estimate{size}.npy"
    np.save(path, np.random.default_rng(0).integers(0, 256, (k, size, size, 3), dtype=np.uint8))
    out = {}
    for s in steps:
        r = _spawn(args, "batched", path, s, layers=cfg.arch.layers, hidden=cfg.arch.hidden, size=size,
                   iterations=its, lr=cfg.lr)
        out[s] = {k2: r[k2] for k2 in ("image_iterations_per_s", "achieved_gflops", "pct_of_peak", "chunk", "workers",
                                       "images", "iterations")}
        out[s]["projected_seconds"] = n * cfg.iterations / r["image_iterations_per_s"]
    return {"dataset": args.estimate, "images": n, "size": size, "preset": pname,
            "arch": f"{cfg.arch.layers}x{cfg.arch.hidden}", "iterations": cfg.iterations, "steps": out}
