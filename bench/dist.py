"""Data-parallel runs on ``torch.distributed``: torchrun's environment -> ``World``; ``--nproc`` -> torchrun.

inr-bench has no launcher of its own. A distributed run is ``torchrun`` starting one process
per device, each running the same ``inrbench`` command; ``init`` reads the environment torchrun
sets (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``/``PORT``)
and joins the process group: NCCL when the rank's device is CUDA, gloo on CPUs. Outside torchrun
(no ``WORLD_SIZE``) a run is the single process ``World()`` and nothing is initialized.

``--nproc N`` on ``bench`` / ``encode`` is a shortcut that builds the torchrun command
(``torchrun_command``) and runs it (``launch``): single node, ``--standalone`` rendezvous.
For a cluster, ``--nnodes M --rdzv-endpoint HOST:PORT`` builds the line to run on every node
(``torchrun --nnodes M --nproc-per-node N --rdzv-backend c10d --rdzv-endpoint HOST:PORT
--rdzv-id ID -m bench ...``); ``inrbench sweep ... --list`` prints it.

Device per rank: ``--device cuda`` means ``cuda:LOCAL_RANK`` on every rank; an explicit
``cuda:N`` is refused under more than one process (two ranks on one device measure nothing
useful). CPU ranks share the node's cores: torchrun sets ``OMP_NUM_THREADS=1`` per process
unless it is already set.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench.argtypes import positive_float, positive_int
from bench.errors import (
    EXIT_INTERRUPTED,
    STATUS_DIR_ENV,
    InputError,
    guarded,
)

# Seconds a collective may wait for a rank before the group gives up (a dead rank must not hang
# the others forever; the slowest legitimate wait is a rank still encoding its last shard).
DEFAULT_TIMEOUT_S = 1800.0
LAUNCH_OPTIONS = ("--nproc", "--nnodes", "--rdzv-endpoint", "--rdzv-id")  # --dist-timeout reaches the ranks
# The most meaningful status first when ranks disagree: bad input, out of memory, crash.
_STATUS_PRIORITY = (2, 3, 1)


@dataclass(frozen=True)
class World:
    """This process's place in the run. ``World()`` is the single-process run."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    backend: str | None = None  # gloo | nccl once the group is initialized; None for one process

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

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "nnodes": self.nnodes}


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
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
    """The device of this rank: ``cuda`` -> ``cuda:LOCAL_RANK``; CPU stays CPU; ``cuda:N`` refused under >1 rank."""
    if not world.distributed or not device.startswith("cuda"):
        return device
    if device != "cuda":
        raise InputError(f"--device {device}: under {world.world_size} processes every rank takes its own GPU "
                         "(cuda:LOCAL_RANK); pass --device cuda")
    return f"cuda:{world.local_rank}"


SAID_BY_LOCAL_RANK_0_WAIT_S = 30.0


@contextlib.contextmanager
def said_once_per_node(world: World, wait_s: float = SAID_BY_LOCAL_RANK_0_WAIT_S):
    """Around a rank's checks before it joins the group: an ``InputError`` raised inside is the same on every rank
    of a node (the same options, the same files), so local rank 0 prints its one line and exits 2, and the node's
    other ranks say nothing: they wait for torchrun, which stops every rank once one has failed. A rank that
    exited first would have torchrun stop local rank 0 before it printed. A rank still running after ``wait_s``
    (its local rank 0 did not fail: the files differ) prints its own line."""
    try:
        yield
    except InputError:
        if world.distributed and world.local_rank != 0:
            import time

            time.sleep(wait_s)
        raise


def init(device: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> World:
    """Join the process group torchrun set up (NCCL for CUDA, gloo otherwise); the ``World`` with its backend.

    A no-op returning ``World()`` outside torchrun; idempotent inside it.
    """
    import datetime

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
    backend = "nccl" if cuda else "gloo"
    if not dist.is_initialized():
        kw: dict[str, Any] = {"timeout": datetime.timedelta(seconds=timeout_s)}
        if cuda:
            kw["device_id"] = torch.device("cuda", world.local_rank)
        dist.init_process_group(backend, **kw)
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


def run_rank(body: Callable[[], int]) -> int:
    """Run one rank's command ``body`` (``bench.errors.guarded``: its InputError is one line, exit 2) and end the rank.

    When this call joined no group before ``body`` ran (the usual case: ``body`` joins and leaves it),
    the rank leaves the group, flushes its output, records its status for ``launch`` and ends with
    ``os._exit``: a gloo rank was seen to abort now and then in the interpreter's teardown after a
    clean ``destroy_process_group`` (``terminate called without an active exception``, no Python
    frame), turning a finished run into a failed one. Every file a command writes is closed (and its
    atomic writes fsynced) before ``body`` returns. A caller that joined the group itself (an
    in-process driver, a test) gets the status back instead.

    Ctrl-C (torchrun passes its SIGINT on to every rank): 130, and ``inrbench: interrupted`` from rank 0
    of the user's own torchrun only; under ``launch`` the launcher says it (``guarded``,
    ``interrupt_said_elsewhere``).
    """
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
    """Leave this rank's exit status for ``launch`` (``rank<R>`` in ``STATUS_DIR_ENV``'s folder; nothing
    outside ``launch``). A rank records it once it has said why it ends (its one line, its traceback,
    or rank 0's summary), so ``torchrun_quiet`` adds no line of its own for it."""
    status_dir = os.environ.get(STATUS_DIR_ENV)
    if status_dir:
        with contextlib.suppress(OSError):
            (Path(status_dir) / f"rank{from_env().rank}").write_text(str(rc))


def recorded_statuses(status_dir: str | Path | None) -> dict[int, int]:
    """rank -> the exit status it recorded (``record_status``); ranks killed before they could: absent."""
    got: dict[int, int] = {}
    if not status_dir:
        return got
    for f in Path(status_dir).glob("rank*"):
        with contextlib.suppress(OSError, ValueError):
            got[int(f.name[len("rank"):])] = int(f.read_text().strip())
    return got


def launch_status(status_dir: str | Path, torchrun_rc: int) -> int:
    """The exit status of a launch: 0 when torchrun succeeded, else the ranks' most meaningful
    recorded status (2 bad input, 3 out of memory, 1 crash), else torchrun's (a rank killed)."""
    if torchrun_rc == 0:
        return 0
    got = set(recorded_statuses(status_dir).values())
    for code in _STATUS_PRIORITY:
        if code in got:
            return code
    return torchrun_rc


def barrier() -> None:
    if active():
        import torch.distributed as dist

        dist.barrier()


# ----------------------------------------------------------------------------- launching

def torchrun_command(inrbench_args: list[str], nproc: int, nnodes: int = 1, rdzv_endpoint: str | None = None,
                     rdzv_id: str = "inrbench") -> list[str]:
    """The torchrun command running ``inrbench <inrbench_args>`` on ``nproc`` processes per node.

    One node: ``--standalone`` (a local rendezvous on a free port). Several: the c10d rendezvous
    at ``rdzv_endpoint`` (``HOST:PORT`` of one node every node reaches), the same line on each node.
    """
    if nproc < 1 or nnodes < 1:
        raise InputError(f"--nproc and --nnodes must be >= 1, got {nproc}, {nnodes}")
    cmd = [sys.executable, "-m", "torch.distributed.run"]
    if nnodes == 1 and rdzv_endpoint is None:
        cmd += ["--standalone", "--nnodes", "1"]
    else:
        if not rdzv_endpoint:
            raise InputError(f"--nnodes {nnodes}: a multi-node run needs --rdzv-endpoint HOST:PORT "
                             "(a node every node can reach)")
        cmd += ["--nnodes", str(nnodes), "--rdzv-backend", "c10d", "--rdzv-endpoint", rdzv_endpoint,
                "--rdzv-id", rdzv_id]
    return [*cmd, "--nproc-per-node", str(nproc), "-m", "bench", *inrbench_args]


def shell_line(cmd: list[str]) -> str:
    """``cmd`` as one copy-pasteable shell line, ``torchrun`` spelled as users type it."""
    if cmd[1:3] == ["-m", "torch.distributed.run"]:
        cmd = ["torchrun", *cmd[3:]]
    return shlex.join(cmd)


def strip_launch_options(argv: list[str]) -> list[str]:
    """``argv`` without the launch options (``--nproc N``, ``--nnodes=M``, ...): what each rank runs."""
    out: list[str] = []
    skip = False
    for a in argv:
        if skip:
            skip = False
            continue
        name = a.split("=", 1)[0]
        if name in LAUNCH_OPTIONS:
            skip = "=" not in a
            continue
        out.append(a)
    return out


def add_launch_arguments(p: Any, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
    """``--nproc``/``--nnodes``/``--rdzv-endpoint``/``--rdzv-id``/``--dist-timeout`` on a command's parser.

    ``timeout_s``: the command's default ``--dist-timeout`` (encode's ranks legitimately wait for a
    peer's last shard, which can take hours at the paper's 5,000 iterations)."""
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
    """Whether this invocation should relaunch itself under torchrun (``--nproc``/``--nnodes`` > 1, not yet inside)."""
    return (getattr(args, "nproc", 1) > 1 or getattr(args, "nnodes", 1) > 1) and from_env().world_size == 1 \
        and "TORCHELASTIC_RUN_ID" not in os.environ


def launch(args: Any, command: str, argv: list[str] | None = None) -> int:
    """Run ``inrbench <command> <argv minus launch options>`` under torchrun; the ranks' exit status
    (``launch_status``: 2 when a rank refused its input, as one process would exit).

    ``argv`` defaults to the command line ``bench.cli.main`` parsed (``args._argv``) after the subcommand.
    """
    return launch_ranks(args, command, argv)[0]


def launch_ranks(args: Any, command: str, argv: list[str] | None = None) -> tuple[int, dict[int, int]]:
    """``launch``, and the statuses the ranks recorded (``recorded_statuses``): a rank absent there
    ended before it said why (killed, or stopped by torchrun), so its caller may say it instead."""
    if argv is None:
        raw = list(getattr(args, "_argv", None) or sys.argv[1:])
        argv = raw[raw.index(command) + 1:] if command in raw else raw
    rest = strip_launch_options(argv)
    cmd = torchrun_command([command, *rest], args.nproc, args.nnodes, args.rdzv_endpoint, args.rdzv_id)
    print(f"inrbench: launching {shell_line(cmd)}", file=sys.stderr, flush=True)
    # run through ``torchrun_quiet`` (this module as a program): the same torchrun, without its
    # multi-screen ChildFailedError report after a rank's own one-line error
    quiet = [cmd[0], "-m", "bench.dist", *cmd[3:]]
    with tempfile.TemporaryDirectory(prefix="inrbench-ranks-") as status_dir:
        proc = subprocess.Popen(quiet, env={**os.environ, STATUS_DIR_ENV: status_dir})
        try:
            rc = proc.wait()
        except KeyboardInterrupt:
            _stop_launch(proc)
            raise
        if rc == EXIT_INTERRUPTED:  # torchrun itself was interrupted (``kill -INT`` of it alone)
            raise KeyboardInterrupt
        return launch_status(status_dir, rc), recorded_statuses(status_dir)


def _stop_launch(proc: subprocess.Popen) -> None:
    """Ctrl-C during ``launch``: the terminal's SIGINT reached torchrun too (one process group), and it
    stops the ranks (SIGINT, SIGKILL after 30 s); wait for that, so that no rank outlives the command
    (the ranks run in sessions of their own). Where torchrun did not get it (``kill -INT`` of this
    process alone) it gets it now; another Ctrl-C meanwhile stops it harder (SIGTERM, then SIGKILL)."""
    import signal

    for sig, wait_s in ((None, 5.0), (signal.SIGINT, 60.0), (signal.SIGTERM, 10.0), (signal.SIGKILL, None)):
        try:
            if sig is not None:
                proc.send_signal(sig)
            proc.wait(wait_s)
            return
        except (subprocess.TimeoutExpired, KeyboardInterrupt):
            continue


def torchrun_quiet(argv: list[str]) -> int:
    """``torchrun <argv>`` (``torch.distributed.run``), its status; when ranks fail, one line instead of
    torchrun's report: nothing when every failed rank said why itself (it exited 2 after its one-line
    error, or recorded its status, ``record_status``, after its line, its traceback or rank 0's summary),
    else ``inrbench: error: torchrun: rank R exited with status S`` for the ranks that did not (killed,
    or stopped by torchrun before they could)."""
    import signal

    try:
        return _torchrun_quiet(argv)
    except KeyboardInterrupt:  # before torchrun's own handlers were installed (importing torch)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        return EXIT_INTERRUPTED


def _torchrun_quiet(argv: list[str]) -> int:
    import logging
    import signal

    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    # torchrun's own log lines (its OMP_NUM_THREADS banner, "failed (exitcode: 2) local_rank: ..."):
    # ``launch`` printed the command and the ranks print their errors; OMP_NUM_THREADS is documented.
    # (torch's elastic loggers each set their own level: every one of them, not only the parents)
    for name in ("torch.distributed.run", "torch.distributed.elastic",
                 *(n for n in list(logging.root.manager.loggerDict) if n.startswith("torch.distributed."))):
        logging.getLogger(name).setLevel(logging.CRITICAL)
    try:
        run(parse_args(argv))
    except SignalException as e:  # Ctrl-C (or a SIGTERM) reached torchrun: it has stopped the ranks
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        return 128 + int(e.sigval)  # the launcher says ``inrbench: interrupted`` (130)
    except ChildFailedError as e:
        said = recorded_statuses(os.environ.get(STATUS_DIR_ENV))
        codes = {int(r): f.exitcode for r, f in e.failures.items() if int(r) not in said}
        if any(c != 2 for c in codes.values()):
            def status(c: int) -> str:
                return f"signal {signal.Signals(-c).name}" if c < 0 and -c in signal.Signals._value2member_map_ \
                    else f"status {c}"

            print("inrbench: error: torchrun: " + "; ".join(f"rank {r} exited with {status(c)}"
                                                         for r, c in sorted(codes.items())), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":  # ``python -m bench.dist TORCHRUN_ARGS``: what ``launch`` runs
    sys.exit(torchrun_quiet(sys.argv[1:]))
