"""The codecs of ``inrbench compare`` (JPEG, WebP, AVIF, JPEG 2000, JPEG XL), each on one 1..100 quality
scale; ``options`` are ``PIL.Image.save`` kwargs, ``payload_bytes`` the coded data (None: not measured).
A codec that cannot run is a skip row with the reason. Settings and reasons: docs/codecs.md."""

from __future__ import annotations

import io
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from bench.compare.jpeg import payload_bytes as jpeg_payload_bytes


def _pil_version() -> str:
    import PIL

    return PIL.__version__


def _decode(data: bytes) -> np.ndarray:
    from PIL import Image

    with Image.open(io.BytesIO(data)) as im:
        return np.asarray(im.convert("RGB"))


@dataclass
class Codec:
    """One PIL codec: ``fmt`` (PIL format) needs PIL ``feature`` (``""``: always there), built with ``lib``;
    ``payload`` counts the coded data of a file; ``header_free``: offers the JPEG-only match key."""

    name: str
    subsampling: str = "4:2:0"
    settings: dict[str, Any] = field(default_factory=dict)
    header_free: bool = False
    options: dict[str, Any] = field(default_factory=dict)
    fmt: str = "JPEG"
    feature: str = ""
    lib: str = ""
    payload: Callable[[bytes], int | None] | None = None

    def unavailable(self) -> str | None:
        """``None``, or why this machine cannot run the codec."""
        if not self.feature:
            return None
        from PIL import features

        try:
            ok = features.check(self.feature)
        except ValueError:
            ok = False
        return None if ok else f"the installed Pillow {_pil_version()} has no {self.lib} support"

    def library(self) -> dict[str, str]:
        from PIL import features

        return {"library": f"Pillow + {self.lib} {features.version(self.feature) or ''}".strip(),
                "version": _pil_version()}

    def encode(self, image: np.ndarray, quality: int) -> bytes:
        """uint8 ``[H, W, 3]`` -> file bytes."""
        return self._save(image, quality=int(quality), **self.options)

    def _save(self, image: np.ndarray, **kw) -> bytes:
        from PIL import Image

        buf = io.BytesIO()
        Image.fromarray(np.ascontiguousarray(image, dtype=np.uint8), "RGB").save(buf, format=self.fmt, **kw)
        return buf.getvalue()

    def decode(self, data: bytes) -> np.ndarray:
        """File bytes -> uint8 ``[H, W, 3]``."""
        return _decode(data)

    def payload_bytes(self, data: bytes) -> int | None:
        return None if self.payload is None else self.payload(data)

    def describe(self) -> dict[str, Any]:
        """The ``config.json`` record: availability, library and version, settings."""
        why = self.unavailable()
        d: dict[str, Any] = {"available": why is None, "quality_scale": "1..100",
                             "settings": {**self.options, **self.settings}}
        d.update({"reason": why} if why is not None else self.library())
        return d


class JpegCodec(Codec):
    def library(self) -> dict[str, str]:
        from PIL import features

        turbo = features.version("libjpeg_turbo")
        lib = f"libjpeg-turbo {turbo}" if turbo else f"libjpeg {features.version('jpg') or ''}".strip()
        return {"library": f"Pillow + {lib}", "version": _pil_version()}


def _riff_payload(data: bytes) -> int:
    """WebP: bytes of the ``VP8 ``/``VP8L``/``ALPH`` chunks (RIFF and chunk headers are overhead)."""
    if data[:4] != b"RIFF" or data[8:12] != b"WEBP":
        raise ValueError("not a RIFF/WEBP file")
    pos, total = 12, 0
    while pos + 8 <= len(data):
        cc, size = data[pos : pos + 4], int.from_bytes(data[pos + 4 : pos + 8], "little")
        total += size if cc in (b"VP8 ", b"VP8L", b"ALPH") else 0
        pos += 8 + size + (size & 1)
    return total


def _boxes(data: bytes):
    """``(type, content start, content end)`` of the top-level ISO-BMFF / JP2 boxes."""
    pos, end = 0, len(data)
    while pos + 8 <= end:
        size, typ, hdr = int.from_bytes(data[pos : pos + 4], "big"), data[pos + 4 : pos + 8], 8
        if size == 1:
            size, hdr = int.from_bytes(data[pos + 8 : pos + 16], "big"), 16
        elif size == 0:
            size = end - pos
        if size < hdr or pos + size > end:
            raise ValueError(f"box {typ!r} at {pos} has bad size {size}")
        yield typ, pos + hdr, pos + size
        pos += size


def _j2k_tile_data(cs: bytes) -> int:
    """Bytes of tile-part data (after each SOD) in a JPEG 2000 codestream; the headers are overhead."""
    if cs[:2] != b"\xff\x4f":
        raise ValueError("codestream does not start with SOC")
    pos, total = 2, 0
    while pos + 4 <= len(cs):
        marker = int.from_bytes(cs[pos : pos + 2], "big")
        if marker == 0xFFD9:  # EOC
            return total
        if marker == 0xFF90:  # SOT: Lsot(2) Isot(2) Psot(4) TPsot(1) TNsot(1)
            psot = int.from_bytes(cs[pos + 6 : pos + 10], "big")
            end = pos + psot if psot else len(cs) - 2
            sod = cs.find(b"\xff\x93", pos + 12, end)
            if sod < 0:
                raise ValueError(f"tile-part at {pos} has no SOD")
            total += end - (sod + 2)
            pos = end
        else:
            pos += 2 + int.from_bytes(cs[pos + 2 : pos + 4], "big")
    return total


def jp2_ratio(quality: int) -> float:
    """Quality 1..100 -> OpenJPEG compression ratio (1000 .. 1, log-spaced)."""
    return float(10 ** (3 * (100 - int(quality)) / 99))


class Jp2Codec(Codec):
    def encode(self, image, quality):
        levels = max(1, min(6, int(np.log2(max(1, min(image.shape[:2])))) + 1))  # OpenJPEG: 2**(levels-1) <= side
        return self._save(image, quality_layers=[jp2_ratio(quality)], num_resolutions=levels, **self.options)


class JxlCodec(Codec):
    def unavailable(self):
        try:
            import pillow_jxl  # noqa: F401  (registers the JXL format with PIL)
        except ImportError as e:
            return f"JPEG XL needs the optional extra `pip install inr-bench[jxl]` (pillow-jxl-plugin): {e}"
        return None

    def library(self):
        from importlib.metadata import version

        return {"library": f"pillow-jxl-plugin {version('pillow-jxl-plugin')} (libjxl via jpegxl-rs)",
                "version": _pil_version()}

    def encode(self, image, quality):
        import pillow_jxl  # noqa: F401

        return self._save(image, quality=min(int(quality), 99), **self.options)  # libjxl refuses lossy 100

    def decode(self, data):
        import pillow_jxl  # noqa: F401

        return _decode(data)


# OpenJPEG's opj_compress defaults with the colour transform on (Pillow's default mct=0 codes R, G, B apart)
JP2_OPTIONS = {"quality_mode": "rates", "irreversible": True, "mct": 1, "codeblock_size": (64, 64),
               "progression": "LRCP"}
_JP2 = {"container": "JP2", "ratio": "10 ** (3 * (100 - q) / 99)", "layers": 1,
        "num_resolutions": "min(6, log2(short side) + 1)"}
_WEBP = dict(fmt="WEBP", feature="webp", lib="libwebp", payload=_riff_payload,
             settings={"subsampling": "4:2:0 (VP8 lossy, fixed)"})
_AVIF = dict(fmt="AVIF", feature="avif", lib="libavif", payload=lambda data: sum(e - s for typ, s, e in _boxes(data) if typ == b"mdat"),
             settings={"codec": "auto (Pillow's libavif picks aom)"})
_JXL = {"quality": "min(q, 99)", "colour": "XYB (libjxl default)"}


def _jpeg(name: str, s: str, best: bool) -> Codec:
    return JpegCodec(name, s, header_free=not best, payload=jpeg_payload_bytes,
                     options={"subsampling": s, "optimize": best, "progressive": best})


def _jxl(name: str, s: str, effort: int) -> Codec:
    return JxlCodec(name, s, dict(_JXL), fmt="JXL",
                    options={"effort": effort, "lossless": False, "use_container": False, "num_threads": 1})


def _jp2(name: str, s: str, irreversible: bool) -> Codec:
    return Jp2Codec(name, s, {**_JP2, "wavelet": "9/7 irreversible" if irreversible else "5/3 reversible"},
                    options={**JP2_OPTIONS, "irreversible": irreversible}, fmt="JPEG2000", feature="jpg_2000",
                    lib="OpenJPEG",
                    payload=lambda data: next((_j2k_tile_data(data[s:e]) for typ, s, e in _boxes(data) if typ == b"jp2c"), None))


# name -> factory of its codec at a chroma subsampling; registry order is the order of ``names()``
_REGISTRY: dict[str, Callable[[str], Codec]] = {
    "jpeg": lambda s: _jpeg("jpeg", s, False),  # the bytes of the JPEG tree the loaders read
    "jpeg-opt": lambda s: _jpeg("jpeg-opt", s, True),  # optimized Huffman + progressive: same pixels
    "webp": lambda s: Codec("webp", s, options={"method": 4, "lossless": False}, **_WEBP),
    "webp-m6": lambda s: Codec("webp-m6", s, options={"method": 6, "lossless": False}, **_WEBP),
    "avif": lambda s: Codec("avif", s, options={"speed": 6, "subsampling": s, "max_threads": 1}, **_AVIF),
    "avif-s4": lambda s: Codec("avif-s4", s, options={"speed": 4, "subsampling": s, "max_threads": 1}, **_AVIF),
    "jp2": lambda s: _jp2("jp2", s, False),  # the published OpenJPEG runs: reversible 5/3
    "jp2-97": lambda s: _jp2("jp2-97", s, True),  # JPEG 2000's lossy 9/7 wavelet
    "jxl": lambda s: _jxl("jxl", s, 7),  # libjxl's default effort
    "jxl-e9": lambda s: _jxl("jxl-e9", s, 9),  # its slowest practical effort
}


def names() -> tuple[str, ...]:
    """Registered codec names, in registry order."""
    return tuple(_REGISTRY)


def create(name: str, subsampling: str = "4:2:0") -> Codec:
    """The codec ``name``; an unknown name fails and lists the known ones."""
    if name not in _REGISTRY:
        raise ValueError(f"unknown codec {name!r}; known: {', '.join(_REGISTRY)}")
    return _REGISTRY[name](subsampling)


@dataclass(frozen=True)
class Encoded:
    quality: int
    data: bytes
    file_bytes: int
    payload_bytes: int | None

    @property
    def overhead_bytes(self) -> int | None:
        return None if self.payload_bytes is None else self.file_bytes - self.payload_bytes


class Ladder:
    """All qualities of one uint8 ``[H, W, 3]`` image under one codec, encoded lazily and memoized;
    ``size(key)`` is ``quality -> bytes`` for the search (``"header-free"``: JPEG only)."""

    def __init__(self, codec: Codec, image: np.ndarray):
        self.codec = codec
        self.image = np.ascontiguousarray(image)
        self._cache: dict[int, Encoded] = {}

    def __call__(self, quality: int) -> Encoded:
        q = int(quality)
        if q not in self._cache:
            data = self.codec.encode(self.image, q)
            self._cache[q] = Encoded(q, data, len(data), self.codec.payload_bytes(data))
        return self._cache[q]

    def size(self, key: str) -> Callable[[int], int]:
        if key == "file":
            return lambda q: self(q).file_bytes
        if key == "header-free" and self.codec.header_free:
            return lambda q: self(q).payload_bytes
        raise ValueError(f"codec {self.codec.name}: unknown byte key {key!r}")

    @property
    def encodes(self) -> int:
        return len(self._cache)
