"""Cell kinds: one typed, frozen config per ``inrbench`` subcommand, and how it becomes an argv.

Every cell runs ``python -m bench <argv>`` in its own folder ``OUT/cells/<id>/``. Fields that
name another cell (``data``, ``store``, ``stores``) are *references*: they resolve to that
cell's output path and make it a dependency. A kind declares its output with ``output``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Protocol


class Context(Protocol):
    """What a cell needs from the runner to build its argv."""

    data_root: Path | None

    def cell_dir(self, cell_id: str) -> Path: ...

    def shared_dir(self, name: str) -> Path:
        """A folder shared by cells of one sweep (``OUT/shared/<name>``), e.g. a fit cache."""
        ...

    def output(self, cell_id: str) -> Path: ...


def store_stem(name: str) -> str:
    """File stem of an encode cell's store: its name with dots replaced (``compare`` names a
    variant by the file name up to the first dot, so ``ds-lr-0.001`` becomes ``ds-lr-0_001``)."""
    return name.replace(".", "_")


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
    root: relative paths are taken under ``--data-root``.
    """

    kind: ClassVar[str] = "prepare"

    source: str = ""
    name: str = ""
    root: str | None = None
    size: int | None = None
    limit: int | None = None
    jpeg_quality: int | None = None

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

    def labels(self) -> dict[str, str]:
        return {"pipeline": "", "dataset": self.name or self.id, "mode": "prepare"}


@dataclass(frozen=True)
class EncodeCell(Cell):
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

    def labels(self) -> dict[str, str]:
        return {"pipeline": "inr", "dataset": "", "mode": "encode"}


@dataclass(frozen=True)
class MetaInitCell(Cell):
    """``inrbench meta-init DATA --preset P [--outer-steps N] [--images N] --out CELL/init.pt``
    (a learned initialization from DATA's train split; encode cells name it with ``init``)."""

    kind: ClassVar[str] = "meta-init"
    REF_FIELDS: ClassVar[tuple[str, ...]] = ("data",)

    data: str = ""
    preset: str | None = None
    outer_steps: int | None = None
    images: int | None = None
    device: str | None = None

    def output(self, ctx: Context) -> Path:
        return ctx.cell_dir(self.id) / "init.pt"

    def argv(self, ctx: Context) -> list[str]:
        argv = ["meta-init", str(ctx.output(self.data))]
        for f in ("preset", "outer_steps", "images", "device"):
            _opt(argv, f, getattr(self, f))
        return argv + ["--out", str(self.output(ctx))] + extra_argv(self.args)

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
class BenchCell(Cell):
    """``inrbench bench --pipeline P --data DATA [--store S] --mode M ... --out CELL/results``."""

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

    def output(self, ctx: Context) -> Path:
        # a results folder of its own: the cell folder also holds the runner's logs
        return ctx.cell_dir(self.id) / RESULTS_SUBDIR

    def __post_init__(self) -> None:
        if self.mode not in self.MODES:
            raise ValueError(f"mode must be one of {'|'.join(self.MODES)}, got {self.mode!r}")

    def argv(self, ctx: Context) -> list[str]:
        argv = ["bench", "--pipeline", self.pipeline, "--data", str(ctx.output(self.data))]
        if self.store is not None:
            argv += ["--store", str(ctx.output(self.store))]
        argv += ["--mode", self.mode]
        for f in ("epochs", "warmup", "repeats", "batch_size", "workers", "device", "backbone"):
            _opt(argv, f, getattr(self, f))
        argv += ["--out", str(self.output(ctx))]
        return argv + extra_argv(self.args)

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


KINDS: dict[str, type[Cell]] = {
    c.kind: c for c in (PrepareCell, MetaInitCell, EncodeCell, CompareCell, BenchCell, CommandCell, PythonCell)
}
