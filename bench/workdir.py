"""Work folders beside an output (``.<OUT>.inrbench-<command>.work``): what a killed ``prepare``, ``encode``
or ``meta-init`` did. Created with ``work.json`` in one rename; any other folder there is refused, untouched."""

from __future__ import annotations

import contextlib
import json
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

from bench.atomic import atomic_write_json, create_marked_dir
from bench.errors import InputError, older_artifact
from bench.jsontext import diff_keys
from bench.outputs import TEMP_TAG, beside, is_own_temp, read_json

WORK_JSON = "work.json"
SCHEMA = 3  # one schema for every command's work folder


class InputRefused(InputError):
    """The input as a whole is refused (a rerun would decode to it again): the work folder goes too."""


def _a(command: str) -> str:
    return ("an " if command[0] in "aeiou" else "a ") + command


def work_path(out: str | Path, command: str) -> Path:
    return beside(Path(out), f"{TEMP_TAG}{command}.work")


def jsonable(doc: object) -> object:
    """``doc`` as it reads back from JSON (tuples as lists, paths as text)."""
    return json.loads(json.dumps(doc, default=str))


def marker(folder: Path, command: str) -> dict | None:
    """``folder``'s ``work.json`` when it marks a work folder of ``command``, else None."""
    doc = read_json(folder / WORK_JSON)
    return doc if isinstance(doc, dict) and doc.get("kind") == f"{command}-work" else None


def check(folder: Path, command: str, job: dict, same: Callable[[dict], dict] | None = None) -> None:
    """``folder`` is ``command``'s work folder for ``job`` (else one ``InputError`` line naming what differs).
    ``same(old_job)``: the old job as this run sees it (a change that keeps the files valid); the marker is rewritten."""
    old = marker(folder, command)
    if old is None:
        raise InputError(f"exists and is not {_a(command)} work folder (no {WORK_JSON} of inrbench {command}); "
                         "refusing to use or remove it", folder)
    if old.get("schema_version") != SCHEMA:
        raise older_artifact(folder, old.get("schema_version"), f"delete it and rerun `inrbench {command}`")
    was, job = jsonable(old.get("job")), jsonable(job)
    now = same(was) if same is not None else was
    diff = diff_keys(now, job)
    if diff:
        raise InputError(f"holds the work of an inrbench {command} with other settings ({', '.join(diff[:6])} "
                         f"{'differs' if len(diff) == 1 else 'differ'}); delete it to start over, or rerun with "
                         "those settings to resume", folder)
    if now != was:
        atomic_write_json(folder / WORK_JSON, {**old, "job": job})


def create_or_check(folder: Path, command: str, job: dict, same: Callable[[dict], dict] | None = None) -> bool:
    """Create ``folder`` marked for ``job``, or ``check`` an existing one; True when this call created it."""
    if folder.is_symlink() or (folder.exists() and not folder.is_dir()):
        raise InputError(f"exists and is not {_a(command)} work folder; refusing to use or remove it", folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    job = jsonable(job)
    doc = {"kind": f"{command}-work", "written_by": "inr-bench", "schema_version": SCHEMA, "job": job}
    if create_marked_dir(folder, WORK_JSON, doc):
        return True
    check(folder, command, job, same)
    for c in folder.iterdir():  # a killed writer's temp file (the output's lock is held: none is live)
        if is_own_temp(c.name) and c.is_file():
            c.unlink()
    return False


def remove(folder: Path, command: str) -> None:
    """Remove ``command``'s work folder; never a folder without its marker."""
    if folder.is_dir() and not folder.is_symlink() and marker(folder, command) is not None:
        shutil.rmtree(folder, ignore_errors=True)


@contextlib.contextmanager
def opened(folder: Path, command: str, job: dict, kept: Callable[[Path], str | None],
           log: Callable[[str], None] | None = None, same: Callable[[dict], dict] | None = None) -> Iterator[Path]:
    """``create_or_check`` for the block. If it fails, ``kept(folder)`` says what is there to resume
    (``log`` is told) or None: the folder goes. A refusal of the folder itself leaves it untouched."""
    create_or_check(folder, command, job, same)
    try:
        yield folder
    except BaseException as e:
        if isinstance(e, InputError) and e.path == folder:
            raise
        what = None if isinstance(e, InputRefused) or not folder.is_dir() else kept(folder)
        if what is None:
            remove(folder, command)
        elif log is not None:
            log(f"{command}: {what} are kept in {folder}: rerun the same command to resume (or delete it)")
        raise
