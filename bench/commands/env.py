"""`inrbench env`: print (or save) the run metadata that every result carries."""

from __future__ import annotations

import argparse
import contextlib
import json

from bench import atomic, envinfo
from bench.argtypes import nonempty
from bench.outputs import claim

HELP = "print the environment record (commit, versions, which PIL, CPU, GPU) as JSON"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", type=nonempty, help="also write it atomically to this file (new, or an env record written by inrbench)")


def run(args: argparse.Namespace) -> int:
    with claim(args.out, "env", mode="replace") if args.out else contextlib.nullcontext() as out:
        info = envinfo.collect()
        print(json.dumps(info, indent=2, sort_keys=True))
        if out is not None:
            atomic.atomic_write_json(out, info)
    return 0
