"""`inrbench` command line: one module per subcommand under ``bench.commands``.

Each command module defines ``HELP`` (one line), ``add_arguments(parser)`` and
``run(args) -> int``, and keeps heavy imports (torch, DALI) inside ``run`` so that
``inrbench --help`` stays fast. ``InputError`` becomes one line on stderr and exit 2. Output piped into
a reader that stops early (``inrbench sweep demo --list | head -1``) ends quietly with exit 141
(``EXIT_BROKEN_PIPE``), as a command killed by SIGPIPE does, once the command has done its work (a sweep
runs every cell: ``Stdout``); a stdout that is closed (``>&-``) or full (``> /dev/full``) is one line
and exit 2, after the same work.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import errno
import importlib
import logging
import os
import re
import signal
import sys
from collections.abc import Callable, Iterable

from bench.errors import EXIT_BROKEN_PIPE, guarded, one_line, stdout_gone

# MKL's conditional numerical reproducibility (CNR), which MKL reads once, at its first call: before any torch maths
# of the process (``inrbench``, ``python -m bench``, a sweep's or perf's child commands, the tests' conftest). Strict
# CNR makes an MKL GEMM's results independent of its thread count and of memory alignment, so a fitted image does not
# depend on the rows beside it, the worker or the machine's load (docs/measurement.md, with its cost).
# A value the user set is kept (e.g. ``COMPATIBLE,STRICT``: the same code path on every x86 CPU, slower).
os.environ.setdefault("MKL_CBWR", "AUTO,STRICT")

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
        self.exit(2, f"inrbench: error: {self.prog}: {one_line(message)} (see {self.prog} --help)\n")


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


class Stdout:
    """``sys.stdout`` while a command runs. A write or flush that fails (the reader of a pipe went away,
    ``> /dev/full``, stdout closed with ``>&-``) is kept in ``lost`` and what follows is dropped: the
    command's work goes on to its end (a sweep runs every cell) instead of stopping midway, and ``main``
    then says what was lost. Text the encoding cannot hold (``PYTHONIOENCODING=ascii``) is escaped."""

    def __init__(self, stream):
        if stream is None:  # fd 1 closed (``>&-``): a file opened later must never become fd 1
            stream = _devnull_stdout()
            self.lost: OSError | None = OSError(errno.EBADF, "it is closed")
        else:
            self.lost = None
        with contextlib.suppress(AttributeError, ValueError, OSError):
            stream.reconfigure(errors="backslashreplace")
        self.stream = stream

    def write(self, text: str) -> int:
        if self.lost is None:
            try:
                return self.stream.write(text)
            except OSError as e:
                self._lose(e)
        return len(text)

    def flush(self) -> None:
        if self.lost is None:
            try:
                self.stream.flush()
            except OSError as e:
                self._lose(e)

    def _lose(self, e: OSError) -> None:
        self.lost = e
        stdout_gone()  # what is still buffered drains into os.devnull, at exit too

    def __getattr__(self, name: str):
        return getattr(self.stream, name)

    def status(self, code: int) -> int:
        """The command's exit status once stdout was lost: a reader that stopped early (``| head``) is
        ``EXIT_BROKEN_PIPE``, quietly; any other loss is one error line and 2. A failed command keeps
        its own status (its error line said why)."""
        if self.lost is None or code != 0:
            return code
        if isinstance(self.lost, BrokenPipeError):
            return EXIT_BROKEN_PIPE
        why = self.lost.strerror or str(self.lost)
        print(f"inrbench: error: cannot write to stdout: {why}; the command ran to its end, only what it "
              "printed there is lost", file=sys.stderr)
        return 2


def _devnull_stdout():
    """A text stream on ``os.devnull``, put at fd 1 where that is closed."""
    try:
        os.fstat(1)
    except OSError:
        fd = os.open(os.devnull, os.O_WRONLY)
        if fd != 1:
            os.dup2(fd, 1)
            os.close(fd)
        return open(1, "w", closefd=False)  # noqa: SIM115 - lives as long as the process
    return open(os.devnull, "w")  # noqa: SIM115 - the same


def main(argv: list[str] | None = None) -> int:
    out = Stdout(sys.stdout)
    saved, sys.stdout = sys.stdout, out
    try:
        code = _main(argv)
        out.flush()  # what is still buffered goes now, while a closed pipe can still be told apart from an error
    finally:
        sys.stdout = saved if saved is not None else out.stream
    if argv is None:  # the process ends now: a Ctrl-C while it shuts down (joins threads, runs atexit) has
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # nothing left to stop, and printed "Exception ignored"
    return out.status(code)


def _main(argv: list[str] | None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # --help (0) or a usage error (2, one line): an exit status, like every command
        return e.code if isinstance(e.code, int) else 2
    args._argv = list(sys.argv[1:] if argv is None else argv)  # what --nproc relaunches (bench.dist.launch)
    out = getattr(args, "out", None)
    return guarded(lambda: args._run(args), out=out if isinstance(out, str) else None)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
