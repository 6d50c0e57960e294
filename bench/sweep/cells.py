"""Cell kinds: one typed, frozen config per ``inrbench`` subcommand, and how it becomes an argv.

Every cell runs ``python -m bench <argv>`` in its own folder ``OUT/cells/<id>/``. Fields that
name another cell (``data``, ``store``, ``stores``) are *references*: they resolve to that
cell's output path and make it a dependency. A kind declares its output with ``output``.

``bench`` and ``encode`` cells are ``DistributedCell``s: ``nproc`` processes per node on
``nnodes`` nodes. Their ``process_argv`` is then the torchrun line (``bench.dist.torchrun_command``)
instead of ``python -m bench``; nothing else about them changes. A cell on more than one node
cannot be started by the sweep (one process on one node): ``elsewhere`` says so, with the line to
run on every node.
"""

from __future__ import annotations

import dataclasses
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Protocol

from bench.argtypes import SEED_MAX


@dataclass(frozen=True)
class Rendezvous:
    """Where the nodes of multi-node cells meet (``inrbench sweep --rdzv-endpoint/--rdzv-id``).

    Not part of any cell's identity: where the nodes meet does not change what they measure.
    """

    endpoint: str | None = None  # HOST:PORT of one node every node reaches (c10d)
    id: str = "inrbench"  # a cell's rendezvous id is ``<id>-<cell id>``


class Context(Protocol):
    """What a cell needs from the runner to build its argv."""

    data_root: Path | None
    rendezvous: Rendezvous

    def cell_dir(self, cell_id: str) -> Path: ...

    def shared_dir(self, name: str) -> Path:
        """A folder shared by cells of one sweep (``OUT/shared/<name>``), e.g. a fit cache."""
        ...

    def output(self, cell_id: str) -> Path: ...


def store_stem(name: str) -> str:
    """File stem of an encode cell's store: its name with dots replaced (``compare`` names a
    variant by the file name up to the first dot, so ``ds-lr-0.001`` becomes ``ds-lr-0_001``)."""
    return name.replace(".", "_")


def check_name(name: str) -> None:
    """A cell's ``name`` is a file or folder name inside the cell's folder: one plain path component
    (a ``/``, ``..`` or an absolute name would place the output outside the sweep folder)."""
    if name and (name in (".", "..") or "/" in name or "\0" in name):
        raise ValueError(f"name {name!r} must be a plain file name (no '/', not '.' or '..'): "
                         "it names the cell's output inside its folder")


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


# encode's resumable work folder beside its store (inr.encode.WORK_SUFFIX; not imported: that imports torch)
ENCODE_WORK_SUFFIX = ".work"
# meta-init's, hidden beside its init file: ".<name>" + this (inr.meta_work.work_path; not imported either)
META_INIT_WORK_SUFFIX = ".inrbench-meta-init.work"
# prepare's, hidden beside its output folder: ".<name>" + this (bench.datasets.resume.work_path)
PREPARE_WORK_SUFFIX = ".inrbench-prepare.work"
# where bench and command cells write inside their folder (bench.sweep.layout.cell_rows reads both)
RESULTS_SUBDIR = "results"
OUT_SUBDIR = "out"


def extra_argv(args: tuple[tuple[str, Any], ...]) -> list[str]:
    """``(("jpeg_qualities", [10, 50]), ("fast", True))`` -> ``--jpeg-qualities 10 50 --fast``."""
    out: list[str] = []
    for name, val in args:
        if val is None or val is False:
            continue
        out.append(_flag(name))
        if val is True:
            continue
        if isinstance(val, (list, tuple)):
            out.extend(str(v) for v in val)
        else:
            out.append(str(val))
    return out


def _opt(argv: list[str], name: str, val: Any) -> None:
    if val is None:
        return
    argv.append(_flag(name))
    if isinstance(val, (list, tuple)):
        argv.extend(str(v) for v in val)
    else:
        argv.append(str(val))


@dataclass(frozen=True)
class Cell:
    """Fields every cell has.

    id: unique, ``[A-Za-z0-9._-]+`` (it is the cell's folder name).
    needs: extra dependencies beyond the reference fields.
    args: extra ``--flag value`` pairs passed through verbatim (``True`` -> bare flag).
    timeout_s: the cell is killed and recorded as an error after this many seconds.
    """

    kind: ClassVar[str] = ""
    REF_FIELDS: ClassVar[tuple[str, ...]] = ()

    id: str
    needs: tuple[str, ...] = ()
    args: tuple[tuple[str, Any], ...] = ()
    timeout_s: float | None = None

    def refs(self) -> tuple[str, ...]:
        """Cell ids this one reads from (reference fields), in field order."""
        out: list[str] = []
        for name in self.REF_FIELDS:
            val = getattr(self, name)
            if val is None:
                continue
            out.extend(val if isinstance(val, tuple) else (val,))
        return tuple(out)

    def deps(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys((*self.refs(), *self.needs)))

    def output(self, ctx: Context) -> Path:
        """The path a reference to this cell resolves to (default: its folder)."""
        return ctx.cell_dir(self.id)

    def argv(self, ctx: Context) -> list[str]:
        """Arguments after ``python -m bench`` (or after ``python`` for ``python`` cells)."""
        raise NotImplementedError

    def process_argv(self, ctx: Context) -> list[str]:
        """The full argv the runner starts: ``python -m bench <argv>``."""
        return [sys.executable, "-m", "bench", *self.argv(ctx)]

    def elsewhere(self, ctx: Context) -> str | None:
        """Why this process cannot run the cell itself (it must be started elsewhere), or ``None``."""
        return None

    def resume_state(self, ctx: Context) -> tuple[Path, ...]:
        """What an interrupted run of this very cell left in its folder to resume from: kept when the
        same cell (same argv, inputs and code) runs again, while the rest of the folder is cleared."""
        return ()

    def identity(self) -> dict[str, Any]:
        """The fields that make the cell's config hash (``to_dict`` unless a kind says otherwise)."""
        return self.to_dict()

    def labels(self) -> dict[str, str]:
        """``pipeline``/``dataset``/``mode`` for this cell's status row (empty when not applicable)."""
        return {"pipeline": "", "dataset": "", "mode": ""}

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["args"] = [list(a) for a in self.args]
        return {"kind": self.kind, **d}


@dataclass(frozen=True)
class PrepareCell(Cell):
    """``inrbench prepare SOURCE [--root DATA_ROOT/root] --out CELL/name``.

    name: the prepared folder's name (the ``dataset`` label in every result row).
    root: relative paths are taken under ``--data-root``. An interrupted cell resumes the decode of
    image files from the command's work folder (``resume_state``: ``CELL/.name.inrbench-prepare.work``).
    """

    kind: ClassVar[str] = "prepare"

    source: str = ""
    name: str = ""
    root: str | None = None
    size: int | None = None
    limit: int | None = None
    jpeg_quality: int | None = None

    def __post_init__(self) -> None:
        check_name(self.name)

    def output(self, ctx: Context) -> Path:
        return ctx.cell_dir(self.id) / (self.name or self.id)

    def argv(self, ctx: Context) -> list[str]:
        argv = ["prepare", self.source]
        if self.root is not None:
            root = Path(self.root)
            if not root.is_absolute() and ctx.data_root is not None:
                root = ctx.data_root / root
            argv += ["--root", str(root)]
        argv += ["--out", str(self.output(ctx))]
        _opt(argv, "size", self.size)
        _opt(argv, "limit", self.limit)
        _opt(argv, "jpeg_quality", self.jpeg_quality)
        return argv + extra_argv(self.args)

    def resume_state(self, ctx: Context) -> tuple[Path, ...]:
        out = self.output(ctx)  # prepare's decoded chunks (bench.datasets.resume.work_path)
        return (out.with_name(f".{out.name}{PREPARE_WORK_SUFFIX}"),)

    def labels(self) -> dict[str, str]:
        return {"pipeline": "", "dataset": self.name or self.id, "mode": "prepare"}


@dataclass(frozen=True)
class DistributedCell(Cell):
    """A cell that can run data-parallel under torchrun.

    nproc: processes per node (one per GPU; default 1: a plain ``python -m bench`` process).
    nnodes: nodes (default 1). More than one needs the sweep's ``Rendezvous`` endpoint, and the
      sweep does not start such a cell: the same line is run on every node (``elsewhere``).

    Identity (``WORLD_IN_IDENTITY``, per kind): where the world size changes the result, both are
    part of the cell's hash (``bench``: each rank's share of the data, the global batch of
    ``nproc x nnodes x batch_size``, the timings); where it does not, neither is (``encode``: the
    store is the one one process writes, only faster). At their default (1) they are left out of
    the hash, so single-process cells keep the hash they had before these fields existed.
    """

    LAUNCH_FIELDS: ClassVar[tuple[str, ...]] = ("nproc", "nnodes")
    WORLD_IN_IDENTITY: ClassVar[bool] = True

    nproc: int = 1
    nnodes: int = 1

    def __post_init__(self) -> None:
        for name in self.LAUNCH_FIELDS:
            val = getattr(self, name)
            if isinstance(val, bool) or not isinstance(val, int) or val < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {val!r}")

    @property
    def world_size(self) -> int:
        return self.nproc * self.nnodes

    def process_argv(self, ctx: Context) -> list[str]:
        """``python -m bench <argv>`` for one process, else the torchrun line (``--standalone`` on one node)."""
        if self.world_size == 1:
            return super().process_argv(ctx)
        from bench import dist

        if self.nnodes == 1:
            return dist.torchrun_command(self.argv(ctx), self.nproc)
        # one rendezvous per cell: a node still in one cell's job never meets the next cell's
        return dist.torchrun_command(self.argv(ctx), self.nproc, self.nnodes, ctx.rendezvous.endpoint,
                                     f"{ctx.rendezvous.id}-{self.id}")

    def elsewhere(self, ctx: Context) -> str | None:
        if self.nnodes == 1:
            return None
        return (f"runs on {self.nnodes} nodes x {self.nproc} processes: the sweep does not start it; "
                f"run on every node: {shell_line(self.process_argv(ctx))}")

    def identity(self) -> dict[str, Any]:
        d = self.to_dict()
        for name in self.LAUNCH_FIELDS:
            if d[name] == 1 or not self.WORLD_IN_IDENTITY:
                del d[name]
        return d


def shell_line(cmd: list[str]) -> str:
    """A runner argv as the line a user types: ``inrbench ...`` or ``torchrun ...``."""
    from bench import dist

    if cmd[1:3] == ["-m", "bench"]:
        return shlex.join(["inrbench", *cmd[3:]])
    return dist.shell_line(cmd)


@dataclass(frozen=True)
class EncodeCell(DistributedCell):
    """``inrbench encode DATA --preset P [--iterations ...] [--prune ...] [--bits ...] --out CELL/name.inr``.

    data: a prepare cell. name: the variant label (``fp32``, ``pruned-8bit``...): the store's file name.
    prune: ``--prune`` fraction (e.g. ``0.15``); bits: ``--bits`` verbatim (``"8"``, ``"16:8:16"``, ``"16,8,8,8,8,16"``).
    fit_cache: share float32 fits between variants of the same images and fit config
      (``--fit-cache OUT/shared/fit-cache``): one fit, then each variant prunes/quantizes.
    """

    kind: ClassVar[str] = "encode"
    REF_FIELDS: ClassVar[tuple[str, ...]] = ("data", "init")

    data: str = ""
    name: str = ""
    preset: str | None = None
    iterations: int | None = None
    layers: int | None = None
    hidden: int | None = None
    w0: float | None = None
    lr: float | None = None
    prune: float | None = None
    bits: str | None = None
    device: str | None = None
    fit_cache: bool = False
    init: str | None = None  # a meta-init cell: --init its file (learned initialization)

    FIT_CACHE: ClassVar[str] = "fit-cache"
    # every shard's bytes depend only on its images and the configuration: the store of N processes is
    # the one 1 process writes (``inr.encode.encode_split_distributed``), so N is not in the hash
    WORLD_IN_IDENTITY: ClassVar[bool] = False

    def __post_init__(self) -> None:
        super().__post_init__()
        check_name(self.name)

    def output(self, ctx: Context) -> Path:
        return ctx.cell_dir(self.id) / f"{store_stem(self.name or self.id)}.inr"

    def argv(self, ctx: Context) -> list[str]:
        argv = ["encode", str(ctx.output(self.data))]
        for f in ("preset", "iterations", "layers", "hidden", "w0", "lr", "prune", "bits", "device"):
            _opt(argv, f, getattr(self, f))
        if self.fit_cache:
            argv += ["--fit-cache", str(ctx.shared_dir(self.FIT_CACHE))]
        if self.init:
            argv += ["--init", str(ctx.output(self.init))]
        argv += ["--out", str(self.output(ctx))]
        return argv + extra_argv(self.args)

    def resume_state(self, ctx: Context) -> tuple[Path, ...]:
        out = self.output(ctx)  # encode's finished shards (inr.encode: OUT + WORK_SUFFIX)
        return (out.with_name(out.name + ENCODE_WORK_SUFFIX),)

    def labels(self) -> dict[str, str]:
        return {"pipeline": "inr", "dataset": "", "mode": "encode"}


@dataclass(frozen=True)
class MetaInitCell(Cell):
    """``inrbench meta-init DATA --preset P [--outer-steps N] [--images N] [--candidates K] --out CELL/init.pt``
    (a learned initialization from DATA's train split; encode cells name it with ``init``; ``candidates``:
    train K Reptile seeds and keep the one that saves most on train images set aside). An interrupted
    cell resumes from the command's checkpoints (``resume_state``: ``CELL/.init.pt.inrbench-meta-init.work``)."""

    kind: ClassVar[str] = "meta-init"
    REF_FIELDS: ClassVar[tuple[str, ...]] = ("data",)

    data: str = ""
    preset: str | None = None
    outer_steps: int | None = None
    images: int | None = None
    candidates: int | None = None
    device: str | None = None

    def output(self, ctx: Context) -> Path:
        return ctx.cell_dir(self.id) / "init.pt"

    def argv(self, ctx: Context) -> list[str]:
        argv = ["meta-init", str(ctx.output(self.data))]
        for f in ("preset", "outer_steps", "images", "candidates", "device"):
            _opt(argv, f, getattr(self, f))
        return argv + ["--out", str(self.output(ctx))] + extra_argv(self.args)

    def resume_state(self, ctx: Context) -> tuple[Path, ...]:
        out = self.output(ctx)  # meta-init's checkpoints (inr.meta_work.work_path)
        return (out.with_name(f".{out.name}{META_INIT_WORK_SUFFIX}"),)

    def labels(self) -> dict[str, str]:
        return {"pipeline": "inr", "dataset": "", "mode": "meta-init"}


@dataclass(frozen=True)
class CompareCell(Cell):
    """``inrbench compare DATA --store S1 S2 ... [--jpeg-qualities ...] --out CELL``."""

    kind: ClassVar[str] = "compare"
    REF_FIELDS: ClassVar[tuple[str, ...]] = ("data", "stores")

    data: str = ""
    stores: tuple[str, ...] = ()
    jpeg_qualities: tuple[int, ...] | None = None

    def output(self, ctx: Context) -> Path:
        # compare replaces its --out folder atomically: keep it apart from the cell's logs
        return ctx.cell_dir(self.id) / "compare"

    def argv(self, ctx: Context) -> list[str]:
        argv = ["compare", str(ctx.output(self.data))]
        if self.stores:
            argv += ["--store", *(str(ctx.output(s)) for s in self.stores)]
        _opt(argv, "jpeg_qualities", self.jpeg_qualities)
        argv += ["--out", str(self.output(ctx))]
        return argv + extra_argv(self.args)

    def labels(self) -> dict[str, str]:
        return {"pipeline": "", "dataset": "", "mode": "compare"}


@dataclass(frozen=True)
class BenchCell(DistributedCell):
    """``inrbench bench --pipeline P --data DATA [--store S] --mode M ... --out CELL/results``.

    seed: ``--seed`` (shuffling, augmentation and model init; bench's default when unset). Train
      cells at several seeds sample the training's randomness: the report's accuracy over seeds
      pairs pipelines by seed (at seed k every pipeline trains from the same initial weights and,
      DALI aside, the same data order). Left out of the hash when unset.
    """

    kind: ClassVar[str] = "bench"
    REF_FIELDS: ClassVar[tuple[str, ...]] = ("data", "store")
    MODES: ClassVar[tuple[str, ...]] = ("loader", "replay", "train")

    pipeline: str = ""
    data: str = ""
    store: str | None = None
    mode: str = "loader"
    epochs: int | None = None
    warmup: int | None = None
    repeats: int | None = None
    batch_size: int | None = None
    workers: int | None = None
    device: str | None = None
    backbone: str | None = None
    seed: int | None = None

    def output(self, ctx: Context) -> Path:
        # a results folder of its own: the cell folder also holds the runner's logs
        return ctx.cell_dir(self.id) / RESULTS_SUBDIR

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.mode not in self.MODES:
            raise ValueError(f"mode must be one of {'|'.join(self.MODES)}, got {self.mode!r}")
        if self.seed is not None and not 0 <= self.seed <= SEED_MAX:
            raise ValueError(f"seed must be an integer in 0..{SEED_MAX}, got {self.seed}")

    def argv(self, ctx: Context) -> list[str]:
        argv = ["bench", "--pipeline", self.pipeline, "--data", str(ctx.output(self.data))]
        if self.store is not None:
            argv += ["--store", str(ctx.output(self.store))]
        argv += ["--mode", self.mode]
        for f in ("epochs", "warmup", "repeats", "batch_size", "workers", "device", "backbone", "seed"):
            _opt(argv, f, getattr(self, f))
        argv += ["--out", str(self.output(ctx))]
        return argv + extra_argv(self.args)

    def identity(self) -> dict[str, Any]:
        d = super().identity()
        if d["seed"] is None:  # left out at its default: cells without one keep the hash they had
            del d["seed"]
        return d

    def labels(self) -> dict[str, str]:
        return {"pipeline": self.pipeline, "dataset": "", "mode": self.mode}


@dataclass(frozen=True)
class CommandCell(Cell):
    """Any other ``inrbench`` subcommand, ``command`` given verbatim (``{out}`` -> ``CELL/out``)."""

    kind: ClassVar[str] = "inrbench"

    command: tuple[str, ...] = ()

    def output(self, ctx: Context) -> Path:
        # a fresh path inside the cell folder (which holds the runner's logs): commands claim it
        return ctx.cell_dir(self.id) / OUT_SUBDIR

    def argv(self, ctx: Context) -> list[str]:
        out = str(self.output(ctx))
        return [a.replace("{out}", out) for a in self.command] + extra_argv(self.args)


@dataclass(frozen=True)
class PythonCell(Cell):
    """``python COMMAND...`` run in the cell folder: fake cells for tests and small helpers."""

    kind: ClassVar[str] = "python"

    command: tuple[str, ...] = ()

    def argv(self, ctx: Context) -> list[str]:
        return list(self.command) + extra_argv(self.args)

    def process_argv(self, ctx: Context) -> list[str]:
        return [sys.executable, *self.argv(ctx)]


KINDS: dict[str, type[Cell]] = {
    c.kind: c for c in (PrepareCell, MetaInitCell, EncodeCell, CompareCell, BenchCell, CommandCell, PythonCell)
}
