"""`inrbench perf TARGET`: benchmarks that measure ratios side by side in one run and print them."""

from __future__ import annotations

import argparse
import importlib

from bench.cli import escape_help
from bench.perf import TARGETS

HELP = "benchmarks that print figures: " + ", ".join(TARGETS)


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="target", metavar="TARGET", required=True)
    for name, modname in TARGETS.items():
        mod = importlib.import_module(modname)
        sp = sub.add_parser(name, help=escape_help(mod.HELP), description=mod.HELP)
        mod.add_arguments(sp)
        sp.set_defaults(_perf_run=mod.run)


def run(args: argparse.Namespace) -> int:
    return args._perf_run(args)
