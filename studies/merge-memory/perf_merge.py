"""`python studies/merge-memory/perf_merge.py` (was `inrbench perf merge`): peak memory of merging shard stores, streamed (``inr.merge``) vs in memory.

Writes synthetic shard stores of ``--images`` images at a preset's architecture (``--bits``,
``--per-channel``, a random ``--prune`` fraction of weights masked): random codes, scales,
labels and PSNRs, no fitting (``write_synthetic_shard``, itself streamed). Then merges them as
``inrbench encode`` does, each merge in a fresh subprocess so that its peak RSS (``bench.perf.rss.peak_rss``:
``VmHWM``) is its own, and reports it against the final store's size. The in-memory merge
(every shard's codes as int64, ``inr.encode.concat_layers``, ``inr.store.save``: the merge before
``inr.merge``) needs about 8 bytes per weight plus copies, so it is measured on ``--old-images``
images (in as many shards; by default 8,192, or ``--images`` when that is fewer: never more than the
store measured) with the streamed merge of the same shards beside it, and the two stores' sha256
compared. "above start" is the peak minus the RSS once the worker has imported everything (Python,
numpy, torch), i.e. what the merge itself added.

The goal (streamed peak < 2x the store) is checked on the whole process's peak RSS, the interpreter and
its libraries included (``start``), which is what a machine must hold. That baseline is the honest one
only for a store well above the start: where the store is smaller than the start RSS (a few thousand
images at the default preset), the ratio measures the interpreter, not the merge, and the goal is
reported as not tested at that size, with what the merge itself added beside it.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the checkout's bench, inr

from bench import jsontext  # noqa: E402

HELP = "peak memory of the streamed shard merge (inr.merge) vs the in-memory merge, against the store size"
OLD_IMAGES = 8192  # the in-memory merge's images by default (at most --images)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--images", type=int, default=50_000, help="images in the merged store (default 50000)")
    p.add_argument("--preset", default="mini-imagenet", help="architecture of the synthetic SIRENs (default mini-imagenet)")
    p.add_argument("--bits", default="32", help="bit widths, as encode --bits (default 32, encode's default)")
    p.add_argument("--per-channel", action="store_true", help="per-channel scales")
    p.add_argument("--prune", type=float, default=0.0, help="fraction of weights masked in the synthetic shards (default 0)")
    p.add_argument("--shard-size", type=int, default=16384, help="images per shard (default 16384, encode's CUDA default)")
    p.add_argument("--old-images", type=int, default=None,
                   help="images for the in-memory merge and its streamed twin (default: 8192, or --images when "
                        "that is fewer; 0 skips them)")
    p.add_argument("--dir", help="folder for the temporary stores (default: the system temp folder)")
    p.add_argument("--json", action="store_true", help="print one JSON document instead of a table")
    p.add_argument("--_worker", choices=["streamed", "in-memory"], help=argparse.SUPPRESS)
    p.add_argument("--_job", help=argparse.SUPPRESS)


def _setup(args: argparse.Namespace) -> dict:
    from bench.errors import InputError
    from inr.fit import preset
    from inr.quantize import parse_bits

    arch = preset(args.preset).arch
    if args.old_images is None:  # the in-memory merge never on more images than the store measured
        args.old_images = min(OLD_IMAGES, max(args.images, 0))
    if args.images < 1 or args.shard_size < 1 or args.old_images < 0 or not 0 <= args.prune < 1:
        raise InputError(f"need --images >= 1, --shard-size >= 1, --old-images >= 0 and 0 <= --prune < 1, got "
                         f"{args.images}, {args.shard_size}, {args.old_images}, {args.prune}")
    return {"arch": arch.to_dict(), "bits": list(parse_bits(args.bits, arch.num_linear)),
            "per_channel": bool(args.per_channel), "prune": args.prune, "image_size": [84, 84]}


def write_synthetic_shard(path: Path, job: dict, n: int, seed: int) -> Path:
    """A shard store of ``n`` images with random codes (valid layout, every CRC right), written streamed."""
    import numpy as np

    from inr import store
    from inr.merge import ArraySpec, write_streamed
    from inr.quantize import FLOAT_BITS
    from inr.siren import SirenArch

    arch = SirenArch.from_dict(job["arch"])
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 100, n).astype(np.uint8)
    psnr = rng.uniform(20, 40, n).astype(np.float16)

    def const(a):
        return lambda: [a.view(np.uint8).reshape(-1)]

    def random_stream(nbits: int, s: int):
        def pieces():
            r, left = np.random.default_rng(s), -(-nbits // 8)
            while left:
                k = min(left, store.CHUNK_BYTES)
                left -= k
                p = np.frombuffer(r.bytes(k), np.uint8).copy()
                if not left and nbits % 8:
                    p[-1] &= (1 << nbits % 8) - 1
                yield p
            yield np.zeros(store.PAD_BYTES, np.uint8)
        return pieces

    specs = [ArraySpec("labels", "|u1", (n,), const(labels)), ArraySpec("psnr", "<f2", (n,), const(psnr))]
    layers = []
    for li, ((i, o), b) in enumerate(zip(arch.shapes, job["bits"], strict=True)):
        count, mask = n * (i + 1) * o, None
        if job["prune"] > 0:
            keep = rng.random((n, i * o)) >= job["prune"]
            mask = np.packbits(keep.astype(np.uint8), axis=1, bitorder="little")
            count = int(keep.sum()) + n * o
        specs.append(ArraySpec(f"codes{li}", "|u1", ((count * b + 7) // 8 + store.PAD_BYTES,),
                               random_stream(count * b, seed * 1000 + li)))
        if b != FLOAT_BITS:
            c = o if job["per_channel"] else 1
            sc = rng.uniform(1e-3, 1, (n, 2, c)).astype(np.float16)
            specs.append(ArraySpec(f"scales{li}", "<f2", sc.shape, const(sc)))
        if mask is not None:
            specs.append(ArraySpec(f"mask{li}", "|u1", mask.shape, const(mask)))
        layers.append((b, mask is not None))
    header = store.make_header(arch, job["image_size"], n, layers, job["per_channel"], [], {"synthetic_shard": seed})
    return write_streamed(path, header, specs)


def _worker(args: argparse.Namespace) -> int:
    """Runs in a fresh subprocess: one merge of ``job["shards"]`` into ``job["out"]``; prints JSON."""
    import time

    import numpy as np
    import psutil

    from bench.perf.rss import peak_rss
    from inr import store
    from inr.encode import concat_layers
    from inr.merge import merge_stores
    from inr.siren import SirenArch

    job = json.loads(args._job)
    arch, shards, out = SirenArch.from_dict(job["arch"]), [Path(p) for p in job["shards"]], Path(job["out"])
    meta = {"perf": "merge"}
    start = psutil.Process().memory_info().rss
    t0 = time.perf_counter()
    if args._worker == "streamed":
        merge_stores(out, shards, arch, job["image_size"], job["bits"], job["per_channel"], meta)
    else:  # the merge before inr.merge: every shard loaded, its codes as int64, concatenated, saved
        sts = [store.load(p) for p in shards]
        labels = np.concatenate([st.labels.numpy() for st in sts])
        psnr = np.concatenate([st.psnr for st in sts])
        layers = concat_layers([st.quantized_layers() for st in sts])
        del sts
        store.save(out, arch, job["image_size"], labels, layers, psnr=psnr, meta=meta, per_channel=job["per_channel"])
    wall = time.perf_counter() - t0
    print(json.dumps({"peak_rss": peak_rss(), "start_rss": start, "seconds": wall}))
    return 0


def _measure(kind: str, job: dict, shards: list[Path], out: Path) -> dict:
    import hashlib

    from bench.errors import InputError

    cmd = [sys.executable, str(Path(__file__).resolve()), "--_worker", kind,
           "--_job", json.dumps({**job, "shards": [str(p) for p in shards], "out": str(out)})]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise InputError(f"the {kind} merge worker failed (exit {r.returncode}): {r.stderr.strip().splitlines()[-1:]}")
    res = json.loads(r.stdout.strip().splitlines()[-1])
    h = hashlib.sha256()
    with open(out, "rb") as f:
        while chunk := f.read(1 << 24):
            h.update(chunk)
    res.update(merge=kind, store_bytes=out.stat().st_size, sha256=h.hexdigest(), shards=len(shards))
    res["peak_over_store"] = res["peak_rss"] / res["store_bytes"]
    res["above_start_over_store"] = (res["peak_rss"] - res["start_rss"]) / res["store_bytes"]
    out.unlink()
    return res


def run(args: argparse.Namespace) -> int:
    if args._worker:
        return _worker(args)
    job = _setup(args)
    with tempfile.TemporaryDirectory(prefix="perf-merge-", dir=args.dir) as tmp:
        return _run(args, job, Path(tmp))


def _run(args: argparse.Namespace, job: dict, tmp: Path) -> int:
    import time

    sizes = [min(args.shard_size, args.images - s) for s in range(0, args.images, args.shard_size)]
    t0 = time.perf_counter()
    shards = [write_synthetic_shard(tmp / f"shard_{k:05d}.inr", job, n, k + 1) for k, n in enumerate(sizes)]
    gen_s = time.perf_counter() - t0
    rows = [{**_measure("streamed", job, shards, tmp / "merged.inr"), "images": args.images}]
    if args.old_images:
        # the in-memory merge on fewer images: as many shards as above, old_images in all
        per = -(-args.old_images // len(sizes))
        small = [min(per, args.old_images - s) for s in range(0, args.old_images, per)]
        old_shards = [write_synthetic_shard(tmp / f"old_{k:05d}.inr", job, n, k + 1) for k, n in enumerate(small)]
        for kind in ("streamed", "in-memory"):
            rows.append({**_measure(kind, job, old_shards, tmp / f"{kind}.inr"), "images": args.old_images})
    identical = None if not args.old_images else rows[1]["sha256"] == rows[2]["sha256"]
    doc = {"config": {**job, "preset": args.preset, "images": args.images, "shard_size": args.shard_size,
                      "old_images": args.old_images}, "rows": rows, "old_and_streamed_identical": identical,
           "generate_seconds": gen_s}
    if args.json:
        print(jsontext.dumps(doc))
        return 0
    import pandas as pd

    from bench.report.markdown import table

    mib = 2**20
    df = pd.DataFrame([{
        "merge": r["merge"], "images": r["images"], "shards": r["shards"], "store MiB": f"{r['store_bytes'] / mib:.0f}",
        "peak RSS MiB": f"{r['peak_rss'] / mib:.0f}", "peak / store": f"{r['peak_over_store']:.2f}",
        "above start MiB": f"{(r['peak_rss'] - r['start_rss']) / mib:.0f}",
        "above start / store": f"{r['above_start_over_store']:.2f}", "seconds": f"{r['seconds']:.1f}"} for r in rows])
    print(f"merge of synthetic {args.preset} shards ({job['arch']['layers']}x{job['arch']['hidden']}, bits "
          f"{job['bits']}{', per-channel' if job['per_channel'] else ''}{f', prune {args.prune:g}' if args.prune else ''}), "
          f"shards of {args.shard_size} images (written in {gen_s:.0f} s)")
    print(table(df, index=False))
    if identical is not None:
        print(f"in-memory and streamed stores of {args.old_images} images: "
              f"{'byte-identical' if identical else 'DIFFERENT'} (sha256 {rows[1]['sha256'][:16]}...)")
    print(goal_line(rows[0], args.images))
    return 0


def goal_line(r: dict, images: int) -> str:
    """The goal, streamed peak RSS < 2x the store, on the whole process (its start, the interpreter and
    libraries, included); not tested where the store is smaller than that start, whose RSS would then
    be most of the ratio."""
    from bench.report.tables import fmt_bytes

    start, added = r["start_rss"], r["peak_rss"] - r["start_rss"]
    what = (f"whole process {fmt_bytes(r['peak_rss'])} = {r['peak_over_store']:.2f}x the {fmt_bytes(r['store_bytes'])} "
            f"store, of which {fmt_bytes(start)} before the merge (interpreter, numpy, torch); the merge itself "
            f"added {fmt_bytes(added)} = {r['above_start_over_store']:.2f}x")
    if r["store_bytes"] < start:
        return (f"goal (streamed peak < 2x store, whole process): not tested at {images} images: the store is "
                f"smaller than the process's RSS before the merge, so the ratio measures the interpreter ({what}); "
                "use --images large enough that the store outweighs it (the default 50000 at mini-imagenet's preset)")
    return f"goal (streamed peak < 2x store at {images} images): {'met' if r['peak_over_store'] < 2 else 'NOT met'} ({what})"


def main(argv: list[str] | None = None) -> int:
    from bench.cli import script_main

    return script_main("perf_merge.py", HELP, add_arguments, run, argv)


if __name__ == "__main__":
    sys.exit(main())
