"""Errors the CLI turns into one line on stderr and exit code 2 (no traceback)."""

from __future__ import annotations

from pathlib import Path


class InputError(Exception):
    """Bad user input: a missing path, a wrong layout, a corrupt file.

    The message must name the file (when there is one) and what is wrong with it,
    on one line. ``bench.cli`` prints ``inrbench: error: <message>`` and exits 2.
    """

    def __init__(self, message: str, path: str | Path | None = None):
        self.path = None if path is None else Path(path)
        super().__init__(f"{path}: {message}" if path is not None else message)


EXIT_OUT_OF_MEMORY = 3  # the documented exit status of a command that ran out of (device or host) memory


def is_out_of_memory(e: BaseException) -> bool:
    """An allocation failure: ``MemoryError``, ``torch.OutOfMemoryError`` (CUDA), or torch's allocator
    error in other words (CPU: ``DefaultCPUAllocator: can't allocate memory``)."""
    import sys

    if isinstance(e, MemoryError):
        return True
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(e, getattr(torch, "OutOfMemoryError", ())):
        return True
    text = str(e).lower()
    return "out of memory" in text or "can't allocate memory" in text
