"""Atomic writes: a temp file or folder beside the target (``bench.outputs.temp_name``), renamed into place."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench import outputs
from bench.errors import InputError


@contextlib.contextmanager
def atomic_open(path: str | Path) -> Iterator[Any]:
    """A binary file to write ``path`` through: a temp file fsynced and renamed over ``path`` when the block
    ends normally, removed when it raises (``path`` untouched)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = outputs.make_temp_file(path)
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    with atomic_open(path) as f:
        f.write(data)


def atomic_write_text(path: str | Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | Path, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


@contextlib.contextmanager
def atomic_dir(final: str | Path, kind: str | None = None, overwrite: bool = False) -> Iterator[Path]:
    """A temp folder beside ``final``, marked as ``kind`` and renamed to ``final`` on success (removed on error).
    With ``overwrite`` an existing ``final`` is replaced only when it is this project's ``kind`` output (or an
    empty folder) holding nothing it did not write: ``claim`` checked before any work, this is the last line."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = outputs.make_temp_dir(final, ".partial")
    try:
        yield tmp
        if kind is not None:
            outputs.write_marker(tmp, kind)
        if final.exists() or final.is_symlink():
            if not overwrite:
                raise FileExistsError(f"{final} already exists")
            own = final.is_dir() and not final.is_symlink() and (
                not any(final.iterdir()) or (kind is not None and outputs.is_own(final, kind)))
            if not own:
                raise InputError(f"{final}: not a {kind or 'folder'} output of inr-bench; refusing to replace it")
            foreign = outputs.foreign_entries(final, kind) if kind is not None else []
            if foreign:  # added while this command ran (``claim`` checked before it started)
                raise InputError(f"{final}: {outputs.foreign_message(final, foreign)}; refusing to replace it")
            old = outputs.make_temp_dir(final, ".old")
            try:
                os.replace(final, old)  # onto the empty temp folder: atomic
                os.replace(tmp, final)
            except BaseException:  # an interrupt between the renames: the old output goes back
                if not (final.exists() or final.is_symlink()):
                    os.replace(old, final)
                with contextlib.suppress(OSError):
                    old.rmdir()  # still the empty temp folder
                raise
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def create_marked_dir(folder: str | Path, marker: str, doc: Any) -> bool:
    """Create ``folder`` holding ``marker`` (JSON ``doc``) in one rename of a temp folder; False, creating
    nothing, when ``folder`` exists. Call it under the output's lock (a rename replaces an empty folder)."""
    folder = Path(folder)
    outputs.remove_stale_temps(folder)
    if folder.exists() or folder.is_symlink():
        return False
    tmp = outputs.make_temp_dir(folder, ".partial")
    try:
        atomic_write_json(tmp / marker, doc)
        os.replace(tmp, folder)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return True
