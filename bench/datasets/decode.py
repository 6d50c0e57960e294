"""Decode image files to uint8 arrays in a thread pool, chunk by chunk, ``--on-error fail|skip``; headers
are checked first (``--max-pixels``, a shared memory budget) against hostile images (docs/datasets.md)."""

from __future__ import annotations

import os
import tempfile
import threading
import warnings
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

import numpy as np
from PIL import Image

from bench.datasets.config import DEFAULT_MAX_PIXELS
from bench.datasets.prepared import SplitData
from bench.datasets.resize import NATIVE_POLICY, native_image, resize_image
from bench.datasets.resume import Chunk, Decoding, chunk_length, chunk_ranges, file_fingerprint
from bench.datasets.splitting import limit_indices
from bench.errors import InputError

if TYPE_CHECKING:
    from bench.datasets.config import PrepareConfig
    from bench.datasets.resume import SplitWork

MEMMAP_BYTES = 1 << 30  # bigger splits are decoded into a memory-mapped scratch file, not RAM

STOP_ENV = "INRBENCH_TEST_PREPARE_STOP"  # test hook (``_StopHook``)

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".webp", ".ppm", ".tif", ".tiff")

DECODE_BUDGET_BYTES = 2 << 30  # decode memory of all threads together (estimated by ``decode_bytes``)
MODE_BYTES = {"1": 1, "L": 1, "P": 1, "I;16": 2, "I;16L": 2, "I;16B": 2, "I;16N": 2}  # per pixel; 4 for the rest
CONVERT_BYTES = 16  # per pixel of the conversion to RGB (RGBA on black: three 4-byte copies + the result)

warnings.filterwarnings("error", category=Image.DecompressionBombWarning)


class ByteBudget:
    """A semaphore counted in bytes: a request larger than the whole budget waits until it is idle and
    runs alone, so one big image never deadlocks and a few are never decoded at once."""

    def __init__(self, total: int):
        if total < 1:
            raise ValueError(f"budget must be >= 1 byte, got {total}")
        self.total = self.free = int(total)
        self._cond = threading.Condition()

    @contextmanager
    def hold(self, nbytes: int) -> Iterator[None]:
        """Wait until ``nbytes`` (at most the whole budget) are free, hold them for the block."""
        n = min(max(int(nbytes), 0), self.total)
        with self._cond:
            self._cond.wait_for(lambda: self.free >= n)
            self.free -= n
        try:
            yield
        finally:
            with self._cond:
                self.free += n
                self._cond.notify_all()


def is_image_name(p: Path) -> bool:
    """Named like an image (``.jpg``, ``.png``, ...; not hidden), whatever it is on disk."""
    return not p.name.startswith(".") and p.suffix.lower() in IMAGE_EXTENSIONS


def _not_a_file(path: Path) -> str:
    """Why ``path`` (named like an image) cannot be read as one."""
    if path.is_symlink() and not path.exists():
        return f"is a dangling symlink (to {os.readlink(path)}), not an image file"
    if path.is_dir():
        return "is a folder, not an image file"
    return "is not a regular file" if path.exists() else "no such file"


def decode_bytes(width: int, height: int, mode: str) -> int:
    """Estimated peak bytes to decode a ``width`` x ``height`` image of PIL ``mode`` and convert it to RGB."""
    return width * height * (MODE_BYTES.get(mode, 4) + CONVERT_BYTES)


ORIENTATION_TAG = 0x0112  # EXIF Orientation: 1 = as stored; 2-8 = mirror and/or rotate to display


def read_image(
    path: Path, size: int | None, policy: str, max_pixels: int = DEFAULT_MAX_PIXELS, budget: ByteBudget | None = None,
    max_side: int | None = None,
) -> tuple[np.ndarray, tuple[int, int], int]:
    """One file -> (uint8 ``[S, S, 3]`` or, policy ``native``, ``[H, W, 3]``; its own ``(H, W)``; its EXIF
    orientation, 1 where unknown). ``InputError`` naming the file when it cannot be read; over
    ``max_pixels`` is refused before decoding; the decode holds ``decode_bytes`` of ``budget``."""
    if not path.is_file():  # a dangling symlink, a folder or a FIFO named like an image: never opened
        raise InputError(_not_a_file(path), path)
    try:
        with Image.open(path) as img:  # reads the header only
            w, h = img.size
            if w * h > max_pixels:
                raise InputError(f"image is {w}x{h} ({w * h:,} pixels), over the --max-pixels limit {max_pixels:,}", path)
            with budget.hold(decode_bytes(w, h, img.mode)) if budget is not None else nullcontext():
                img.load()  # decode fully now: a truncated file fails here, not later
                orientation = _orientation(img)
                if policy == NATIVE_POLICY:
                    return native_image(img, max_side), (h, w), orientation
                return resize_image(img, size, policy), (h, w), orientation
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as e:
        raise InputError(f"refused as a decompression bomb ({_first_line(e)})", path) from None
    except MemoryError:
        raise InputError("out of memory decoding the image (lower --max-pixels or --workers)", path) from None
    except (OSError, SyntaxError, ValueError) as e:
        raise InputError(f"cannot read image ({_first_line(e)})", path) from None


def _orientation(img: Image.Image) -> int:
    """The EXIF orientation tag of an opened image; 1 (as stored) without one or when it is unreadable."""
    try:
        v = int(img.getexif().get(ORIENTATION_TAG, 1))
    except Exception:  # a malformed EXIF block: the pixels decoded, the tag is just not known
        return 1
    return v if 1 <= v <= 8 else 1


def _first_line(e: BaseException) -> str:
    return str(e).splitlines()[0] if str(e) else type(e).__name__


@contextmanager
def header_check_only() -> Iterator[None]:
    """While decoding, ``read_image``'s ``--max-pixels`` check stands in for PIL's bomb guard."""
    old = Image.MAX_IMAGE_PIXELS
    Image.MAX_IMAGE_PIXELS = None
    try:
        yield
    finally:
        Image.MAX_IMAGE_PIXELS = old


def _decode_chunk(pool: ThreadPoolExecutor, paths: Sequence[Path], s: int, e: int, st: Decoding, read,
                  on_error: str, progress: Callable[[int], None] | None, stop: _StopHook) -> Chunk:
    """Decode files ``[s, e)``; fixed sizes land in ``st.images`` rows ``st.rows ..``, compacted (``st.rows <= s``)."""
    native = isinstance(st.images, list)
    base = st.rows
    got: list = [None] * (e - s)
    own = np.zeros((e - s, 2), dtype=np.int64)  # each file's (H, W) from its header
    orient = np.ones(e - s, dtype=np.int64)  # each file's EXIF orientation (1: as stored)

    def one(i: int) -> InputError | None:
        try:
            im, own[i - s], orient[i - s] = read(paths[i])
        except InputError as err:
            return err
        if native:
            got[i - s] = im
        else:
            st.images[base + i - s] = im
        return None

    kept: list[int] = []
    skipped: list[dict[str, str]] = []
    for i, err in zip(range(s, e), pool.map(one, range(s, e)), strict=True):
        if err is None:
            kept.append(i)
        elif on_error == "fail":
            pool.shutdown(wait=True, cancel_futures=True)
            raise err
        else:
            skipped.append({"file": str(paths[i]), "error": str(err).removeprefix(f"{paths[i]}: ")})
        if progress is not None:
            progress(1)
        stop.count()
    if not native:
        for j, i in enumerate(kept):  # compact in place (rows only move down): no second copy
            if j != i - s:
                st.images[base + j] = st.images[base + i - s]
    return Chunk(s, e, kept, skipped, [own[i - s].tolist() for i in kept],
                 [got[i - s] for i in kept] if native else None,
                 oriented=[i for i in kept if orient[i - s] != 1])


class _StopHook:
    """Test hook: ``INRBENCH_TEST_PREPARE_STOP=N`` interrupts the decode (``KeyboardInterrupt``) once N images
    of one ``prepare`` were decoded (restored ones not counted); ``N:kill`` sends SIGKILL instead."""

    def __init__(self, after: int | None, kill: bool):
        self.after, self.kill, self.seen = after, kill, 0

    @classmethod
    def from_env(cls) -> _StopHook:
        want = os.environ.get(STOP_ENV, "").strip()
        if not want:
            return cls(None, False)
        n, _, how = want.partition(":")
        return cls(int(n), how == "kill")

    def count(self) -> None:
        self.seen += 1
        if self.after is None or self.seen != self.after:
            return
        if self.kill:
            import signal

            os.kill(os.getpid(), signal.SIGKILL)
        raise KeyboardInterrupt(f"injected stop after {self.after} images ({STOP_ENV})")


def allocate(shape: tuple[int, ...], scratch: Path | None) -> np.ndarray:
    """uint8 array of ``shape``: in memory, or a ``.npy`` memmap under ``scratch`` when it is big."""
    nbytes = int(np.prod(shape))
    if scratch is None or nbytes <= MEMMAP_BYTES:
        return np.empty(shape, dtype=np.uint8)
    fd, name = tempfile.mkstemp(suffix=".npy", dir=scratch)
    os.close(fd)
    return np.lib.format.open_memmap(name, mode="w+", dtype=np.uint8, shape=shape)


class SplitRead(NamedTuple):
    """split: the readable files (native: ``images`` a list of uint8 ``[H_i, W_i, 3]``); skipped: ``{"file",
    "error"}`` per unreadable file; downscaled: ``{"file", "from", "to"}`` per image reduced by ``max_side``;
    oriented: kept files with an EXIF orientation (names relative to the root)."""

    split: SplitData
    skipped: list[dict[str, str]]
    downscaled: list[dict]
    oriented: list[str]


def split_from_files(
    paths: Sequence[Path],
    labels: Sequence[int] | np.ndarray,
    cfg: PrepareConfig,
    root: Path,
    split_index: int,
    progress: Callable[[int], None] | None = None,
    scratch: Path | None = None,
    work: SplitWork | None = None,
) -> SplitRead:
    """The ``--limit`` subset of ``paths`` decoded in order, chunk by chunk, unreadable files dropped (``fail``:
    the first raises). ``cfg``: resolved (size and policy set). Splits over ``MEMMAP_BYTES`` live in a memmap
    under ``scratch``; ``work``: this split's work folder, whose chunks are restored and extended."""
    labels = np.asarray(labels, dtype=np.int64)
    sel = limit_indices(len(paths), cfg.limit, cfg.seed + split_index)
    paths = [paths[i] for i in sel]
    n, native = len(paths), cfg.native
    policy, size = (NATIVE_POLICY, None) if native else (cfg.resize_policy, cfg.size)
    shape = None if native else (n, size, size, 3)
    if work is not None:
        st = work.open(paths, shape)
    else:
        st = Decoding(images=[] if shape is None else allocate(shape, scratch), length=chunk_length(size))
    if progress is not None and st.chunks:
        progress(st.done(n))
    budget = ByteBudget(DECODE_BUDGET_BYTES)

    def read(p: Path) -> tuple[np.ndarray, tuple[int, int], int]:
        return read_image(p, size, policy, cfg.max_pixels, budget, cfg.max_side)

    # one count for the whole prepare (every split in turn), so a stop can land in any split
    stop = _StopHook.from_env() if work is None else work.work.shared.setdefault(STOP_ENV, _StopHook.from_env())
    with header_check_only(), ThreadPoolExecutor(max_workers=cfg.workers or min(8, os.cpu_count() or 1)) as pool:
        for c, (s, e) in enumerate(chunk_ranges(n, st.length)):
            if c < st.chunks:
                continue
            files = file_fingerprint(paths[s:e], work.work.root) if work is not None else None
            ch = _decode_chunk(pool, paths, s, e, st, read, cfg.on_error, progress, stop)
            ch.files = files
            st.add(ch)
            if work is not None:
                work.commit(c, ch, st)
    images = list(st.images) if native else st.images[: st.rows]
    down = [{"file": _rel(paths[i], root), "from": list(own), "to": list(im.shape[:2])}
            for i, own, im in zip(st.kept, st.own, images, strict=True) if tuple(im.shape[:2]) != tuple(own)
            ] if native else []
    split = SplitData(images=images, labels=labels[sel][np.asarray(st.kept, dtype=np.int64)],
                      ids=[_rel(paths[i], root) for i in st.kept])
    return SplitRead(split, st.skipped, down, [_rel(paths[i], root) for i in st.oriented])


ORIENTATION_EXAMPLES = 20  # files listed in the manifest (all are counted)


def orientation_meta(oriented: list[str]) -> dict:
    """Manifest ``source_meta``: the count of kept files with an EXIF orientation other than 1 (not applied)
    and the first few."""
    return {"exif_orientation": {"applied": False, "files": len(oriented),
                                 "examples": oriented[:ORIENTATION_EXAMPLES]}}


def native_meta(cfg: PrepareConfig, downscaled: list[dict]) -> dict:
    """Manifest ``source_meta`` of a ``--size native`` read (empty otherwise): the cap, the images it reduced."""
    if not cfg.native:
        return {}
    return {"max_side": cfg.max_side, "downscaled": downscaled,
            "native": "each image at its own size; downscaled (aspect kept, bicubic) only past max_side"}


def _rel(p: Path, root: Path) -> str:
    try:
        return str(Path(p).relative_to(root))
    except ValueError:
        return str(p)
