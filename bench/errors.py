"""Errors and exit statuses: what the CLI turns into one line on stderr (``guarded``), never a traceback.

The base layer: imports nothing from the project, so every layer above can raise and report through it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path


class InputError(Exception):
    """Bad user input: a missing path, a wrong layout, a corrupt file.

    The message must name the file (when there is one) and what is wrong with it,
    on one line. ``guarded`` prints ``inrbench: error: <message>`` and exits 2.
    """

    def __init__(self, message: str, path: str | Path | None = None):
        self.path = None if path is None else Path(path)
        super().__init__(f"{path}: {message}" if path is not None else message)


def older_artifact(path: str | Path, schema: object, rerun: str) -> InputError:
    """The one line refusing an artifact of an older schema (no compatibility code before 1.0)."""
    return InputError(f"written by an older inr-bench (schema {schema}); {rerun}", path)


EXIT_OUT_OF_MEMORY = 3  # the documented exit status of a command that ran out of (device or host) memory
EXIT_INTERRUPTED = 130  # 128 + SIGINT: Ctrl-C
# stdout's reader went away (``| head``): 128 + SIGPIPE (13), the status a shell reports for a command
# killed by SIGPIPE (``yes | head``), as Ctrl-C is 130 (128 + SIGINT). Not 2 (bad input), not 0: under
# ``set -o pipefail`` a cut-short listing is not a success, and it reads as what it is.
EXIT_BROKEN_PIPE = 141
# Set by ``bench.dist.launch`` for the ranks it starts: a folder where each rank leaves its exit status
# (``rank<R>``), so ``--nproc`` exits with the ranks' class (2 bad input, 3 out of memory), not torchrun's 1.
STATUS_DIR_ENV = "INRBENCH_RANK_STATUS_DIR"


def is_out_of_memory(e: BaseException) -> bool:
    """An allocation failure: ``MemoryError``, ``torch.OutOfMemoryError`` (CUDA), or torch's allocator
    error in other words (CPU: ``DefaultCPUAllocator: can't allocate memory``)."""
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


# numpy's ``tofile``/``save`` report a short write (a full disk) as ``OSError("N requested and M written")``,
# with no errno: the only sign that the disk filled up
_SHORT_WRITE = re.compile(r"(\d+) requested and (\d+) written")
_FREE_SPACE = " (free some space and rerun: finished work is kept and resumed)"


def os_error_message(e: OSError) -> str:
    """One line for an ``OSError`` (disk full, permission denied...) naming the file.

    What happened: the system's words (``strerror``), else the exception's own message (an ``OSError``
    raised without an errno), else its type. A short write (numpy's ``N requested and M written``) is
    said to be what it most likely is, a full disk, with the same advice as ``ENOSPC``.
    """
    what = e.strerror or " ".join(str(e).split()) or type(e).__name__
    short = _SHORT_WRITE.fullmatch(what) if e.strerror is None else None
    if short:
        what = (f"short write ({short[2]} of {short[1]} bytes written): the disk may be full"
                f"{_FREE_SPACE}")
    elif e.errno in (errno.ENOSPC, errno.EDQUOT):
        what += _FREE_SPACE
    name = e.filename if e.filename is not None else None
    return f"{name}: {what}" if name is not None else what


def interrupt_said_elsewhere() -> bool:
    """Whether this process is a rank whose Ctrl-C another process reports: the launcher (``bench.dist.launch``),
    or rank 0. Further SIGINTs are ignored from now on: the rank is on its way out (torchrun passes one on
    after the terminal's), and a second KeyboardInterrupt would interrupt that with a traceback."""
    import signal

    try:  # torchrun's environment (``bench.dist.from_env``); one process, or one that cannot be read: not a rank
        size, rank = int(os.environ.get("WORLD_SIZE") or 1), int(os.environ.get("RANK") or 0)
    except ValueError:
        return False
    if size <= 1 or not 0 <= rank < size:
        return False
    with contextlib.suppress(ValueError):  # not the main thread
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    return bool(os.environ.get(STATUS_DIR_ENV)) or rank != 0


def guarded(run: Callable[[], int], prefix: str = "", out: str | None = None) -> int:
    """Run a command body and turn what the user must act on into one line on stderr and an exit status.

    ``InputError`` and ``OSError`` (disk full, permission denied, read-only file system: the
    machine, not a bug) -> ``inrbench: error: <prefix><message>``, 2; running out of memory
    (``MemoryError``, a torch allocator error: sizes beyond the machine) -> ``inrbench: error:
    <prefix>out of memory: ...``, 3; ``--help`` or a usage error (``SystemExit``) -> its status;
    Ctrl-C -> 130 (said once in a data-parallel run: ``interrupt_said_elsewhere``); stdout's reader gone
    (``BrokenPipeError``: ``| head``) -> nothing printed, 141 (``stdout_gone``). Anything else is a bug: a
    traceback. ``out``: the command's ``--out``, named in an ``OSError`` line that names no file.
    """
    try:
        return int(run() or 0)
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else 2
    except InputError as e:
        print(f"inrbench: error: {prefix}{one_line(str(e))}", file=sys.stderr)
        return 2
    except BrokenPipeError as e:
        if stdout_closed():
            return stdout_gone()
        print(f"inrbench: error: {prefix}{one_line(_os_error_line(e, out))}", file=sys.stderr)  # another pipe
        return 2
    except OSError as e:
        print(f"inrbench: error: {prefix}{one_line(_os_error_line(e, out))}", file=sys.stderr)
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


def _os_error_line(e: OSError, out: str | None) -> str:
    """``os_error_message``, naming the command's ``--out`` where the error itself names no file (a write
    that hit a full disk). A folder that cannot hold ``--out`` is named by ``bench.outputs.output_lock``."""
    if out and e.filename is None:
        return f"--out {out}: {os_error_message(e)}"
    return os_error_message(e)


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
