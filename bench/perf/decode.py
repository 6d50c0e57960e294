"""`inrbench perf decode`: images/s of batched INR decode against CPU and CUDA JPEG decoders in one run,
with GFLOP/s as a share of the matmul peak and PSNR; unrunnable rows skipped (docs/measurement.md)."""

from __future__ import annotations

import argparse
import io
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import jsontext
from bench.argtypes import nonnegative_float, positive_int

HELP = "images/s of INR decode vs PIL / torchvision / TorchCodec / DALI JPEG decode, and INR GFLOP/s vs matmul peak"
SMALL_ARCH, LARGE_ARCH = (5, 13), (10, 32)  # Rapid-INR's CIFAR-10 and Flowers102 configurations


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--sizes", type=positive_int, nargs="+", default=[32, 224], help="image sides (default: 32 224)")
    p.add_argument("--threads", type=positive_int, default=1, help="CPU threads for every decoder (default 1: per core)")
    p.add_argument("--seconds", type=nonnegative_float, default=0.3, help="minimum time per repeat (default 0.3)")
    p.add_argument("--repeats", type=positive_int, default=5, help="repeats per row; the median is reported (default 5)")
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (default cpu): where the matmul peak, the INR "
                   "decode and (on CUDA) the JPEG decoders run")
    p.add_argument("--no-compile", action="store_true", help="skip the torch.compile variants (slow to build)")
    p.add_argument("--json", action="store_true", help="print one JSON document instead of a table")


def inr_batch(size: int, cuda: bool) -> int:
    """Images per decode call at ``size``: CPU, seconds of work per call on one core; CUDA, a batch that
    fills the GPU so per-call launch costs stay small (docs/measurement.md, "perf decode")."""
    if cuda:
        return 4096 if size <= 64 else 256
    return 256 if size <= 64 else 8


def synchronizer(device: Any) -> Callable[[], None]:
    """``torch.cuda.synchronize`` of ``device`` on CUDA (before a clock read), nothing on the CPU."""
    import torch

    dev = torch.device(device)
    if dev.type != "cuda":
        return lambda: None
    return lambda: torch.cuda.synchronize(dev)


def rate(fn: Callable[[], int], seconds: float, repeats: int) -> dict[str, float]:
    """Items/s of ``fn`` (returns items done per call): median and best of ``repeats`` runs of ``seconds``."""
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
    """Dense ``torch.mm`` GFLOP/s (best of ``repeats``): 2048^3 on the CPU (512^3 in bf16, which a CPU without
    native bf16 runs far slower), 8192^3 on CUDA (synchronized)."""
    import torch

    dev = torch.device(device or "cpu")
    cuda = dev.type == "cuda"
    n = 8192 if cuda else 2048 if dtype in (None, torch.float32) else 512
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


def _each(decode: Callable[[Any], Any], items: list[Any]) -> Callable[[], int]:
    """A timing step: ``decode`` each of ``items``, one call each."""
    def step() -> int:
        for x in items:
            decode(x)
        return len(items)

    return step


def _pil_decode(data: bytes) -> None:
    from PIL import Image

    with Image.open(io.BytesIO(data)) as im:
        im.convert("RGB").load()


def jpeg_rows(size: int, root: Path, blobs: list[bytes], args: argparse.Namespace) -> list[dict[str, Any]]:
    """The CPU JPEG decoders, one image per call: PIL, torchvision, TorchCodec, and DALI (a batch per call)."""
    import PIL
    import torch
    import torchvision
    from torchvision.io import decode_jpeg

    tensors = [torch.frombuffer(bytearray(b), dtype=torch.uint8) for b in blobs]
    with warnings.catch_warnings():  # torchvision 0.29 deprecates its decoders (for TorchCodec) on every call
        warnings.simplefilter("ignore", DeprecationWarning)
        tv = rate(_each(lambda t: decode_jpeg(t, mode="RGB"), tensors), args.seconds, args.repeats)
    return [{"method": f"PIL {PIL.__version__} decode", "variant": "Image.open+convert('RGB')",
             "rate": rate(_each(_pil_decode, blobs), args.seconds, args.repeats)},
            {"method": f"torchvision.io.decode_jpeg {torchvision.__version__}", "variant": "cpu, one image per call",
             "rate": tv},
            torchcodec_row(tensors, args), dali_row(root, len(blobs), args, size)]


def torchcodec_row(tensors: list[Any], args: argparse.Namespace) -> dict[str, Any]:
    """``torchcodec.decoders.decode_jpeg`` on the CPU where ``torch-nvjpeg`` would use it, as the torchvision row."""
    from pipelines.torch_nvjpeg import jpeg_decoder

    row: dict[str, Any] = {"method": "torchcodec.decoders.decode_jpeg", "variant": "cpu, one image per call"}
    dec = jpeg_decoder()
    if dec.library != "torchcodec":
        row["skipped"] = dec.fallback_reason
        return row
    row["method"] += f" {dec.version}"
    row["rate"] = rate(_each(lambda t: dec.decode(t, mode="RGB"), tensors), args.seconds, args.repeats)
    return row


def dali_row(root: Path, n: int, args: argparse.Namespace, size: int) -> dict[str, Any]:
    """DALI ``decoders.image`` of the files under ``root``, ``n`` per call: on the CPU, or ``mixed`` on a CUDA
    ``--device`` with the ``dali`` adapter's decoder options."""
    import torch

    dev = torch.device(args.device)
    gpu = dev.type == "cuda"
    device_id = (dev.index if dev.index is not None else torch.cuda.current_device()) if gpu else None
    row: dict[str, Any] = {"method": "DALI decoders.image", "variant": f"cpu, num_threads={args.threads}, readers.file"}
    if gpu:
        row["variant"] = f"mixed, device_id={device_id}, num_threads={args.threads}, readers.file, batch of {n} per call"
    try:
        from nvidia.dali import fn, pipeline_def, types
    except Exception as e:
        row["skipped"] = f"nvidia.dali cannot be imported: {e}"
        return row
    kw: dict[str, Any] = {}
    if gpu:
        from pipelines.dali import decoder_options, hw_jpeg_decoder

        hw = hw_jpeg_decoder(torch.cuda.get_device_name(device_id), torch.cuda.get_device_capability(device_id))
        kw = decoder_options(True, hw, size, size)
        row["variant"] += f", hardware decoder {'expected' if hw else 'not expected'}"

    @pipeline_def(batch_size=n, num_threads=args.threads, device_id=device_id, prefetch_queue_depth=1)
    def pipe():
        jpegs, _ = fn.readers.file(file_root=str(root), file_list=str(root / "file_list.txt"))
        return fn.decoders.image(jpegs, device="mixed" if gpu else "cpu", output_type=types.RGB, **kw)

    sync = synchronizer(dev)
    pipes: list[Any] = []  # the one pipeline, dropped (and on a GPU its pooled memory released) at the end
    try:
        pipes.append(pipe())
        pipes[0].build()
        # mixed: the decode runs on DALI's stream; the device-wide synchronize waits for it
        row["rate"] = rate(lambda: (pipes[0].run(), sync(), n)[2], args.seconds, args.repeats)
    except Exception as e:  # noqa: BLE001 - on a GPU: a DALI without CUDA, no nvImageCodec, an old driver
        if not gpu:
            raise
        row["skipped"] = f"DALI mixed decode cannot run on {args.device}: {_one_line(e)}"
    finally:
        pipes.clear()
        if gpu:  # the rows measured after it start without DALI's pools
            from pipelines.dali import release_memory

            release_memory()
    return row


def _one_line(e: BaseException) -> str:
    return f"{type(e).__name__}: {' '.join(str(e).split())}"[:300]


def gpu_jpeg_rows(size: int, root: Path, blobs: list[bytes], batch: int, args: argparse.Namespace) -> list[dict[str, Any]]:
    """The GPU JPEG decoders, ``batch`` images per call (the files repeated): nvJPEG and DALI ``mixed``."""
    import torch

    tensors = [torch.frombuffer(bytearray(b), dtype=torch.uint8) for b in blobs]
    data = [tensors[i % len(tensors)] for i in range(batch)]
    return [nvjpeg_row(data, args), dali_row(root, batch, args, size)]


def nvjpeg_row(data: list[Any], args: argparse.Namespace) -> dict[str, Any]:
    """``decode_jpeg(list, mode="RGB", device=D)``, synchronized: the call ``torch-nvjpeg`` makes per batch."""
    from pipelines import Unavailable
    from pipelines.torch_nvjpeg import _reason, jpeg_decoder

    row: dict[str, Any] = {"method": "decode_jpeg (torch-nvjpeg)", "variant": f"{args.device}, batch of {len(data)} per call"}
    try:
        dec = jpeg_decoder()
    except Unavailable as e:
        row["skipped"] = str(e)
        return row
    row["method"] = f"{dec.function} {dec.version}"
    sync = synchronizer(args.device)

    def run() -> int:
        dec.decode(data, mode="RGB", device=args.device)
        sync()
        return len(data)

    try:
        row["rate"] = rate(run, args.seconds, args.repeats)
    except Exception as e:  # noqa: BLE001 - a decoder built without nvJPEG, or none for this device
        row["skipped"] = f"{dec.function} cannot decode on {args.device}: {type(e).__name__}: {_reason(e)}"[:400]
    return row


def decoder_variants(size: int, device: Any, no_compile: bool) -> list[tuple[str, dict[str, Any]]]:
    """``(label, SirenDecoder keyword arguments)`` of the measured decoders: on CUDA as the ``inr`` adapter
    builds them there (whole batch, ``torch.sin``); on the CPU also L2-sized chunks and the polynomial sine."""
    import torch

    from pipelines.inr_decode import cpu_chunk

    bf16 = torch.bfloat16
    if torch.device(device).type == "cuda":
        return [("channels-first [B,h,P], whole batch", {}),
                ("channels-first, whole batch, bf16", dict(dtype=bf16))] + ([] if no_compile else [
                ("torch.compile, whole batch", dict(compile=True)),
                ("torch.compile, whole batch, bf16", dict(compile=True, dtype=bf16))])
    auto_chunk = cpu_chunk(_arch(size), size)
    return [
        ("channels-first [B,h,P], whole batch", dict(chunk=inr_batch(size, False))),
        (f"channels-first, chunks of {auto_chunk}", dict(chunk=auto_chunk)),
        (f"channels-first, chunks of {auto_chunk}, bf16", dict(chunk=auto_chunk, dtype=bf16)),
    ] + ([] if no_compile else [
        (f"torch.compile, chunks of {auto_chunk}", dict(chunk=auto_chunk, compile=True)),
        (f"torch.compile + polynomial sine, chunks of {auto_chunk}", dict(chunk=auto_chunk, compile=True, fast_sine=True)),
        (f"torch.compile + polynomial sine, chunks of {auto_chunk}, bf16", dict(chunk=auto_chunk, compile=True, fast_sine=True, dtype=bf16)),
    ])


def _arch(size: int) -> Any:
    from inr.siren import SirenArch

    return SirenArch(*(SMALL_ARCH if size <= 64 else LARGE_ARCH))


def inr_rows(size: int, args: argparse.Namespace, peaks: dict[str, float]) -> list[dict[str, Any]]:
    import torch

    from bench.metrics import mean_psnr, psnr_per_image, to_uint8
    from inr.siren import coord_grid, forward, init_weights
    from pipelines.inr_decode import SirenDecoder

    dev = torch.device(args.device)
    sync = synchronizer(dev)
    arch = _arch(size)
    batch = inr_batch(size, dev.type == "cuda")
    weights = init_weights(arch, batch, seed=0, device=dev)
    pixels = size * size
    flops = 2 * pixels * sum(i * o for i, o in arch.shapes)
    coords = coord_grid(size, size, device=dev)
    theta = torch.tensor([[1.0, 0, 0], [0, 1.0, 0]], device=dev).expand(batch, 2, 3).contiguous()
    ref = forward(weights, coords, arch).clamp(0, 1).view(batch, size, size, 3).permute(0, 3, 1, 2)
    ref8 = to_uint8(ref)
    del ref

    variants: list[tuple[str, Callable[[], torch.Tensor], str]] = [
        ("inr.siren.forward (reference: [B,P,h] baddbmm, w0 folded, in-place sin_)", lambda: forward(weights, coords, arch), "fp32"),
    ]
    for label, kw in decoder_variants(size, dev, args.no_compile):
        dec = SirenDecoder(arch, size, dev, **kw)
        variants.append((label, lambda dec=dec: dec(weights, theta), "bf16" if kw.get("dtype") == torch.bfloat16 else "fp32"))

    rows = []
    for label, fn, dt in variants:
        t0 = time.perf_counter()
        out = fn()
        sync()
        first_s = time.perf_counter() - t0
        if out.shape[-1] == 3:  # reference layout [B, P, 3]
            out = out.clamp(0, 1).view(batch, size, size, 3).permute(0, 3, 1, 2)
        psnr = mean_psnr(psnr_per_image(out.float(), ref8))
        del out
        r = rate(lambda fn=fn: (fn(), sync(), batch)[2], args.seconds, args.repeats)
        gflops = r["median"] * flops / 1e9
        rows.append({
            "method": f"INR decode SIREN {arch.layers}x{arch.hidden}", "variant": label, "rate": r,
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
    from bench.devices import resolve_device

    args.device = resolve_device(args.device)  # a malformed or absent device: exit 2, one line
    import torch

    torch.set_num_threads(args.threads)
    cuda = torch.device(args.device).type == "cuda"
    peaks = {"fp32": matmul_peak(args.seconds, args.repeats, device=args.device),
             "bf16": matmul_peak(args.seconds, args.repeats, torch.bfloat16, device=args.device)}
    results: dict[str, Any] = {"device": args.device, "threads": args.threads, "matmul_peak_gflops": peaks,
                               "inr_batch": {str(s): inr_batch(s, cuda) for s in args.sizes}, "rows": []}
    if not args.json:
        where = (f"device: {args.device} ({torch.cuda.get_device_name(torch.device(args.device))})" if cuda
                 else f"threads: {args.threads}")
        print(f"{where}   dense matmul (torch.mm {8192 if cuda else 2048}^3): fp32 {peaks['fp32']:.1f} GFLOP/s, "
              f"bf16 {peaks['bf16']:.1f} GFLOP/s (%peak of an INR row: against its own dtype)"
              + ("; every call synchronized" if cuda else ""))
        if cuda:
            print("batch per call (every row): " + ", ".join(f"{s} px: {b}" for s, b in results["inr_batch"].items()))
        print("PSNR: INR variant vs the reference decode (8-bit, 100 = identical)")
        print(f"{'size':>4}  {'img/s':>9}  {'GFLOP/s':>7}  {'%peak':>5}  {'PSNR':>6}  method / variant", flush=True)
    with tempfile.TemporaryDirectory(prefix="inrbench-perf-decode-") as tmp:
        for size in args.sizes:
            root, blobs = photo_jpegs(size, Path(tmp))
            jpeg = (gpu_jpeg_rows(size, root, blobs, inr_batch(size, True), args) if cuda
                    else jpeg_rows(size, root, blobs, args))
            for row in jpeg + inr_rows(size, args, peaks):
                row["size"] = size
                if "rate" in row:
                    row["images_per_s"] = row["rate"]["median"]
                    if not cuda:  # per CPU thread: a CPU figure only
                        row["images_per_s_per_thread"] = row["rate"]["median"] / args.threads
                results["rows"].append(row)
                if not args.json:
                    print(_line(row), flush=True)
    if args.json:
        print(jsontext.dumps(results, indent=2))
    return 0
