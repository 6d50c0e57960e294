"""Claiming an output: the one place that decides whether a command may write to a path.
``claim`` refuses overlaps with inputs, foreign paths, and replaces that would delete what it did not
write; it locks beside ``out`` and removes stale temporaries (docs/output-safety.md)."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from bench.errors import InputError

MARKER = ".inrbench.json"
TEMP_TAG = "inrbench-"  # every temp name this project makes beside an output carries it
TEMP_SUFFIXES = (".partial", ".scratch", ".old", ".tmp")
MODES = ("new", "replace", "append")


def read_json(path: Path) -> object:
    """The JSON document at ``path``, or None when it is missing or unreadable."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _is_store(p: Path) -> bool:
    try:
        with open(p, "rb") as f:
            return f.read(8) in (b"INRSTORE", b"INRPACKZ")  # a store, or its packed at-rest form (inr.atrest)
    except OSError:
        return False


def _is_meta_init(p: Path) -> bool:
    """A learned initialization written by ``inrbench meta-init`` (a torch zip whose pickle names its format)."""
    import zipfile

    try:
        with zipfile.ZipFile(p) as z:
            pkl = [n for n in z.namelist() if n.endswith("/data.pkl")]
            return bool(pkl) and b"inr-bench meta-init" in z.read(pkl[0])
    except (OSError, zipfile.BadZipFile, KeyError):
        return False


def _is_env(p: Path) -> bool:
    m = read_json(p)
    return isinstance(m, dict) and {"schema_version", "git", "versions"} <= set(m)


def _gpu_check_layout(p: Path, name: str) -> bool:
    return name in ("gpu-check.json", "gpu-check.md", "gpu-check-logs.tar.gz", "work")


@dataclass(frozen=True)
class OutputKind:
    """What a command writes: a folder (known by its marker) or a file (known by ``is_file_kind``)."""

    name: str
    noun: str  # how messages call it: "prepared dataset folder", "INR store file"
    is_dir: bool
    is_file_kind: Callable[[Path], bool] | None = None
    layout: Callable[[Path, str], bool] | None = None  # a folder marked without entries: the names it writes


KINDS: dict[str, OutputKind] = {k.name: k for k in (
    OutputKind("prepared", "prepared dataset folder", True),
    OutputKind("store", "INR store file", False, _is_store),
    OutputKind("compare", "compare output folder", True),
    OutputKind("results", "results folder", True),
    OutputKind("report", "report folder", True),
    OutputKind("sweep", "sweep results folder", True),
    OutputKind("fit-cache", "fit cache folder", True),
    OutputKind("env", "environment record file", False, _is_env),
    OutputKind("gpu-check", "gpu-check output folder", True, layout=_gpu_check_layout),
    OutputKind("meta-init", "learned initialization file", False, _is_meta_init),
)}


def kind_of(name: str) -> OutputKind:
    if name not in KINDS:
        raise ValueError(f"unknown output kind {name!r}; known: {', '.join(KINDS)}")
    return KINDS[name]


def marker_kind(folder: Path) -> str | None:
    """The kind named by ``folder``'s marker, or ``None`` (no marker, unreadable)."""
    m = read_json(folder / MARKER)
    return m.get("kind") if isinstance(m, dict) else None


def write_marker(folder: Path, kind: str, *, entries: bool = True) -> None:
    """Mark ``folder`` as this project's ``kind`` output (atomically), listing what it holds now as what the
    command wrote (``entries``); ``entries=False`` for a folder filled after it is marked (its kind's layout)."""
    kind_of(kind)
    doc: dict[str, object] = {"kind": kind, "written_by": "inr-bench",
                              "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    if entries:
        doc["entries"] = {c.name: _tree_size(c) for c in sorted(folder.iterdir()) if c.name != MARKER}
    fd, tmp = make_temp_file(folder / MARKER)  # temp + rename (bench.atomic builds on this module)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(json.dumps(doc, indent=2, sort_keys=True, default=str) + "\n")
        os.replace(tmp, folder / MARKER)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def _tree_size(p: Path) -> int:
    if p.is_symlink() or not p.is_dir():
        return 0
    return sum(len(dirs) + len(files) for _, dirs, files in os.walk(p))


# what a desktop's file browser drops into any folder (and writes again): a replace may delete them
OS_FILES = frozenset({".DS_Store", "Thumbs.db", "desktop.ini"})


def is_own_temp(name: str) -> bool:
    return f".{TEMP_TAG}" in name and name.endswith(TEMP_SUFFIXES)


def foreign_entries(folder: Path, kind: str) -> list[str]:
    """Entries of the ``kind`` output ``folder`` that inr-bench did not write (a replace would delete them):
    names, or ``name/`` where a folder it wrote holds more. The marker's ``entries`` decide, else the kind's layout (none: all)."""
    k = kind_of(kind)
    m = read_json(folder / MARKER)
    wrote = m.get("entries") if isinstance(m, dict) else None
    names = sorted(c.name for c in folder.iterdir()
                   if c.name != MARKER and not is_own_temp(c.name) and c.name not in OS_FILES)
    if isinstance(wrote, dict):
        foreign = []
        for n in names:
            if n not in wrote:
                foreign.append(n)
            elif isinstance(wrote[n], int) and _tree_size(folder / n) > wrote[n]:
                foreign.append(f"{n}/")
        return foreign
    return [n for n in names if k.layout is None or not k.layout(folder, n)]


def foreign_message(folder: Path, foreign: list[str]) -> str:
    shown = [f"{n} (more files than inr-bench wrote there)" if n.endswith("/") else n for n in foreign[:3]]
    what = ", ".join(shown) + (f" and {len(foreign) - 3} more" if len(foreign) > 3 else "")
    return f"holds {what}, which inr-bench did not write; move it out of {folder} to replace it"


def is_own(path: str | Path, kind: str) -> bool:
    """True when ``path`` is an existing output of ``kind`` that this project wrote."""
    k, p = kind_of(kind), Path(path)
    if k.is_dir:
        return p.is_dir() and marker_kind(p) == kind
    return p.is_file() and k.is_file_kind(p)


def _is_empty_dir(p: Path) -> bool:
    return p.is_dir() and not any(p.iterdir())


def _describe(p: Path) -> str:
    if p.is_symlink() and not p.exists():
        return "a dangling symlink"
    if p.is_dir():
        mk = marker_kind(p)
        own = next((k for k in KINDS.values() if k.is_dir and mk == k.name), None)
        return f"an existing {own.noun}" if own else "an existing folder that inr-bench did not write"
    own = next((k for k in KINDS.values() if not k.is_dir and k.is_file_kind(p)), None)
    return f"an existing {own.noun}" if own else "an existing file that inr-bench did not write"


def _a(noun: str) -> str:
    return ("an " if noun[0].lower() in "aeiou" or noun.startswith("INR") else "a ") + noun


def check_output(path: str | Path, kind: str, *, inputs: Mapping[str, object] | None = None,
                 mode: str = "new", option: str = "--out") -> Path:
    """``path`` resolved, or one ``InputError`` line where the command must not write (the module docstring).
    inputs: label -> path (or paths, or None) of everything the command reads. Writes nothing."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    k = kind_of(kind)
    raw = Path(path).expanduser()
    out = raw.resolve()
    where = f"{option} {raw}"
    for label, value in (inputs or {}).items():
        values = value if isinstance(value, (list, tuple)) else [value]
        for v in values:
            if v is None or str(v) == "":
                continue
            inp = Path(str(v)).expanduser().resolve()
            if out == inp:
                rel = f"is the {label} itself"
            elif inp in out.parents:
                rel = f"lies inside the {label} {v}"
            elif out in inp.parents:
                rel = f"contains the {label} {v}"
            else:
                continue
            raise InputError(f"{where}: {rel}; an output must not overlap an input (choose another {option})")
    for parent in out.parents:
        if parent.exists() and not parent.is_dir():
            raise InputError(f"{where}: {parent} is a file, not a folder")
    if raw.is_symlink() or out.exists():
        if k.is_dir and out.is_file():
            raise InputError(f"{where}: is a file, not {_a(k.noun)}; refusing to replace it")
        if not k.is_dir and out.is_dir():
            raise InputError(f"{where}: is a folder, not {_a(k.noun)}; refusing to replace it")
        if not out.exists():
            raise InputError(f"{where}: is {_describe(raw)}; refusing to write through it")
        if not (is_own(out, kind) or (k.is_dir and _is_empty_dir(out))):
            raise InputError(f"{where}: is {_describe(out)}, not {_a(k.noun)}; "
                             "inr-bench replaces only what it wrote itself (choose another path)")
        if mode == "new" and not _is_empty_dir(out):
            raise InputError(f"{where}: {k.noun} already exists (pass --overwrite to replace it)")
        if mode == "replace" and k.is_dir:
            foreign = foreign_entries(out, kind)
            if foreign:
                raise InputError(f"{where}: {foreign_message(out, foreign)} (or choose another {option})")
    return out


@contextlib.contextmanager
def claim(path: str | Path, kind: str, *, inputs: Mapping[str, object] | None = None, mode: str = "new",
          option: str = "--out", lock: bool = True) -> Iterator[Path]:
    """``check_output``, then hold the output's lock and clear stale temporaries while the body runs;
    yields the resolved path. Append-mode folders are created and marked here."""
    out = check_output(path, kind, inputs=inputs, mode=mode, option=option)
    out.parent.mkdir(parents=True, exist_ok=True)
    nested = _lock_path(out) in _HELD  # the command already holds it: its temporaries are live
    with output_lock(out, option) if lock else contextlib.nullcontext():
        if lock and not nested:
            remove_stale_temps(out)
        if mode == "append" and kind_of(kind).is_dir:
            out.mkdir(exist_ok=True)
            if marker_kind(out) is None:
                write_marker(out, kind, entries=False)  # it accumulates: never replaced whole
        yield out


def _lock_path(out: Path) -> Path:
    return beside(out, f"{TEMP_TAG}lock")


NAME_MAX = 255  # bytes of one file name (Linux, macOS)


def beside(out: Path, tail: str, reserve: int = 0) -> Path:
    """``.<out name>.<tail>`` beside ``out``; where that (plus ``reserve``) passes ``NAME_MAX`` bytes, the name
    is cut and a hash of it added: every legal output name gets legal, distinct side names."""
    name = f".{out.name}.{tail}"
    if len(os.fsencode(name)) + reserve <= NAME_MAX:
        return out.with_name(name)
    digest = hashlib.sha256(os.fsencode(out.name)).hexdigest()[:16]
    room = NAME_MAX - reserve - len(os.fsencode(f".~{digest}.{tail}"))
    return out.with_name(f".{os.fsdecode(os.fsencode(out.name)[:room])}~{digest}.{tail}")


_HELD: dict[Path, int] = {}  # lock file -> depth: a command and the library call inside it share one lock


@contextlib.contextmanager
def output_lock(out: Path, option: str = "--out") -> Iterator[None]:
    """Exclusive lock on ``out`` held by this process (a dead holder's lock is free again); re-entrant."""
    lp = _lock_path(out)
    if lp in _HELD:
        _HELD[lp] += 1
        try:
            yield
        finally:
            _HELD[lp] -= 1
        return
    while True:
        try:
            fd = os.open(lp, os.O_RDWR | os.O_CREAT, 0o666)
        except OSError as e:  # a folder that cannot hold the output: name the output, not the lock file beside it
            raise InputError(f"{option} {out}: cannot write in {out.parent}: {e.strerror or e or type(e).__name__}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode("ascii", "replace").strip() or "unknown"
            os.close(fd)
            raise InputError(f"{option} {out}: another inrbench process (pid {holder}) is writing it; "
                             "wait for it or choose another path") from None
        try:  # the file we locked must still be the lock file (a releaser unlinks it)
            same = os.fstat(fd).st_ino == os.stat(lp).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    _HELD[lp] = 1
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        del _HELD[lp]
        with contextlib.suppress(FileNotFoundError):
            os.unlink(lp)
        os.close(fd)


def temp_name(out: Path, suffix: str) -> str:
    """Prefix for ``tempfile`` names beside ``out`` (``.<name>.inrbench-XXXX<suffix>``)."""
    assert suffix in TEMP_SUFFIXES, suffix
    return beside(out, TEMP_TAG, reserve=8 + len(suffix)).name  # mkstemp adds 8 characters, then the suffix


def _is_stale_temp(name: str, out: Path) -> bool:
    """Exactly the names ``temp_name`` + ``tempfile`` make (8 random characters): nothing else."""
    suffix = name[name.rfind("."):]
    if suffix not in TEMP_SUFFIXES:
        return False
    return re.fullmatch(re.escape(temp_name(out, suffix)) + r"[a-z0-9_]{8}" + re.escape(suffix), name) is not None


def remove_stale_temps(out: Path) -> list[Path]:
    """Remove temporaries beside ``out`` left by killed writers of ``out``; call under its lock. An ``.old``
    folder (a replace killed between its two renames, ``out`` missing) is put back at ``out``."""
    removed = []
    with contextlib.suppress(FileNotFoundError):
        olds = sorted((c for c in out.parent.iterdir() if c.name.endswith(".old") and _is_stale_temp(c.name, out)
                       and c.is_dir() and not c.is_symlink() and any(c.iterdir())),
                      key=lambda c: c.stat().st_mtime, reverse=True)
        if olds and not (out.exists() or out.is_symlink()):
            os.replace(olds[0], out)
        for c in out.parent.iterdir():
            if _is_stale_temp(c.name, out):
                if c.is_dir() and not c.is_symlink():
                    shutil.rmtree(c, ignore_errors=True)
                else:
                    with contextlib.suppress(FileNotFoundError):
                        c.unlink()
                removed.append(c)
    return removed


def _umask() -> int:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    old = os.umask(0o022)
    os.umask(old)
    return old


def make_temp_dir(out: Path, suffix: str) -> Path:
    """A fresh temp folder beside ``out`` with the permissions the umask gives (not 0700)."""
    tmp = Path(tempfile.mkdtemp(prefix=temp_name(out, suffix), suffix=suffix, dir=out.parent))
    os.chmod(tmp, 0o777 & ~_umask())
    return tmp


def make_temp_file(out: Path) -> tuple[int, Path]:
    """A fresh temp file beside ``out`` (fd, path), permissions from the umask (not 0600)."""
    fd, tmp = tempfile.mkstemp(prefix=temp_name(out, ".tmp"), suffix=".tmp", dir=out.parent)
    os.fchmod(fd, 0o666 & ~_umask())
    return fd, Path(tmp)
