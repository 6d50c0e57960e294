"""Paths a source reads stay inside its root, and each file is read once: ``inside_root`` for paths
from a csv or index, ``list_tree`` (symlinked folders below the top not followed) and ``ReadOnce``
(a file reached twice through a symlink is refused) for folder walks.
"""

from __future__ import annotations

import os
from pathlib import Path

from bench.errors import InputError


def inside_root(root: str | Path, rel: str | Path, where: str | Path, row: int | None = None) -> Path:
    """``root / rel`` resolved; an ``InputError`` naming ``where`` (and ``row``) when it is outside ``root``."""
    base = Path(root).resolve()
    at = f"row {row}: " if row is not None else ""
    try:
        path = (base / rel).resolve()
    except (ValueError, OSError) as e:  # an embedded NUL byte, a symlink loop
        raise InputError(f"{at}path {str(rel)!r} is not a usable path ({e})", where) from None
    if not path.is_relative_to(base):
        raise InputError(f"{at}path {str(rel)!r} resolves outside the dataset root {base}", where)
    return path


def cannot_read(e: OSError, path: str | Path) -> InputError:
    """One-line ``InputError`` for an ``OSError`` met while listing or opening ``path``."""
    return InputError(f"cannot read ({e.strerror or type(e).__name__})", e.filename or path)


def list_dir(folder: Path) -> list[Path]:
    """Entries of ``folder``, sorted; an unreadable folder is an ``InputError``."""
    try:
        with os.scandir(folder) as it:
            return sorted(folder / e.name for e in it)
    except OSError as e:
        raise cannot_read(e, folder) from None


def list_tree(folder: Path) -> list[Path]:
    """Every non-folder entry under ``folder``, sorted; symlinked folders below the top are not followed."""

    def fail(e: OSError) -> None:
        raise cannot_read(e, folder)

    out = []
    for top, _, files in os.walk(folder, onerror=fail, followlinks=False):
        out += [Path(top) / f for f in files]
    return sorted(out)


class ReadOnce:
    """Resolved paths already taken; ``take`` refuses a file reached twice (through a symlink)."""

    def __init__(self, root: str | Path):
        self.root = Path(root).resolve()
        self.seen: dict[Path, Path] = {}

    def inside(self, path: Path) -> Path:
        """``path`` resolved; an ``InputError`` naming it when it resolves outside the root."""
        real = Path(path).resolve()
        if not real.is_relative_to(self.root):
            raise InputError(f"is a symlink to {real}, outside the dataset root {self.root}", path)
        return real

    def take(self, path: Path) -> Path:
        """``path`` resolved, inside the root and not taken before (else an ``InputError`` naming it)."""
        real = self.inside(path)
        first = self.seen.setdefault(real, path)
        if first != path:
            raise InputError(f"is the same file as {first} (a symlink): the tree would be read twice", path)
        return real
