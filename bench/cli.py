"""`inrbench` command line: one module per subcommand under ``bench.commands`` (``HELP``,
``add_arguments(parser)``, ``run(args) -> int``; heavy imports inside ``run``). Errors are one line
(``bench.errors.guarded``); a stdout that goes away is reported once the command's work is done.
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
from typing import Any

from tqdm import tqdm

from bench.errors import EXIT_BROKEN_PIPE, guarded, one_line, stdout_gone

# MKL's strict conditional numerical reproducibility, read at its first call: a GEMM's results then do
# not depend on thread count or alignment, so a fitted image does not depend on its neighbours
# (docs/measurement.md). A value the user set is kept.
os.environ.setdefault("MKL_CBWR", "AUTO,STRICT")

# name -> module, in the order ``--help`` lists them
COMMANDS: dict[str, str] = {name: f"bench.commands.{name.replace('-', '_')}" for name in (
    "datasets", "prepare", "meta-init", "encode", "inspect", "bench", "compare", "perf", "sweep", "report", "env")}


def escape_help(text: str) -> str:
    """argparse %-formats ``help=`` strings: a literal '%' must be doubled (not in ``description=``)."""
    return text.replace("%", "%%")


class HelpFormatter(argparse.HelpFormatter):
    """Ends each option's help with ``(default X)`` unless it says its default already or has none worth
    showing (flags, None, empty); fills ``{names}`` from ``list_names``."""

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
            or d is None or d is argparse.SUPPRESS or isinstance(d, bool) or d in ("", [], ())
            or re.search(r"\bdefault\b", action.help or "", re.I)):
        return None

    def one(v) -> str:
        return f"{v:g}" if isinstance(v, float) else str(v)

    return " ".join(map(one, d)) if isinstance(d, (list, tuple)) else one(d)


def list_names(action: argparse.Action, names: Callable[[], Iterable[str]]) -> argparse.Action:
    """Fill ``{names}`` in ``action``'s help from a registry only when ``--help`` prints it: the registries
    import torch, which building the parser must not."""
    action.help_names = names  # type: ignore[attr-defined]
    return action


def progress_bar(total: int, desc: str, unit: str, enabled: bool = True, **kw):
    """A tqdm bar on stderr, drawn only where stderr is a terminal; ``enabled=False`` (``--no-progress``): never."""
    return tqdm(total=total, desc=desc, unit=unit, disable=None if enabled else True, **kw)


def no_cuda_runtime_note(record: logging.LogRecord) -> bool:
    return not str(record.msg).startswith("No CUDA runtime is found")


def quiet_cuda_home_note() -> None:
    """Drop torch's ``No CUDA runtime is found, using CUDA_HOME=...`` warning, logged when inductor builds
    CPU kernels on a machine with a CUDA toolkit and no GPU (only that message)."""
    log = logging.getLogger("torch.utils.cpp_extension")
    if no_cuda_runtime_note not in log.filters:
        log.addFilter(no_cuda_runtime_note)


class OneLineParser(argparse.ArgumentParser):
    """argparse whose usage errors are one line (``inrbench: error: ...``) and exit 2; ``--help`` shows defaults."""

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
    """A parser in ``sub`` per ``{name: module}``: its ``HELP``, its ``add_arguments``, its ``run`` as ``run_dest``."""
    for name, modname in modules.items():
        mod = importlib.import_module(modname)
        p = sub.add_parser(name, help=escape_help(mod.HELP), description=mod.HELP)
        mod.add_arguments(p)
        p.set_defaults(**{run_dest: mod.run})


def _parse(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace | int:
    """The parsed arguments, or the exit status of ``--help`` (0) or a usage error (2, one line)."""
    try:
        return parser.parse_args(argv)
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else 2


def script_main(prog: str, description: str, add_arguments: Callable[[argparse.ArgumentParser], None],
                run: Callable[[argparse.Namespace], int], argv: list[str] | None = None) -> int:
    """``main`` of a standalone script (a study): parsed and run as an ``inrbench`` command (one-line errors)."""
    parser = OneLineParser(prog=prog, description=description)
    add_arguments(parser)
    args = _parse(parser, argv)
    return args if isinstance(args, int) else guarded(lambda: run(args))


class Stdout:
    """``sys.stdout`` while a command runs. A failed write or flush (``| head`` gone, ``> /dev/full``, ``>&-``)
    is kept in ``lost`` and what follows is dropped, so the command's work goes on to its end; ``status``
    then says what was lost. Text the encoding cannot hold is escaped."""

    def __init__(self, stream):
        self.lost: OSError | None = None
        if stream is None:  # fd 1 closed: a file opened later must never become fd 1
            stream, self.lost = _devnull_stdout(), OSError(errno.EBADF, "it is closed")
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

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)

    def status(self, code: int) -> int:
        """The exit status once stdout was lost: ``EXIT_BROKEN_PIPE`` quietly for a reader that stopped,
        else one error line and 2; a failed command keeps its own status."""
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
        out.flush()  # now, while a closed pipe can still be told apart from an error
    finally:
        sys.stdout = saved if saved is not None else out.stream
    if argv is None:  # the process ends now: a Ctrl-C while it shuts down has nothing left to stop
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    return out.status(code)


def _main(argv: list[str] | None) -> int:
    args = _parse(build_parser(), argv)
    if isinstance(args, int):
        return args
    args._argv = list(sys.argv[1:] if argv is None else argv)  # what --nproc relaunches (bench.dist.launch)
    out = getattr(args, "out", None)
    return guarded(lambda: args._run(args), out=out if isinstance(out, str) else None)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
