"""Peak resident memory of this process, as the perf workers report it."""

from __future__ import annotations

from pathlib import Path


def peak_rss() -> int:
    """This process's peak resident bytes: ``VmHWM`` (Linux), else ``ru_maxrss``, which Linux keeps across
    ``execve`` (a worker would report at least its parent's peak)."""
    import resource
    import sys

    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    scale = 1 if sys.platform == "darwin" else 1024  # bytes on macOS, KiB elsewhere
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale
