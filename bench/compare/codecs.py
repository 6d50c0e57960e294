"""The codec registry of ``inrbench compare``: JPEG, WebP, AVIF, JPEG XL and JPEG 2000, each at the
settings of the published run it mirrors, plus named "at its best" variants (``jpeg-opt``, ``webp-m6``,
``avif-s4``, ``jxl-e9``, ``jp2-97``); docs/codecs.md has the table and the reasons.

Every codec has one quality scale 1..100 (higher = more bytes, roughly monotone), so the
matched-bytes search of ``bench.compare.jpeg`` (binary search + repair window, or exhaustive)
and the quality sweep work unchanged for all of them. A codec:

* ``encode(image, q) -> bytes`` and ``decode(bytes) -> uint8 [H, W, 3]`` (PIL);
* ``payload_bytes(data)``: the codec's coded image data inside the file, or ``None`` where it
  cannot be measured; ``file - payload`` is the container overhead reported per row;
* ``options``: the exact keyword arguments of ``PIL.Image.save`` besides ``quality`` (per-image ones,
  JPEG 2000's resolution levels and rate, are added by ``encode``); ``settings``: what else is
  recorded; ``library()``, ``options`` and ``settings`` go to ``config.json``;
* ``unavailable()``: ``None``, or the reason it cannot run here (a skip row, never a crash).

What counts as payload (the rest is container/header overhead):

* ``jpeg``: entropy-coded scan data (``bench.compare.jpeg.payload_bytes``; also the
  header-free bytes, which stay JPEG-specific as a match key).
* ``webp``: the data of the ``VP8 ``/``VP8L``/``ALPH`` chunks (RIFF header and chunk headers
  are overhead; the VP8 frame header inside the chunk counts as payload).
* ``avif``: the content of the ``mdat`` box(es) (the AV1 sequence header inside counts as
  payload; ``ftyp``/``meta`` boxes are overhead).
* ``jp2``: tile-part data after each SOD marker (JP2 boxes, codestream main header and
  tile-part headers are overhead). Quality ``q`` maps to OpenJPEG's compression ratio
  ``10 ** (3 * (100 - q) / 99)`` (q=100: ratio 1, q=1: ratio 1000), log-spaced.
* ``jxl``: a bare codestream (no container); its internal headers are not parsed: ``None``.
  libjxl refuses lossy quality 100, so q=100 encodes as 99.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

QUALITIES = range(1, 101)


def _pil_version() -> str:
    import PIL

    return PIL.__version__


def _decode(data: bytes) -> np.ndarray:
    from PIL import Image

    with Image.open(io.BytesIO(data)) as im:
        return np.asarray(im.convert("RGB"))


def _save(image: np.ndarray, fmt: str, **kw) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(image, dtype=np.uint8), "RGB").save(buf, format=fmt, **kw)
    return buf.getvalue()


@dataclass
class Codec:
    """One codec (see the module docstring). ``subsampling``: chroma subsampling where the
    codec takes one (JPEG, AVIF)."""

    name: str
    subsampling: str = "4:2:0"
    settings: dict[str, Any] = field(default_factory=dict)
    header_free: bool = False  # offers the "header-free" match key (JPEG only)
    options: dict[str, Any] = field(default_factory=dict)

    def unavailable(self) -> str | None:
        return None

    def library(self) -> dict[str, str]:
        return {"library": "Pillow", "version": _pil_version()}

    def encode(self, image: np.ndarray, quality: int) -> bytes:
        raise NotImplementedError

    def decode(self, data: bytes) -> np.ndarray:
        return _decode(data)

    def payload_bytes(self, data: bytes) -> int | None:
        return None

    def describe(self) -> dict[str, Any]:
        """The ``config.json`` record: availability, library and version, settings."""
        why = self.unavailable()
        d: dict[str, Any] = {"available": why is None, "quality_scale": "1..100",
                             "settings": {**self.options, **self.settings}}
        if why is not None:
            d["reason"] = why
        else:
            d.update(self.library())
        return d


_REGISTRY: dict[str, Callable[[str], Codec]] = {}


def register(name: str):
    def deco(factory: Callable[[str], Codec]):
        _REGISTRY[name] = factory
        return factory

    return deco


def names() -> tuple[str, ...]:
    """Registered codec names, in registry order."""
    return tuple(_REGISTRY)


def create(name: str, subsampling: str = "4:2:0") -> Codec:
    """The codec ``name``; an unknown name fails and lists the known ones."""
    if name not in _REGISTRY:
        raise ValueError(f"unknown codec {name!r}; known: {', '.join(_REGISTRY)}")
    return _REGISTRY[name](subsampling)


def _features_reason(feature: str, what: str) -> str | None:
    from PIL import features

    try:
        ok = features.check(feature)
    except ValueError:
        ok = False
    return None if ok else f"the installed Pillow {_pil_version()} has no {what} support"


# ---------------------------------------------------------------- JPEG


class JpegCodec(Codec):
    def library(self) -> dict[str, str]:
        from PIL import features

        turbo = features.version("libjpeg_turbo")
        lib = f"libjpeg-turbo {turbo}" if turbo else f"libjpeg {features.version('jpg') or ''}".strip()
        return {"library": f"Pillow + {lib}", "version": _pil_version()}

    def encode(self, image, quality):
        return _save(image, "JPEG", quality=int(quality), **self.options)

    def payload_bytes(self, data):
        from bench.compare.jpeg import payload_bytes

        return payload_bytes(data)


@register("jpeg")
def _jpeg(subsampling: str) -> Codec:
    # Pillow's defaults: the bytes of bench.datasets.prepared.encode_jpeg (the JPEG tree the loaders read)
    return JpegCodec("jpeg", subsampling, header_free=True,
                     options={"subsampling": subsampling, "optimize": False, "progressive": False})


@register("jpeg-opt")
def _jpeg_opt(subsampling: str) -> Codec:
    # optimized Huffman tables + progressive scans: same pixels, fewer bytes (libjpeg-turbo's best)
    return JpegCodec("jpeg-opt", subsampling, options={"subsampling": subsampling, "optimize": True, "progressive": True})


# ---------------------------------------------------------------- WebP

WEBP_METHOD = 4  # libwebp's (cwebp's) and Pillow's default effort, as in the published Pillow run


def _riff_chunks(data: bytes):
    """``(fourcc, size)`` of every chunk of a RIFF/WEBP file."""
    if data[:4] != b"RIFF" or data[8:12] != b"WEBP":
        raise ValueError("not a RIFF/WEBP file")
    pos = 12
    while pos + 8 <= len(data):
        cc, size = data[pos : pos + 4], int.from_bytes(data[pos + 4 : pos + 8], "little")
        yield cc, size
        pos += 8 + size + (size & 1)


class WebpCodec(Codec):
    def unavailable(self):
        return _features_reason("webp", "WebP")

    def library(self):
        from PIL import features

        return {"library": f"Pillow + libwebp {features.version('webp') or ''}".strip(), "version": _pil_version()}

    def encode(self, image, quality):
        return _save(image, "WEBP", quality=int(quality), **self.options)

    def payload_bytes(self, data):
        return sum(s for cc, s in _riff_chunks(data) if cc in (b"VP8 ", b"VP8L", b"ALPH"))


@register("webp")
def _webp(subsampling: str) -> Codec:
    return WebpCodec("webp", subsampling, {"subsampling": "4:2:0 (VP8 lossy, fixed)"},
                     options={"method": WEBP_METHOD, "lossless": False})


@register("webp-m6")
def _webp_m6(subsampling: str) -> Codec:
    return WebpCodec("webp-m6", subsampling, {"subsampling": "4:2:0 (VP8 lossy, fixed)"},
                     options={"method": 6, "lossless": False})


# ---------------------------------------------------------------- AVIF

AVIF_SPEED = 6  # libavif's (and Pillow's) default speed


def _boxes(data: bytes, start: int = 0, end: int | None = None):
    """``(type, header bytes, content start, content end)`` of ISO-BMFF / JP2 boxes."""
    end = len(data) if end is None else end
    pos = start
    while pos + 8 <= end:
        size, typ, hdr = int.from_bytes(data[pos : pos + 4], "big"), data[pos + 4 : pos + 8], 8
        if size == 1:
            size, hdr = int.from_bytes(data[pos + 8 : pos + 16], "big"), 16
        elif size == 0:
            size = end - pos
        if size < hdr or pos + size > end:
            raise ValueError(f"box {typ!r} at {pos} has bad size {size}")
        yield typ, hdr, pos + hdr, pos + size
        pos += size


class AvifCodec(Codec):
    def unavailable(self):
        return _features_reason("avif", "AVIF")

    def library(self):
        from PIL import features

        return {"library": f"Pillow + libavif {features.version('avif') or ''}".strip(), "version": _pil_version()}

    def encode(self, image, quality):
        return _save(image, "AVIF", quality=int(quality), **self.options)

    def payload_bytes(self, data):
        return sum(e - s for typ, _, s, e in _boxes(data) if typ == b"mdat")


@register("avif")
def _avif(subsampling: str) -> Codec:
    return AvifCodec("avif", subsampling, {"codec": "auto (Pillow's libavif picks aom)"},
                     options={"speed": AVIF_SPEED, "subsampling": subsampling, "max_threads": 1})


@register("avif-s4")
def _avif_s4(subsampling: str) -> Codec:
    # speed 4: the fast end of AVIF's documented best range (0-4); 0 costs ~10x more for ~0.1 dB
    return AvifCodec("avif-s4", subsampling, {"codec": "auto (Pillow's libavif picks aom)"},
                     options={"speed": 4, "subsampling": subsampling, "max_threads": 1})


# ---------------------------------------------------------------- JPEG 2000


def jp2_ratio(quality: int) -> float:
    """Quality 1..100 -> OpenJPEG compression ratio (1000 .. 1, log-spaced)."""
    return float(10 ** (3 * (100 - int(quality)) / 99))


def _j2k_tile_data(cs: bytes) -> int:
    """Bytes of tile-part data (after SOD) in a JPEG 2000 codestream."""
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


class Jp2Codec(Codec):
    def unavailable(self):
        return _features_reason("jpg_2000", "JPEG 2000 (OpenJPEG)")

    def library(self):
        from PIL import features

        return {"library": f"Pillow + OpenJPEG {features.version('jpg_2000') or ''}".strip(), "version": _pil_version()}

    def encode(self, image, quality):
        h, w = image.shape[:2]
        levels = max(1, min(6, int(np.log2(max(1, min(h, w)))) + 1))  # OpenJPEG needs 2**(levels-1) <= side
        return _save(image, "JPEG2000", quality_layers=[jp2_ratio(quality)], num_resolutions=levels, **self.options)

    def payload_bytes(self, data):
        for typ, _, s, e in _boxes(data):
            if typ == b"jp2c":
                return _j2k_tile_data(data[s:e])
        return None


# OpenJPEG's opj_compress defaults (6 levels, 64x64 code-blocks, LRCP, one layer, rate allocation by
# distortion) with the colour transform on, which Pillow leaves off (mct=0: R, G, B coded apart)
JP2_OPTIONS = {"quality_mode": "rates", "irreversible": True, "mct": 1, "codeblock_size": (64, 64),
               "progression": "LRCP"}


@register("jp2")
def _jp2(subsampling: str) -> Codec:
    # the published OpenJPEG runs: its default reversible 5/3 wavelet (opj_compress needs -I for 9/7;
    # ffmpeg, in CompressAI's run, does not ask for it), colour transform on
    return Jp2Codec("jp2", subsampling, {"container": "JP2", "wavelet": "5/3 reversible",
                                         "ratio": "10 ** (3 * (100 - q) / 99)", "layers": 1,
                                         "num_resolutions": "min(6, log2(short side) + 1)"},
                    options={**JP2_OPTIONS, "irreversible": False})


@register("jp2-97")
def _jp2_97(subsampling: str) -> Codec:
    # at its best: the irreversible 9/7 wavelet, JPEG 2000's lossy mode (about 0.8 dB above 5/3 on Kodak)
    return Jp2Codec("jp2-97", subsampling, {"container": "JP2", "wavelet": "9/7 irreversible",
                                            "ratio": "10 ** (3 * (100 - q) / 99)", "layers": 1,
                                            "num_resolutions": "min(6, log2(short side) + 1)"},
                    options=dict(JP2_OPTIONS))


# ---------------------------------------------------------------- JPEG XL

JXL_EFFORT = 7  # libjxl's default effort


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

        # libjxl refuses lossy quality 100 (distance 0 is lossless mode): q=100 encodes as 99
        return _save(image, "JXL", quality=min(int(quality), 99), **self.options)

    def decode(self, data):
        import pillow_jxl  # noqa: F401

        return _decode(data)


def _jxl_codec(name: str, subsampling: str, effort: int) -> Codec:
    return JxlCodec(name, subsampling, {"quality": "min(q, 99)", "colour": "XYB (libjxl default)"},
                    options={"effort": effort, "lossless": False, "use_container": False, "num_threads": 1})


@register("jxl")
def _jxl(subsampling: str) -> Codec:
    return _jxl_codec("jxl", subsampling, JXL_EFFORT)


@register("jxl-e9")
def _jxl_e9(subsampling: str) -> Codec:
    return _jxl_codec("jxl-e9", subsampling, 9)  # libjxl's slowest practical effort


# ---------------------------------------------------------------- ladder


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
    """All qualities of one image under one codec, encoded lazily and memoized.

    image: uint8 ``[H, W, 3]``. ``size(key)`` gives ``quality -> bytes`` for the search:
    ``"file"`` for every codec, ``"header-free"`` for JPEG only.
    """

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
