"""Sweep files -> a validated ``SweepConfig``: cells expanded from ``matrix``, ``defaults`` merged, references
resolved to earlier cells, every line checked by its command's parser. The format: ``docs/sweeps.md``."""

from __future__ import annotations

import dataclasses
import fnmatch
import importlib.resources
import itertools
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.errors import InputError
from bench.sweep import cells as C
from bench.sweep.cells import ID_RE, KINDS, Cell, Rendezvous, SweepContext

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

    def by_id(self) -> dict[str, Cell]:
        return {c.id: c for c in self.cells}

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "description": self.description, "device": self.device, "report": self.report,
                "source": self.source, "rendezvous": dataclasses.asdict(self.rendezvous),
                "cells": [c.to_dict() for c in self.cells]}


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
    """Read, expand and validate a sweep; ``device`` overrides the file's, ``nproc``/``nnodes`` fill the
    distributed cells on the sweep's device that do not set them."""
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
        C.check_name(str(name), what="the sweep's default folders runs/<name> and reports/<name>")
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
    host, _, port = (rdzv.endpoint or "").rpartition(":")
    if rdzv.endpoint is not None and (not host or not port.isdigit() or not 0 < int(port) < 65536):
        raise InputError(f"--rdzv-endpoint {rdzv.endpoint!r}: expected HOST:PORT (e.g. node0.cluster:29500)")
    launch = {k: v for k, v in (("nproc", nproc), ("nnodes", nnodes)) if v is not None}
    raw_cells = doc.get("cells")
    if not isinstance(raw_cells, list) or not raw_cells:
        raise InputError("'cells' must be a non-empty list", path)

    cells: list[Cell] = []
    seen: dict[str, Cell] = {}
    probe = SweepContext(out=Path("/probe"), data_root=Path("/probe/data-root"), cells=seen)  # outputs to parse
    for i, raw in enumerate(raw_cells):
        where = f"cell #{i + 1}"
        if not isinstance(raw, dict):
            raise InputError(f"{where}: must be a mapping", path)
        kind = raw.get("kind")
        if kind not in KINDS:
            raise InputError(f"{where}: unknown kind {kind!r}; known: {', '.join(KINDS)}", path)
        for fields_ in _expand(raw, defaults.get(kind, {}), KINDS[kind].keys, path, where):
            if len(cells) == MAX_CELLS:
                raise InputError(f"more than {MAX_CELLS:,} cells, more than a sweep may hold", path)
            cell = _build(KINDS[kind], fields_, dev, path, where, launch)
            if cell.nnodes > 1 and not rdzv.endpoint:
                raise InputError(f"cell {cell.id!r}: nnodes {cell.nnodes} needs a rendezvous: pass "
                                 "--rdzv-endpoint HOST:PORT (a node every node reaches) to inrbench sweep", path)
            cell = _check_refs(cell, seen, path)
            seen[cell.id] = cell
            try:
                cell.check(probe)
            except ValueError as e:
                raise InputError(f"cell {cell.id!r}: {e}", path) from None
            cells.append(cell)
    return SweepConfig(name=str(name), description=description, device=dev,
                       report=bool(doc.get("report", True)), cells=tuple(cells), source=str(path), rendezvous=rdzv)


def _check_size(doc: Any, path: Path) -> None:
    """Refuse more than ``MAX_NODES`` values once YAML aliases are expanded (an alias bomb), counted without expanding."""
    seen, stack = 0, [doc]
    while stack:
        node = stack.pop()
        seen += 1
        if seen > MAX_NODES:
            raise InputError(f"more than {MAX_NODES:,} values once its YAML aliases (*name) are expanded: "
                             "an alias bomb or a mistake", path)
        if isinstance(node, (dict, list)):
            stack.extend([*node.keys(), *node.values()] if isinstance(node, dict) else node)


def _format_id(template: str, fields_: dict, path: Path, where: str) -> str:
    """A cell's ``id`` template filled in: ``{name}`` or ``{name[key]}`` only, the result at most ``ID_MAX`` long."""
    import string

    try:
        for _, name, spec, _ in string.Formatter().parse(template):
            if name is not None and not FIELD_RE.match(name):
                raise ValueError(f"{{{name}}}: a field is a name, or name[key] (no attribute access)")
            if name is not None and ("{" in (spec or "") or any(int(n) > ID_MAX for n in re.findall(r"\d+", spec or ""))):
                raise ValueError(f"{{{name}:{spec}}}: widths and precisions are at most {ID_MAX}")
        out = template.format(**fields_)
    except (KeyError, IndexError, ValueError, TypeError, AttributeError) as e:
        bad = str(e) if isinstance(e, ValueError) and str(e).startswith("{") else f"{type(e).__name__}: {e}"
        raise InputError(f"{where}: cannot format id {_short(template)}: {bad[:120]}", path) from None
    if len(out) > ID_MAX:
        raise InputError(f"{where}: id {_short(out)} is {len(out)} characters long, at most {ID_MAX}", path)
    return out


def _short(text: str, limit: int = 80) -> str:
    r = repr(text)
    return r if len(r) <= limit else f"{r[:limit]}...' ({len(text)} characters)"


def _expand(raw: dict, defaults: dict, known: set[str], path: Path, where: str) -> list[dict]:
    """One cell mapping with an optional ``matrix`` -> one mapping per combination. A scalar matrix key the kind
    does not know, and a dict item's ``label``, only name the combination (in the id) and are dropped."""
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


def _int(f: dict, key: str, where: str, path: Path) -> int:
    v = f.get(key, 1)
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        more = " >= 1" if isinstance(v, int) and not isinstance(v, bool) else ""
        raise InputError(f"{where}: {key} must be an integer{more}, got {v!r}", path)
    return v


def _build(kind: C.Kind, f: dict, device: str, path: Path, where: str, launch: dict) -> Cell:
    """One expanded cell mapping -> a ``Cell`` whose line its command's parser and checks accept."""
    cid = f.get("id")
    where = f"cell {cid!r}" if cid else where
    if not ID_RE.match(str(cid)):
        raise InputError(f"{where}: id must match {ID_RE.pattern}", path)
    args = f.get("args") or {}
    if not isinstance(args, dict):
        raise InputError(f"{where}: 'args' must be a mapping of flag -> value", path)
    own = {k: v for k, v in f.items() if k not in (*C.COMMON, *C.LAUNCH)}
    if kind.command is None:
        unknown = set(f) - kind.keys
        if unknown:
            raise InputError(f"{where}: unknown fields {sorted(unknown)} for kind {kind.name!r}; "
                             f"known: {sorted(kind.keys)}", path)
        own = {"command": [str(a) for a in own.get("command") or ()], **({"args": args} if args else {})}
    else:
        opts: dict[str, Any] = {}
        try:
            if not kind.distributed and set(f) & set(C.LAUNCH):
                raise ValueError(f"unknown fields {sorted(set(f) & set(C.LAUNCH))} for kind {kind.name!r}")
            for what, src in (("field", own), ("args key", args)):
                for k, v in src.items():
                    C.check_option(kind, k, v, what)
                    name = k.replace("-", "_")
                    if name in opts:
                        raise ValueError(f"{what} {k!r} sets {name!r} a second time")
                    if v is not None:
                        opts[name] = v
            C.check_name(str(opts.get("name", "")))
            if not isinstance(opts.get("fit_cache", False), bool):
                raise ValueError(f"fit_cache must be true/false, got {opts['fit_cache']!r}")
            if "store" in opts and "stores" in opts:
                raise ValueError("set 'store' or 'stores', not both")
        except ValueError as e:
            raise InputError(f"{where}: {e}", path) from None
        if kind.positional and kind.positional not in opts:
            raise InputError(f"{where}: missing required field {kind.positional!r}", path)
        if "device" in kind.options:
            opts.setdefault("device", device)
        if kind.distributed and opts.get("device", device) == device:  # --nproc/--nnodes: cells not setting them
            f = {**launch, **f}
        own = opts
    timeout = f.get("timeout_s")
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float))
                                or not 0 < timeout < math.inf):
        raise InputError(f"{where}: timeout_s must be a finite number of seconds > 0, got {timeout!r}", path)
    needs = f.get("needs") or []
    if not isinstance(needs, list) or not all(isinstance(n, str) for n in needs):
        raise InputError(f"{where}: 'needs' must be a list of cell ids", path)
    world = {k: _int(f, k, where, path) for k in C.LAUNCH} if kind.distributed else {}
    return Cell(id=str(cid), kind=kind.name, fields=own, needs=tuple(needs),
                timeout_s=None if timeout is None else float(timeout), **world)


def _check_refs(cell: Cell, seen: dict[str, Cell], path: Path) -> Cell:
    """References name earlier cells of the right kind; globs in ``stores`` expand."""
    fields = dict(cell.fields)
    for key, want in C.REFS.items():
        val = fields.get(key)
        if val is None:
            continue
        many = isinstance(val, list)
        resolved: list[str] = []
        for ref in val if many else [val]:
            if not isinstance(ref, str):
                raise InputError(f"cell {cell.id!r}: {key}={ref!r} must name a cell", path)
            glob = many and any(ch in ref for ch in "*?[")
            matches = [i for i in seen if fnmatch.fnmatchcase(i, ref)] if glob else [ref] if ref in seen else []
            if not matches:
                raise InputError(f"cell {cell.id!r}: {key}={ref!r} names no earlier cell", path)
            for m in matches:
                if seen[m].kind != want:
                    raise InputError(f"cell {cell.id!r}: {key}={m!r} is a {seen[m].kind} cell, expected {want}", path)
            resolved.extend(matches)
        fields[key] = resolved if many else resolved[0]
    for dep in cell.needs:
        if dep not in seen:
            raise InputError(f"cell {cell.id!r}: needs {dep!r}, which is not an earlier cell", path)
    if cell.id in seen:
        raise InputError(f"duplicate cell id {cell.id!r}", path)
    return dataclasses.replace(cell, fields=fields)
