"""`inrbench perf decode`: images/s of INR decode vs JPEG decoders, side by side in one run.

Per size (default 32 and 224): PIL, ``torchvision.io.decode_jpeg``, ``torchcodec.decoders.decode_jpeg``
(what ``torch-nvjpeg`` calls when TorchCodec is installed; the row is skipped with the reason when it
cannot be imported) and DALI CPU decode of the ``photos`` JPEGs (quality 90), and batched SIREN decode (5x13 up to 64 px, 10x32 above, random
SIREN-initialized weights: decode cost does not depend on the values) in several
implementations. All on ``--threads`` CPU threads (default 1: per-core figures). INR rows
also give achieved GFLOP/s (2 * MACs of the linear layers; sines not counted) as a percentage
of this machine's dense matmul rate in the same dtype, measured in the same run (``torch.mm``
2048^3, fp32 and bf16),
and their agreement with the reference decode (PSNR against ``inr.siren.forward``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

HELP = "images/s of INR decode vs PIL / torchvision / TorchCodec / DALI JPEG decode, and INR GFLOP/s vs matmul peak"
SMALL_ARCH, LARGE_ARCH = (5, 13), (10, 32)  # Rapid-INR's CIFAR-10 and Flowers102 configurations


def add_arguments(p: argparse.ArgumentParser) -> None:
    from bench.argtypes import nonnegative_float, positive_int

    p.add_argument("--sizes", type=positive_int, nargs="+", default=[32, 224], help="image sides (default: 32 224)")
    p.add_argument("--threads", type=positive_int, default=1, help="CPU threads for every decoder (default 1: per core)")
    p.add_argument("--seconds", type=nonnegative_float, default=0.3, help="minimum time per repeat (default 0.3)")
    p.add_argument("--repeats", type=positive_int, default=5, help="repeats per row; the median is reported (default 5)")
    p.add_argument("--no-compile", action="store_true", help="skip the torch.compile variants (slow to build)")
    p.add_argument("--json", action="store_true", help="print one JSON document instead of a table")


def rate(fn: Callable[[], int], seconds: float, repeats: int) -> dict[str, float]:
    """Items/s of ``fn`` (returns items done per call): median and best of ``repeats`` timed runs."""
    fn()  # warm-up
    rates = []
    for _ in range(repeats):
        n, t0 = 0, time.perf_counter()
        while True:
            n += fn()
            dt = time.perf_counter() - t0
            if dt >= seconds:
                break
        rates.append(n / dt)
    return {"median": statistics.median(rates), "best": max(rates)}


def matmul_peak(seconds: float, repeats: int, dtype: Any = None, device: Any = None) -> float:
    """Dense ``torch.mm`` GFLOP/s (best of ``repeats``): 2048^3 on the CPU's current threads, 8192^3
    on a CUDA device (each call synchronized, so the rate is of finished products)."""
    import torch

    dev = torch.device(device or "cpu")
    cuda = dev.type == "cuda"
    n = 8192 if cuda else 2048
    a, b = torch.randn(n, n, dtype=dtype, device=dev), torch.randn(n, n, dtype=dtype, device=dev)

    def one() -> int:
        torch.mm(a, b)
        if cuda:
            torch.cuda.synchronize(dev)
        return 1

    r = rate(one, seconds, repeats)
    return r["best"] * 2 * n**3 / 1e9


def photo_jpegs(size: int, workdir: Path) -> tuple[Path, list[bytes]]:
    """Prepare ``photos`` at ``size`` (4 crops per photo) and return its train split folder and JPEG bytes."""
    from bench.datasets.prepare import prepare_dataset
    from bench.datasets.prepared import open_prepared

    out = prepare_dataset("photos", workdir / f"photos{size}", size=size, per_class=5, jpeg_quality=90)
    split = open_prepared(out).split("train")
    return split.root, [p.read_bytes() for p in split.jpeg_paths]


def jpeg_rows(size: int, root: Path, blobs: list[bytes], args: argparse.Namespace) -> list[dict[str, Any]]:
    import io

    import torch
    from PIL import Image

    rows: list[dict[str, Any]] = []

    def pil() -> int:
        for b in blobs:
            with Image.open(io.BytesIO(b)) as im:
                im.convert("RGB").load()
        return len(blobs)

    rows.append({"method": f"PIL {Image.__version__} decode", "variant": "Image.open+convert('RGB')", "rate": rate(pil, args.seconds, args.repeats)})

    import torchvision
    from torchvision.io import decode_jpeg

    tensors = [torch.frombuffer(bytearray(b), dtype=torch.uint8) for b in blobs]

    def tv() -> int:
        for t in tensors:
            decode_jpeg(t, mode="RGB")
        return len(tensors)

    with warnings.catch_warnings():  # torchvision 0.29 deprecates its decoders (for TorchCodec) on every call
        warnings.simplefilter("ignore", DeprecationWarning)
        tv_rate = rate(tv, args.seconds, args.repeats)
    rows.append({"method": f"torchvision.io.decode_jpeg {torchvision.__version__}", "variant": "cpu, one image per call",
                 "rate": tv_rate})
    rows.append(torchcodec_row(tensors, args))
    rows.append(dali_row(root, len(blobs), args))
    return rows


def torchcodec_row(tensors: list[Any], args: argparse.Namespace) -> dict[str, Any]:
    """``torchcodec.decoders.decode_jpeg`` on the CPU, called as the torchvision row calls its decoder."""
    from pipelines.torch_nvjpeg import jpeg_decoder

    row: dict[str, Any] = {"method": "torchcodec.decoders.decode_jpeg", "variant": "cpu, one image per call"}
    dec = jpeg_decoder()  # the import torch-nvjpeg does, so the row runs exactly where the adapter uses it
    if dec.library != "torchcodec":
        row["skipped"] = dec.fallback_reason
        return row
    row["method"] += f" {dec.version}"

    def tc() -> int:
        for t in tensors:
            dec.decode(t, mode="RGB")
        return len(tensors)

    row["rate"] = rate(tc, args.seconds, args.repeats)
    return row


def dali_row(root: Path, n: int, args: argparse.Namespace) -> dict[str, Any]:
    row: dict[str, Any] = {"method": "DALI decoders.image", "variant": f"cpu, num_threads={args.threads}, readers.file"}
    try:
        from nvidia.dali import fn, pipeline_def, types
    except Exception as e:
        row["skipped"] = f"nvidia.dali cannot be imported: {e}"
        return row

    @pipeline_def(batch_size=n, num_threads=args.threads, device_id=None, prefetch_queue_depth=1)
    def pipe():
        jpegs, _ = fn.readers.file(file_root=str(root), file_list=str(root / "file_list.txt"))
        return fn.decoders.image(jpegs, device="cpu", output_type=types.RGB)

    p = pipe()
    p.build()

    def run() -> int:
        p.run()
        return n

    row["rate"] = rate(run, args.seconds, args.repeats)
    return row


def inr_rows(size: int, args: argparse.Namespace, peaks: dict[str, float]) -> list[dict[str, Any]]:
    import torch

    from bench.metrics import mean_psnr, psnr_per_image, to_uint8
    from inr.siren import SirenArch, coord_grid, forward, init_weights
    from pipelines.inr_decode import SirenDecoder, cpu_chunk

    layers, hidden = SMALL_ARCH if size <= 64 else LARGE_ARCH
    arch = SirenArch(layers, hidden)
    batch = 256 if size <= 64 else 8
    weights = init_weights(arch, batch, seed=0)
    pixels = size * size
    flops = 2 * pixels * sum(i * o for i, o in arch.shapes)
    coords = coord_grid(size, size)
    theta = torch.tensor([[1.0, 0, 0], [0, 1.0, 0]]).expand(batch, 2, 3).contiguous()
    ref = forward(weights, coords, arch).clamp(0, 1).view(batch, size, size, 3).permute(0, 3, 1, 2)
    ref8 = to_uint8(ref)
    auto_chunk = cpu_chunk(arch, size)  # activations of a chunk stay in L2

    variants: list[tuple[str, Callable[[], torch.Tensor]]] = [
        ("inr.siren.forward (reference: [B,P,h] baddbmm, w0 folded, in-place sin_)", lambda: forward(weights, coords, arch)),
    ]
    for label, kw in [
        ("channels-first [B,h,P], whole batch", dict(chunk=batch)),
        (f"channels-first, chunks of {auto_chunk}", dict(chunk=auto_chunk)),
        (f"channels-first, chunks of {auto_chunk}, bf16", dict(chunk=auto_chunk, dtype=torch.bfloat16)),
    ] + ([] if args.no_compile else [
        (f"torch.compile, chunks of {auto_chunk}", dict(chunk=auto_chunk, compile=True)),
        (f"torch.compile + polynomial sine, chunks of {auto_chunk}", dict(chunk=auto_chunk, compile=True, fast_sine=True)),
        (f"torch.compile + polynomial sine, chunks of {auto_chunk}, bf16", dict(chunk=auto_chunk, compile=True, fast_sine=True, dtype=torch.bfloat16)),
    ]):
        dec = SirenDecoder(arch, size, "cpu", **kw)
        variants.append((label, lambda dec=dec: dec(weights, theta)))
    dtypes = ["fp32"] + ["bf16" if "bf16" in label else "fp32" for label, _ in variants[1:]]

    rows = []
    for (label, fn), dt in zip(variants, dtypes, strict=True):
        t0 = time.perf_counter()
        out = fn()
        first_s = time.perf_counter() - t0
        if out.shape[-1] == 3:  # reference layout [B, P, 3]
            out = out.clamp(0, 1).view(batch, size, size, 3).permute(0, 3, 1, 2)
        psnr = mean_psnr(psnr_per_image(out.float(), ref8))
        r = rate(lambda fn=fn: (fn(), batch)[1], args.seconds, args.repeats)
        gflops = r["median"] * flops / 1e9
        rows.append({
            "method": f"INR decode SIREN {layers}x{hidden}", "variant": label, "rate": r,
            "gflops": gflops, "pct_peak": 100 * gflops / peaks[dt], "peak_dtype": dt,
            "psnr_vs_reference_db": psnr, "first_call_s": first_s,
        })
    return rows


def _line(r: dict[str, Any]) -> str:
    if "skipped" in r:
        return f"{r['size']:>4}  {'skipped':>9}  {'':>7}  {'':>5}  {'':>6}  {r['method']}: {r['skipped']}"
    g = f"{r['gflops']:7.1f}" if "gflops" in r else f"{'':>7}"
    pp = f"{r['pct_peak']:5.1f}" if "pct_peak" in r else f"{'':>5}"
    ps = f"{r['psnr_vs_reference_db']:6.1f}" if "psnr_vs_reference_db" in r else f"{'':>6}"
    return f"{r['size']:>4}  {r['images_per_s']:9.0f}  {g}  {pp}  {ps}  {r['method']} / {r['variant']}"


def run(args: argparse.Namespace) -> int:
    import torch

    torch.set_num_threads(args.threads)
    peaks = {"fp32": matmul_peak(args.seconds, args.repeats), "bf16": matmul_peak(args.seconds, args.repeats, torch.bfloat16)}
    results: dict[str, Any] = {"threads": args.threads, "matmul_peak_gflops": peaks, "rows": []}
    if not args.json:
        print(f"threads: {args.threads}   dense matmul (torch.mm 2048^3): fp32 {peaks['fp32']:.1f} GFLOP/s, "
              f"bf16 {peaks['bf16']:.1f} GFLOP/s (%peak of an INR row: against its own dtype)")
        print("PSNR: INR variant vs the reference decode (8-bit, 100 = identical)")
        print(f"{'size':>4}  {'img/s':>9}  {'GFLOP/s':>7}  {'%peak':>5}  {'PSNR':>6}  method / variant", flush=True)
    with tempfile.TemporaryDirectory(prefix="inrbench-perf-decode-") as tmp:
        for size in args.sizes:
            root, blobs = photo_jpegs(size, Path(tmp))
            for row in jpeg_rows(size, root, blobs, args) + inr_rows(size, args, peaks):
                row["size"] = size
                if "rate" in row:
                    row["images_per_s"] = row["rate"]["median"]
                    row["images_per_s_per_thread"] = row["rate"]["median"] / args.threads
                results["rows"].append(row)
                if not args.json:
                    print(_line(row), flush=True)
    if args.json:
        print(json.dumps(results, indent=2))
    return 0
