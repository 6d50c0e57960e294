"""`inrbench sweep NAME|FILE.yaml`: run a grid of inrbench commands, resumable, then its report."""

from __future__ import annotations

import argparse
import importlib
import re
from pathlib import Path

from bench.argtypes import positive_int
from bench.cli import list_names

HELP = "run a sweep (a built-in one or a YAML file) cell by cell, resumable, then report"


def add_arguments(p: argparse.ArgumentParser) -> None:
    list_names(p.add_argument("sweep", metavar="NAME|FILE.yaml",
                              help="a built-in sweep ({names}) or a sweep YAML file"),
               lambda: importlib.import_module("bench.sweep.spec").builtin_names())
    p.add_argument("--data-root", metavar="DIR",
                   help="folder holding the source datasets (relative 'root' fields are taken under it)")
    p.add_argument("--device", choices=("cpu", "cuda"), help="override the sweep's device")
    p.add_argument("--out", metavar="DIR", help="results folder (default: runs/<sweep name>)")
    p.add_argument("--report", metavar="DIR",
                   help="where the report goes (default: reports/<sweep name>)")
    p.add_argument("--no-report", action="store_true", help="do not build the report at the end")
    p.add_argument("--resume", action="store_true",
                   help="continue an existing results folder (a plain rerun also never redoes finished cells)")
    p.add_argument("--redo", nargs="+", default=[], metavar="ID_GLOB",
                   help="run these finished cells again (glob over cell ids), and every cell downstream")
    p.add_argument("--keep-stale", action="store_true",
                   help="keep cells finished under another code version or library versions (stale) "
                        "instead of recomputing them; the report marks them")
    p.add_argument("--list", action="store_true",
                   help="print every cell and the exact command line it runs (torchrun lines for nproc > 1; "
                        "for nnodes > 1 the line to run on every node), run nothing")
    g = p.add_argument_group("distributed cells (bench, encode; run under torchrun)")
    g.add_argument("--nproc", type=positive_int, metavar="N",
                   help="processes per node (one per GPU) for every bench/encode cell on the sweep's device "
                        "that does not set nproc itself, e.g. 8 on an 8-GPU node")
    g.add_argument("--nnodes", type=positive_int, metavar="M",
                   help="nodes for those cells (needs --rdzv-endpoint); the sweep does not start them: "
                        "--list prints the line to run on every node")
    g.add_argument("--rdzv-endpoint", metavar="HOST:PORT",
                   help="c10d rendezvous of multi-node cells: a node every node reaches")
    g.add_argument("--rdzv-id", default="inrbench", metavar="ID",
                   help="rendezvous id prefix (default inrbench): each multi-node cell meets as ID-<cell id>")
    p.add_argument("--no-progress", action="store_true",
                   help="no progress bar (there is none anyway where stderr is not a terminal)")


def run(args: argparse.Namespace) -> int:
    import sys

    from bench.outputs import check_output
    from bench.sweep.cells import Rendezvous
    from bench.sweep.runner import run_sweep
    from bench.sweep.spec import load_sweep

    cfg = load_sweep(args.sweep, device=args.device, nproc=args.nproc, nnodes=args.nnodes,
                     rendezvous=Rendezvous(args.rdzv_endpoint, args.rdzv_id))
    out = Path(args.out or Path("runs") / cfg.name)
    if args.list:
        _print_cells(cfg, out, args.data_root)
        return 0
    # both outputs are checked before any cell runs: neither may overlap the other or --data-root
    check_output(out, "sweep", inputs={"--data-root": args.data_root}, mode="append")
    report_dir = Path(args.report or Path("reports") / cfg.name)
    if cfg.report and not args.no_report:
        check_output(report_dir, "report", inputs={"sweep results folder (--out)": out, "--data-root": args.data_root},
                     mode="replace", option="--report")
    summary = run_sweep(cfg, out, data_root=args.data_root, resume=args.resume,
                        progress=not args.no_progress, redo=tuple(args.redo),
                        keep_stale=args.keep_stale, plan=_print_plan)
    counts = {s: list(summary.status.values()).count(s) for s in ("ok", "skip", "error")}
    print(f"sweep {cfg.name}: {len(summary.status)} cells ({counts['ok']} ok, {counts['skip']} skip, "
          f"{counts['error']} error; {len(summary.kept)} kept from before) in {summary.wall_s:.1f} s -> {out}")
    if cfg.report and not args.no_report:
        from bench.report.build import build_report

        build_report(out, report_dir)
        headline = _headline((report_dir / "README.md").read_text(encoding="utf-8"))
        if headline:
            print(headline)
        print(f"report -> {report_dir / 'README.md'}")
    if summary.errors:
        for cid in summary.errors:
            print(f"failed cell {cid}: see {_error_log(out, cid)}", file=sys.stderr)
        return 1
    return 0


def _headline(report: str) -> str:
    """The report's headline section (verdict and table), as printed at the end of a sweep."""
    m = re.search(r"^## Headline\n(.*?)(?=^## |\Z)", report, re.S | re.M)
    return m.group(1).strip() if m else ""


def _print_plan(summary) -> None:
    """Before the first cell runs: the finished cells whose results this run replaces (settings changed,
    stale) or keeps although stale, so that a rerun with other settings never replaces results unannounced."""
    if summary.changed:
        print(f"{len(summary.changed)} finished cells changed (their fields, command line or a cell they depend "
              "on): each runs again, and its earlier results are deleted when it starts (to keep them, stop now "
              f"and run the changed file with another --out): {', '.join(summary.changed)}", flush=True)
    if summary.stale:
        print(f"{len(summary.stale)} stale cells (finished under another code version) recomputed: "
              f"{', '.join(summary.stale)}", flush=True)
    if summary.kept_stale:
        print(f"{len(summary.kept_stale)} stale cells kept (--keep-stale; marked in the report): "
              f"{', '.join(summary.kept_stale)}", flush=True)


def _error_log(out: Path, cell_id: str) -> Path:
    """Where a failed cell says why: its ``stderr.log``, or its folder when the sweep did not start it
    (a cell run by hand on several nodes, whose own rows hold the error)."""
    from bench.sweep import layout

    cell_dir = out / layout.CELLS_DIR / cell_id
    log = cell_dir / "stderr.log"
    return log if log.is_file() else cell_dir


def _print_cells(cfg, out: Path, data_root: str | None) -> None:
    """Per cell: ``id [kind] <- deps``, then the exact line it runs (``inrbench ...`` / ``torchrun ...``)."""
    from bench.sweep.cells import shell_line
    from bench.sweep.runner import SweepContext

    ctx = SweepContext(out=out.resolve(), data_root=Path(data_root).resolve() if data_root else None,
                       cells=cfg.by_id(), rendezvous=cfg.rendezvous)
    for c in cfg.cells:
        deps = f"  <- {', '.join(c.deps())}" if c.deps() else ""
        nodes = getattr(c, "nnodes", 1)
        where = f"  (on each of {nodes} nodes; the sweep does not start it)" if c.elsewhere(ctx) else ""
        print(f"{c.id} [{c.kind}]{deps}{where}\n    {shell_line(c.process_argv(ctx))}")
