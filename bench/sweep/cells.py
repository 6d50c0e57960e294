"""Sweep cells: an ``inrbench`` command whose options are the cell's keys (``jpeg_quality: 50`` -> ``--jpeg-quality
50``), checked by that command's own parser; the sweep owns only the output, the launch and references (``REFS``)."""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib
import io
import re
import shlex
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.errors import InputError, one_line
from bench.sweep import layout
from bench.workdir import work_path

REFS = {"data": "prepare", "store": "encode", "stores": "encode", "init": "meta-init"}  # key -> the kind it names
SWEEP_OWNED = ("out", "overwrite", "rdzv_endpoint", "rdzv_id")  # options the sweep writes or never passes
LAUNCH = ("nproc", "nnodes")  # keys of a distributed kind: processes per node, nodes (torchrun)
COMMON = ("id", "needs", "args", "timeout_s")
FIT_CACHE = "fit-cache"  # OUT/shared/<this>: float32 fits shared by encode cells with ``fit_cache: true``
RESULTS_SUBDIR, OUT_SUBDIR = layout.RESULTS_SUBDIR, layout.OUT_SUBDIR
ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")  # a cell id is a folder name: never ".", ".." or hidden
_KEY_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]*$")
_NUMBER_RE = re.compile(r"^-(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$")  # a negative number argparse reads as a value


@dataclass(frozen=True)
class Rendezvous:
    """Where the nodes of multi-node cells meet; not part of any cell's identity."""

    endpoint: str | None = None  # HOST:PORT of one node every node reaches (c10d)
    id: str = "inrbench"  # a cell's rendezvous id is ``<id>-<cell id>``


@dataclass
class SweepContext:
    """Where a sweep's cells live: ``OUT/cells/<id>/``, ``OUT/shared/<name>/``."""

    out: Path
    data_root: Path | None
    cells: dict[str, Cell]
    rendezvous: Rendezvous = field(default_factory=Rendezvous)
    fork: bool = False  # start ``python -m bench`` cells from the fork server

    def cell_dir(self, cell_id: str) -> Path:
        if not ID_RE.match(cell_id):  # the folder is emptied before the cell runs: never ".." or a path
            raise InputError(f"cell id {cell_id!r} is not a folder name ({ID_RE.pattern})")
        return self.out / layout.CELLS_DIR / cell_id

    def shared_dir(self, name: str) -> Path:
        return self.out / layout.SHARED_DIR / name

    def output(self, cell_id: str) -> Path:
        return self.cells[cell_id].output(self)


def store_stem(name: str) -> str:
    """An encode cell's store stem: dots replaced (``compare`` names a variant up to the first dot)."""
    return name.replace(".", "_")


def check_name(name: str, what: str = "the cell's output inside its folder") -> None:
    if name and (name in (".", "..") or "/" in name or "\0" in name):
        raise ValueError(f"name {name!r} must be a plain file name (no '/', not '.' or '..'): it names {what}")


@functools.cache
def command_parser(command: str) -> argparse.ArgumentParser:
    """The parser of ``inrbench <command>``, as ``bench.cli`` builds it."""
    from bench.cli import COMMANDS, OneLineParser

    p = OneLineParser(prog=f"inrbench {command}")
    importlib.import_module(COMMANDS[command]).add_arguments(p)
    return p


def command_checks(command: str, ns: argparse.Namespace) -> None:
    """The command's own checks of its parsed options (its ``build_config``), as far as they read no file: the
    cell's inputs are other cells' outputs, which do not exist when the sweep is loaded."""
    from bench.cli import COMMANDS

    if command == "encode":
        ns.init = None
    try:
        cfg = importlib.import_module(COMMANDS[command]).build_config(ns)
        if command == "prepare":
            from bench.datasets.prepare import resolve

            resolve(cfg, read_root=False)  # the root is read when the cell runs
    except InputError as e:
        if command != "bench" or e.path != Path(ns.data):  # bench opens --data once its other checks passed
            raise


@dataclass(frozen=True)
class Kind:
    """How a cell of one kind runs: ``command`` (None: written out in full under ``command:``), the key given
    as its positional argument, its output inside the cell folder (``{name}``: the cell's ``name`` or id), and
    what an interrupted run resumes from: the output's path -> that folder (the command's work folder)."""

    name: str
    command: str | None = None
    positional: str | None = None
    output: str = ""
    resume: Callable[[Path], Path] | None = None
    world_in_identity: bool = True  # nproc/nnodes change the result (bench), or not (encode)
    python: bool = False  # ``python COMMAND...`` instead of ``python -m bench COMMAND...``

    @functools.cached_property
    def options(self) -> dict[str, argparse.Action]:
        """Option key (``jpeg_quality``) -> its action, for every exact ``--option`` of the command."""
        if self.command is None:
            return {}
        acts = command_parser(self.command)._option_string_actions
        return {o[2:].replace("-", "_"): a for o, a in acts.items()
                if o.startswith("--") and not isinstance(a, argparse._HelpAction)}

    @property
    def distributed(self) -> bool:
        return "nproc" in self.options

    @functools.cached_property
    def keys(self) -> frozenset[str]:
        """Every key a cell of this kind may hold."""
        if self.command is None:
            return frozenset({*COMMON, "command"})
        many = self.options.get("store") is not None and self.options["store"].nargs in ("+", "*")
        refs = {r for r in REFS if r in self.options or r == self.positional or (r == "stores" and many)}
        keys = {*COMMON, *self.options, *refs, *(LAUNCH if self.distributed else ())} - set(SWEEP_OWNED)
        if self.positional:
            keys.add(self.positional)
        if "{name}" in self.output:
            keys.add("name")
        return frozenset(keys)


KINDS: dict[str, Kind] = {k.name: k for k in (
    Kind("prepare", "prepare", "source", "{name}", resume=lambda out: work_path(out, "prepare")),
    Kind("meta-init", "meta-init", "data", "init.pt", resume=lambda out: work_path(out, "meta-init")),
    Kind("encode", "encode", "data", "{name}.inr", resume=lambda out: work_path(out, "encode"),
         world_in_identity=False),
    Kind("compare", "compare", "data", "compare"),
    Kind("bench", "bench", output=RESULTS_SUBDIR),
    Kind("inrbench", output=OUT_SUBDIR),
    Kind("python", python=True),
)}


def extra_argv(args: dict[str, Any] | tuple) -> list[str]:
    """``{"jpeg_qualities": [10, 50], "fast": True}`` -> ``--jpeg-qualities 10 50 --fast``."""
    out: list[str] = []
    for name, val in dict(args).items():
        if val is None or val is False:
            continue
        out.append("--" + name.replace("_", "-"))
        if val is not True:
            out.extend(str(v) for v in (val if isinstance(val, (list, tuple)) else [val]))
    return out


@dataclass(frozen=True, eq=False)
class Cell:
    """One command of a sweep: its ``kind``, ``fields`` (the command's options and references, keys with
    ``_``), and what the sweep itself reads (``needs``, ``timeout_s``, ``nproc``, ``nnodes``)."""

    id: str
    kind: str
    fields: dict[str, Any] = field(default_factory=dict)
    needs: tuple[str, ...] = ()
    timeout_s: float | None = None
    nproc: int = 1
    nnodes: int = 1

    def __getattr__(self, name: str) -> Any:  # ``cell.pipeline``: a field, None when unset
        if name.startswith("_") or name == "fields":
            raise AttributeError(name)
        return self.fields.get(name)

    @property
    def spec(self) -> Kind:
        return KINDS[self.kind]

    @property
    def world_size(self) -> int:
        return self.nproc * self.nnodes

    def refs(self) -> tuple[str, ...]:
        out: list[str] = []
        for r in REFS:
            v = self.fields.get(r)
            out.extend(v if isinstance(v, (list, tuple)) else ([v] if v else []))
        return tuple(out)

    def deps(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys((*self.refs(), *self.needs)))

    def output(self, ctx: SweepContext) -> Path:
        """The path a reference to this cell resolves to."""
        name = self.fields.get("name") or self.id
        out = self.spec.output.replace("{name}", store_stem(name) if self.kind == "encode" else name)
        return ctx.cell_dir(self.id) / out

    def resume_state(self, ctx: SweepContext) -> tuple[Path, ...]:
        """What an interrupted run of this very cell left to resume from (kept when it runs again)."""
        out = self.output(ctx)
        return (self.spec.resume(out),) if self.spec.resume else ()

    def argv(self, ctx: SweepContext) -> list[str]:
        """Arguments after ``python -m bench`` (after ``python`` for python cells)."""
        spec, f = self.spec, self.fields
        if spec.command is None:
            out = str(self.output(ctx))
            return [str(a).replace("{out}", out) for a in f.get("command", ())] + extra_argv(f.get("args", {}))
        argv = [spec.command]
        if spec.positional:
            argv.append(self._value(spec.positional, f.get(spec.positional), ctx))
        for key in spec.options:  # the command's own order
            if key == "out":
                val = self.output(ctx)
            elif key in SWEEP_OWNED or key in LAUNCH:
                continue
            elif key == "store" and "stores" in f:
                val = f["stores"]
            elif key == "fit_cache":
                val = ctx.shared_dir(FIT_CACHE) if f.get(key) else None
            else:
                val = f.get(key)
            if val is None or val is False or val == []:
                continue
            argv.append("--" + key.replace("_", "-"))
            if val is not True:
                vals = val if isinstance(val, (list, tuple)) else [val]
                argv.extend(self._value(key, v, ctx) for v in vals)
        return argv

    def _value(self, key: str, val: Any, ctx: SweepContext) -> str:
        if key in REFS:
            return str(ctx.output(val))
        if key == "root" and ctx.data_root is not None and not Path(str(val)).is_absolute():
            return str(ctx.data_root / str(val))
        return str(val)

    def process_argv(self, ctx: SweepContext) -> list[str]:
        """What the runner starts: ``python -m bench <argv>``, or the torchrun line for several processes."""
        if self.spec.python:
            return [sys.executable, *self.argv(ctx)]
        if self.world_size == 1:
            return [sys.executable, "-m", "bench", *self.argv(ctx)]
        from bench import dist

        # one rendezvous per multi-node cell: a node still in one cell's job never meets the next cell's
        nodes = (self.nnodes, ctx.rendezvous.endpoint, f"{ctx.rendezvous.id}-{self.id}") if self.nnodes > 1 else ()
        return dist.torchrun_command(self.argv(ctx), self.nproc, *nodes)

    def elsewhere(self, ctx: SweepContext) -> str | None:
        """Why the sweep cannot start this cell itself (several nodes: the same line on each), or None."""
        if self.nnodes == 1:
            return None
        return (f"runs on {self.nnodes} nodes x {self.nproc} processes: the sweep does not start it; "
                f"run on every node: {shell_line(self.process_argv(ctx))}")

    def identity(self, ctx: SweepContext) -> dict[str, Any]:
        """What the cell's hash covers: its kind, its resolved command and (where it changes the result) its
        world size; never ``timeout_s`` or the rendezvous."""
        d: dict[str, Any] = {"kind": self.kind, "argv": self.argv(ctx)}
        if self.spec.world_in_identity and self.world_size > 1:
            d["world"] = [self.nproc, self.nnodes]
        return d

    def labels(self) -> dict[str, str]:
        """``pipeline``/``dataset``/``mode`` of this cell's status row."""
        if self.spec.command is None:
            return {"pipeline": "", "dataset": "", "mode": ""}
        mode = self.kind if self.kind != "bench" else self.fields.get("mode") or self.spec.options["mode"].default
        pipeline = self.fields.get("pipeline") or ("inr" if self.kind in ("encode", "meta-init") else "")
        dataset = (self.fields.get("name") or self.id) if self.kind == "prepare" else ""
        return {"pipeline": pipeline, "dataset": dataset, "mode": mode}

    def to_dict(self) -> dict[str, Any]:
        d = {"kind": self.kind, "id": self.id, "needs": list(self.needs), "timeout_s": self.timeout_s, **self.fields}
        if self.spec.distributed:
            d.update(nproc=self.nproc, nnodes=self.nnodes)
        return d

    def check(self, ctx: SweepContext) -> None:
        """Parse the cell's line with its command's parser, then run the command's checks that read no file
        (``ValueError`` with the parser's message)."""
        spec = self.spec
        if spec.command is None:
            return
        said = io.StringIO()
        try:
            with contextlib.redirect_stderr(said):
                command_checks(spec.command, command_parser(spec.command).parse_args(self.argv(ctx)[1:]))
        except SystemExit:
            raise ValueError(one_line(said.getvalue().strip()).removeprefix("inrbench: error: ")) from None
        except InputError as e:
            raise ValueError(str(e)) from None


def owned_options(kind: Kind) -> list[str]:
    """The command's options whose value the sweep decides: outputs, other cells, the launch (docs/sweeps.md)."""
    return sorted(a.option_strings[0] for k, a in kind.options.items()
                  if k in (*SWEEP_OWNED, *LAUNCH, *REFS, "fit_cache"))


def check_option(kind: Kind, key: str, val: Any, where: str) -> None:
    """Refuse a key the sweep owns or the command lacks, and a value argparse would read as an option."""
    if not isinstance(key, str) or not _KEY_RE.fullmatch(key.lstrip("-")):
        raise ValueError(f"{where} {key!r} must be an option name such as 'jpeg_quality' (letters, digits, '_', '-')")
    name = key.lstrip("-").replace("-", "_")
    if name in SWEEP_OWNED or (name in LAUNCH and name in kind.options and where == "args key"):
        raise ValueError(f"{where} {key!r} would set --{name.replace('_', '-')}, which the sweep sets itself "
                         "(from the cell's folder and its own options): remove it (see docs/sweeps.md)")
    if key.startswith("-"):
        raise ValueError(f"{where} {key!r}: write the option name without dashes ({name!r})")
    if kind.command is not None and name not in kind.keys:
        raise ValueError(f"{where} {key!r}: inrbench {kind.command} has no option --{name.replace('_', '-')}")
    if isinstance(val, dict):
        raise ValueError(f"{where} {key!r}: a value is a scalar or a list, got a mapping")
    for tok in extra_argv({name: val})[1:]:
        if tok.startswith("-") and not _NUMBER_RE.fullmatch(tok):
            raise ValueError(f"{where} {key!r}: value {tok!r} would be read as an option")


def shell_line(cmd: list[str]) -> str:
    """A runner argv as the line a user types: ``inrbench ...`` or ``torchrun ...``."""
    from bench import dist

    if cmd[1:3] == ["-m", "bench"]:
        return shlex.join(["inrbench", *cmd[3:]])
    return dist.shell_line(cmd)
