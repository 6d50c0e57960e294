"""``torch-nvjpeg``: JPEG bytes resident in host memory, decoded per batch by TorchCodec (or torchvision.io),
then ``raw``'s augmentation; on CUDA on its own stream (TorchCodec syncs its stream, docs/pipelines.md)."""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from bench.datasets.prepared import PreparedSplit
from bench.errors import InputError
from pipelines.base import Unavailable, installed_version, register
from pipelines.crops import Crops, normalize_, warp
from pipelines.device_epoch import DeviceEpochPipeline, nbytes
from pipelines.jpeg_header import check_jpeg_bytes, jpeg_bytes_per_image, too_long


def read_jpegs(paths: tuple[Path, ...], size: tuple[int, int]) -> list[torch.Tensor]:
    """Each file as a 1-D uint8 view of one host buffer, read straight into it (the split is never held
    twice); every file must pass ``check_jpeg_bytes`` for ``size``."""
    try:
        lengths = [p.stat().st_size for p in paths]
    except OSError as e:
        raise InputError(f"cannot read JPEG ({e.strerror or e})", Path(e.filename or "")) from None
    for p, n in zip(paths, lengths, strict=True):  # before the buffer is sized: a huge file is refused, not allocated
        if (problem := too_long(n, size)) is not None:
            raise InputError(problem, p)
    whole = bytearray(sum(lengths))
    view, spans, at = memoryview(whole), [], 0
    for p, n in zip(paths, lengths, strict=True):
        try:
            with open(p, "rb") as f:
                got = f.readinto(view[at:at + n])
                more = f.read(1)
        except OSError as e:
            raise InputError(f"cannot read JPEG ({e.strerror or e})", p) from None
        if got != n or more:
            raise InputError("changed while it was read (its size is not what it was a moment before)", p)
        check_jpeg_bytes(bytes(view[at:at + n]), size, p)
        spans.append((at, n))
        at += n
    buf = torch.frombuffer(whole, dtype=torch.uint8) if whole else torch.empty(0, dtype=torch.uint8)
    return [buf[a:a + n] for a, n in spans]


@dataclass(frozen=True)
class JpegDecoder:
    """The ``decode_jpeg`` this adapter calls: ``decode(data, mode="RGB", device=...)`` takes a file's bytes
    (1-D uint8 on the host), or a list of them, and returns uint8 ``[3, H, W]`` (a list for a list).
    ``version``: the module's, build tag included; ``fallback_reason``: why not TorchCodec (None: it is)."""

    library: str  # "torchcodec" | "torchvision"
    version: str
    decode: Callable[..., Any]
    fallback_reason: str | None = None

    @property
    def function(self) -> str:
        return f"{self.library}.{'decoders' if self.library == 'torchcodec' else 'io'}.decode_jpeg"

    def info(self) -> dict[str, str | None]:
        """What results record: ``{"library", "version", "function", "fallback_reason"}``."""
        return {"library": self.library, "version": self.version, "function": self.function,
                "fallback_reason": self.fallback_reason}


def jpeg_decoder() -> JpegDecoder:
    """TorchCodec's ``decode_jpeg`` when it imports (its native libraries may not load), else torchvision.io's
    with the reason; ``Unavailable`` when neither imports."""
    try:
        import torchcodec
        from torchcodec.decoders import decode_jpeg
    except Exception as e:  # noqa: BLE001 - ImportError, or OSError/RuntimeError from its native libraries
        why = f"torchcodec cannot be imported: {type(e).__name__}: {' '.join(str(e).split())}"
    else:
        return JpegDecoder("torchcodec", str(getattr(torchcodec, "__version__", "unknown")), decode_jpeg)
    try:
        import torchvision
        from torchvision.io import decode_jpeg
    except Exception as e:  # noqa: BLE001 - a broken torchvision install
        raise Unavailable(f"{why}; torchvision.io.decode_jpeg cannot be imported either: "
                          f"{type(e).__name__}: {e}") from None
    return JpegDecoder("torchvision", torchvision.__version__, quiet_torchvision_decode, fallback_reason=why)


TORCHVISION_DEPRECATION = "The image decoding and encoding capabilities of TorchVision are deprecated"


def quiet_torchvision_decode(data, **kwargs):
    """``torchvision.io.decode_jpeg`` without the ``DeprecationWarning`` torchvision 0.29 raises on every call."""
    from torchvision.io import decode_jpeg

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=TORCHVISION_DEPRECATION, category=DeprecationWarning)
        return decode_jpeg(data, **kwargs)


_SOURCE_LOCATION = re.compile(r"^[\w:]+, \S+\.(?:cpp|cu|h|hpp):\d+, ")


def _reason(e: Exception) -> str:
    """The decoder's error on one line, without its C++ function and source location."""
    return _SOURCE_LOCATION.sub("", " ".join(str(e).split()))


@register("torch-nvjpeg")
class TorchNvjpegPipeline(DeviceEpochPipeline):
    """Holds the held samples' JPEG files (``jpegs``, uint8 views of one host buffer); ``decoder``: the
    ``JpegDecoder`` every batch goes through."""

    releases = ("jpegs",)

    def load(self, split: PreparedSplit, held: torch.Tensor) -> torch.Tensor:
        self.decoder = jpeg_decoder()
        self.paths = tuple(split.jpeg_paths[i] for i in held.tolist())  # position k: sample held[k]
        self.jpegs: list[torch.Tensor] | None = read_jpegs(self.paths, split.image_size)
        cuda = self.device.type == "cuda"
        if cuda:  # a decoder built without nvJPEG raises on the first CUDA decode: say so now
            try:
                self.decoder.decode(self.jpegs[:1], mode="RGB", device=self.device)
            except RuntimeError as e:
                self.jpegs = None
                raise Unavailable(f"{self.decoder.function} ({self.decoder.version}) cannot decode JPEG on "
                                  f"{self.device}: {' '.join(str(e).split())}") from None
        self.decode_stream = torch.cuda.Stream(self.device) if cuda else None
        return self.split_labels(split, held)

    def _decode_batch(self, idx: list[int]) -> torch.Tensor:
        """uint8 ``[B, 3, H, W]`` on ``config.device`` for the files ``idx``."""
        data = [self.jpegs[i] for i in idx]
        try:
            if self.decode_stream is None:
                return torch.stack(self.decoder.decode(data, mode="RGB", device=self.device))
            consumer = torch.cuda.current_stream(self.device)
            with torch.cuda.stream(self.decode_stream):
                images = self.decoder.decode(data, mode="RGB", device=self.device)
        except RuntimeError:
            bad = self._bad_file(idx)
            if bad is None:  # every file decodes on the CPU: the device failed (memory, driver), not the data
                raise
            raise bad from None
        consumer.wait_stream(self.decode_stream)  # on the device: the host does not wait here
        for im in images:  # allocated on the decode stream, used on the consumer's
            im.record_stream(consumer)
        return torch.stack(images)

    def _bad_file(self, idx: list[int]) -> InputError | None:
        """The first file of ``idx`` the decoder cannot decode on the CPU, naming it; None when every one
        decodes (then the device failed, not the data)."""
        for i in idx:
            try:
                self.decoder.decode(self.jpegs[i], mode="RGB")
            except RuntimeError as err:
                return InputError(f"cannot decode JPEG ({self.decoder.library}: {_reason(err)})", self.paths[i])
        return None

    def render(self, positions: torch.Tensor, positions_dev: torch.Tensor, crops: Crops) -> torch.Tensor:
        aug = self.config.augment
        return normalize_(warp(self._decode_batch(positions.tolist()).float(), crops, aug), aug)

    def resident_bytes(self) -> dict[str, int]:
        """``host``: the JPEG files' bytes; ``device``: the labels."""
        return {"device": nbytes(self.labels), "host": sum(t.numel() for t in self.jpegs or ())}

    def dataset_bytes_per_image(self) -> float | None:
        """The split's JPEG files, mean bytes (all of them, also when this rank holds only its shard)."""
        return jpeg_bytes_per_image(self.data, self.config.split)

    @classmethod
    def libraries(cls) -> dict[str, str | None]:
        """The two libraries ``jpeg_decoder`` may decode with (which one did: ``JpegDecoder.info``)."""
        return {"torchcodec": installed_version("torchcodec"), "torchvision": installed_version("torchvision")}
