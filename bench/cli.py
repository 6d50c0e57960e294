"""`inrbench` command line: one module per subcommand under ``bench.commands``.

Each command module defines ``HELP`` (one line), ``add_arguments(parser)`` and
``run(args) -> int``, and keeps heavy imports (torch, DALI) inside ``run`` so that
``inrbench --help`` stays fast. ``InputError`` becomes one line on stderr and exit 2.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable

from bench.errors import InputError

# name -> module; the order is the order ``--help`` lists them in.
COMMANDS: dict[str, str] = {
    "datasets": "bench.commands.datasets",
    "prepare": "bench.commands.prepare",
    "meta-init": "bench.commands.meta_init",
    "encode": "bench.commands.encode",
    "inspect": "bench.commands.inspect",
    "bench": "bench.commands.bench",
    "compare": "bench.commands.compare",
    "perf": "bench.commands.perf",
    "sweep": "bench.commands.sweep",
    "report": "bench.commands.report",
    "env": "bench.commands.env",
}


def escape_help(text: str) -> str:
    """argparse %-formats help strings; a literal '%' (\"% of raw RGB\") must be doubled."""
    return text.replace("%", "%%")


class OneLineParser(argparse.ArgumentParser):
    """argparse whose usage errors are one line (``inrbench: error: ...``) and exit 2, like every error."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(2, f"inrbench: error: {self.prog}: {_one_line(message)} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="inrbench",
        description="Benchmark training input pipelines: torch-jpeg, torch-nvjpeg, dali, inr (Rapid-INR) and raw.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, modname in COMMANDS.items():
        mod = importlib.import_module(modname)
        p = sub.add_parser(name, help=escape_help(mod.HELP), description=escape_help(mod.HELP))
        mod.add_arguments(p)
        p.set_defaults(_run=mod.run)
    return parser


def _one_line(text: str) -> str:
    """Messages are one line: embedded newlines (a file name holding one) are shown escaped."""
    return text.replace("\r", "\\r").replace("\n", "\\n")


def guarded(run: Callable[[], int], prefix: str = "") -> int:
    """Run a command body and turn what the user must act on into one line on stderr and an exit status.

    ``InputError`` and ``OSError`` (disk full, permission denied, read-only file system: the
    machine, not a bug) -> ``inrbench: error: <prefix><message>``, 2; ``--help`` or a usage
    error (``SystemExit``) -> its status; Ctrl-C -> 130. Anything else is a bug: a traceback.
    """
    try:
        return int(run() or 0)
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else 2
    except InputError as e:
        print(f"inrbench: error: {prefix}{_one_line(str(e))}", file=sys.stderr)
        return 2
    except OSError as e:
        from bench.outputs import os_error_message

        print(f"inrbench: error: {prefix}{_one_line(os_error_message(e))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("inrbench: interrupted", file=sys.stderr)
        return 130


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # --help (0) or a usage error (2, one line): an exit status, like every command
        return e.code if isinstance(e.code, int) else 2
    args._argv = list(sys.argv[1:] if argv is None else argv)  # what --nproc relaunches (bench.dist.launch)
    return guarded(lambda: args._run(args))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
