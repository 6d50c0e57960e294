"""``torch-nvjpeg``: JPEG bytes resident in host memory, decoded in batches by TorchCodec (or torchvision.io).

What many users pick today instead of DALI: the split's JPEG files are read once at build into
one host buffer, a 1-D uint8 view per file (``read_jpegs``). Not pinned: the decoders take the
bitstreams as CPU tensors and nvJPEG stages them through pinned buffers of its own, so pinning
ours would buy no DMA; it would cost a ``cudaHostAlloc`` per file in the first build (the caching
host allocator serves later builds from its cache: build times differing between repeats) and up
to 2x the bytes (it rounds every block up to a power of two), which ``resident_bytes`` would not
see;
each batch is one ``decode_jpeg(list_of_tensors, mode="RGB", device=config.device)`` call:
``torchcodec.decoders.decode_jpeg`` when TorchCodec can be imported, else
``torchvision.io.decode_jpeg`` (the same call; torchvision 0.29 deprecates it in favour of
TorchCodec with a ``DeprecationWarning`` per call, which ``quiet_torchvision_decode`` keeps quiet:
the fallback and its reason are recorded instead). On CUDA that is nvJPEG, batched (on
A100/H100-class GPUs nvJPEG may use the hardware decoder); without a GPU the same call decodes on
the CPU (libjpeg-turbo: TorchCodec's own copy, or torchvision's) in the calling thread, one image
after the other. ``config.workers`` is not used: a pool of decode threads measured slower here
(1.8x at 224 px on 2 cores: the augmentation's OpenMP threads spin between batches and compete
with it), and on a GPU the decode is nvJPEG's.

Which decoder ran is recorded: ``TorchNvjpegPipeline.decoder`` (``jpeg_decoder()``: library,
version with its build tag, the function, and why TorchCodec was not used when it was not), and
``env.json``'s ``torch_nvjpeg`` section (``bench.envinfo.collect``) next to ``versions.torchcodec``.
On the CPU both decoders give the same pixels as PIL, bit for bit, on the prepared JPEGs
(``tests/test_pipelines_nvjpeg.py``). TorchCodec applies a file's EXIF orientation (torchvision
and PIL do not by default); prepared files carry no EXIF (written from arrays by
``bench.datasets.prepared``).

Augmentation is ``raw``'s device-side code (``pipelines.crops``): the decoded ``[3, H, W]`` images
all have the prepared size, so they stack into one ``[B, 3, H, W]`` batch; crops and flips are
drawn per image on the CPU from ``(seed, epoch)`` and applied with one ``grid_sample`` (``warp``),
then ``normalize_``. So the augmentation, and its statistics, are ``raw``'s exactly: the two
differ only by the decode.

Sharding: as ``raw``, rank ``config.rank`` decodes its slice of the epoch's global permutation with
crops from its own generator (``pipelines.shard.epoch_shard``); every rank holds all the files, or
with ``config.resident == "shard"`` only its fixed shard's (``shard.held_samples``).

Host syncs on CUDA: none of ours in an epoch's steady state. The epoch's order goes to the device
once per epoch with ``crops.to_device`` (pinned, non-blocking); the file indices stay on the CPU
(``order`` there), crops go through ``warp`` like ``raw``'s. What the decoder does inside is the
API's own cost, and part of what this adapter measures: TorchCodec (0.17, ``DecodeJpegCuda.cpp``)
decodes on the current stream and ``cudaStreamSynchronize``-s it before returning (and once before
a batch goes to the hardware decoder). Called on the training stream, a batch's decode would first
wait for the GPU work queued before it, the previous training step included, so the adapter calls
the decoder on a stream of its own (``decode_stream``), as a careful user would: the host waits for
the decode only, the training stream waits for the decoded batch on the device (``wait_stream``),
and the batch's memory is kept for the training stream (``record_stream``). torchvision decodes on
a side stream of its own anyway. Those syncs are CUDA runtime calls, which
``torch.cuda.set_sync_debug_mode`` does not see.

Resident bytes: ``host`` = the JPEG bytes held (whole files, headers included); ``device`` = the
labels on ``config.device``. Every file is checked at build (``pipelines.jpeg_header.check_jpeg_bytes``,
the check ``dali`` and ``torch-jpeg`` run): a file whose frame size is not the prepared size (a
replaced or damaged file, or a pixel bomb), or whose markers do not walk through its scans to an
end-of-image marker at its end (a cut or damaged file: TorchCodec refuses some, decodes others with
grey blocks), is refused naming the file, before anything is decoded.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from bench.datasets.prepared import PreparedDataset
from bench.errors import InputError
from pipelines.base import PipelineConfig, Unavailable, installed_version, register
from pipelines.crops import Crops, normalize_, warp
from pipelines.device_epoch import DeviceEpochPipeline
from pipelines.jpeg_header import check_jpeg_bytes, jpeg_bytes_per_image, too_long
from pipelines.shard import held_samples


def read_jpegs(paths: tuple[Path, ...], size: tuple[int, int]) -> list[torch.Tensor]:
    """Each file as a 1-D uint8 view of one contiguous host buffer (their bytes, nothing more: the
    resident figure is exact); every file must pass ``pipelines.jpeg_header.check_jpeg_bytes`` for ``size``.
    Files are read straight into the buffer (sized from ``stat``): the build never holds the split twice."""
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
        check_jpeg_bytes(bytes(view[at:at + n]), size, p)  # frame size, markers through the scans (libjpeg pads a cut scan with grey)
        spans.append((at, n))
        at += n
    buf = torch.frombuffer(whole, dtype=torch.uint8) if whole else torch.empty(0, dtype=torch.uint8)
    return [buf[a:a + n] for a, n in spans]


@dataclass(frozen=True)
class JpegDecoder:
    """The ``decode_jpeg`` this adapter calls, and which library it is.

    ``decode(data, mode="RGB", device=...)``: ``data`` a 1-D uint8 tensor of a JPEG file's bytes
    (on the host) or a list of them; returns uint8 ``[3, H, W]`` on ``device`` (a list for a list).
    ``version`` is the module's ``__version__``, build tag included (``"0.17.0+cu130"``).
    ``fallback_reason``: why TorchCodec is not the decoder (None when it is).
    """

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
    """TorchCodec's ``decode_jpeg`` when it can be imported, else torchvision.io's.

    Any failure to import TorchCodec falls back (not installed; or its native libraries do not
    load: the PyPI wheel is built for one CUDA major and needs a CUDA build of torch), with the
    reason kept in ``fallback_reason``. Raises ``Unavailable`` when neither can be imported.
    """
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
    """``torchvision.io.decode_jpeg(data, **kwargs)`` without the ``DeprecationWarning`` torchvision 0.29
    raises on every call (one per batch, hundreds per run); which decoder ran, and why, is in ``env.json``."""
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
    """Holds the split's JPEG files as uint8 tensors on the host and ``labels`` int64 ``[N]`` on the device
    (or only the rank's fixed shard's: ``[M]``, ``shard.held_samples``); ``decoder``: the ``JpegDecoder``
    every batch goes through."""

    def __init__(self, data: PreparedDataset, config: PipelineConfig, store: Path | None = None):
        super().__init__(data, config, store)
        self.decoder = jpeg_decoder()  # which library decodes: recorded with the results (module docstring)
        split = data.split(config.split)
        self.device = torch.device(config.device)
        self.cuda = self.device.type == "cuda"
        self.height, self.width = split.image_size
        self.n = len(split)
        held = held_samples(self.n, config).tolist()
        self.paths = tuple(split.jpeg_paths[i] for i in held)  # position k: sample held[k]
        self.jpegs: list[torch.Tensor] | None = read_jpegs(self.paths, split.image_size)
        if self.cuda:  # a decoder built without nvJPEG raises on the first CUDA decode: say so now
            try:
                self.decoder.decode(self.jpegs[:1], mode="RGB", device=self.device)
            except RuntimeError as e:
                self.jpegs = None
                raise Unavailable(f"{self.decoder.function} ({self.decoder.version}) cannot decode JPEG on "
                                  f"{self.device}: {' '.join(str(e).split())}") from None
        self.labels: torch.Tensor | None = torch.from_numpy(split.labels[held]).to(self.device)
        # CUDA: the decoder runs on its own stream, so that its host sync never waits for training (docstring)
        self.decode_stream = torch.cuda.Stream(self.device) if self.cuda else None

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
        """The first file of ``idx`` the decoder cannot decode on the CPU, as one line naming it; None when
        every one decodes (as ``dali.decode_error``: a device failure is the run's error, not the data's)."""
        for i in idx:
            try:
                self.decoder.decode(self.jpegs[i], mode="RGB")
            except RuntimeError as err:
                return InputError(f"cannot decode JPEG ({self.decoder.library}: {_reason(err)})", self.paths[i])
        return None

    def render(self, positions: torch.Tensor, positions_dev: torch.Tensor, crops: Crops) -> torch.Tensor:
        aug = self.config.augment
        return normalize_(warp(self._decode_batch(positions.tolist()).float(), crops, aug), aug)

    def close(self) -> None:
        self.jpegs = None
        self.labels = None

    def resident_bytes(self) -> dict[str, int]:
        """``host``: the JPEG files' bytes (one buffer); ``device``: the labels on ``config.device``."""
        host = sum(t.numel() for t in self.jpegs) if self.jpegs is not None else 0
        device = self.labels.numel() * self.labels.element_size() if self.labels is not None else 0
        return {"device": device, "host": host}

    def dataset_bytes_per_image(self) -> float | None:
        """The split's JPEG files, mean bytes (``jpeg_header.jpeg_bytes_per_image``: all of them, also
        when this rank holds only its shard's)."""
        return jpeg_bytes_per_image(self.data, self.config.split)

    @classmethod
    def libraries(cls) -> dict[str, str | None]:
        """The two libraries ``jpeg_decoder`` may decode with (which one did: ``JpegDecoder.info``)."""
        return {"torchcodec": installed_version("torchcodec"), "torchvision": installed_version("torchvision")}
