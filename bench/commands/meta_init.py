"""`inrbench meta-init PREPARED_DIR --preset P --out init.pt`: a learned SIREN initialization (Reptile).

Trains on a seeded subset of the *train* split only; resumable from its work folder (``inr.meta_work``).
"""

from __future__ import annotations

import argparse

from bench.argtypes import positive_float, positive_int, seed
from bench.cli import list_names
from bench.commands.encode import preset_names
from bench.errors import InputError

VALIDATION = 16  # --validation's default (inr.meta.MetaConfig.validation)

HELP = "meta-learn a SIREN initialization (Reptile) on a seeded subset of a prepared train split, for encode --init"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("prepared", help="a prepared dataset folder (`inrbench prepare`); only its train split is read")
    list_names(p.add_argument("--preset", default="demo", metavar="NAME",
                              help="the encode preset the init is for (architecture, lr): {names}"), preset_names)
    p.add_argument("--layers", type=positive_int, help="override the preset's sine layers (as encode --layers)")
    p.add_argument("--hidden", type=positive_int, help="override the preset's hidden width (as encode --hidden)")
    p.add_argument("--w0", type=positive_float, help="override the preset's w0 (as encode --w0)")
    p.add_argument("--out", required=True, help="the init file to write (an existing one needs --overwrite); a killed "
                                                 "run resumes from .NAME.inrbench-meta-init.work beside it")
    p.add_argument("--overwrite", action="store_true", help="replace an existing init file written by meta-init")
    p.add_argument("--images", type=positive_int, default=1024, help="train images in the seeded subset (default 1024)")
    p.add_argument("--outer-steps", type=positive_int, default=300, help="Reptile outer steps (default 300)")
    p.add_argument("--inner-steps", type=positive_int, default=8, help="Adam steps per outer step (default 8)")
    p.add_argument("--meta-batch", type=positive_int, default=16, help="images per outer step (default 16)")
    p.add_argument("--inner-lr", type=positive_float, help="inner Adam lr (default: the preset's lr)")
    p.add_argument("--outer-lr", type=positive_float, default=1.0, help="Reptile step, annealed to 0 (default 1)")
    p.add_argument("--pixels", type=positive_int, default=4096, help="pixels sampled per outer step (default 4096)")
    p.add_argument("--seed", type=seed, default=0,
                   help="seed of the train subset, the validation images and the Reptile steps (candidates: SEED, "
                        "SEED+1, ...)")
    p.add_argument("--candidates", type=positive_int, default=1,
                   help="train this many inits (seeds SEED, SEED+1, ...) and keep the one that saves the most fit "
                        "iterations on --validation train images set aside (default 1: no choice)")
    p.add_argument("--validation", type=positive_int,
                   help="with --candidates 2 or more: train images set aside to choose among them, each fitted for "
                        f"the preset's iterations from random init and from every candidate (default {VALIDATION}); "
                        "at least --meta-batch train images must be left to meta-train on")
    p.add_argument("--device", default="cpu", help="cpu or cuda[:N]")
    p.add_argument("--threads", type=positive_int, help="torch CPU threads")


def build_config(args: argparse.Namespace):
    """``(fit config of the preset, MetaConfig)`` of the options, validated (``InputError``); reads no file
    (``inrbench sweep`` checks its meta-init cells with it when the sweep file is loaded)."""
    from inr.fit import preset
    from inr.meta import MetaConfig

    if args.validation is not None and args.candidates == 1:
        raise InputError(f"--validation {args.validation} sets train images aside to choose among --candidates; "
                         "with one candidate nothing is chosen: leave it out, or add --candidates 2 or more")
    try:
        fit_cfg = preset(args.preset, layers=args.layers, hidden=args.hidden, w0=args.w0)
        mcfg = MetaConfig(outer_steps=args.outer_steps, inner_steps=args.inner_steps, meta_batch=args.meta_batch,
                          inner_lr=args.inner_lr or 0.0, outer_lr=args.outer_lr, pixels=args.pixels,
                          images=args.images, seed=args.seed, candidates=args.candidates,
                          validation=VALIDATION if args.validation is None else args.validation)
    except ValueError as e:
        raise InputError(f"bad meta-init options: {e}") from None
    return fit_cfg, mcfg


def run(args: argparse.Namespace) -> int:
    from bench.datasets.prepared import open_prepared
    from bench.devices import resolve_device
    from bench.outputs import claim
    from inr.meta import meta_init_dataset, save_init
    from inr.meta_work import remove_work, work_path

    args.device = resolve_device(args.device)
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    fit_cfg, mcfg = build_config(args)
    with claim(args.out, "meta-init", inputs={"prepared dataset": args.prepared},
               mode="replace" if args.overwrite else "new") as out:
        ds = open_prepared(args.prepared)
        _check_validation(mcfg, len(ds.split("train")), args.prepared)
        work = work_path(out)
        weights, info = meta_init_dataset(ds, fit_cfg.arch, fit_cfg.lr, mcfg, device=args.device,
                                          iterations=fit_cfg.iterations, work=work,
                                          on_resume=lambda line: print(line, flush=True))
        info["preset"] = args.preset
        sha = save_init(out, fit_cfg.arch, weights, info)
        remove_work(work)  # meta-init's own: the init file now holds what it kept
    sel = info.get("selection")
    if sel:
        for c in sel["candidates"]:
            print(f"  candidate seed {c['seed']}: saves {c['validation_saving']:.2f}x fit iterations on "
                  f"{sel['validation_images']} validation train images ({c['never']} never reach random init's PSNR)"
                  + ("  <- kept" if c["seed"] == sel["chosen_seed"] else ""))
    images = (f"meta-trained on {sel['meta_train_images']} of {info['num_images']} train images, "
              f"{sel['validation_images']} held out to choose the best of {mcfg.candidates} seeds" if sel
              else f"meta-trained on {info['num_images']} train images")
    print(f"wrote {out}: {fit_cfg.arch.layers}x{fit_cfg.arch.hidden} init {images} "
          f"({mcfg.outer_steps} outer x {mcfg.inner_steps} inner steps, {info['seconds']:.1f} s), sha256 {sha}")
    return 0


def _check_validation(mcfg, n_train: int, prepared: str) -> None:
    """With ``--candidates`` > 1, at least ``--meta-batch`` images must be left after ``--validation`` (each outer
    step adapts to that many distinct images); else one line, exit 2."""
    if mcfg.candidates < 2:
        return
    subset = min(mcfg.images, n_train)
    left = subset - mcfg.validation
    if left >= mcfg.meta_batch:
        return
    pool = (f"the train split has {n_train} images" if subset == n_train
            else f"the --images subset has {subset} of the {n_train} train images")
    most = subset - mcfg.meta_batch
    fix = (f"use --validation {most} or less" if most >= 1
           else f"lower --meta-batch below {subset}, or use --candidates 1")
    raise InputError(f"--validation {mcfg.validation} leaves {max(left, 0)} train images to meta-train on: {pool}, "
                     f"and at least --meta-batch ({mcfg.meta_batch}) must be left, as each outer step adapts to "
                     f"that many distinct images; {fix}", prepared)
