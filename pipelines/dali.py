"""``dali``: NVIDIA DALI reads, decodes (``mixed`` on a GPU, ``cpu`` without), crops, flips and normalizes
with its own operators at its best; its sharding is DALI's own (docs/pipelines.md, "Adapter details")."""

from __future__ import annotations

import contextlib
import gc
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from PIL import Image

from bench.datasets.prepared import PreparedDataset
from bench.errors import InputError
from pipelines.base import (
    Augment,
    Batch,
    Pipeline,
    PipelineConfig,
    Unavailable,
    installed_distributions,
    register,
)
from pipelines.crops import RRC_TRIES
from pipelines.jpeg_header import check_jpeg_files, jpeg_bytes_per_image
from pipelines.shard import num_batches, rank_seed

PREFETCH_DEPTH = 2  # DALI's default: one batch consumed while the next is produced
# Share of JPEGs sent to the hardware decoder where there is one: DALI's default, set explicitly so
# that it is part of the code identity (NVIDIA/DALI#6366 weighs 0.90 against p99 latency).
HW_DECODER_LOAD = 0.65
# Compute capabilities (and names) of the GPUs whose hardware JPEG decoder nvJPEG documents:
# A100/A30/A800, H100/H200/H800/GH200, B100/B200. A wrong answer costs speed, never results.
HW_JPEG_CAPABILITIES = {(8, 0), (9, 0), (10, 0)}
HW_JPEG_NAMES = ("A100", "A800", "H100", "H200", "H800", "GH200", "B100", "B200", "GB200")


def hw_jpeg_decoder(name: str, capability: tuple[int, int]) -> bool:
    """Whether a CUDA device has a hardware JPEG decoder, by compute capability or by name."""
    return tuple(capability) in HW_JPEG_CAPABILITIES or any(k in name.upper() for k in HW_JPEG_NAMES)


def decoder_options(gpu: bool, hw_jpeg: bool, height: int, width: int) -> dict[str, Any]:
    """Decoder keyword arguments: the hardware decoder's load and buffer hints (``mixed`` backend only)."""
    if not (gpu and hw_jpeg):
        return {}
    return {"hw_decoder_load": HW_DECODER_LOAD, "preallocate_width_hint": width, "preallocate_height_hint": height}


def _graph(file_root: str, file_list: str, config: PipelineConfig, height: int, width: int, gpu: bool,
           decoder_kw: dict[str, Any]) -> tuple[Any, Any]:
    """The DALI graph (called inside ``pipeline_def``): ``(images float [3, s, s], labels)``."""
    from nvidia.dali import fn, types

    aug, shuffle, seed = config.augment, config.shuffle, config.seed  # the seed: the same on every rank
    order = ({"stick_to_shard": True, "random_shuffle": shuffle, "seed": seed} if config.resident == "shard"
             else {"shuffle_after_epoch": shuffle, "shuffle_after_epoch_seed": seed})
    jpegs, labels = fn.readers.file(file_root=file_root, file_list=file_list, **order, pad_last_batch=True,
                                    shard_id=config.rank, num_shards=config.world_size, name="Reader")
    decoder = "mixed" if gpu else "cpu"
    if aug.crop == "random-resized":
        images = fn.decoders.image_random_crop(jpegs, device=decoder, output_type=types.RGB, random_area=list(aug.scale),
                                               random_aspect_ratio=list(aug.ratio), num_attempts=RRC_TRIES, **decoder_kw)
        return _finish(fn.resize(images, size=[aug.size, aug.size], antialias=True), aug), labels
    images = fn.decoders.image(jpegs, device=decoder, output_type=types.RGB, **decoder_kw)
    if aug.crop == "random-pad":
        # anchor (x, y) uniform over the zero-padded image: RandomCrop(size, padding=pad)
        ax, ay = (fn.random.uniform(values=list(range(-aug.pad, extent + aug.pad - aug.size + 1)), dtype=types.INT32)
                  for extent in (width, height))
        images = fn.slice(images, fn.stack(ax, ay), types.Constant([aug.size, aug.size], dtype=types.INT32),
                          axis_names="WH", out_of_bounds_policy="pad", fill_values=0)
    else:
        s = min(height, width)
        images = fn.crop(images, crop=[s, s])
        if s != aug.size:
            images = fn.resize(images, size=[aug.size, aug.size], antialias=True)
    return _finish(images, aug), labels


def _finish(images: Any, aug: Augment) -> Any:
    """Flip (per sample) and normalize to float CHW."""
    from nvidia.dali import fn, types

    mirror = fn.random.coin_flip(probability=0.5) if aug.flip else 0
    return fn.crop_mirror_normalize(images, dtype=types.FLOAT, output_layout="CHW", mirror=mirror,
                                    mean=[255.0 * m for m in aug.mean], std=[255.0 * s for s in aug.std])


def listed_files(root: Path, file_list: Path) -> tuple[Path, ...]:
    """The files ``readers.file(file_root=root, file_list=file_list)`` reads, in order (DALI's format:
    a line per file, its name relative to ``root``, whitespace, its label)."""
    try:
        text = file_list.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(f"cannot read DALI's file list ({getattr(e, 'strerror', None) or e})", file_list) from None
    return tuple(Path(f"{root}/{line.strip().rsplit(maxsplit=1)[0]}") for line in text.splitlines() if line.strip())


SCAN_SECONDS = 30.0  # how long a failed decode may spend finding the file DALI could not decode


def decode_error(e: Exception, paths: tuple[Path, ...], budget_s: float = SCAN_SECONDS) -> InputError | None:
    """A DALI decoder failure as bad input naming the first file PIL cannot decode either (DALI's error
    names none); None for any other error, and when every file scanned decodes (a driver, library or
    memory failure is the run's, not the data's)."""
    msg = " ".join(str(e).split())
    if "decoders.image" not in msg and "nvImageCodec" not in msg:
        return None
    cause = msg.split("encountered:", 1)[-1].replace("Current pipeline object is no longer valid.", "").strip()
    t_end = time.monotonic() + budget_s
    for p in paths:
        try:
            with Image.open(p) as im:
                im.load()
        except Exception:  # noqa: BLE001 - any failure marks the file
            return InputError(f"cannot decode JPEG (DALI: {cause})", p)
        if time.monotonic() > t_end:
            break
    return None


@register("dali")
class DaliPipeline(Pipeline):
    def __init__(self, data: PreparedDataset, config: PipelineConfig, store: Path | None = None):
        super().__init__(data, config, store)
        try:
            from nvidia.dali import pipeline_def
            from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy
        except Exception as e:  # ImportError, or a broken CUDA runtime inside DALI
            raise Unavailable(f"nvidia.dali cannot be imported: {type(e).__name__}: {e}") from None
        split = data.split(config.split)
        self.device = torch.device(config.device)
        self.n = len(split)
        gpu = self.device.type == "cuda"
        h, w = split.image_size
        device_id, self.hw_jpeg = None, False
        if gpu:
            device_id = self.device.index if self.device.index is not None else torch.cuda.current_device()
            self.hw_jpeg = hw_jpeg_decoder(torch.cuda.get_device_name(device_id),
                                           torch.cuda.get_device_capability(device_id))
        self._paths = listed_files(split.root, split.file_list)
        check_jpeg_files(self._paths, (h, w))  # before DALI sees any (module docstring)
        self.pipe = pipeline_def(_graph)(
            str(split.root), str(split.file_list), config, h, w, gpu, decoder_options(gpu, self.hw_jpeg, h, w),
            batch_size=config.batch_size, num_threads=max(1, config.workers), device_id=device_id,
            seed=rank_seed(config.seed, config.rank, config.world_size), prefetch_queue_depth=PREFETCH_DEPTH,
        )
        # only uneven shards can leave a rank an empty last batch (module docstring)
        self._uneven = self.n % config.world_size != 0 and not config.drop_last
        self._in_epoch = False
        try:
            self.pipe.build()
            self.iterator = DALIGenericIterator(  # prefetches: a bad file can fail here already
                [self.pipe], ["images", "labels"], reader_name="Reader", last_batch_policy=LastBatchPolicy.PARTIAL,
                auto_reset=True)
        except RuntimeError as e:
            self._reraise(e)

    def _reraise(self, e: RuntimeError):
        """A decode failure is bad input (one line naming the file); anything else propagates."""
        err = decode_error(e, self._paths)
        self.close()
        if err is not None:
            raise err from None
        raise e

    def __len__(self) -> int:
        return num_batches(self.n, self.config)

    def __iter__(self) -> Iterator[Batch]:
        if self.iterator is None:
            raise RuntimeError("dali pipeline is closed")
        if self._in_epoch:  # DALI cannot reset mid-epoch: finish the abandoned one first
            for _ in self.iterator:
                pass
        self._in_epoch = True
        keep, done = len(self), 0
        spare: tuple[torch.Tensor, torch.Tensor] | None = None
        it = iter(self.iterator)
        while True:
            try:
                out = next(it)
            except StopIteration:
                break
            except RuntimeError as e:
                self._reraise(e)
            if done >= keep:  # drop_last: the shard's partial tail, drained so the reader stays in step
                continue
            d = out[0]
            images = d["images"].to(self.device, non_blocking=True)
            labels = d["labels"].reshape(-1).to(self.device, torch.int64, non_blocking=True)
            if labels.numel() == 0:  # a shard one short lost its last batch: repeat its last sample
                if spare is None:
                    raise RuntimeError(f"dali: rank {self.config.rank} got an empty batch "
                                       f"({self.n} images over {self.config.world_size} ranks)")
                images, labels = spare
            elif self._uneven and done == keep - 2:  # DALI may reuse its buffers: keep a copy
                spare = images[-1:].clone(), labels[-1:].clone()
            done += 1
            yield Batch(images=images, labels=labels)
        self._in_epoch = False

    def close(self) -> None:
        """Drop the pipeline and hand DALI's pooled memory back: DALI keeps freed memory in pools of its own,
        which the next pipeline built in this process (and its memory figures) would otherwise start with."""
        if getattr(self, "iterator", None) is None and getattr(self, "pipe", None) is None:
            return
        self.iterator = self.pipe = None
        release_memory()

    def dataset_bytes_per_image(self) -> float | None:
        return jpeg_bytes_per_image(self.data, self.config.split)

    @classmethod
    def libraries(cls) -> dict[str, str | None]:
        """The installed DALI wheels (``nvidia-dali-cuda130 2.4.0``; both, with two CUDA builds)."""
        dali = sorted(f"{n} {v}" for n, v in installed_distributions().items() if n.startswith("nvidia-dali"))
        return {"nvidia-dali": ", ".join(dali) or None}


def release_memory() -> None:
    """Hand DALI's pooled memory back once its pipelines are dropped (an older DALI keeps its pools)."""
    gc.collect()  # a pipeline's C++ object (and its buffers) goes with its last reference
    with contextlib.suppress(ImportError):
        from nvidia.dali.backend import ReleaseUnusedMemory

        ReleaseUnusedMemory()
