"""``bench.cli.main`` of several command lines in one child Python, for the tests that run the CLI in a
child so that a crash in a native library (DALI's SIGSEGV) fails the test instead of pytest: one
interpreter start (torch, DALI) for all of them instead of one each."""

from __future__ import annotations

import json
from pathlib import Path

# The child runs the command lines one after another, each with its own stdout and stderr files on
# fds 1 and 2 (a native library's own lines land in its command's file), and writes each one's exit
# code when it returns: the first without one is the command a child killed by a signal was running.
_CHILD = """
import json, os, sys
from pathlib import Path
from bench.cli import main
work = Path(sys.argv[1])
for i, argv in enumerate(json.loads((work / "argvs.json").read_text())):
    sys.stdout.flush(); sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    with open(work / f"{i}.out", "wb") as o, open(work / f"{i}.err", "wb") as e:
        os.dup2(o.fileno(), 1); os.dup2(e.fileno(), 2)
        try:
            code = main(argv)
        except SystemExit as x:
            code = x.code
        sys.stdout.flush(); sys.stderr.flush()
        os.dup2(saved[0], 1); os.dup2(saved[1], 2)
    (work / f"{i}.code").write_text(str(code))
"""


def run_children(argvs: list[list[str]], work: Path) -> list[tuple[int, str, str] | str]:
    """``bench.cli.main(argv)`` of each of ``argvs`` in one child Python, in turn: (exit code, stdout,
    stderr) each; a case whose child died of a signal is the failure text naming it, and the cases
    after it run in a new child."""
    import os
    import signal
    import subprocess
    import sys

    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    got: list[tuple[int, str, str] | str] = []
    while len(got) < len(argvs):
        rest = argvs[len(got):]
        w = work / f"child{len(got)}"
        w.mkdir()
        (w / "argvs.json").write_text(json.dumps(rest))
        p = subprocess.run([sys.executable, "-c", _CHILD, str(w)], capture_output=True, text=True, env=env,
                           timeout=300)
        for i in range(len(rest)):
            if not (w / f"{i}.code").exists():
                break
            got.append((int((w / f"{i}.code").read_text()), (w / f"{i}.out").read_text(),
                        (w / f"{i}.err").read_text()))
        else:
            continue
        why = (f"died of {signal.Signals(-p.returncode).name} (exit {128 - p.returncode})" if p.returncode < 0
               else f"exited {p.returncode} outside a case")
        err = (w / f"{i}.err").read_text() if (w / f"{i}.err").exists() else p.stderr
        got.append(f"the CLI {why}: {err.strip()[-500:]}")
    return got
