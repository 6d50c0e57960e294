"""Atomic writes: a temp file (or folder) beside the target, renamed into place.

An interrupted writer never leaves a half-written file or dataset that looks complete.
Temporaries are named ``.<name>.inrbench-XXXX.tmp|partial|old`` (``bench.outputs``), so a later
run of a command writing the same output can recognize and remove what a killed run left, and
they get the permissions the umask gives, like any other file.
"""

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
    """A binary file to write ``path`` through: a temp file in the same folder, fsynced and renamed
    over ``path`` when the block ends normally, removed when it raises (``path`` untouched)."""
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
    """Write ``data`` to ``path`` via a temp file in the same folder + ``os.replace``."""
    with atomic_open(path) as f:
        f.write(data)


def atomic_write_text(path: str | Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | Path, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


@contextlib.contextmanager
def atomic_dir(final: str | Path, kind: str | None = None, overwrite: bool = False) -> Iterator[Path]:
    """Yield a temp folder beside ``final``; on success rename it to ``final``.

    On any exception the temp folder is removed and ``final`` is untouched. ``kind`` (a
    ``bench.outputs`` kind) marks the new folder as this project's output of that kind. With
    ``overwrite`` an existing ``final`` is replaced only after the new one is complete, and only
    when it is an output of the same ``kind`` this project wrote (or an empty folder) and holds
    nothing it did not write (``bench.outputs.foreign_entries``): callers check with
    ``bench.outputs.claim`` before any work; this is the last line of defence.
    """
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
    """Create ``folder`` holding ``marker`` (JSON ``doc``) in one step: both are written in a temp folder
    beside it, which is then renamed into place. Returns False, creating nothing, when ``folder`` exists.

    A work folder made this way exists only with its marker, so a folder at that name without one
    (even an empty one) was made by someone else and is never used or removed. A killed call leaves only
    its own temp folder (``bench.outputs.remove_stale_temps(folder)`` removes it). Call it under the
    output's lock: ``os.replace`` onto a folder made between the check and the rename would take its
    place if that folder were empty.
    """
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
