"""Start a cell's ``python -m bench`` by forking a server that has torch and the project imported: each cell is still
its own process (folder, environment, stdio, signals, exit code), only the imports are shared. The server forks only
while no thread and no CUDA context exist. Protocol (JSON lines): ``{"argv", "cwd", "env", "stdout", "stderr"}`` in;
``{"pid"}`` once the child runs, then ``{"rc"}`` out."""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from typing import Any

PRELOAD = ("numpy", "torch", "torchvision", "pandas", "scipy.stats", "PIL.Image", "bench.cli", "pipelines",
           "inr.store", "inr.encode", "bench.harness.runner", "bench.train.loop", "bench.report.build")
DISABLE_ENV = "INRBENCH_NO_FORKSERVER"  # set (to anything) to start every cell as a fresh interpreter


def die_with_parent() -> None:
    """SIGTERM this process when its parent dies (``PR_SET_PDEATHSIG``)."""
    with contextlib.suppress(OSError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _child(req: dict[str, Any]) -> None:  # pragma: no cover - runs in the forked child, ends in os._exit
    code = 1
    try:
        die_with_parent()
        signal.signal(signal.SIGINT, signal.default_int_handler)
        os.chdir(req["cwd"])
        for fd, path in ((1, req["stdout"]), (2, req["stderr"])):
            f = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
            os.dup2(f, fd)
            os.close(f)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        os.environ.clear()
        os.environ.update(req["env"])
        sys.path[0] = req["cwd"]  # what ``python -m`` puts first
        sys.argv = ["-m", *req["argv"]]
        import runpy

        try:
            runpy.run_module("bench", run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            if not isinstance(e.code, int | None):
                print(e.code, file=sys.stderr)
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        with contextlib.suppress(BaseException):
            import atexit

            atexit._run_exitfuncs()  # what an interpreter's exit runs (multiprocessing, tempfile, ...)
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(BaseException):
                stream.flush()
        os._exit(code)


def serve() -> None:  # pragma: no cover - the server process (tested through ForkServer)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the runner's and the cells' to handle
    die_with_parent()
    import importlib

    for name in PRELOAD:
        with contextlib.suppress(ImportError):
            importlib.import_module(name)
    out = sys.stdout

    def say(**kw: Any) -> None:
        out.write(json.dumps(kw) + "\n")
        out.flush()

    # safe to fork: no Python thread but this one and no CUDA context (what a DataLoader's workers rely on)
    torch = sys.modules.get("torch")
    ready = threading.active_count() == 1 and not (torch is not None and torch.cuda.is_initialized())
    say(ready=ready)
    if not ready:
        return
    for line in sys.stdin:
        req = json.loads(line)
        pid = os.fork()
        if pid == 0:
            _child(req)
        say(pid=pid)
        _, status = os.waitpid(pid, 0)
        say(rc=os.waitstatus_to_exitcode(status))


class ForkedCell:
    """The ``subprocess.Popen`` calls the runner makes, for a child of the server."""

    def __init__(self, server: ForkServer, pid: int):
        self.server, self.pid, self.returncode = server, pid, None

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            msg = self.server.read(timeout)
            self.returncode = int(msg["rc"]) if msg is not None else 1  # None: the server died
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class ForkServer:
    """One server per environment; ``start`` returns None when a cell should run as a subprocess."""

    def __init__(self, env: dict[str, str]):
        self.env = env
        self.buf = b""
        self.proc = subprocess.Popen([sys.executable, "-m", "bench.sweep.forkserver"], env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, preexec_fn=die_with_parent)
        hello = self.read(timeout=300)
        self.ok = bool(hello and hello.get("ready"))

    def read(self, timeout: float | None) -> dict[str, Any] | None:
        """The server's next message; None when it has gone; ``TimeoutExpired`` after ``timeout`` s."""
        end = None if timeout is None else time.monotonic() + timeout
        fd = self.proc.stdout.fileno()
        while b"\n" not in self.buf:
            left = None if end is None else max(0.0, end - time.monotonic())
            if not select.select([fd], [], [], left)[0]:
                raise subprocess.TimeoutExpired(self.proc.args, timeout)
            chunk = os.read(fd, 65536)
            if not chunk:
                self.ok = False
                return None
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return json.loads(line)

    def start(self, argv: list[str], cwd: str, stdout: str, stderr: str) -> ForkedCell | None:
        if not self.ok:
            return None
        req = {"argv": argv, "cwd": cwd, "env": self.env, "stdout": stdout, "stderr": stderr}
        try:
            self.proc.stdin.write((json.dumps(req) + "\n").encode())
            self.proc.stdin.flush()
            msg = self.read(timeout=60)
        except (OSError, subprocess.TimeoutExpired):
            msg = None
        if msg is None or "pid" not in msg:
            self.close()
            return None
        return ForkedCell(self, int(msg["pid"]))

    def close(self) -> None:
        self.ok = False
        with contextlib.suppress(OSError):
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


_SERVER: ForkServer | None = None


def server_for(env: dict[str, str]) -> ForkServer | None:
    """The server for ``env`` (started on first use), or None where forking is off or not possible here."""
    global _SERVER
    if env.get(DISABLE_ENV) or not hasattr(os, "fork"):
        return None
    if _SERVER is not None and _SERVER.env != env:
        _SERVER.close()
        _SERVER = None
    if _SERVER is None:
        _SERVER = ForkServer(env)
        import atexit

        atexit.register(_SERVER.close)
    return _SERVER if _SERVER.ok else None


def close() -> None:
    """Stop the running server, if any (the end of a sweep)."""
    global _SERVER
    if _SERVER is not None:
        _SERVER.close()
        _SERVER = None


if __name__ == "__main__":
    serve()
