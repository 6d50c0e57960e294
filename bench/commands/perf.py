"""`inrbench perf TARGET`: benchmarks that measure ratios side by side in one run and print them."""

from __future__ import annotations

import argparse

from bench.cli import add_module_parsers
from bench.perf import TARGETS

HELP = "benchmarks that print figures: " + ", ".join(TARGETS)


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_module_parsers(p.add_subparsers(dest="target", metavar="TARGET", required=True), TARGETS, "_perf_run")


def run(args: argparse.Namespace) -> int:
    return args._perf_run(args)
