"""`inrbench datasets`: list the dataset sources ``prepare`` reads, one line each."""

from __future__ import annotations

import argparse

HELP = "list the dataset sources that `inrbench prepare` reads"


def add_arguments(p: argparse.ArgumentParser) -> None:
    pass


def run(args: argparse.Namespace) -> int:
    from bench.datasets.sources import get_source, source_names

    names = source_names()
    width = max(len(n) for n in names)
    for n in names:
        src = get_source(n)
        root = "--root PATH" if src.needs_root else "built in"
        size = f"size {src.default_size}" if src.default_size else "native size"
        print(f"{n:<{width}}  {src.description}  [{root}; default {size}]")
    return 0
