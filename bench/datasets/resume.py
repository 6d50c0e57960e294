"""Resumable decoding for ``prepare``: decoded chunks kept in a work folder beside the output.

A source that decodes image files (``Source.resumable``: imagefolder, flowers102, mini-imagenet)
decodes each split in chunks of ``chunk_length`` images, and ``prepare`` commits every finished
chunk to the work folder ``.OUT.inrbench-prepare.work`` beside ``OUT`` (``work_path``): a killed
run loses at most the chunk in progress, and a rerun with the same settings and the same
source files decodes only the rest. Layout::

    work.json                 what the folder is for (its marker and fingerprint): kind
                              "prepare-work", schema_version, config (the resolved
                              ``PrepareConfig.to_dict()``), resample (PIL version, filter)
    split<k>.json             the source's k-th split: name, count of files (after --limit),
                              shape, images per chunk
    split<k>.pixels.npy       uint8 [files, S, S, 3] memmap; its first rows hold the kept images
                              of the committed chunks, in order (a skipped file takes no row)
    split<k>.chunk<c>.json    committed chunk c (written last, atomically: the commit): its
                              range [start, end) of the split's files, each file's [path relative
                              to --root, size, mtime_ns] (stat before decoding), the kept
                              indices, the ``--on-error skip`` records, the kept files with an
                              EXIF orientation other than 1 (``oriented``); --size native: each kept
                              image's [H, W] and its file's own [H, W]
    split<k>.chunk<c>.npy     --size native only: the chunk's kept images, flat uint8

A rerun compares its own fingerprint with ``work.json``: other settings (``workers`` and
``jpeg_quality`` aside, which change no decoded pixel) or another PIL are refused with one line
naming the folder, as ``encode`` refuses a work folder of other settings; so is a committed
chunk whose files changed since (other size, mtime or name). Nothing decoded under other
settings or from other bytes is ever reused. One change is accepted: ``--on-error fail`` ->
``skip`` (a run stopped by an unreadable file, rerun to skip it), since chunks committed under
``fail`` hold no skipped file; ``work.json`` then says ``skip``, so the reverse is refused. The folder is created with its
``work.json`` in one rename (``bench.atomic.create_marked_dir``), so a folder at that name without
``work.json`` of ``prepare``, even an empty one, is someone else's: refused and never removed. The folder is removed once the prepared folder is
written, and when a run fails before committing any chunk (nothing in it to resume).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from bench.atomic import atomic_open, atomic_write_json, create_marked_dir
from bench.errors import InputError
from bench.outputs import TEMP_TAG

if TYPE_CHECKING:
    from bench.datasets.config import PrepareConfig

WORK_KIND = "prepare-work"
WORK_SCHEMA = 2  # 2: chunk records list the files with an EXIF orientation
WORK_JSON = "work.json"
CHUNK_IMAGES = 1024  # images per committed chunk (fewer for big sides: ``CHUNK_BYTES``)
CHUNK_BYTES = 256 << 20  # pixels per chunk at most (a 4096 x 4096 prepare commits every 5 images)
UNUSED_BY_DECODE = ("workers", "jpeg_quality")  # config keys that change no decoded pixel


def work_path(out: Path) -> Path:
    """The work folder of the prepared folder ``out``: ``.<name>.inrbench-prepare.work`` beside it."""
    return out.with_name(f".{out.name}.{TEMP_TAG}prepare.work")


def chunk_length(size: int | None) -> int:
    """Images per chunk for side ``size`` (``None``: native sizes)."""
    if size is None:
        return CHUNK_IMAGES
    return max(1, min(CHUNK_IMAGES, CHUNK_BYTES // (size * size * 3)))


def chunk_ranges(n: int, length: int) -> list[tuple[int, int]]:
    """``(start, end)`` of the chunks of ``n`` files; chunk ``c`` is ``split<k>.chunk<c>``."""
    return [(s, min(n, s + length)) for s in range(0, n, length)]


@dataclass
class Chunk:
    """One decoded chunk ``[start, end)`` of a split's files.

    kept: indices (into the split's files) of the readable ones; skipped: ``{"file", "error"}``
    per unreadable one; own: each kept file's own ``[H, W]``; images: (native) the kept uint8
    ``[H_i, W_i, 3]`` (fixed sizes live in ``Decoding.images``); files: the fingerprint of its files;
    oriented: indices of kept files with an EXIF orientation other than 1 (recorded, not applied).
    """

    start: int
    end: int
    kept: list[int]
    skipped: list[dict[str, str]]
    own: list[list[int]]
    images: list[np.ndarray] | None = None
    files: list | None = None
    oriented: list[int] = field(default_factory=list)


@dataclass
class Decoding:
    """A split's decode so far (the finished chunks).

    images: uint8 ``[N, S, S, 3]`` whose first ``rows`` rows hold the kept images, compacted; or
    (native) the list of kept uint8 ``[H_i, W_i, 3]``. length: images per chunk.
    """

    images: np.ndarray | list[np.ndarray]
    length: int
    chunks: int = 0
    rows: int = 0
    kept: list[int] = field(default_factory=list)
    skipped: list[dict[str, str]] = field(default_factory=list)
    own: list[list[int]] = field(default_factory=list)
    oriented: list[int] = field(default_factory=list)

    def add(self, ch: Chunk) -> None:
        """Account for a chunk whose fixed-size images are already in rows ``rows ..``."""
        self.kept += ch.kept
        self.skipped += ch.skipped
        self.own += ch.own
        self.oriented += ch.oriented
        if isinstance(self.images, list):
            self.images += ch.images or []
        self.rows += len(ch.kept)
        self.chunks += 1

    def done(self, n: int) -> int:
        """Files of the finished chunks, of ``n``."""
        return min(n, self.chunks * self.length)


def _json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def file_fingerprint(paths: Sequence[Path], root: Path) -> list:
    """``[path relative to root, size, mtime_ns]`` per file (``-1`` where it cannot be stat'ed)."""
    out = []
    for p in paths:
        try:
            st = os.stat(p)
        except OSError:
            try:
                st = os.lstat(p)  # a dangling symlink: its own
            except OSError:
                st = None
        rel = os.path.relpath(p, root)
        out.append([rel, -1, -1] if st is None else [rel, int(st.st_size), int(st.st_mtime_ns)])
    return out


def fingerprint(cfg: PrepareConfig) -> dict:
    """What a work folder's chunks depend on (``work.json``)."""
    from bench.datasets.resize import resample_info

    return {"kind": WORK_KIND, "written_by": "inr-bench", "schema_version": WORK_SCHEMA,
            "config": cfg.to_dict(), "resample": resample_info()}


def _compared(doc: dict) -> dict:
    cfg = {k: v for k, v in (doc.get("config") or {}).items() if k not in UNUSED_BY_DECODE}
    return json.loads(json.dumps({"schema_version": doc.get("schema_version"), "config": cfg,
                                  "resample": doc.get("resample")}, default=str))


def _differ(a: dict, b: dict) -> list[str]:
    """Dotted keys (two levels) where two fingerprints differ."""
    out = []
    for k in sorted(set(a) | set(b)):
        x, y = a.get(k), b.get(k)
        if isinstance(x, dict) and isinstance(y, dict):
            out += [f"{k}.{s}" for s in sorted(set(x) | set(y)) if x.get(s) != y.get(s)]
        elif x != y:
            out.append(k)
    return out


def _open(folder: Path, fp: dict) -> None:
    """Create the work folder, or check that an existing one holds chunks of these very settings."""
    if folder.is_symlink() or (folder.exists() and not folder.is_dir()):
        raise InputError("exists and is not a prepare work folder; refusing to use or remove it", folder)
    if create_marked_dir(folder, WORK_JSON, fp):  # the folder and its work.json appear together
        return
    old = _json(folder / WORK_JSON)
    if not isinstance(old, dict) or old.get("kind") != WORK_KIND:
        raise InputError("exists and is not a prepare work folder (no work.json of inrbench prepare); "
                         "refusing to use or remove it (an empty one may be left by an older inr-bench "
                         "killed while creating it: delete it to start over)", folder)
    was = _compared(old)
    # chunks decoded with --on-error fail hold no skipped file: they are what `skip` decodes too
    relaxed = was["config"].get("on_error") == "fail" and fp["config"].get("on_error") == "skip"
    if relaxed:
        was["config"]["on_error"] = "skip"
    diff = _differ(was, _compared(fp))
    if diff:
        raise InputError(f"holds images decoded with other settings ({', '.join(diff[:6])} "
                         f"{'differs' if len(diff) == 1 else 'differ'}); "
                         "delete it to start over, or rerun with those settings to resume", folder)
    if relaxed:
        atomic_write_json(folder / WORK_JSON, fp)  # now `skip`: the reverse is refused


@dataclass(frozen=True)
class PrepareWork:
    """An open work folder (``prepare_work``); ``split(k, name)`` gives each split its files there."""

    folder: Path
    root: Path
    log: Callable[[str], None] | None = None
    shared: dict = field(default_factory=dict, compare=False)  # state the splits' decodes share (test hook)

    def split(self, index: int, name: str) -> SplitWork:
        return SplitWork(self, index, name)

    def committed(self) -> int:
        """Files in committed chunks (0: nothing to resume)."""
        recs = [_json(p) for p in self.folder.glob("split*.chunk*.json")] if self.folder.is_dir() else []
        return sum(r["end"] - r["start"] for r in recs if isinstance(r, dict) and {"start", "end"} <= set(r))


class InputRefused(InputError):
    """A refusal of the decoded input as a whole (a class or a split left with no image): the same command
    would decode to it again, and a fixed source no longer matches the decoded chunks, so the work
    folder is removed rather than kept for a resume."""


@contextlib.contextmanager
def prepare_work(out: Path, cfg: PrepareConfig, log: Callable[[str], None] | None = None) -> Iterator[PrepareWork]:
    """Open (or create, or check) ``out``'s work folder for the resolved ``cfg``; remove it when the
    block ends normally (the prepared folder is written), or fails before any chunk was committed."""
    folder = work_path(out)
    _open(folder, fingerprint(cfg))
    work = PrepareWork(folder, Path(cfg.root or out.parent), log)
    try:
        yield work
    except BaseException as e:
        kept = work.committed()
        if not kept or isinstance(e, InputRefused):
            shutil.rmtree(folder, ignore_errors=True)
        elif log is not None and not (isinstance(e, InputError) and e.path == folder):  # not a refusal of it
            log(f"prepare: {kept:,} decoded images are kept in {folder}: rerun the same command to resume "
                "(or delete it)")
        raise
    shutil.rmtree(folder, ignore_errors=True)


@dataclass(frozen=True)
class SplitWork:
    """Split ``index`` (``name``) of an open work folder: restores its committed chunks, commits new ones."""

    work: PrepareWork
    index: int
    name: str

    def _path(self, what: str) -> Path:
        return self.work.folder / f"split{self.index}.{what}"

    def _chunk(self, c: int, ext: str) -> Path:
        return self._path(f"chunk{c:05d}.{ext}")

    def open(self, paths: Sequence[Path], shape: tuple[int, ...] | None) -> Decoding:
        """The split's ``Decoding`` restored from its committed chunks (a fresh one when there are none).

        shape: ``(N, S, S, 3)``, or ``None`` for native sizes. Raises ``InputError`` when a committed
        chunk's files changed since, or the split now has another number of files.
        """
        n = len(paths)
        want = {"name": self.name, "count": n, "shape": None if shape is None else list(shape)}
        rec = _json(self._path("json"))
        chunks = self._records(rec)
        if chunks and {k: rec.get(k) for k in want} != want:
            raise InputError(f"holds images of split {rec.get('name')!r} decoded from {rec.get('count')} files, "
                             f"this run reads {n} for split {self.name!r}; delete it to start over, or restore "
                             "the source to resume", self.work.folder)
        pixels = self._pixels(shape) if chunks and shape is not None else None
        if not chunks or (shape is not None and pixels is None):
            return self._fresh(want, shape)
        st = Decoding(images=[] if shape is None else pixels, length=int(rec["chunk"]))
        for c, r in enumerate(chunks):
            s, e = r["start"], r["end"]
            now = file_fingerprint(paths[s:e], self.work.root)
            changed = next((i for i, (a, b) in enumerate(zip(r["files"], now, strict=True)) if a != b), None)
            if changed is not None:
                raise InputError(f"holds images decoded from {r['files'][changed][0]!r} as it was before (its name, "
                                 "size or mtime changed since); delete it to start over, or restore the file to "
                                 "resume", self.work.folder)
            st.add(Chunk(s, e, r["kept"], r["skipped"], r.get("own", []),
                         self._native_images(c, r) if shape is None else None, oriented=r["oriented"]))
        for stale in self.work.folder.glob(f"split{self.index}.chunk*"):  # past the restored prefix: redone
            if int(stale.name.split(".")[1].removeprefix("chunk")) >= len(chunks):
                stale.unlink()
        if self.work.log is not None:
            self.work.log(f"prepare: resuming {self.name}, {st.done(n):,} of {n:,} images already decoded "
                          f"(work folder {self.work.folder})")
        return st

    def _records(self, rec: Any) -> list[dict]:
        """The committed chunks, in order, up to the first missing or unreadable one."""
        if not isinstance(rec, dict) or not isinstance(rec.get("chunk"), int) or not isinstance(rec.get("count"), int):
            return []
        out = []
        for c, (s, e) in enumerate(chunk_ranges(rec["count"], rec["chunk"])):
            r = _json(self._chunk(c, "json"))
            if not (isinstance(r, dict) and r.get("start") == s and r.get("end") == e
                    and isinstance(r.get("files"), list) and len(r["files"]) == e - s):
                break
            if rec.get("shape") is None and self._native_images(c, r) is None:
                break
            out.append(r)
        return out

    def _native_images(self, c: int, r: dict) -> list[np.ndarray] | None:
        try:
            flat = np.load(self._chunk(c, "npy"), allow_pickle=False)
            sizes = [(int(h), int(w)) for h, w in r["sizes"]]
            ends = np.cumsum([0] + [h * w * 3 for h, w in sizes])
            if flat.dtype != np.uint8 or flat.ndim != 1 or flat.size != ends[-1]:
                return None
        except (OSError, ValueError, KeyError, TypeError):
            return None
        return [flat[a:b].reshape(h, w, 3) for (h, w), a, b in zip(sizes, ends[:-1], ends[1:], strict=True)]

    def _pixels(self, shape: tuple[int, ...]) -> np.ndarray | None:
        try:
            mm = np.load(self._path("pixels.npy"), mmap_mode="r+")
        except (OSError, ValueError):
            return None
        return mm if mm.dtype == np.uint8 and mm.shape == tuple(shape) else None

    def _fresh(self, want: dict, shape: tuple[int, ...] | None) -> Decoding:
        """Start the split over: its old files (this folder's own) go, a new record and memmap come."""
        for p in self.work.folder.glob(f"split{self.index}.*"):
            p.unlink()
        length = chunk_length(None if shape is None else shape[1])
        images: np.ndarray | list = []
        if shape is not None:
            tmp = self._path("pixels.tmp.npy")
            np.lib.format.open_memmap(tmp, mode="w+", dtype=np.uint8, shape=tuple(shape)).flush()
            os.replace(tmp, self._path("pixels.npy"))
            images = np.load(self._path("pixels.npy"), mmap_mode="r+")
        atomic_write_json(self._path("json"), {**want, "chunk": length})
        return Decoding(images=images, length=length)

    def commit(self, c: int, ch: Chunk, st: Decoding) -> None:
        """Make chunk ``c`` (already added to ``st``) durable: its pixels first, then its record."""
        rec: dict[str, Any] = {"start": ch.start, "end": ch.end, "files": ch.files, "kept": ch.kept,
                               "skipped": ch.skipped, "oriented": ch.oriented}
        if isinstance(st.images, list):
            ims = ch.images or []
            rec.update(own=ch.own, sizes=[list(im.shape[:2]) for im in ims])
            flat = np.concatenate([np.ascontiguousarray(im).reshape(-1) for im in ims]) if ims else np.zeros(0, np.uint8)
            with atomic_open(self._chunk(c, "npy")) as f:
                np.save(f, flat)
        elif isinstance(st.images, np.memmap):
            st.images.flush()
        atomic_write_json(self._chunk(c, "json"), rec)
