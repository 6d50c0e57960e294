"""The prepared dataset on disk: written once by ``inrbench prepare`` (atomically), read by everything.

``DIR/manifest.json`` (schema_version, source, image_size, classes, splits {name: {count, checksums, jpeg_bytes}}, ...);
per split ``pixels.npy`` uint8 [N, H, W, 3] (or, native sizes, ``pixels_flat.npy`` + ``sizes.npy`` int64 [N, 2]),
``labels.npy`` int64 [N], ``jpeg/000000.jpg`` ..., ``file_list.txt`` (DALI format), ``source_ids.json``.
"""

from __future__ import annotations

import hashlib
import io
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from bench.atomic import atomic_dir
from bench.errors import InputError, older_artifact

SCHEMA_VERSION = 2
MANIFEST = "manifest.json"
SOURCE_IDS = "source_ids.json"


@dataclass(frozen=True)
class SplitData:
    """One split in memory: uint8 ``[N, H, W, 3]`` images (or, native sizes, a list), int64 labels, source ids."""

    images: np.ndarray | list[np.ndarray]
    labels: np.ndarray
    ids: list[str] = field(default_factory=list)

    @property
    def ragged(self) -> bool:
        return isinstance(self.images, list)

    def __post_init__(self) -> None:
        if self.ragged:
            for i, im in enumerate(self.images):
                if not isinstance(im, np.ndarray) or im.dtype != np.uint8 or im.ndim != 3 or im.shape[-1] != 3 or 0 in im.shape:
                    raise ValueError(f"image {i} must be uint8 [H,W,3], got {getattr(im, 'dtype', type(im))} {getattr(im, 'shape', '')}")
            if self.labels.shape != (len(self.images),):
                raise ValueError(f"labels shape {self.labels.shape} does not match {len(self.images)} images")
            return
        if self.images.dtype != np.uint8 or self.images.ndim != 4 or self.images.shape[-1] != 3:
            raise ValueError(f"images must be uint8 [N,H,W,3], got {self.images.dtype} {self.images.shape}")
        if self.labels.shape != (self.images.shape[0],):
            raise ValueError(f"labels shape {self.labels.shape} does not match {self.images.shape[0]} images")


def sha256_array(a: np.ndarray, chunk_bytes: int = 1 << 26) -> str:
    """sha256 of the array's C-order bytes, hashed in chunks (a memmap is never copied whole)."""
    h = hashlib.sha256()
    if a.ndim == 0 or a.shape[0] == 0:
        h.update(np.ascontiguousarray(a).tobytes())
        return h.hexdigest()
    step = max(1, chunk_bytes // max(1, a[0].nbytes))
    for i in range(0, a.shape[0], step):
        h.update(np.ascontiguousarray(a[i : i + step]).tobytes())
    return h.hexdigest()


def encode_jpeg(image: np.ndarray, quality: int, subsampling: str = "4:2:0") -> bytes:
    """uint8 ``[H, W, 3]`` -> JPEG bytes with PIL (baseline, no optimize, fixed subsampling)."""
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(image, "RGB").save(buf, format="JPEG", quality=int(quality), subsampling=subsampling)
    return buf.getvalue()


def write_prepared(
    out: str | Path,
    splits: Mapping[str, SplitData],
    meta: Mapping[str, Any],
    jpeg_quality: int = 90,
    jpeg_subsampling: str = "4:2:0",
    overwrite: bool = False,
    progress: Any = None,
) -> Path:
    """Write a prepared dataset atomically (``splits``: name -> ``SplitData``; ``meta``: manifest fields); returns it."""
    out = Path(out)
    if not splits:
        raise InputError("no splits to write", out)
    native = any(s.ragged for s in splits.values())
    if not native:
        shapes = {tuple(s.images.shape[1:3]) for s in splits.values()}
        if len(shapes) != 1:
            raise InputError(f"splits have different image sizes {sorted(shapes)}", out)
        (h, w) = shapes.pop()
    manifest: dict[str, Any] = dict(meta)
    manifest.update(
        schema_version=SCHEMA_VERSION,
        image_size=None if native else [h, w],
        jpeg={"quality": int(jpeg_quality), "subsampling": jpeg_subsampling, "encoder": "PIL"},
        splits={},
    )
    if native:
        manifest["native"] = True
    with atomic_dir(out, kind="prepared", overwrite=overwrite) as tmp:
        for name, s in splits.items():
            d = tmp / name
            (d / "jpeg").mkdir(parents=True)
            n = len(s.images) if s.ragged else int(s.images.shape[0])
            if native:
                ims = list(s.images)
                sizes = np.array([im.shape[:2] for im in ims], dtype=np.int64).reshape(n, 2)
                flat = np.concatenate([np.ascontiguousarray(im).reshape(-1) for im in ims]) if n else np.zeros(0, np.uint8)
                np.save(d / "pixels_flat.npy", flat)
                np.save(d / "sizes.npy", sizes)
            else:
                np.save(d / "pixels.npy", s.images)
            np.save(d / "labels.npy", s.labels.astype(np.int64))
            lines, jbytes = [], 0
            for i in range(n):
                rel = f"jpeg/{i:06d}.jpg"
                data = encode_jpeg(s.images[i], jpeg_quality, jpeg_subsampling)
                (d / rel).write_bytes(data)
                jbytes += len(data)
                lines.append(f"{rel} {int(s.labels[i])}")
                if progress is not None:
                    progress(1)
            (d / "file_list.txt").write_text("\n".join(lines) + "\n")
            if s.ids:
                (d / SOURCE_IDS).write_text(json.dumps(list(s.ids)) + "\n")
            manifest["splits"][name] = {
                "count": n,
                "pixels_sha256": sha256_array(flat if native else s.images),
                "labels_sha256": sha256_array(s.labels.astype(np.int64)),
                "jpeg_bytes": jbytes,
            }
            if native:
                manifest["splits"][name]["sizes_sha256"] = sha256_array(sizes)
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return out


@dataclass(frozen=True)
class PreparedSplit:
    """One split, memory-mapped: uint8 ``[N, H, W, 3]`` images, int64 ``[N]`` labels, N JPEG paths."""

    name: str
    root: Path
    images: np.ndarray
    labels: np.ndarray
    jpeg_paths: tuple[Path, ...]

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    @property
    def image_size(self) -> tuple[int, int]:
        return int(self.images.shape[1]), int(self.images.shape[2])

    @property
    def file_list(self) -> Path:
        """DALI-style file list (``relative/path label`` lines, relative to ``root``)."""
        return self.root / "file_list.txt"


NATIVE_REFUSAL = ("images have different sizes (prepared with --size native): this needs one image size; "
                  "prepare with --size S (native sizes are for `inrbench compare`)")


@dataclass(frozen=True)
class NativeSplit:
    """One split as one uint8 ``[H_i, W_i, 3]`` array per image, with int64 sizes ``[N, 2]``."""

    name: str
    root: Path
    images: tuple[np.ndarray, ...]
    labels: np.ndarray
    sizes: np.ndarray
    jpeg_paths: tuple[Path, ...]

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    @property
    def uniform(self) -> bool:
        return len(self) == 0 or bool((self.sizes == self.sizes[0]).all())


_VERIFIED: dict[tuple[str, int, int, str], bool] = {}


def _verified(path: Path, arr: np.ndarray, expected: str | None) -> bool:
    """sha256 of ``arr`` (read from ``path``) equals ``expected``; cached per process by the
    file's (path, size, mtime_ns) so opening a split again does not rehash it."""
    st = path.stat()
    key = (str(path.resolve()), st.st_size, st.st_mtime_ns, str(expected))
    if key not in _VERIFIED:
        _VERIFIED[key] = expected is not None and sha256_array(arr) == expected
    return _VERIFIED[key]


@dataclass(frozen=True)
class PreparedDataset:
    root: Path
    manifest: dict[str, Any]

    @property
    def classes(self) -> list[str]:
        return list(self.manifest["classes"])

    @property
    def num_classes(self) -> int:
        return len(self.manifest["classes"])

    @property
    def splits(self) -> list[str]:
        return list(self.manifest["splits"])

    @property
    def native(self) -> bool:
        """Images keep their own sizes (``prepare --size native``)."""
        return bool(self.manifest.get("native"))

    def _refuse_native(self) -> None:
        if self.native:
            raise InputError(NATIVE_REFUSAL, self.root)

    @property
    def image_size(self) -> tuple[int, int]:
        self._refuse_native()
        h, w = self.manifest["image_size"]
        return int(h), int(w)

    def _arrays(self, name: str, files: tuple[str, ...]) -> tuple[dict[str, np.ndarray], Path, dict, int]:
        """Split ``name``'s ``files`` (pixels memory-mapped) with its labels checked -> (arrays, folder, info, count)."""
        if name not in self.manifest["splits"]:
            raise InputError(f"no split {name!r} (has {', '.join(self.splits)})", self.root / MANIFEST)
        info, d = self.manifest["splits"][name], self.root / name
        try:
            arrs = {f: np.load(d / f, mmap_mode="r" if f.startswith("pixels") else None) for f in (*files, "labels.npy")}
        except (OSError, ValueError) as e:
            raise InputError(f"cannot read split arrays: {e}", d) from None
        n, labels, k = info["count"], arrs["labels.npy"], self.num_classes
        if labels.shape != (n,) or labels.dtype.kind not in "iu":
            raise InputError(f"labels.npy is {labels.dtype} {labels.shape}, expected integers [{n}]", d / "labels.npy")
        if n and (int(labels.min()) < 0 or int(labels.max()) >= k):
            bad = int(labels.min()) if int(labels.min()) < 0 else int(labels.max())
            raise InputError(f"label {bad} is outside the dataset's {k} classes (0..{k - 1})", d / "labels.npy")
        return arrs, d, info, n

    @staticmethod
    def _verify(arrs: dict[str, np.ndarray], d: Path, info: dict) -> None:
        for fname, arr in arrs.items():
            key = fname.split(".")[0].removesuffix("_flat") + "_sha256"
            if not _verified(d / fname, arr, info.get(key)):
                raise InputError(f"checksum mismatch with {MANIFEST} ({key}): the file is damaged or was "
                                 "changed after `inrbench prepare`", d / fname)

    def native_split(self, name: str, verify: bool = True) -> NativeSplit:
        """Split ``name`` as one array per image (native-size datasets and uniform ones), checked like ``split``."""
        if not self.native:
            sp = self.split(name, verify=verify)
            n, (h, w) = len(sp), sp.image_size
            return NativeSplit(name, sp.root, tuple(sp.images[i] for i in range(n)), sp.labels,
                               np.tile(np.array([h, w], np.int64), (n, 1)), sp.jpeg_paths)
        arrs, d, info, n = self._arrays(name, ("pixels_flat.npy", "sizes.npy"))
        flat, sizes, labels = arrs["pixels_flat.npy"], arrs["sizes.npy"], arrs["labels.npy"]
        if sizes.shape != (n, 2) or sizes.dtype.kind not in "iu" or (n and int(sizes.min()) < 1):
            raise InputError(f"sizes.npy is {sizes.dtype} {sizes.shape}, expected positive int [{n}, 2]", d / "sizes.npy")
        ends = np.cumsum(sizes[:, 0] * sizes[:, 1] * 3)
        total = int(ends[-1]) if n else 0
        if flat.dtype != np.uint8 or flat.ndim != 1 or flat.shape[0] != total:
            raise InputError(f"pixels_flat.npy is {flat.dtype} {flat.shape}, sizes.npy needs uint8 [{total}]",
                             d / "pixels_flat.npy")
        if verify:
            self._verify(arrs, d, info)
        starts = np.concatenate([[0], ends[:-1]]) if n else np.zeros(0, np.int64)
        images = tuple(flat[int(a) : int(a) + int(h) * int(w) * 3].reshape(int(h), int(w), 3)
                       for a, (h, w) in zip(starts, sizes, strict=True))
        paths = tuple(d / "jpeg" / f"{i:06d}.jpg" for i in range(n))
        return NativeSplit(name, d, images, labels.astype(np.int64), sizes.astype(np.int64), paths)

    def split(self, name: str, verify: bool = True) -> PreparedSplit:
        """Open split ``name`` memory-mapped; ``verify`` checks the arrays against the manifest's sha256 (once per file state)."""
        self._refuse_native()
        arrs, d, info, n = self._arrays(name, ("pixels.npy",))
        images, labels, (h, w) = arrs["pixels.npy"], arrs["labels.npy"], self.image_size
        if images.shape != (n, h, w, 3) or images.dtype != np.uint8:
            raise InputError(f"pixels.npy is {images.dtype} {images.shape}, manifest says uint8 {(n, h, w, 3)}", d / "pixels.npy")
        if verify:
            self._verify(arrs, d, info)
        paths = tuple(d / "jpeg" / f"{i:06d}.jpg" for i in range(n))
        return PreparedSplit(name=name, root=d, images=images, labels=labels.astype(np.int64), jpeg_paths=paths)


def open_prepared(path: str | Path) -> PreparedDataset:
    """Open a prepared folder; a missing or foreign manifest is an ``InputError``."""
    root = Path(path)
    if not root.exists():
        raise InputError("no such prepared dataset folder", root)
    if not root.is_dir():
        raise InputError("is a file, not a prepared dataset folder", root)
    mpath = root / MANIFEST
    if not mpath.is_file():
        raise InputError(f"not a prepared dataset (no {MANIFEST}; run `inrbench prepare`)", root)
    try:
        manifest = json.loads(mpath.read_text())
    except json.JSONDecodeError as e:
        raise InputError(f"manifest is not valid JSON: {e}", mpath) from None
    if not isinstance(manifest, dict):
        raise InputError(f"manifest is a JSON {type(manifest).__name__}, expected an object", mpath)
    version = manifest.get("schema_version")
    if isinstance(version, int) and version < SCHEMA_VERSION:
        raise older_artifact(mpath, version, "rerun `inrbench prepare`")
    if version != SCHEMA_VERSION:
        raise InputError(f"manifest schema_version {version!r}, this inrbench reads {SCHEMA_VERSION}", mpath)
    _check_manifest(manifest, mpath)
    return PreparedDataset(root=root, manifest=manifest)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _check_manifest(m: dict[str, Any], mpath: Path) -> None:
    """Refuse (``InputError`` naming the key) a manifest whose keys the readers use have the wrong shape."""
    def bad(d: dict[str, Any], key: str, expected: str, where: str = "") -> InputError:
        got = "missing" if key not in d else f"{type(d[key]).__name__} {json.dumps(d[key])[:60]}"
        return InputError(f"manifest key {where + key!r} is {got}, expected {expected}", mpath)

    native = m.get("native", False)
    if not isinstance(native, bool):
        raise bad(m, "native", "true or false")
    size = m.get("image_size")
    if native:
        if size is not None:
            raise bad(m, "image_size", "null (native sizes)")
    elif not (isinstance(size, list) and len(size) == 2 and all(_is_int(v) and v >= 1 for v in size)):
        raise bad(m, "image_size", "[height, width], two integers >= 1")
    classes = m.get("classes")
    if not (isinstance(classes, list) and classes and all(isinstance(c, str) for c in classes)):
        raise bad(m, "classes", "a non-empty list of class names")
    splits = m.get("splits")
    if not (isinstance(splits, dict) and splits):
        raise bad(m, "splits", "an object {split name: {count, pixels_sha256, ...}}")
    for name, info in splits.items():
        if not isinstance(info, dict):
            raise bad(splits, name, "an object {count, pixels_sha256, ...}", "splits.")
        if not (_is_int(info.get("count")) and info["count"] >= 0):
            raise bad(info, "count", "an integer >= 0", f"splits.{name}.")
        for key in ("pixels_sha256", "labels_sha256", "sizes_sha256"):
            if info.get(key) is not None and not isinstance(info[key], str):
                raise bad(info, key, "a sha256 string", f"splits.{name}.")
    for key, typ, expected in (("source", str, "a string"), ("resize_policy", str, "a string"),
                               ("skipped", list, "a list"), ("jpeg", dict, "an object")):
        if m.get(key) is not None and not isinstance(m[key], typ):
            raise bad(m, key, expected)


def read_source_ids(split_dir: str | Path) -> list[str] | None:
    """The source ids of a prepared split folder (``source_ids.json``); ``None`` if absent."""
    p = Path(split_dir) / SOURCE_IDS
    if not p.is_file():
        return None
    try:
        ids = json.loads(p.read_text())
    except json.JSONDecodeError as e:
        raise InputError(f"not valid JSON: {e}", p) from None
    if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
        raise InputError("is not a JSON list of strings", p)
    return ids

