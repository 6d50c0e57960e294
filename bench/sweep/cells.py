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

import argparse
import dataclasses
import functools
import re
import shlex
import sys
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Protocol

from bench.argtypes import SEED_MAX
from bench.workdir import work_path


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


def check_name(name: str, what: str = "the cell's output inside its folder") -> None:
    """A cell's ``name`` is a file or folder name inside the cell's folder (a sweep's, its folder under
    ``runs/``): one plain path component (a ``/``, ``..`` or an absolute name would place the output
    outside the sweep folder). ``what``: what the name names, for the message."""
    if name and (name in (".", "..") or "/" in name or "\0" in name):
        raise ValueError(f"name {name!r} must be a plain file name (no '/', not '.' or '..'): it names {what}")


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


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

    id: unique, ``[A-Za-z0-9][A-Za-z0-9._-]*`` (it is the cell's folder name).
    needs: extra dependencies beyond the reference fields.
    args: extra ``--flag value`` pairs appended to the line (``True`` -> bare flag); on a kind with a
      ``COMMAND``, never one the kind sets itself (``check_args``).
    timeout_s: the cell is killed and recorded as an error after this many seconds.
    """

    kind: ClassVar[str] = ""
    REF_FIELDS: ClassVar[tuple[str, ...]] = ()
    # the ``inrbench`` subcommand this kind runs, whose options ``args`` may add to (``managed_dests``);
    # ``None``: a command written out in full (``inrbench``, ``python`` kinds), its args not checked
    COMMAND: ClassVar[str | None] = None
    # options the sweep manages without writing them on the cell's line (the ones it writes are read
    # off ``argv``): the sweep owns the cell's folder and clears it before a rerun, so a cell never
    # replaces an output itself
    SWEEP_FLAGS: ClassVar[tuple[str, ...]] = ("overwrite",)

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

    def check_options(self) -> None:
        """Refuse (``ValueError``), when the sweep is loaded, what the cell's command would refuse without
        reading a file: its line, parsed by the command's own parser (``command_parser``), then the
        command's own checks of the parsed options (``check_command``). Nothing for kinds without a
        ``COMMAND`` (their command is written out in full)."""
        if self.COMMAND is None:
            return
        import contextlib
        import io

        from bench.errors import InputError, one_line

        said = io.StringIO()
        try:
            with contextlib.redirect_stderr(said):
                ns = command_parser(self.COMMAND).parse_args(self.argv(_ProbeContext())[1:])
        except SystemExit:
            raise ValueError(one_line(said.getvalue()).removeprefix("inrbench: error: ")) from None
        try:
            self.check_command(ns)
        except InputError as e:
            raise ValueError(str(e)) from None

    def check_command(self, ns: argparse.Namespace) -> None:
        """The command's own checks (``InputError``) of the cell's parsed line, as the command runs them
        before its work, except what needs a file; a kind names them. The cell's inputs are other cells'
        outputs, which do not exist when the sweep is loaded: a check that reads them is left to the run."""

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
    COMMAND: ClassVar[str | None] = "prepare"

    source: str = ""
    name: str = ""
    root: str | None = None
    size: int | str | None = None  # a side in pixels, or "native" (prepare --size native)
    limit: int | None = None
    jpeg_quality: int | None = None

    def __post_init__(self) -> None:
        check_name(self.name)
        if isinstance(self.size, str) and self.size != "native":
            raise ValueError(f"size must be an integer or 'native', got {self.size!r}")

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

    def check_command(self, ns: argparse.Namespace) -> None:
        """``inrbench prepare``'s checks (``build_config``, then ``resolve`` against the source: a known
        source, ``root`` where it needs one, ...), except that the root is not read: ``--data-root`` is the
        sweep's, and the source's files are read when the cell runs."""
        from bench.commands.prepare import build_config
        from bench.datasets.prepare import resolve

        resolve(build_config(ns), read_root=False)

    def resume_state(self, ctx: Context) -> tuple[Path, ...]:
        return (work_path(self.output(ctx), "prepare"),)

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
    # the rendezvous of a multi-node cell comes from ``inrbench sweep --rdzv-endpoint/--rdzv-id``
    SWEEP_FLAGS: ClassVar[tuple[str, ...]] = (*Cell.SWEEP_FLAGS, "rdzv-endpoint", "rdzv-id")
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
    COMMAND: ClassVar[str | None] = "encode"
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

    def check_command(self, ns: argparse.Namespace) -> None:
        """The options ``inrbench encode`` would refuse on this cell's line (``bench.commands.encode.build_config``:
        a pruning option without pruning, QAT with float widths, ...), refused when the sweep is loaded
        instead of as an error cell hours into it. Reads no file (the init is checked when the cell runs)."""
        from bench.commands.encode import build_config

        ns.init = None  # the init file is another cell's output: it does not exist yet
        build_config(ns)

    def resume_state(self, ctx: Context) -> tuple[Path, ...]:
        return (work_path(self.output(ctx), "encode"),)

    def labels(self) -> dict[str, str]:
        return {"pipeline": "inr", "dataset": "", "mode": "encode"}


@dataclass(frozen=True)
class MetaInitCell(Cell):
    """``inrbench meta-init DATA --preset P [--outer-steps N] [--images N] [--candidates K] --out CELL/init.pt``
    (a learned initialization from DATA's train split; encode cells name it with ``init``; ``candidates``:
    train K Reptile seeds and keep the one that saves most on train images set aside). An interrupted
    cell resumes from the command's checkpoints (``resume_state``: ``CELL/.init.pt.inrbench-meta-init.work``)."""

    kind: ClassVar[str] = "meta-init"
    COMMAND: ClassVar[str | None] = "meta-init"
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

    def check_command(self, ns: argparse.Namespace) -> None:
        """``inrbench meta-init``'s checks of its options (``build_config``: the preset, the Reptile settings);
        the dataset (``--validation`` against its train images) is checked when the cell runs."""
        from bench.commands.meta_init import build_config

        build_config(ns)

    def resume_state(self, ctx: Context) -> tuple[Path, ...]:
        return (work_path(self.output(ctx), "meta-init"),)

    def labels(self) -> dict[str, str]:
        return {"pipeline": "inr", "dataset": "", "mode": "meta-init"}


@dataclass(frozen=True)
class CompareCell(Cell):
    """``inrbench compare DATA --store S1 S2 ... [--jpeg-qualities ...] --out CELL``."""

    kind: ClassVar[str] = "compare"
    COMMAND: ClassVar[str | None] = "compare"
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

    def check_command(self, ns: argparse.Namespace) -> None:
        """``inrbench compare``'s checks of its options (``build_config``: qualities, codecs, ...); the dataset
        and the stores are checked when the cell runs."""
        from bench.commands.compare import build_config

        build_config(ns)

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
    COMMAND: ClassVar[str | None] = "bench"
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

    def check_command(self, ns: argparse.Namespace) -> None:
        """``inrbench bench``'s checks (``build_config``) as far as they go without the dataset: a known
        pipeline, ``--store`` for a pipeline that reads one. ``build_config`` opens ``--data`` next (the
        prepared folder of an earlier cell, which does not exist yet): that and every check after it (the
        splits, the store file, the counts in ``BenchConfig``) happen when the cell runs."""
        from bench.commands.bench import build_config
        from bench.errors import InputError

        try:
            build_config(ns)
        except InputError as e:
            if e.path != Path(ns.data):  # else build_config reached the dataset: the file-free checks passed
                raise

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


# --- what ``args`` may not say ---------------------------------------------------------------------
# A cell's ``args`` are appended to the line its kind builds, and argparse keeps the last value of an
# option given twice (and takes a unique prefix for the whole option): ``args: {out: /elsewhere,
# overwrite: true}`` would send a prepare cell's output over a folder outside the sweep. So every
# option the kind sets itself is refused in ``args``, by any spelling that reaches it. The set is read
# off the kind's own ``argv`` (a probe cell with every field set), not listed by hand.

_KEY_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]*$")
_NUMBER_RE = re.compile(r"^-(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$")  # a negative number argparse reads as a value


class _ProbeContext:
    """A ``Context`` that places every cell under ``/probe``: enough to build any kind's argv."""

    data_root = Path("/probe/data-root")
    rendezvous = Rendezvous()

    def cell_dir(self, cell_id: str) -> Path:
        return Path("/probe/cells") / cell_id

    def shared_dir(self, name: str) -> Path:
        return Path("/probe/shared") / name

    def output(self, cell_id: str) -> Path:
        return self.cell_dir(cell_id)


def _sample(tp: Any) -> Any:
    """A valid value of a field annotation (``str | None`` -> a string, ``tuple[int, ...]`` -> ``(1,)``)."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return _sample(next(a for a in typing.get_args(tp) if a is not type(None)))
    if origin is tuple:
        return (_sample(typing.get_args(tp)[0]),)
    return {bool: True, int: 1, float: 1.0}.get(tp, "probe")


def probe_cell(cls: type[Cell]) -> Cell:
    """An instance of ``cls`` with each of its own fields set (a field with a value already, such as
    ``mode`` or ``nproc``, keeps it): its ``argv`` then writes every option the kind can write."""
    base = {fl.name for fl in dataclasses.fields(Cell)}
    hints = typing.get_type_hints(cls)
    kw: dict[str, Any] = {"id": "probe"}
    for fl in dataclasses.fields(cls):
        if fl.name not in base and fl.default in (None, "", (), False):
            kw[fl.name] = _sample(hints[fl.name])
    return cls(**kw)


@functools.cache
def command_parser(command: str) -> argparse.ArgumentParser:
    """The parser of ``inrbench <command>``, as ``bench.cli`` builds it (a cell's line is parsed by it)."""
    import importlib

    from bench.cli import COMMANDS, OneLineParser

    p = OneLineParser(prog=f"inrbench {command}")
    importlib.import_module(COMMANDS[command]).add_arguments(p)
    return p


def resolve_option(parser: argparse.ArgumentParser, flag: str) -> list[argparse.Action]:
    """The options ``flag`` (``--name``) reaches, as argparse matches it: the exact option, else every
    option it is a prefix of (argparse takes a unique prefix for the whole option)."""
    acts = parser._option_string_actions
    if flag in acts:
        return [acts[flag]]
    if not parser.allow_abbrev:
        return []
    return list({id(a): a for o, a in acts.items() if o.startswith(flag)}.values())


@functools.cache
def managed_dests(cls: type[Cell]) -> frozenset[str]:
    """The options (argparse ``dest``) a kind sets itself: every one its ``argv`` writes (read off a
    probe cell), its launch fields (``nproc``, ``nnodes``) and ``SWEEP_FLAGS``."""
    if cls.COMMAND is None:
        return frozenset()
    parser = command_parser(cls.COMMAND)
    dests = set()
    for flag in (a for a in probe_cell(cls).argv(_ProbeContext()) if a.startswith("--")):
        hit = resolve_option(parser, flag)
        if len(hit) != 1 or flag not in hit[0].option_strings:
            raise AssertionError(f"{cls.kind} cells write {flag}, which is not an option of inrbench {cls.COMMAND}")
        dests.add(hit[0].dest)
    for flag in (_flag(f) for f in (*getattr(cls, "LAUNCH_FIELDS", ()), *cls.SWEEP_FLAGS)):
        dests.update(a.dest for a in resolve_option(parser, flag) if flag in a.option_strings)
    return frozenset(dests)


def check_args(cell: Cell) -> None:
    """Refuse ``args`` that would set what the sweep sets itself (``ValueError`` naming the key).

    A key is an option name without dashes (``jpeg_quality`` or ``jpeg-quality``). Refused: a field
    of the kind (set it on the cell), an option the kind writes itself (``managed_dests``: ``out``,
    ``overwrite``, ``data``, ``store``, ``init``, ``root``, ``device``, ``nproc``...) or any prefix
    argparse would complete to one (``ou``), an option ``inrbench <command>`` does not have, and a
    value that argparse would read as an option (``--out``). Kinds without a ``COMMAND`` (``inrbench``,
    ``python``) run a command written out in full: nothing is checked there.
    """
    if cell.COMMAND is None or not cell.args:
        return
    cmd = f"inrbench {cell.COMMAND}"
    parser = command_parser(cell.COMMAND)
    managed = managed_dests(type(cell))
    fields = {fl.name for fl in dataclasses.fields(cell)}
    for key, val in cell.args:
        if not isinstance(key, str) or not _KEY_RE.fullmatch(key.lstrip("-")):
            raise ValueError(f"args key {key!r} must be an option name such as 'jpeg_quality' "
                             "(letters, digits, '_' and '-')")
        name = key.lstrip("-").replace("-", "_")
        if name in fields:
            raise ValueError(f"args key {key!r} is a field of {cell.kind} cells: set '{name}:' on the cell, "
                             "not in args")
        flag = _flag(name)
        hit = resolve_option(parser, flag)
        if any(a.dest in managed for a in hit):
            opt = "/".join(a.option_strings[0] for a in hit if a.dest in managed)
            raise ValueError(f"args key {key!r} would set {opt}, which the sweep sets itself for {cell.kind} "
                             "cells (from its fields and its folder): remove it (see docs/sweeps.md)")
        if key.startswith("-"):
            raise ValueError(f"args key {key!r}: write the option name without dashes ({name!r})")
        if not hit:
            raise ValueError(f"args key {key!r}: {cmd} has no option {flag}")
        if len(hit) > 1:
            raise ValueError(f"args key {key!r}: {flag} is ambiguous in {cmd} "
                             f"({', '.join(a.option_strings[0] for a in hit)})")
        if isinstance(hit[0], argparse._HelpAction):
            raise ValueError(f"args key {key!r}: {flag} prints the help and runs nothing")
        for tok in extra_argv(((name, val),))[1:]:
            if tok.startswith("-") and not _NUMBER_RE.fullmatch(tok):
                raise ValueError(f"args key {key!r}: value {tok!r} would be read as an option")
