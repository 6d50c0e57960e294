"""Sweep files -> a validated ``SweepConfig`` of frozen cells.

YAML layout::

    name: demo
    description: one line
    device: cpu                      # default for every cell with a ``device`` field
    report: true                     # build the report after the last cell
    defaults:                        # per kind, merged under each cell's own fields
      bench: {epochs: 2, repeats: 3}
    cpu_defaults:                    # on a CPU run only: merged over ``defaults`` (the description says so)
      encode: {iterations: 500}
    cells:
      - {kind: prepare, id: prep, source: photos, name: photos32, size: 32}
      - kind: bench
        id: "bench-{pipeline}-{mode}"          # formatted with the cell's fields
        data: prep
        matrix:                                # cartesian product, one cell per combination
          mode: [loader, train]                # scalar items set that field
          feed: [{pipeline: raw}, {pipeline: inr, store: enc}]   # dict items merge fields

Distributed cells (``bench``, ``encode``): ``nproc`` processes per node and ``nnodes`` nodes,
per cell, in ``defaults`` or from the command line (``inrbench sweep paper --nproc 8``): a
command-line value fills every such cell on the sweep's device that does not set the field
itself (a cell pinned to ``device: cpu`` in a GPU sweep stays one process). ``nnodes > 1``
needs the rendezvous endpoint (``--rdzv-endpoint HOST:PORT``), else an ``InputError``.

Rules: ids are unique and ``[A-Za-z0-9][A-Za-z0-9._-]*``; a cell may only reference cells declared
before it (so file order is a valid run order and there are no cycles); ``data`` must name a
``prepare`` cell and ``store``/``stores`` ``encode`` cells (``stores`` items may be globs
over ids). The sweep's ``name`` (default: the file's stem) is a plain file name: it names the default
folders ``runs/<name>`` and ``reports/<name>``. A typed cell's ``args`` may not set what the kind
sets itself (``cells.check_args``: its fields, every option its line writes, ``--overwrite``, or a
prefix argparse completes to one), and its whole line is checked by its command's own parser and checks,
as far as they read no file (``Cell.check_options``). Any violation is an ``InputError`` naming the file
and the cell.
The format, for users: ``docs/sweeps.md``.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import functools
import importlib.resources
import itertools
import math
import re
import types
import typing
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from bench.errors import InputError
from bench.sweep.cells import KINDS, Cell, DistributedCell, Rendezvous, check_args, check_name

ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")  # a folder name: never ".", ".." or hidden
FIELD_RE = re.compile(r"^[A-Za-z_]\w*(\[[^\]]*\])*$")  # an id template's field: name or name[key]
ID_MAX = 200  # characters of a cell id (its folder's name: at most 255 bytes on most file systems)
MAX_CELLS = 10_000  # cells of one sweep: each is a process; a matrix beyond it is a mistake
MAX_NODES = 1_000_000  # values in a sweep file with its YAML aliases expanded (an alias bomb is refused)
DEVICES = ("cpu", "cuda")
TOP_KEYS = {"name", "description", "device", "report", "defaults", "cpu_defaults", "cells"}
LABEL = "label"  # a matrix dict item's key that only names the item (in the id template)


@dataclass(frozen=True)
class SweepConfig:
    """A resolved sweep: cells in run order (dependencies first)."""

    name: str
    description: str
    device: str
    report: bool
    cells: tuple[Cell, ...]
    source: str = ""
    rendezvous: Rendezvous = Rendezvous()

    def __post_init__(self) -> None:
        if self.device not in DEVICES:
            raise ValueError(f"device must be one of {'|'.join(DEVICES)}, got {self.device!r}")

    def by_id(self) -> dict[str, Cell]:
        return {c.id: c for c in self.cells}

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "description": self.description,
            "device": self.device,
            "report": self.report,
            "source": self.source,
            "rendezvous": dataclasses.asdict(self.rendezvous),
            "cells": [c.to_dict() for c in self.cells],
        }


def builtin_names() -> list[str]:
    root = importlib.resources.files("bench") / "sweeps"
    return sorted(p.name[: -len(".yaml")] for p in root.iterdir() if p.name.endswith(".yaml"))


def locate(name_or_path: str) -> Path:
    """A built-in sweep name (``demo``) or a path to a YAML file."""
    p = Path(name_or_path)
    if p.suffix in (".yaml", ".yml") or p.exists():
        if not p.is_file():
            raise InputError("no such sweep file", p)
        return p
    root = importlib.resources.files("bench") / "sweeps" / f"{name_or_path}.yaml"
    if not root.is_file():
        raise InputError(f"unknown sweep {name_or_path!r}; built-in: {', '.join(builtin_names())} "
                         "(or give a path to a .yaml file)")
    return Path(str(root))


def load_sweep(name_or_path: str, device: str | None = None, nproc: int | None = None, nnodes: int | None = None,
               rendezvous: Rendezvous | None = None) -> SweepConfig:
    """Read, expand and validate a sweep; ``device`` overrides the file's default device.

    ``nproc``/``nnodes`` fill the distributed cells on the sweep's device that do not set them;
    ``rendezvous`` is where multi-node cells meet.
    """
    path = locate(name_or_path)
    import yaml

    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        raise InputError(f"cannot read sweep YAML: {' '.join(str(e).split())[:300]}", path) from None
    return parse_sweep(doc, path, device=device, nproc=nproc, nnodes=nnodes, rendezvous=rendezvous)


def parse_sweep(doc: Any, path: Path, device: str | None = None, nproc: int | None = None,
                nnodes: int | None = None, rendezvous: Rendezvous | None = None) -> SweepConfig:
    _check_size(doc, path)
    if not isinstance(doc, dict):
        raise InputError("a sweep file must be a mapping with 'name' and 'cells'", path)
    unknown = set(doc) - TOP_KEYS
    if unknown:
        raise InputError(f"unknown top-level keys {sorted(unknown)}; known: {sorted(TOP_KEYS)}", path)
    name = doc.get("name") or path.stem
    if isinstance(name, (dict, list)) or not str(name).strip():
        raise InputError(f"'name' must be a plain file name, got {name!r}", path)
    try:  # the default results and report folders are runs/<name> and reports/<name>
        check_name(str(name), what="the sweep's default folders runs/<name> and reports/<name>")
    except ValueError as e:
        raise InputError(f"sweep {e}", path) from None
    dev = device or doc.get("device", "cpu")
    if dev not in DEVICES:
        raise InputError(f"device must be one of {'|'.join(DEVICES)}, got {dev!r}", path)
    description = str(doc.get("description", ""))
    defaults, on_cpu = (doc.get(k) or {} for k in ("defaults", "cpu_defaults"))
    for key, d in (("defaults", defaults), ("cpu_defaults", on_cpu)):
        if not isinstance(d, dict) or not all(isinstance(v, dict) for v in d.values()):
            raise InputError(f"'{key}' must map a cell kind to a mapping of fields", path)
        bad = set(d) - set(KINDS)
        if bad:
            raise InputError(f"'{key}' names unknown kinds {sorted(bad)}; known: {sorted(KINDS)}", path)
    if dev == "cpu" and on_cpu:  # e.g. fewer fit iterations than a GPU recipe: said in the report
        defaults = {k: {**defaults.get(k, {}), **on_cpu.get(k, {})} for k in {**defaults, **on_cpu}}
        said = "; ".join(f"{k} {', '.join(f'{f}={v}' for f, v in d.items())}" for k, d in on_cpu.items())
        description = f"{description} On this CPU run, cpu_defaults applied: {said}.".strip()
    rdzv = rendezvous or Rendezvous()
    _check_endpoint(rdzv.endpoint)
    launch = {k: v for k, v in (("nproc", nproc), ("nnodes", nnodes)) if v is not None}
    raw_cells = doc.get("cells")
    if not isinstance(raw_cells, list) or not raw_cells:
        raise InputError("'cells' must be a non-empty list", path)

    cells: list[Cell] = []
    seen: dict[str, Cell] = {}
    for i, raw in enumerate(raw_cells):
        where = f"cell #{i + 1}"
        if not isinstance(raw, dict):
            raise InputError(f"{where}: must be a mapping", path)
        kind = raw.get("kind")
        if kind not in KINDS:
            raise InputError(f"{where}: unknown kind {kind!r}; known: {', '.join(KINDS)}", path)
        known = {fl.name for fl in fields(KINDS[kind])}
        for fields_ in _expand(raw, defaults.get(kind, {}), known, path, where):
            if len(cells) == MAX_CELLS:
                raise InputError(f"more than {MAX_CELLS:,} cells, more than a sweep may hold", path)
            cell = _build(KINDS[kind], fields_, dev, path, where, launch)
            if isinstance(cell, DistributedCell) and cell.nnodes > 1 and not rdzv.endpoint:
                raise InputError(f"cell {cell.id!r}: nnodes {cell.nnodes} needs a rendezvous: pass "
                                 "--rdzv-endpoint HOST:PORT (a node every node reaches) to inrbench sweep", path)
            cell = _check_refs(cell, seen, path)
            seen[cell.id] = cell
            cells.append(cell)
    return SweepConfig(name=str(name), description=description, device=dev,
                       report=bool(doc.get("report", True)), cells=tuple(cells), source=str(path), rendezvous=rdzv)


def _check_size(doc: Any, path: Path) -> None:
    """Refuse a document of more than ``MAX_NODES`` values once its aliases are expanded (``&a`` used
    as ``*a`` nine times per level: a billion values from a few lines), counted without expanding it."""
    seen, stack = 0, [doc]
    while stack:
        node = stack.pop()
        seen += 1
        if seen > MAX_NODES:
            raise InputError(f"more than {MAX_NODES:,} values once its YAML aliases (*name) are expanded: "
                             "an alias bomb or a mistake", path)
        if isinstance(node, dict):
            stack.extend(node.keys())
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)


def _format_id(template: str, fields_: dict, path: Path, where: str) -> str:
    """A cell's ``id`` template filled in with its fields: ``{name}`` or ``{name[key]}`` fields (no attribute
    access), widths and precisions of at most ``ID_MAX``; the result at most ``ID_MAX`` long."""
    import string

    bad = None
    try:
        for _, name, spec, _ in string.Formatter().parse(template):
            if name is None:
                continue
            if not FIELD_RE.match(name):
                bad = f"{{{name}}}: a field is a name, or name[key] (no attribute access)"
            elif "{" in (spec or "") or any(int(n) > ID_MAX for n in re.findall(r"\d+", spec or "")):
                bad = f"{{{name}:{spec}}}: widths and precisions are at most {ID_MAX}"
            if bad:
                break
        if bad is None:
            out = template.format(**fields_)
    except (KeyError, IndexError, ValueError, TypeError, AttributeError) as e:
        bad = f"{type(e).__name__}: {e}"
    if bad is not None:
        raise InputError(f"{where}: cannot format id {_short(template)}: {bad[:120]}", path)
    if len(out) > ID_MAX:
        raise InputError(f"{where}: id {_short(out)} is {len(out)} characters long, at most {ID_MAX}", path)
    return out


def _short(text: str, limit: int = 80) -> str:
    """``repr(text)``, cut to ``limit`` characters: a message stays one short line."""
    r = repr(text)
    return r if len(r) <= limit else f"{r[:limit]}...' ({len(text)} characters)"


def _check_endpoint(endpoint: str | None) -> None:
    """``HOST:PORT`` (a port 1..65535), else an ``InputError``."""
    if endpoint is None:
        return
    host, _, port = endpoint.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise InputError(f"--rdzv-endpoint {endpoint!r}: expected HOST:PORT (e.g. node0.cluster:29500)")


def _expand(raw: dict, defaults: dict, known: set[str], path: Path, where: str) -> list[dict]:
    """One cell mapping with an optional ``matrix`` -> one field mapping per combination.

    A scalar matrix key that is not a field of the kind only names the combination (usable in
    the ``id`` template) and is dropped afterwards; so is a dict item's ``label`` (``LABEL``), a
    reserved key that only names the item (``{label: expand, args: {...}}`` with
    ``id: "method-{label}"``) where the kind has no field of that name. Any other unknown key of a
    dict item is refused by validation, even when the id names it (a typo'd field never drops
    silently).
    """
    base = {**defaults, **{k: v for k, v in raw.items() if k not in ("kind", "matrix")}}
    if isinstance(defaults.get("args"), dict) and isinstance(raw.get("args"), dict):
        base["args"] = {**defaults["args"], **raw["args"]}  # extra flags merge, the cell's win
    matrix = raw.get("matrix") or {}
    if not isinstance(matrix, dict) or not all(isinstance(v, list) and v for v in matrix.values()):
        raise InputError(f"{where}: 'matrix' must map names to non-empty lists", path)
    n = math.prod(map(len, matrix.values()))
    if n > MAX_CELLS:
        raise InputError(f"{where}: 'matrix' makes {n:,} cells, more than a sweep may hold ({MAX_CELLS:,})", path)
    out = []
    for combo in itertools.product(*matrix.values()):
        f = dict(base)
        for key, item in zip(matrix, combo, strict=True):
            if isinstance(item, dict):
                if isinstance(item.get("args"), dict) and isinstance(f.get("args"), dict):
                    item = {**item, "args": {**f["args"], **item["args"]}}
                f.update(item)
            else:
                f[key] = item
        if "id" not in f:
            raise InputError(f"{where}: missing 'id'", path)
        f["id"] = _format_id(str(f["id"]), f, path, where)
        for key, item in zip(matrix, combo, strict=True):
            if not isinstance(item, dict) and key not in known:
                del f[key]
            elif isinstance(item, dict) and LABEL in item and LABEL not in known:
                f.pop(LABEL, None)
        out.append(f)
    return out


def _coerce(value: Any, tp: Any, name: str) -> Any:
    """Check/convert a YAML value against a dataclass field annotation."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        errs = []
        for a in args:
            if a is type(None):
                continue
            try:
                return _coerce(value, a, name)
            except ValueError as e:
                errs.append(str(e))
        raise ValueError(errs[0] if errs else f"{name}: bad value {value!r}")
    if origin is tuple:
        args = typing.get_args(tp)
        if not isinstance(value, (list, tuple)):
            value = [value]
        if args and args[-1] is Ellipsis:
            return tuple(_coerce(v, args[0], name) for v in value)
        if args == (str, Any):  # a (flag, value) pair of ``args``
            return tuple(value)
        return tuple(value)
    if tp is Any:
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise ValueError(f"{name} must be true/false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{name} must be an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"{name} must be a number, got {value!r}")
        return float(value)
    if tp is str:
        if isinstance(value, (dict, list)) or value is None:
            raise ValueError(f"{name} must be a string, got {value!r}")
        return str(value)
    return value


@functools.cache
def _type_hints(cls: type[Cell]) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _build(cls: type[Cell], f: dict, device: str, path: Path, where: str, launch: dict | None = None) -> Cell:
    hints = _type_hints(cls)
    known = {fl.name for fl in fields(cls)}
    cid = f.get("id")
    where = f"cell {cid!r}" if cid else where
    unknown = set(f) - known
    if unknown:
        raise InputError(f"{where}: unknown fields {sorted(unknown)} for kind {cls.kind!r}; "
                         f"known: {sorted(known)}", path)
    if not ID_RE.match(str(cid)):
        raise InputError(f"{where}: id must match {ID_RE.pattern}", path)
    if "device" in known and f.get("device") is None:
        f = {**f, "device": device}
    if f.get("device", device) == device:  # command-line nproc/nnodes: cells that do not set them
        f = {**{k: v for k, v in (launch or {}).items() if k in known}, **f}
    if "args" in f:
        if not isinstance(f["args"], dict):
            raise InputError(f"{where}: 'args' must be a mapping of flag -> value", path)
        f = {**f, "args": tuple(f["args"].items())}
    kw = {}
    try:
        for k, v in f.items():
            kw[k] = _coerce(v, hints[k], k)
        cell = cls(**kw)
        check_args(cell)
        cell.check_options()
    except (TypeError, ValueError) as e:
        raise InputError(f"{where}: {e}", path) from None
    if cell.timeout_s is not None and not 0 < cell.timeout_s < math.inf:
        raise InputError(f"{where}: timeout_s must be a finite number of seconds > 0, got {f.get('timeout_s')!r}", path)
    for fl in fields(cls):
        if fl.name in ("data", "source", "pipeline") and fl.name in known and not getattr(cell, fl.name):
            raise InputError(f"{where}: missing required field {fl.name!r}", path)
    return cell


def _check_refs(cell: Cell, seen: dict[str, Cell], path: Path) -> Cell:
    """References resolve to earlier cells of the right kind; globs in ``stores`` expand."""
    want = {"data": "prepare", "store": "encode", "stores": "encode", "init": "meta-init"}
    updates: dict[str, Any] = {}
    for name in cell.REF_FIELDS:
        val = getattr(cell, name)
        if val is None:
            continue
        items = val if isinstance(val, tuple) else (val,)
        resolved: list[str] = []
        for ref in items:
            matches = [i for i in seen if fnmatch.fnmatchcase(i, ref)] if any(
                ch in ref for ch in "*?[") else ([ref] if ref in seen else [])
            if not matches:
                raise InputError(f"cell {cell.id!r}: {name}={ref!r} names no earlier cell", path)
            for m in matches:
                if seen[m].kind != want[name]:
                    raise InputError(f"cell {cell.id!r}: {name}={m!r} is a {seen[m].kind} cell, "
                                     f"expected {want[name]}", path)
            resolved.extend(matches)
        if isinstance(val, tuple) and tuple(resolved) != val:
            updates[name] = tuple(resolved)
    if updates:
        cell = dataclasses.replace(cell, **updates)
    for dep in cell.needs:
        if dep not in seen:
            raise InputError(f"cell {cell.id!r}: needs {dep!r}, which is not an earlier cell", path)
    if cell.id in seen:
        raise InputError(f"duplicate cell id {cell.id!r}", path)
    return cell
