"""Data-parallel runs on ``torch.distributed``: torchrun's environment -> ``World``; ``--nproc`` -> torchrun.
``init`` joins the group (NCCL on CUDA, gloo on CPUs); ``launch`` runs the torchrun line (docs/distributed.md)."""

from __future__ import annotations

import contextlib
import datetime
import logging
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.argtypes import positive_float, positive_int
from bench.errors import EXIT_INTERRUPTED, STATUS_DIR_ENV, InputError, guarded

# Seconds a collective may wait for a rank (a dead rank must not hang the others forever).
DEFAULT_TIMEOUT_S = 1800.0
LAUNCH_OPTIONS = ("--nproc", "--nnodes", "--rdzv-endpoint", "--rdzv-id")  # --dist-timeout reaches the ranks
_STATUS_PRIORITY = (2, 3, 1)  # when ranks disagree: bad input, out of memory, crash
SAID_BY_LOCAL_RANK_0_WAIT_S = 30.0


@dataclass(frozen=True)
class World:
    """This process's place in the run. ``World()`` is the single-process run."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    backend: str | None = None  # gloo | nccl once the group is initialized

    def __post_init__(self) -> None:
        if self.world_size < 1 or not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank {self.rank} is not in a world of {self.world_size}")
        if self.local_world_size < 1 or not 0 <= self.local_rank < self.local_world_size:
            raise ValueError(f"local rank {self.local_rank} is not in a node of {self.local_world_size}")

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @property
    def nnodes(self) -> int:
        return max(1, self.world_size // self.local_world_size)

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if not raw:
        return default
    try:
        return int(raw)
    except ValueError:
        raise InputError(f"environment variable {name}={raw!r} is not an integer (set by torchrun)") from None


def from_env() -> World:
    """The ``World`` torchrun describes in the environment (``World()`` outside torchrun)."""
    world_size = _env_int("WORLD_SIZE", 1)
    try:
        return World(rank=_env_int("RANK", 0), world_size=world_size, local_rank=_env_int("LOCAL_RANK", 0),
                     local_world_size=_env_int("LOCAL_WORLD_SIZE", world_size))
    except ValueError as e:
        raise InputError(f"inconsistent torchrun environment: {e}") from None


def rank_device(device: str, world: World) -> str:
    """This rank's device: ``cuda`` -> ``cuda:LOCAL_RANK``; CPU stays CPU; ``cuda:N`` refused under >1 rank."""
    if not world.distributed or not device.startswith("cuda"):
        return device
    if device != "cuda":
        raise InputError(f"--device {device}: under {world.world_size} processes every rank takes its own GPU "
                         "(cuda:LOCAL_RANK); pass --device cuda")
    return f"cuda:{world.local_rank}"


@contextlib.contextmanager
def said_once_per_node(world: World, wait_s: float = SAID_BY_LOCAL_RANK_0_WAIT_S):
    """Around a rank's checks before it joins the group: an ``InputError`` is the same on every rank of a
    node, so local rank 0 says it and the others wait (``wait_s``) for torchrun to stop them; one still
    running then (its files differ) says its own."""
    try:
        yield
    except InputError:
        if world.distributed and world.local_rank != 0:
            time.sleep(wait_s)
        raise


def init(device: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> World:
    """Join the process group torchrun set up (NCCL for CUDA, gloo otherwise): the ``World`` with its
    backend. ``World()`` outside torchrun; idempotent inside it."""
    world = from_env()
    if not world.distributed:
        return world
    import torch
    import torch.distributed as dist

    cuda = device.startswith("cuda")
    if cuda:
        if not torch.cuda.is_available():
            raise InputError(f"--device {device}: no CUDA device here (torch.cuda.is_available() is False)")
        if world.local_rank >= torch.cuda.device_count():
            raise InputError(f"local rank {world.local_rank} has no GPU: this node has {torch.cuda.device_count()} "
                             f"(--nproc-per-node must not exceed it)")
        torch.cuda.set_device(world.local_rank)
    if not dist.is_initialized():
        kw: dict[str, Any] = {"timeout": datetime.timedelta(seconds=timeout_s)}
        if cuda:
            kw["device_id"] = torch.device("cuda", world.local_rank)
        dist.init_process_group("nccl" if cuda else "gloo", **kw)
    return World(world.rank, world.world_size, world.local_rank, world.local_world_size, dist.get_backend())


def shutdown() -> None:
    """Leave the process group (if one was joined)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def active() -> bool:
    """Whether this process is in an initialized group of more than one process."""
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def all_gather_object(obj: Any) -> list[Any]:
    """``obj`` from every rank, in rank order (``[obj]`` for one process)."""
    if not active():
        return [obj]
    import torch.distributed as dist

    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def broadcast_object(obj: Any, src: int = 0) -> Any:
    """Rank ``src``'s ``obj`` on every rank (``obj`` itself for one process)."""
    if not active():
        return obj
    import torch.distributed as dist

    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def barrier() -> None:
    if active():
        import torch.distributed as dist

        dist.barrier()


def run_rank(body: Callable[[], int]) -> int:
    """Run one rank's command ``body`` under ``guarded`` and end the rank: leave the group, record the status,
    ``os._exit`` (gloo ranks aborted in teardown). A caller that joined the group itself gets the status."""
    import torch.distributed as tdist

    owner = not (tdist.is_available() and tdist.is_initialized())
    rc = guarded(body)
    if not owner:
        return rc
    shutdown()
    record_status(rc)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc)


def record_status(rc: int) -> None:
    """Leave this rank's exit status for ``launch`` (``rank<R>`` in ``STATUS_DIR_ENV``'s folder), once it
    has said why it ends: ``torchrun_quiet`` then adds no line for it."""
    status_dir = os.environ.get(STATUS_DIR_ENV)
    if status_dir:
        with contextlib.suppress(OSError):
            (Path(status_dir) / f"rank{from_env().rank}").write_text(str(rc))


def recorded_statuses(status_dir: str | Path | None) -> dict[int, int]:
    """rank -> the exit status it recorded; ranks killed before they could: absent."""
    got: dict[int, int] = {}
    for f in Path(status_dir).glob("rank*") if status_dir else ():
        with contextlib.suppress(OSError, ValueError):
            got[int(f.name[len("rank"):])] = int(f.read_text().strip())
    return got


# ----------------------------------------------------------------------------- launching

def torchrun_command(inrbench_args: list[str], nproc: int, nnodes: int = 1, rdzv_endpoint: str | None = None,
                     rdzv_id: str = "inrbench") -> list[str]:
    """The torchrun command running ``inrbench <inrbench_args>`` on ``nproc`` processes per node: one node
    ``--standalone``, several the c10d rendezvous at ``rdzv_endpoint`` (the same line on each node)."""
    if nproc < 1 or nnodes < 1:
        raise InputError(f"--nproc and --nnodes must be >= 1, got {nproc}, {nnodes}")
    cmd = [sys.executable, "-m", "torch.distributed.run"]
    if nnodes == 1 and rdzv_endpoint is None:
        cmd += ["--standalone", "--nnodes", "1"]
    elif not rdzv_endpoint:
        raise InputError(f"--nnodes {nnodes}: a multi-node run needs --rdzv-endpoint HOST:PORT "
                         "(a node every node can reach)")
    else:
        cmd += ["--nnodes", str(nnodes), "--rdzv-backend", "c10d", "--rdzv-endpoint", rdzv_endpoint,
                "--rdzv-id", rdzv_id]
    return [*cmd, "--nproc-per-node", str(nproc), "-m", "bench", *inrbench_args]


def shell_line(cmd: list[str]) -> str:
    """``cmd`` as one copy-pasteable shell line, ``torchrun`` spelled as users type it."""
    if cmd[1:3] == ["-m", "torch.distributed.run"]:
        cmd = ["torchrun", *cmd[3:]]
    return shlex.join(cmd)


def add_launch_arguments(p: Any, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
    """``--nproc``/``--nnodes``/``--rdzv-endpoint``/``--rdzv-id``/``--dist-timeout`` on a command's parser;
    ``timeout_s``: the command's default ``--dist-timeout``."""
    g = p.add_argument_group("distributed (torchrun)")
    g.add_argument("--nproc", type=positive_int, default=1,
                   help="processes per node: relaunch this command under torchrun, one process per device "
                        "(default 1: this process). Or run the command under torchrun yourself")
    g.add_argument("--nnodes", type=positive_int, default=1, help="nodes (with --rdzv-endpoint; run the same line on every node)")
    g.add_argument("--rdzv-endpoint", help="HOST:PORT of the rendezvous for --nnodes > 1")
    g.add_argument("--rdzv-id", default="inrbench", help="rendezvous id shared by every node (default inrbench)")
    g.add_argument("--dist-timeout", type=positive_float, default=timeout_s,
                   help=f"seconds a rank waits for the others at a collective (default {timeout_s:g})")


def launch_requested(args: Any) -> bool:
    """Whether this invocation should relaunch itself under torchrun (``--nproc``/``--nnodes`` > 1, not inside)."""
    return (getattr(args, "nproc", 1) > 1 or getattr(args, "nnodes", 1) > 1) and from_env().world_size == 1 \
        and "TORCHELASTIC_RUN_ID" not in os.environ


def launch(args: Any, command: str, argv: list[str] | None = None) -> int:
    """Run ``inrbench <command> <argv minus launch options>`` under torchrun: the ranks' exit status."""
    return launch_ranks(args, command, argv)[0]


def launch_ranks(args: Any, command: str, argv: list[str] | None = None) -> tuple[int, dict[int, int]]:
    """``launch``, and the statuses the ranks recorded (a rank absent there ended before it said why).
    ``argv``: by default what ``bench.cli.main`` parsed (``args._argv``) after the subcommand."""
    if argv is None:
        raw = list(getattr(args, "_argv", None) or sys.argv[1:])
        argv = raw[raw.index(command) + 1:] if command in raw else raw
    ranks_argv, skip = [command], False  # argv without the launch options (--nproc N, --nnodes=M, ...)
    for a in argv:
        if skip:
            skip = False
        elif a.split("=", 1)[0] in LAUNCH_OPTIONS:
            skip = "=" not in a
        else:
            ranks_argv.append(a)
    cmd = torchrun_command(ranks_argv, args.nproc, args.nnodes, args.rdzv_endpoint, args.rdzv_id)
    print(f"inrbench: launching {shell_line(cmd)}", file=sys.stderr, flush=True)
    quiet = [cmd[0], "-m", "bench.dist", *cmd[3:]]  # torchrun without its report after a rank's own error line
    with tempfile.TemporaryDirectory(prefix="inrbench-ranks-") as status_dir:
        proc = subprocess.Popen(quiet, env={**os.environ, STATUS_DIR_ENV: status_dir})
        try:
            rc = proc.wait()
        except KeyboardInterrupt:  # torchrun got the terminal's SIGINT too: wait for it to stop the ranks, so
            # no rank outlives the command; SIGINT where it did not, harder signals on another Ctrl-C
            for sig, wait_s in ((None, 5.0), (signal.SIGINT, 60.0), (signal.SIGTERM, 10.0), (signal.SIGKILL, None)):
                try:
                    if sig is not None:
                        proc.send_signal(sig)
                    proc.wait(wait_s)
                    break
                except (subprocess.TimeoutExpired, KeyboardInterrupt):
                    continue
            raise
        if rc == EXIT_INTERRUPTED:  # torchrun itself was interrupted (``kill -INT`` of it alone)
            raise KeyboardInterrupt
        got = recorded_statuses(status_dir)  # failed: the ranks' most meaningful status, else torchrun's
        return (next((c for c in _STATUS_PRIORITY if c in got.values()), rc) if rc else 0), got


def torchrun_quiet(argv: list[str]) -> int:
    """``torchrun <argv>``: its status; when ranks fail, ``inrbench: error: torchrun: rank R exited with
    status S`` for the ranks that did not say why themselves, instead of torchrun's report."""
    try:
        from torch.distributed.elastic.multiprocessing.api import SignalException
        from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
        from torch.distributed.run import parse_args, run

        # torchrun's own log lines: ``launch`` printed the command and the ranks print their errors
        for name in ("torch.distributed.run", "torch.distributed.elastic",
                     *(n for n in list(logging.root.manager.loggerDict) if n.startswith("torch.distributed."))):
            logging.getLogger(name).setLevel(logging.CRITICAL)
        run(parse_args(argv))
    except KeyboardInterrupt:  # before torchrun's own handlers were installed (importing torch)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        return EXIT_INTERRUPTED
    except SignalException as e:  # Ctrl-C (or SIGTERM) reached torchrun: it has stopped the ranks
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        return 128 + int(e.sigval)
    except ChildFailedError as e:
        said = recorded_statuses(os.environ.get(STATUS_DIR_ENV))
        codes = {int(r): f.exitcode for r, f in e.failures.items() if int(r) not in said}
        if any(c != 2 for c in codes.values()):
            lines = [f"rank {r} exited with " + (f"signal {signal.Signals(-c).name}" if c < 0 and
                                                -c in signal.Signals._value2member_map_ else f"status {c}")
                    for r, c in sorted(codes.items())]
            print("inrbench: error: torchrun: " + "; ".join(lines), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":  # ``python -m bench.dist TORCHRUN_ARGS``: what ``launch`` runs
    sys.exit(torchrun_quiet(sys.argv[1:]))
