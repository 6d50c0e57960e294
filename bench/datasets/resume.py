"""Resumable decoding for ``prepare``: decoded chunks kept in its work folder (``bench.workdir``); a chunk
whose files changed is refused, nothing decoded under other settings is reused (files: docs/datasets.md)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from bench import workdir
from bench.atomic import atomic_open, atomic_write_json
from bench.errors import InputError
from bench.outputs import read_json
from bench.workdir import InputRefused

if TYPE_CHECKING:
    from bench.datasets.config import PrepareConfig

__all__ = ["InputRefused", "prepare_work"]
CHUNK_IMAGES = 1024  # images per committed chunk (fewer for big sides: ``CHUNK_BYTES``)
CHUNK_BYTES = 256 << 20  # pixels per chunk at most
UNUSED_BY_DECODE = ("workers", "jpeg_quality")  # config keys that change no decoded pixel


def work_path(out: Path) -> Path:
    return workdir.work_path(out, "prepare")


def chunk_length(size: int | None) -> int:
    """Images per chunk for side ``size`` (``None``: native sizes)."""
    if size is None:
        return CHUNK_IMAGES
    return max(1, min(CHUNK_IMAGES, CHUNK_BYTES // (size * size * 3)))


def chunk_ranges(n: int, length: int) -> list[tuple[int, int]]:
    return [(s, min(n, s + length)) for s in range(0, n, length)]


@dataclass
class Chunk:
    """Files ``[start, end)`` decoded: kept indices, skipped records, each kept file's own ``[H, W]``,
    (native) the kept images, the files' fingerprint, kept files with an EXIF orientation other than 1."""

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
    """A split's finished chunks: images uint8 ``[N, S, S, 3]`` (first ``rows`` rows filled) or (native) a list."""

    images: np.ndarray | list[np.ndarray]
    length: int
    chunks: int = 0
    rows: int = 0
    kept: list[int] = field(default_factory=list)
    skipped: list[dict[str, str]] = field(default_factory=list)
    own: list[list[int]] = field(default_factory=list)
    oriented: list[int] = field(default_factory=list)

    def add(self, ch: Chunk) -> None:
        self.kept += ch.kept
        self.skipped += ch.skipped
        self.own += ch.own
        self.oriented += ch.oriented
        if isinstance(self.images, list):
            self.images += ch.images or []
        self.rows += len(ch.kept)
        self.chunks += 1

    def done(self, n: int) -> int:
        return min(n, self.chunks * self.length)


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
    """What the decoded chunks depend on (the work folder's job)."""
    from bench.datasets.resize import resample_info

    return {"config": {k: v for k, v in cfg.to_dict().items() if k not in UNUSED_BY_DECODE},
            "resample": resample_info()}


@dataclass(frozen=True)
class PrepareWork:
    """An open work folder; ``split(k, name)`` gives each split its files there."""

    folder: Path
    root: Path
    log: Callable[[str], None] | None = None
    shared: dict = field(default_factory=dict, compare=False)  # state the splits' decodes share (test hook)

    def split(self, index: int, name: str) -> SplitWork:
        return SplitWork(self, index, name)

    def committed(self) -> int:
        """Files in committed chunks (0: nothing to resume)."""
        recs = [read_json(p) for p in self.folder.glob("split*.chunk*.json")] if self.folder.is_dir() else []
        return sum(r["end"] - r["start"] for r in recs if isinstance(r, dict) and {"start", "end"} <= set(r))


@contextlib.contextmanager
def prepare_work(out: Path, cfg: PrepareConfig, log: Callable[[str], None] | None = None) -> Iterator[PrepareWork]:
    """``out``'s work folder for the resolved ``cfg``, removed once the block ends normally."""
    folder, job = work_path(out), workdir.jsonable(fingerprint(cfg))

    def same(old: dict) -> dict:  # chunks decoded with --on-error fail hold no skipped file: `skip` reuses them
        was = old.get("config") or {}
        if was.get("on_error") == "fail" and job["config"].get("on_error") == "skip":
            return {**old, "config": {**was, "on_error": "skip"}}
        return old

    work = PrepareWork(folder, Path(cfg.root or out.parent), log)
    kept = lambda f: f"{work.committed():,} decoded images" if work.committed() else None  # noqa: E731
    with workdir.opened(folder, "prepare", job, kept, log, same):
        yield work
    workdir.remove(folder, "prepare")


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
        """The split's ``Decoding`` from its committed chunks (``shape``: ``(N, S, S, 3)`` or None for native sizes);
        an ``InputError`` when a chunk's files changed since or the split has another number of files."""
        n = len(paths)
        want = {"name": self.name, "count": n, "shape": None if shape is None else list(shape)}
        rec = read_json(self._path("json"))
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
            r = read_json(self._chunk(c, "json"))
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
