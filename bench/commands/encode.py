"""`inrbench encode PREPARED_DIR --preset NAME --out FILE`: fit, prune, quantize, store."""

from __future__ import annotations

import argparse

HELP = "encode a prepared split as per-image SIRENs (fit, prune, quantize) into one INR store file"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("prepared", help="a prepared dataset folder")


def run(args: argparse.Namespace) -> int:
    from bench.errors import InputError

    raise InputError("encode: not wired yet (issue #3 in progress; use inr.fit / inr.store from Python)")
