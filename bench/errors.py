"""Errors and exit statuses: what the CLI turns into one line on stderr (``guarded``), never a traceback.
The base layer: it imports nothing from the project."""

from __future__ import annotations

import contextlib
import errno
import os
import re
import select
import signal
import sys
from collections.abc import Callable
from pathlib import Path


class InputError(Exception):
    """Bad user input (a missing path, a wrong layout, a corrupt file), naming the file and what is wrong:
    ``guarded`` prints ``inrbench: error: <message>`` and exits 2."""

    def __init__(self, message: str, path: str | Path | None = None):
        self.path = None if path is None else Path(path)
        super().__init__(f"{path}: {message}" if path is not None else message)


def older_artifact(path: str | Path, schema: object, rerun: str) -> InputError:
    """The one line refusing an artifact of an older schema (no compatibility code before 1.0)."""
    return InputError(f"written by an older inr-bench (schema {schema}); {rerun}", path)


EXIT_OUT_OF_MEMORY = 3  # a command that ran out of (device or host) memory
EXIT_INTERRUPTED = 130  # 128 + SIGINT: Ctrl-C
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE: stdout's reader went away (``| head``), as a shell reports it
# A folder where each rank ``bench.dist.launch`` starts leaves its exit status (``rank<R>``), so that
# ``--nproc`` exits with the ranks' class (2 bad input, 3 out of memory), not torchrun's 1.
STATUS_DIR_ENV = "INRBENCH_RANK_STATUS_DIR"


def is_out_of_memory(e: BaseException) -> bool:
    """An allocation failure: ``MemoryError``, ``torch.OutOfMemoryError``, or torch's CPU allocator's error."""
    if isinstance(e, MemoryError):
        return True
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(e, getattr(torch, "OutOfMemoryError", ())):
        return True
    text = str(e).lower()
    return "out of memory" in text or "can't allocate memory" in text


def one_line(text: str) -> str:
    """Messages are one line: embedded newlines (a file name holding one) are shown escaped."""
    return text.replace("\r", "\\r").replace("\n", "\\n")


# numpy reports a short write (a full disk) as ``OSError("N requested and M written")``, with no errno
_SHORT_WRITE = re.compile(r"(\d+) requested and (\d+) written")
_FREE_SPACE = " (free some space and rerun: finished work is kept and resumed)"


def os_error_message(e: OSError, out: str | None = None) -> str:
    """One line for an ``OSError`` naming the file (else ``--out out``, a command's output): the system's
    words, else the message, else the type; a full disk (``ENOSPC``, numpy's short write) with advice."""
    what = e.strerror or " ".join(str(e).split()) or type(e).__name__
    short = _SHORT_WRITE.fullmatch(what) if e.strerror is None else None
    if short:
        what = f"short write ({short[2]} of {short[1]} bytes written): the disk may be full{_FREE_SPACE}"
    elif e.errno in (errno.ENOSPC, errno.EDQUOT):
        what += _FREE_SPACE
    if e.filename is not None:
        return f"{e.filename}: {what}"
    return f"--out {out}: {what}" if out else what


def interrupt_said_elsewhere() -> bool:
    """Whether this process is a rank whose Ctrl-C another reports (the launcher, or rank 0). Further SIGINTs
    are ignored from now on: a second KeyboardInterrupt would interrupt the rank's exit with a traceback."""
    try:  # torchrun's environment; one process, or one that cannot be read: not a rank
        size, rank = int(os.environ.get("WORLD_SIZE") or 1), int(os.environ.get("RANK") or 0)
    except ValueError:
        return False
    if size <= 1 or not 0 <= rank < size:
        return False
    with contextlib.suppress(ValueError):  # not the main thread
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    return bool(os.environ.get(STATUS_DIR_ENV)) or rank != 0


def guarded(run: Callable[[], int], prefix: str = "", out: str | None = None) -> int:
    """Run a command body; what the user must act on becomes one stderr line and an exit status:
    input/OS error 2, out of memory 3, Ctrl-C 130, stdout gone 141 (silent); other errors are bugs
    (traceback). ``out``: the ``--out`` named in an ``OSError`` line naming no file."""
    try:
        return int(run() or 0)
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else 2
    except InputError as e:
        print(f"inrbench: error: {prefix}{one_line(str(e))}", file=sys.stderr)
        return 2
    except OSError as e:
        if isinstance(e, BrokenPipeError) and stdout_closed():
            return stdout_gone()
        print(f"inrbench: error: {prefix}{one_line(os_error_message(e, out))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        if not interrupt_said_elsewhere():  # a rank: the launcher (or rank 0) says it, once
            print("inrbench: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as e:
        if not is_out_of_memory(e):
            raise
        message = one_line(" ".join(f"{type(e).__name__}: {e}".split()))
        print(f"inrbench: error: {prefix}out of memory: {message[:500]}", file=sys.stderr)
        return EXIT_OUT_OF_MEMORY


def stdout_closed() -> bool:
    """Whether stdout is a pipe whose reader has gone (``poll``: POLLERR), so that a ``BrokenPipeError`` from
    a pipe of the command's own is not taken for ``| head``; True where this cannot be told."""
    try:
        p = select.poll()
        p.register(sys.stdout.fileno(), select.POLLOUT)
        return any(ev & (select.POLLERR | select.POLLHUP) for _, ev in p.poll(0))
    except (AttributeError, OSError, ValueError):
        return True


def stdout_gone() -> int:
    """The reader of stdout went away: point stdout at ``os.devnull`` (the final flush then finds no closed
    pipe, as the signal module's docs recommend) and return ``EXIT_BROKEN_PIPE``, printing nothing."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):  # stdout without a file descriptor (a test's capture)
        pass
    return EXIT_BROKEN_PIPE
