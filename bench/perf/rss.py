"""Peak resident memory of this process, as the perf workers report it."""

from __future__ import annotations

from pathlib import Path


def peak_rss() -> int:
    """This process's peak resident bytes: ``VmHWM`` of ``/proc/self/status`` (Linux), else ``ru_maxrss``.

    Not ``ru_maxrss`` first: Linux keeps it across ``execve``, so a worker started by ``subprocess``
    (vfork + exec) reports at least its parent's peak (e.g. the parent that generated a benchmark's inputs).
    """
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
