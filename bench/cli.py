"""`inrbench` command line: one module per subcommand under ``bench.commands``.

Each command module defines ``HELP`` (one line), ``add_arguments(parser)`` and
``run(args) -> int``, and keeps heavy imports (torch, DALI) inside ``run`` so that
``inrbench --help`` stays fast. ``InputError`` becomes one line on stderr and exit 2. Output piped into
a reader that stops early (``inrbench sweep demo --list | head -1``) ends quietly with exit 141
(``EXIT_BROKEN_PIPE``), as a command killed by SIGPIPE does.
"""

from __future__ import annotations

import argparse
import copy
import importlib
import logging
import os
import re
import sys
from collections.abc import Callable, Iterable
from pathlib import Path

from bench.errors import InputError

# MKL's conditional numerical reproducibility (CNR), which MKL reads once, at its first call: before any torch maths
# of the process (``inrbench``, ``python -m bench``, a sweep's or perf's child commands, the tests' conftest). Strict
# CNR makes an MKL GEMM's results independent of its thread count and of memory alignment, so a fitted image does not
# depend on the rows beside it, the worker or the machine's load (docs/measurement.md, with its cost).
# A value the user set is kept (e.g. ``COMPATIBLE,STRICT``: the same code path on every x86 CPU, slower).
os.environ.setdefault("MKL_CBWR", "AUTO,STRICT")

# stdout's reader went away (``| head``): 128 + SIGPIPE (13), the status a shell reports for a command
# killed by SIGPIPE (``yes | head``), as Ctrl-C is 130 (128 + SIGINT). Not 2 (bad input), not 0: under
# ``set -o pipefail`` a cut-short listing is not a success, and it reads as what it is.
EXIT_BROKEN_PIPE = 141

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
    """argparse %-formats help strings (``help=``); a literal '%' (\"% of raw RGB\") must be doubled.
    Not for ``description=``, which argparse prints as written (unless it holds ``%(prog)``)."""
    return text.replace("%", "%%")


class HelpFormatter(argparse.HelpFormatter):
    """Every option that has a default worth showing ends its help with ``(default X)``, unless its
    help already says what the default is. Flags (``store_true``), ``None`` and empty defaults show
    nothing: no "default: False" noise. ``{names}`` in a help is filled in by ``list_names``."""

    def add_argument(self, action: argparse.Action) -> None:
        text, names = default_text(action), getattr(action, "help_names", None)
        if text is not None or names is not None:
            action = copy.copy(action)  # the parser's own action keeps its help
            if names is not None and action.help:
                action.help = action.help.replace("{names}", escape_help(", ".join(names())))
            if text is not None:
                suffix = escape_help(f"(default {text})")
                action.help = f"{action.help} {suffix}" if action.help else suffix
        super().add_argument(action)


def default_text(action: argparse.Action) -> str | None:
    """What ``--help`` appends as ``action``'s default, or None (nothing worth showing, or said already)."""
    d = action.default
    if (not action.option_strings or action.nargs == 0 or action.help is argparse.SUPPRESS
            or d is None or d is argparse.SUPPRESS or isinstance(d, bool) or d == "" or d == [] or d == ()
            or re.search(r"\bdefault\b", action.help or "", re.I)):
        return None

    def one(v) -> str:
        return f"{v:g}" if isinstance(v, float) else str(v)

    return " ".join(map(one, d)) if isinstance(d, (list, tuple)) else one(d)


def list_names(action: argparse.Action, names: Callable[[], Iterable[str]]) -> argparse.Action:
    """Replace ``{names}`` in ``action``'s help by a registry's names, read only when ``--help`` prints
    them: the registries of backbones, pipelines and presets import torch, which building the parser
    must not (every command would pay for it). The command that uses the option checks the name."""
    action.help_names = names  # type: ignore[attr-defined]
    return action


def progress_bar(total: int, desc: str, unit: str, enabled: bool = True, **kw):
    """A tqdm progress bar on stderr, drawn only where stderr is a terminal: a log or a pipe gets no
    bar frames (tqdm's ``disable=None``). ``enabled=False`` (``--no-progress``) turns it off everywhere."""
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit=unit, disable=None if enabled else True, **kw)


class _NoCudaRuntimeNote(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("No CUDA runtime is found")


def quiet_cuda_home_note() -> None:
    """Drop torch's ``No CUDA runtime is found, using CUDA_HOME=...`` warning, which
    ``torch.utils.cpp_extension`` logs when inductor builds C++ kernels (``--fit-step compiled``) on a
    machine that has a CUDA toolkit but no GPU: a CPU compile needs no CUDA. Only that message."""
    log = logging.getLogger("torch.utils.cpp_extension")
    if not any(isinstance(f, _NoCudaRuntimeNote) for f in log.filters):
        log.addFilter(_NoCudaRuntimeNote())


class OneLineParser(argparse.ArgumentParser):
    """argparse whose usage errors are one line (``inrbench: error: ...``) and exit 2, like every error;
    its ``--help`` shows the options' defaults (``HelpFormatter``)."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str):  # type: ignore[override]
        self.exit(2, f"inrbench: error: {self.prog}: {_one_line(message)} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="inrbench",
        description="Benchmark training input pipelines: torch-jpeg, torch-nvjpeg, dali, inr (Rapid-INR) and raw.",
    )
    add_module_parsers(parser.add_subparsers(dest="command", metavar="COMMAND", required=True), COMMANDS, "_run")
    return parser


def add_module_parsers(sub, modules: dict[str, str], run_dest: str) -> None:
    """One parser in ``sub`` (``add_subparsers``'s result) per entry of ``modules`` (name -> module path):
    the module's ``HELP`` as help and description, its ``add_arguments(p)``, and its ``run`` as the
    default of ``run_dest`` (the attribute the caller then calls with the parsed args)."""
    for name, modname in modules.items():
        mod = importlib.import_module(modname)
        p = sub.add_parser(name, help=escape_help(mod.HELP), description=mod.HELP)
        mod.add_arguments(p)
        p.set_defaults(**{run_dest: mod.run})


def _one_line(text: str) -> str:
    """Messages are one line: embedded newlines (a file name holding one) are shown escaped."""
    return text.replace("\r", "\\r").replace("\n", "\\n")


def _os_error_line(e: OSError, out: str | None) -> str:
    """``bench.outputs.os_error_message``, naming the command's ``--out`` where the error itself names
    no file (a write that hit a full disk) or names the lock file beside it (its folder is read-only
    or missing), which the user never asked for."""
    from bench.outputs import _lock_path, os_error_message

    if out:
        if e.filename is not None and Path(os.fsdecode(e.filename)).name == _lock_path(Path(out)).name:
            where = str(Path(out).parent)
            return f"--out {out}: cannot write in {where}: {e.strerror or str(e) or type(e).__name__}"
        if e.filename is None:
            return f"--out {out}: {os_error_message(e)}"
    return os_error_message(e)


def guarded(run: Callable[[], int], prefix: str = "", out: str | None = None) -> int:
    """Run a command body and turn what the user must act on into one line on stderr and an exit status.

    ``InputError`` and ``OSError`` (disk full, permission denied, read-only file system: the
    machine, not a bug) -> ``inrbench: error: <prefix><message>``, 2; running out of memory
    (``MemoryError``, a torch allocator error: sizes beyond the machine) -> ``inrbench: error:
    <prefix>out of memory: ...``, 3; ``--help`` or a usage error (``SystemExit``) -> its status;
    Ctrl-C -> 130 (said once in a data-parallel run: ``bench.dist.interrupt_said_elsewhere``); stdout's reader gone (``BrokenPipeError``: ``| head``) -> nothing printed, 141
    (``stdout_gone``). Anything else is a bug: a traceback. ``out``: the command's ``--out``, named in an
    ``OSError`` line that would otherwise name no file or the lock file beside it.
    """
    try:
        return int(run() or 0)
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else 2
    except InputError as e:
        print(f"inrbench: error: {prefix}{_one_line(str(e))}", file=sys.stderr)
        return 2
    except BrokenPipeError as e:
        if stdout_closed():
            return stdout_gone()
        print(f"inrbench: error: {prefix}{_one_line(_os_error_line(e, out))}", file=sys.stderr)  # another pipe
        return 2
    except OSError as e:
        print(f"inrbench: error: {prefix}{_one_line(_os_error_line(e, out))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        from bench.dist import EXIT_INTERRUPTED, interrupt_said_elsewhere

        if not interrupt_said_elsewhere():  # a rank: the launcher (or rank 0) says it, once
            print("inrbench: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as e:
        from bench.errors import EXIT_OUT_OF_MEMORY, is_out_of_memory

        if not is_out_of_memory(e):
            raise
        message = _one_line(" ".join(f"{type(e).__name__}: {e}".split()))
        print(f"inrbench: error: {prefix}out of memory: {message[:500]}", file=sys.stderr)
        return EXIT_OUT_OF_MEMORY


def stdout_closed() -> bool:
    """Whether stdout is a pipe whose reader has gone (``poll`` reports POLLERR on its write end), so a
    ``BrokenPipeError`` from a pipe of the command's own (a worker's) is not taken for ``| head``.
    True where this cannot be told (no ``poll``, no file descriptor)."""
    try:
        import select

        p = select.poll()
        p.register(sys.stdout.fileno(), select.POLLOUT)
        return any(ev & (select.POLLERR | select.POLLHUP) for _, ev in p.poll(0))
    except (AttributeError, OSError, ValueError):
        return True


def stdout_gone() -> int:
    """The reader of stdout went away (``inrbench env | head``): point stdout at ``os.devnull``, so the
    interpreter's final flush of what is still buffered finds no closed pipe (no "Exception ignored ...
    BrokenPipeError" at exit), as the Python docs recommend (signal module, "Note on SIGPIPE"), and
    return ``EXIT_BROKEN_PIPE``, printing nothing: the user stopped reading, nothing failed."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):  # stdout without a file descriptor (a test's capture)
        pass
    return EXIT_BROKEN_PIPE


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # --help (0) or a usage error (2, one line): an exit status, like every command
        return e.code if isinstance(e.code, int) else 2
    args._argv = list(sys.argv[1:] if argv is None else argv)  # what --nproc relaunches (bench.dist.launch)
    out = getattr(args, "out", None)
    code = guarded(lambda: args._run(args), out=out if isinstance(out, str) else None)
    try:  # what is still buffered goes now, while a closed pipe can still be told apart from an error
        sys.stdout.flush()
    except BrokenPipeError:
        gone = stdout_gone()
        return gone if code == 0 else code  # a failure's status is not masked by a reader that stopped early
    return code


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
