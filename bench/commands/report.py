"""`inrbench report RESULTS_DIR`: README.md with tables and PNG figures, from result files only."""

from __future__ import annotations

import argparse
from pathlib import Path

from bench.argtypes import nonempty

HELP = "build README.md tables and PNG figures from a sweep (or bench) results folder"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("results", metavar="RESULTS_DIR", help="a sweep --out folder or a bench --out folder")
    p.add_argument("--out", metavar="DIR", type=nonempty,
                   help="report folder (default: reports/<results folder name>)")


def run(args: argparse.Namespace) -> int:
    from bench.report.build import build_report

    out = Path(args.out or Path("reports") / Path(args.results).resolve().name)
    build_report(args.results, out)
    print(f"report -> {out / 'README.md'}")
    return 0
