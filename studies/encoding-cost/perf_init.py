"""`python studies/encoding-cost/perf_init.py` (was `inrbench perf init`): how many fit iterations a learned initialization saves, and at what cost.

For each image set (``photos`` at 32x32 with the ``cifar10`` preset's 5x13 SIREN, and ``photos``
at 224x224 with the ``flowers102`` preset's 10x32 SIREN): meta-train an init (``inr.meta``,
Reptile; at 32 px the best of ``CANDIDATES`` seeds on validation train images) on the set's *train*
split, then fit the *held-out test* images from the seeded random
init and from the learned init, with the preset's lr and cosine schedule, recording the mean
best-so-far PSNR after every iteration. Reported:

* the PSNR random init reaches at ``--iterations`` (the preset's full count at 32x32; fewer by
  default at 224x224 so the benchmark runs in minutes on a CPU), and the first iteration at
  which the learned init reaches it (same schedule length): the saving factor; and per image
  (each image's learned curve against its own random-init PSNR at full length) the geometric
  mean saving with a 95% interval over the held-out images (``inr.meta.per_image_saving``: Student's t
  on the log savings below 30 images, a bootstrap from 30),
  beside the same measure of random init against itself (what stopping an image once its PSNR stops
  rising saves without a learned init);
* a confirmation fit from the learned init with *that* many iterations (its own cosine
  schedule), through the real encoder (``inr.encode.encode_images`` with ``FitConfig.init``),
  with fp32, 8-bit (16:8:16) and pruned + 8-bit end points, next to random init's at full
  iterations: a shared starting point could change the weight distributions 8-bit relies on;
* the meta-training cost (seconds, image-iterations) and the number of images to encode before
  it pays for itself;
* the *realized* saving: real encodes (``inr.fit.fit``) of held-out images (at 32 px all 32 test
  images in chunks of 8, ``REALIZED_RUN``), timed side by side and interleaved over ``--repeats``
  rounds: random init over the full schedule (the reference; and with the compiled step); random
  init with each image stopping once it reaches its own full-schedule PSNR (early stop,
  ``fit(stop_at=...)``, continuous batching: what early stop alone buys); and the learned init with
  the same early stop, with the eager and with the compiled step. Reported: image-iterations run,
  wall seconds (median over rounds; ratio with its interval, below), mean PSNR and how many images got there;
  for the learned variants also the saving against random init with the same early stop (the
  learned init's own share). This is what the iterations-to-reach figures buy an encode. Each round
  runs in its own worker process (``perf init --_round``, as ``perf encode`` runs each timed step:
  compiled graphs compiled there before its clocks start), so the rounds are the units: the savings are
  ratios of geometric means over rounds with Welch's 95% t interval on the logs (``bench.stats.unit_ratio_ci``),
  and one round (``--repeats 1``) gives a ratio but no interval, not a result. The fit that sets the
  early-stop targets runs before the rounds, in this process, and is not a sample.

``--figure PATH`` draws PSNR against iterations (log axis), random vs learned, with the fp32 and
8-bit end points, as a PNG written to PATH exactly; PATH is checked before any work and replaces
only a figure of an earlier ``perf init`` (``bench.outputs``: never a user's file or a folder).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the checkout's bench, inr

from bench import jsontext, outputs  # noqa: E402

FIGURE_TAG = "inr-bench perf init"  # the PNG's Software text: bench.outputs recognizes the figure by it
HELP = "learned init (meta-init) vs random init: iterations to the same PSNR, 8-bit/pruned PSNR, meta-training cost"

SETS = {  # name -> (image side, preset, default iterations, default held-out images, meta-training defaults)
    "32": (32, "cifar10", 5000, 8, {"outer_steps": 300, "inner_steps": 8, "meta_batch": 16, "pixels": 4096}),
    "224": (224, "flowers102", 300, 1, {"outer_steps": 80, "inner_steps": 4, "meta_batch": 8, "pixels": 2048}),
}
# Reptile seeds trained per set, the best kept on 16 validation train images (meta-init --candidates): at 32 px
# the validation saving ranks seeds as the test saving does (studies/encoding-cost/meta-init-seeds); at 224 px the validation
# fits would cost a CPU more than the rest of the benchmark
CANDIDATES = {"32": 4, "224": 1}
# the realized-saving encodes: (held-out images, chunk) per set; 0 = the curves' images / the encoder's own chunk.
# At 32 px: every test image in chunks of 8, so that (as in a large encode) there are more images than rows and
# early stop refills rows from the queue; every variant runs with the same chunk.
REALIZED_RUN = {"32": (32, 8), "224": (0, 0)}


def _is_perf_figure(p: Path) -> bool:
    """A PNG written by ``perf_init.py --figure`` (its ``Software`` text names it)."""
    try:
        with open(p, "rb") as f:
            head = f.read(4096)
    except OSError:
        return False
    return head.startswith(b"\x89PNG\r\n\x1a\n") and b"inr-bench perf init" in head


# its figure is claimed as an inr-bench output (never a user's file or a folder) of this study's own kind
outputs.KINDS["perf-figure"] = outputs.OutputKind("perf-figure", "perf init figure file", False, _is_perf_figure)


def add_arguments(p: argparse.ArgumentParser) -> None:
    from bench.argtypes import nonnegative_int, positive_int, seed

    p.add_argument("--sets", default="32,224", help="image sets to measure: 32, 224 or both (default 32,224)")
    # counts: positive, or left out for the documented default (None); 0 is refused, never read as "default"
    p.add_argument("--iterations-32", type=positive_int,
                   help=f"fit iterations at 32x32 (default {SETS['32'][2]}: the cifar10 preset's)")
    p.add_argument("--iterations-224", type=positive_int,
                   help=f"fit iterations at 224x224 (default {SETS['224'][2]}: CPU minutes)")
    p.add_argument("--test-images", type=positive_int,
                   help=f"held-out images per set (default {SETS['32'][3]} at 32, {SETS['224'][3]} at 224)")
    p.add_argument("--outer-steps", type=positive_int,
                   help=f"Reptile outer steps (default {SETS['32'][4]['outer_steps']} at 32, "
                        f"{SETS['224'][4]['outer_steps']} at 224)")
    p.add_argument("--seed", type=seed, default=0)
    p.add_argument("--candidates", type=positive_int,
                   help="meta-train this many Reptile seeds and keep the one that saves the most iterations on 16 "
                        f"validation train images (meta-init --candidates; default {CANDIDATES['32']} at 32, "
                        f"{CANDIDATES['224']} at 224)")
    p.add_argument("--threads", type=positive_int, help="torch CPU threads (default: torch's default, the core count)")
    p.add_argument("--device", default="cpu",
                   help="cpu, cuda or cuda:N for meta-training, the fit curves and the encoder (default cpu); on a "
                        "GPU, --iterations-224 5000 measures the 224 px set at the preset's full length")
    p.add_argument("--repeats", type=nonnegative_int, default=3,
                   help="rounds of the realized-saving encodes (interleaved; default 3; 0 skips them)")
    p.add_argument("--no-prune", action="store_true", help="skip the pruned + 8-bit end points")
    p.add_argument("--figure", help="write the PSNR-vs-iterations figure (PNG) to this file (replaces only a figure "
                                    "an earlier perf init wrote)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--_round", help=argparse.SUPPRESS)  # a realized-saving round's spec: run it in this worker


def _log_points(n: int) -> list[int]:
    import numpy as np

    return sorted({0, n, *np.unique(np.round(np.logspace(0, np.log10(max(n, 1)), 60)).astype(int)).tolist()})


def _end_points(imgs, arch, lr: float, iterations: int, init: tuple[str, str] | None, prune: bool,
                device: str = "cpu") -> dict[str, float]:
    """Mean PSNR of the real encoder's fp32 fit, 8-bit (16:8:16) and pruned(15%) + 8-bit stores."""
    from inr.encode import EncodeConfig, encode_images
    from inr.fit import FitConfig
    from inr.prune import PruneConfig
    from inr.quantize import QuantConfig, parse_bits

    fit = FitConfig(arch=arch, iterations=iterations, lr=lr, init=init[0] if init else "",
                    init_sha256=init[1] if init else "")
    q8 = QuantConfig(parse_bits("16:8:16", arch.num_linear))
    e8 = encode_images(imgs, EncodeConfig(fit=fit, quant=q8), device=device)
    out = {"fp32": e8.stages["fit_psnr"], "8bit": e8.stages["final_psnr"]}
    if prune:
        pc = PruneConfig(ratio=0.15, rounds=1, finetune_iterations=max(10, iterations // 10), lr=lr)
        ep = encode_images(imgs, EncodeConfig(fit=fit, quant=q8, prune=pc), device=device)
        out["pruned-8bit"] = ep.stages["final_psnr"]
    return out


SUBSAMPLE = 1 / 8  # the subsampled variant's pixels per step (FitConfig.pixel_fraction; docs/encoding-cost.md)
REALIZED = ("random, full schedule", "random, full schedule, compiled", "random, early stop", "learned, early stop",
            "learned, early stop, compiled", "learned, early stop, compiled, 1/8 px")
# variants that stop each image at its own random-init PSNR. "random, early stop" is what early stop alone buys
# (an image's best-so-far PSNR often stops rising before the schedule ends); the learned init's own share is the
# learned variants against it.
EARLY_STOP = frozenset(REALIZED[2:])


RATIO_METHOD = "rounds as units, one worker process each: ratio of geometric means, Welch's 95% t interval"


def _realized(imgs, cfg, iters: int, init: tuple[str, str], repeats: int, device: str) -> dict[str, Any]:
    """Encode-time saving of learned init + early stop, measured: ``REALIZED`` fits of ``imgs`` timed in
    ``repeats`` interleaved rounds (ABCD, DCBA, ...), each round in a fresh worker process (``_round``; its
    compiled graphs compiled there before any clock runs). The fit that sets each image's target (random
    init, full schedule) runs first, here, and is not timed as a sample."""
    import pickle
    from dataclasses import replace

    import numpy as np
    import torch

    from bench.stats import unit_ratio_ci
    from inr.fit import fit

    n = len(imgs)
    base = replace(cfg, iterations=iters)
    learned = replace(base, init=init[0], init_sha256=init[1])
    cfgs = dict(zip(REALIZED, (base, replace(base, step="compiled"), base, learned, replace(learned, step="compiled"),
                               replace(learned, step="compiled", pixel_fraction=SUBSAMPLE)), strict=True))
    ref = fit(imgs, cfgs[REALIZED[0]], device=device)
    target = ref.psnr.astype(np.float64)  # each image's own random-init PSNR at full length
    secs: dict[str, list[float]] = {k: [] for k in REALIZED}
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="perf-init-round-") as td:
        for r in range(repeats):
            order = list(REALIZED if r % 2 else REALIZED[::-1])
            spec = Path(td) / f"round{r}.pkl"
            spec.write_bytes(pickle.dumps({"imgs": np.asarray(imgs), "cfgs": cfgs, "target": target, "order": order,
                                           "device": device, "threads": torch.get_num_threads()}))
            for name, d in _spawn_round(spec).items():
                secs[name].append(d.pop("seconds"))
                out[name] = d
    ref_it = n * iters
    for name in REALIZED:
        d = out.setdefault(name, {"image_iterations": ref_it, "mean_psnr": float(ref.psnr.mean()), "reached": n,
                                  "images": n, "max_shortfall_db": 0.0})
        d["seconds"] = secs[name]
        d["median_seconds"] = float(np.median(secs[name])) if secs[name] else float("nan")
        d["iterations_saving"] = ref_it / max(d["image_iterations"], 1)
        # a subsampled step touches a fraction of the pixels: its cost in all-pixel iterations (``_round``)
        d["pixel_iterations_saving"] = ref_it / max(d.get("pixel_iterations", d["image_iterations"]), 1e-9)
        d["pixel_fraction"] = cfgs[name].pixel_fraction
        d["time_saving"] = _round_ratio(unit_ratio_ci, secs[REALIZED[0]], secs[name])  # > 1: faster than the reference
    for name in REALIZED[3:]:  # the learned init's own share: against random init with the same early stop
        d = out[name]
        es = out["random, early stop"]
        d["vs_random_early_stop"] = {"iterations": es["image_iterations"] / max(d["image_iterations"], 1),
                                     **_round_ratio(unit_ratio_ci, secs["random, early stop"], secs[name])}
        d["vs_random_early_stop"]["time"] = d["vs_random_early_stop"]["value"]
    return {"repeats": repeats, "processes": repeats, "method": RATIO_METHOD, "variants": out}


def _round_ratio(unit_ratio_ci, top: list[float], bottom: list[float]) -> dict[str, Any]:
    """``top`` / ``bottom`` seconds, one value per round (worker process): ``value``, ``lo``/``hi`` (None without
    an interval: one round, or no spread), ``n`` rounds, ``why`` none."""
    import math

    iv = unit_ratio_ci([[t] for t in top], [[t] for t in bottom])
    ok = math.isfinite(iv.lo) and math.isfinite(iv.hi)
    return {"value": iv.value, "lo": iv.lo if ok else None, "hi": iv.hi if ok else None, "n": iv.n,
            "why": None if ok else (iv.why or "no interval")}


def _spawn_round(spec: Path) -> dict[str, dict[str, Any]]:
    """Run one round (``_round``) in a fresh worker process, as ``bench.perf.encode`` runs its timed steps."""
    import subprocess
    import sys

    r = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--_round", str(spec)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"perf init round worker failed:\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def _round(spec_path: str) -> dict[str, dict[str, Any]]:
    """One round of the realized-saving encodes, in this (worker) process: every compiled graph compiled first
    (every chunk size the timed compiled runs will use, ``inr.early_stop.bucket_sizes``), then each variant of
    ``order`` fitted and timed once."""
    import pickle

    import numpy as np
    import torch

    from inr.fit import fit

    spec = pickle.loads(Path(spec_path).read_bytes())
    imgs, cfgs, target, device = spec["imgs"], spec["cfgs"], spec["target"], spec["device"]
    torch.set_num_threads(int(spec["threads"]))
    n = len(imgs)

    def sync() -> None:
        if torch.device(device).type == "cuda":
            torch.cuda.synchronize(device)

    from dataclasses import replace

    fit(imgs, replace(cfgs[REALIZED[1]], iterations=1), device=device)
    for name in REALIZED[4:]:  # the early-stop loop's graphs (all pixels, and subsampled)
        fit(imgs, replace(cfgs[name], iterations=1), device=device, stop_at=np.full(n, np.inf))
    out = {}
    for name in spec["order"]:
        sync()
        t0 = time.perf_counter()
        res = fit(imgs, cfgs[name], device=device, stop_at=target if name in EARLY_STOP else None)
        sync()
        t = time.perf_counter() - t0
        ran = res.extra["iterations_run"]
        out[name] = {"seconds": t, "image_iterations": int(ran.sum()), "pixel_iterations": _pixel_iterations(
                         ran, cfgs[name].pixel_fraction, imgs.shape[1] * imgs.shape[2]), "mean_psnr": float(res.psnr.mean()),
                     "reached": int(np.count_nonzero(res.psnr >= target - 1e-9)), "images": n,
                     "max_shortfall_db": float(np.max(target - res.psnr))}
    return out


def _pixel_iterations(ran, fraction: float, pixels: int) -> float:
    """What image-iterations ``ran`` ``[N]`` cost in all-pixel iterations (docs/encoding-cost.md's unit): a step on
    ``per_step`` pixels counts ``per_step / pixels``, and a subsampled fit's all-pixel measurements (its start
    weights, each check, the end of the schedule: ``inr.early_stop``) count 1/3 each (a forward pass alone, 2 of
    the 6 FLOPs per weight and pixel of a step)."""
    import numpy as np

    from inr.early_stop import STOP_CHECK_EVERY
    from inr.subsample import pixels_per_step

    ran = np.asarray(ran, dtype=np.float64)
    per_step = pixels_per_step(pixels, fraction)
    if per_step >= pixels:
        return float(ran.sum())
    return float((ran * per_step / pixels + (1.0 + np.ceil(ran / STOP_CHECK_EVERY)) / 3.0).sum())


def settings(name: str, args: argparse.Namespace) -> tuple[int, int, dict[str, int]]:
    """Set ``name``'s (fit iterations, held-out test images, meta-training settings): an option left out
    (None) takes the set's documented default (``SETS``, ``CANDIDATES``); the parser refuses 0."""
    _, _, iters, n_test, meta = SETS[name]

    def given(value, default):
        return default if value is None else value

    meta = {**meta, "outer_steps": given(args.outer_steps, meta["outer_steps"]),
            "candidates": given(args.candidates, CANDIDATES[name])}
    return given(getattr(args, f"iterations_{name}"), iters), given(args.test_images, n_test), meta


def measure_set(name: str, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    import numpy as np

    from bench.datasets.prepare import prepare_dataset
    from bench.datasets.prepared import open_prepared
    from inr.fit import preset
    from inr.meta import (
        MetaConfig,
        fit_curve,
        iterations_to_reach,
        meta_init_dataset,
        per_image_saving,
        save_init,
    )

    size, preset_name = SETS[name][:2]
    cfg = preset(preset_name)
    iters, n_test, meta = settings(name, args)
    per_class = 20 if size <= 64 else 5
    ds = open_prepared(prepare_dataset("photos", workdir / f"photos{size}", size=size, per_class=per_class, jpeg_quality=90))
    test = np.asarray(ds.split("test").images)[:n_test]  # held out: never seen by meta-training
    mcfg = MetaConfig(**meta, seed=args.seed)
    dev = args.device
    weights, info = meta_init_dataset(ds, cfg.arch, cfg.lr, mcfg, device=dev, iterations=iters)
    init_path = workdir / f"init{size}.pt"
    sha = save_init(init_path, cfg.arch, weights, info)
    t0 = time.perf_counter()
    rand_i = fit_curve(test, cfg.arch, iters, cfg.lr, seed=args.seed, device=dev, per_image=True)
    sec_per_img_it = (time.perf_counter() - t0) / (iters * len(test))
    learned_i = fit_curve(test, cfg.arch, iters, cfg.lr, start=weights, device=dev, per_image=True)
    rand, learned = rand_i.mean(axis=1), learned_i.mean(axis=1)
    per_image = per_image_saving(rand_i, learned_i)
    # the same measure of random init against itself: an image's best-so-far PSNR often stops rising before the
    # schedule ends, so stopping there saves iterations whatever the init (early stop's share of per_image)
    per_image_random = per_image_saving(rand_i, rand_i)
    target = float(rand[-1])
    k = iterations_to_reach(learned, target)
    k_run = k if k else iters
    ends_random = _end_points(test, cfg.arch, cfg.lr, iters, None, not args.no_prune, dev)
    ends_learned = _end_points(test, cfg.arch, cfg.lr, max(1, k_run), (str(init_path), sha), not args.no_prune, dev)
    realized = None
    if args.repeats > 0:
        from dataclasses import replace

        n_r, batch_r = REALIZED_RUN[name]
        imgs_r = np.asarray(ds.split("test").images)[:n_r] if n_r else test
        realized = _realized(imgs_r, replace(cfg, batch=batch_r), iters, (str(init_path), sha), args.repeats, dev)
        realized.update(chunk=batch_r or None)
    saved_s = (iters - k_run) * sec_per_img_it
    pts = _log_points(iters)
    return {
        "set": f"photos {size}x{size}", "preset": preset_name, "arch": f"{cfg.arch.layers}x{cfg.arch.hidden}",
        "lr": cfg.lr, "iterations": iters, "held_out_images": int(len(test)),
        "meta": {k2: info.get(k2) for k2 in ("split", "num_images", "seconds", "image_iterations", "pixels_per_step",
                                              "config", "selection")},
        "random_psnr_at_full": target,
        "learned_psnr_at_full": float(learned[-1]),
        "learned_psnr_at_0": float(learned[0]), "random_psnr_at_0": float(rand[0]),
        "iterations_to_reach": k,
        "saving_factor": (iters / k) if k else None,
        "per_image": per_image, "per_image_random": per_image_random,
        "seconds_per_image_iteration": sec_per_img_it,
        "seconds_saved_per_image": saved_s,
        "break_even_images": (info["seconds"] / saved_s) if saved_s > 0 else None,
        "end_points": {"random": {"iterations": iters, **ends_random}, "learned": {"iterations": k_run, **ends_learned}},
        "realized": realized,
        "curve": {"iterations": pts, "random": [float(rand[i]) for i in pts], "learned": [float(learned[i]) for i in pts]},
    }


def figure(results: list[dict], path: str | Path) -> Path:
    """Draw the curves of ``results`` and write them as a PNG to ``path`` (atomically; claimed by ``run``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from bench.atomic import atomic_write_bytes

    fig, axes = plt.subplots(1, len(results), figsize=(5.5 * len(results), 4), squeeze=False)
    for ax, r in zip(axes[0], results, strict=True):
        c = r["curve"]
        x = [max(i, 1) for i in c["iterations"]]  # iteration 0 drawn at 1 on the log axis
        ax.plot(x, c["random"], color="#555555", label="random init (fp32, best so far)")
        ax.plot(x, c["learned"], color="#0072B2", label="learned init (fp32, best so far)")
        for who, col in (("random", "#555555"), ("learned", "#0072B2")):
            e = r["end_points"][who]
            ax.scatter([e["iterations"]], [e["fp32"]], color=col, marker="o", zorder=3,
                       label=f"{who}: encoder fp32 @ {e['iterations']} it")
            ax.scatter([e["iterations"]], [e["8bit"]], color=col, marker="v", zorder=3,
                       label=f"{who}: 8-bit (16:8:16) @ {e['iterations']} it")
        ax.axhline(r["random_psnr_at_full"], color="#999999", ls=":", lw=0.8)
        ax.set_xscale("log")
        ax.set_xlabel("fit iterations (log)")
        ax.set_ylabel("mean PSNR, held-out images (dB)")
        ax.set_title(f"{r['set']}, SIREN {r['arch']} ({r['held_out_images']} held-out)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    buf = io.BytesIO()  # PNG whatever the name; tagged so that a later run recognizes it as its own
    fig.savefig(buf, format="png", dpi=120, metadata={"Software": FIGURE_TAG})
    plt.close(fig)
    out = Path(path)
    atomic_write_bytes(out, buf.getvalue())
    return out


def run(args: argparse.Namespace) -> int:
    import torch

    from bench import envinfo
    from bench.devices import resolve_device
    from bench.errors import InputError
    from bench.outputs import claim

    if args._round:  # a realized-saving round's worker (``_spawn_round``)
        print(json.dumps(_round(args._round)))
        return 0
    args.device = resolve_device(args.device)  # a malformed or absent device: one line, exit 2
    names = [s.strip() for s in args.sets.split(",") if s.strip()]
    if not names or any(n not in SETS for n in names):
        raise InputError(f"--sets takes {', '.join(SETS)} (comma separated), got {args.sets!r}")
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    # --figure is checked (never a user's file or folder) and held before the long work
    with claim(args.figure, "perf-figure", mode="replace", option="--figure") if args.figure \
            else contextlib.nullcontext() as fig_out:
        with tempfile.TemporaryDirectory(prefix="perf-init-") as td:
            results = [measure_set(n, args, Path(td)) for n in names]
        fig = figure(results, fig_out) if fig_out else None
    doc = {"sets": results, "figure": str(fig) if fig else None, "threads": torch.get_num_threads(), "device": args.device,
           "seconds": time.perf_counter() - t0,
           "env": {k: v for k, v in envinfo.collect().items() if k in ("git", "torch", "cpu", "gpu")}}
    if args.json:
        print(jsontext.dumps(doc, indent=2, sort_keys=True, default=str))
        return 0
    print_table(doc)
    return 0


def _fmt_saving(pi: dict | None) -> str:
    """Geometric mean of the per-image savings with its interval (``bench.stats.fmt_ratio``: an interval
    that holds 1x reads "no difference detected"), and how many images never got there."""
    from bench.stats import Interval, fmt_ratio

    if not pi:
        return "-"
    never = f", {pi['never']} never" if pi["never"] else ""
    nan = float("nan")
    iv = Interval(pi["geomean"], nan if pi["lo"] is None else pi["lo"], nan if pi["hi"] is None else pi["hi"], pi["n"])
    if pi["n"] < 2 or not iv.ok:  # one image, or every image the same saving: no interval
        why = "one image" if pi["n"] < 2 else "the same on every image, no spread"
        return f"{pi['geomean']:.1f}x (n={pi['n']}: {why}, no interval, not a result{never})"
    return fmt_ratio(iv) + never


def print_table(doc: dict) -> None:
    """The text form of ``perf init --json``'s document."""
    results, fig = doc["sets"], doc["figure"]
    print(f"perf init: learned (Reptile, train split) vs random init, held-out test images, "
          f"device {doc.get('device', 'cpu')}, threads {doc['threads']}")
    print(f"{'set':<18} {'SIREN':>6} {'iters':>6} {'random@full':>11} {'learned@full':>12} {'learned@0':>9} "
          f"{'it to reach':>11} {'saving':>7} {'per-image saving [95% CI]':>30} {'meta s':>7} {'meta img-it':>11} "
          f"{'break-even imgs':>15}")
    for r in results:
        k = r["iterations_to_reach"]
        be = r["break_even_images"]
        print(f"{r['set']:<18} {r['arch']:>6} {r['iterations']:>6} {r['random_psnr_at_full']:>11.2f} "
              f"{r['learned_psnr_at_full']:>12.2f} {r['learned_psnr_at_0']:>9.2f} {k if k else 'never':>11} "
              f"{(str(round(r['saving_factor'], 1)) + 'x') if k else '-':>7} {_fmt_saving(r.get('per_image')):>30} "
              f"{r['meta']['seconds']:>7.1f} "
              f"{r['meta']['image_iterations']:>11} {(f'{be:.3g}' if be else '-'):>15}")
    for r in results:
        sel = r["meta"].get("selection")
        if sel:
            print(f"  {r['set']}: init chosen among {len(sel['candidates'])} Reptile seeds on {sel['validation_images']} "
                  f"validation train images ({sel['iterations']} iterations): " +
                  ", ".join(f"seed {c['seed']} {c['validation_saving']:.2f}x" for c in sel["candidates"]) +
                  f"; kept seed {sel['chosen_seed']} (meta s and img-it include every candidate and the validation fits)")
        pr = r.get("per_image_random")
        if pr:
            print(f"  {r['set']}: per-image saving of random init against itself (early stop alone, no learned init): "
                  f"{_fmt_saving(pr)}")
    print("end points through the encoder (mean PSNR dB; learned at its iterations-to-reach, own cosine schedule):")
    for r in results:
        for who in ("random", "learned"):
            e = r["end_points"][who]
            extra = f"  pruned15%+8-bit {e['pruned-8bit']:.2f}" if "pruned-8bit" in e else ""
            print(f"  {r['set']:<18} {who:<8} {e['iterations']:>5} it: fp32 {e['fp32']:.2f}  8-bit {e['8bit']:.2f}{extra}")
    if any(r.get("realized") for r in results):
        print("realized: real encodes of the held-out images, random init at full length vs learned init stopping each "
              "image at its own random-init PSNR (wall seconds: median of the rounds; saving: " + RATIO_METHOD + ")")
        for r in results:
            rz = r.get("realized")
            if not rz:
                continue
            n_img = rz["variants"][REALIZED[0]]["images"]
            print(f"  {r['set']}: {n_img} held-out images, chunk {rz.get('chunk') or 'auto'}, {rz['repeats']} rounds"
                  + (", each in its own worker process" if rz.get("processes") else " in one process (in-process runs)"))
            for name in REALIZED:
                d = rz["variants"][name]
                vs = d.get("vs_random_early_stop")
                share = ""
                if vs:
                    share = f"  vs random early stop: {vs['iterations']:.2f}x it, time {_fmt_round_ratio(vs)}"
                frac = d.get("pixel_fraction", 1.0)
                pix = f" of {frac:g} px = {d['pixel_iterations_saving']:.2f}x in pixel-it" if frac < 1 else ""
                print(f"  {r['set']:<18} {name:<38} {d['image_iterations']:>8} img-it ({d['iterations_saving']:.2f}x{pix})  "
                      f"{d['median_seconds']:>7.2f} s (time {_fmt_round_ratio(d['time_saving'], name == REALIZED[0])})  "
                      f"PSNR {d['mean_psnr']:.2f}  reached {d['reached']}/{d['images']}" +
                      (f" (worst {d['max_shortfall_db']:.2f} dB short)" if d["reached"] < d["images"] else "") + share)
            if any(len(rz["variants"][name].get("seconds") or []) > 1 for name in REALIZED):
                print(f"  {r['set']}: wall seconds by round (round 1 first; rounds alternate the variants' order)")
                for name in REALIZED:
                    secs = rz["variants"][name].get("seconds") or []
                    print(f"  {r['set']:<18} {name:<38} " + " ".join(f"{t:7.2f}" for t in secs))
    print(f"meta-init trains on the train split only ({', '.join(str(r['meta']['num_images']) + ' images' for r in results)}); "
          f"total {doc['seconds']:.0f} s" + (f"; figure {fig}" if fig else ""))


def _fmt_round_ratio(t: dict, reference: bool = False) -> str:
    """A realized-saving time ratio (``_round_ratio``) as ``bench.stats.fmt_ratio`` prints it, or the value said to
    be no result without an interval (one round, or an older record without one)."""
    import math

    from bench.stats import Interval, fmt_ratio

    if reference:
        return "1.00x (reference)"
    v = t.get("value", t.get("time"))
    if t.get("lo") is None or t.get("hi") is None:
        n = t.get("n")
        why = t.get("why") or ("one round" if n == 1 else "no interval")
        why = "one round (worker process)" if why == "one sample" else why
        return f"{v:.2f}x ({why}: no interval, not a result)" if v is not None and math.isfinite(v) else "-"
    return fmt_ratio(Interval(v, t["lo"], t["hi"], t.get("n", 0)))


def main(argv: list[str] | None = None) -> int:
    from bench.cli import script_main

    return script_main("perf_init.py", HELP, add_arguments, run, argv)


if __name__ == "__main__":
    sys.exit(main())
