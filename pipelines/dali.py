"""``dali``: NVIDIA DALI reads the JPEG files, decodes (``mixed`` on a GPU, ``cpu`` without one),
crops/flips/normalizes per sample with DALI operators, and hands torch tensors to the harness.

``device_id=None`` builds a CPU-only pipeline (no GPU needed); its output is moved to
``config.device``. The reader shuffles a true permutation every epoch (``shuffle_after_epoch``)
and pads the last shard batch (``pad_last_batch``) so ``LastBatchPolicy.PARTIAL`` yields every
sample exactly once.

Sharding (``config.rank`` of ``config.world_size``), DALI's own way: the reader reads
``shard_id=rank`` of ``num_shards=world_size``, every rank with the same
``shuffle_after_epoch_seed`` (``config.seed``), so each epoch's global shuffle is the same on
every rank and the shards partition it. ``shuffle_after_epoch`` implies ``stick_to_shard``
(``reader_meta`` says so): rank ``r`` always reads the contiguous slice
``[floor(r n / w), floor((r + 1) n / w))`` of the epoch's shuffled list, so shard sizes differ by
at most one. DALI's permutation is not ``pipelines.shard``'s (which sample a rank sees differs
from ``raw``/``inr``/``torch-jpeg``); the invariant is the union. ``len`` is the same on every
rank and equals the other adapters' (``ceil(ceil(n / w) / b)``; ``(n // w) // b`` with
``drop_last``). The last batch, measured on DALI 2.4 CPU pipelines (``tests/test_pipelines_shard.py``):

* ``drop_last=False``: every sample at least once per epoch. ``pad_last_batch`` gives every rank
  the same number of batches; where a rank's shard is one short and that costs it its last batch,
  DALI's ``PARTIAL`` iterator hands it an empty batch, which this adapter replaces by that rank's
  previous sample again, same crop (one duplicate; at most ``world_size - 1`` per epoch, as
  ``DistributedSampler``'s padding). Otherwise no sample twice.
* ``drop_last=True``: the iterator runs ``PARTIAL`` too and the adapter yields only the first
  ``(n // w) // b`` (full) batches, draining the rest: DALI's own ``DROP`` policy with
  ``num_shards > 1`` and uneven shards leaves the reader a sample out of step, and later epochs
  then repeat samples (seen on DALI 2.4). No sample twice; the rest of each shard is dropped.

Fixed shards (``config.resident == "shard"``): the reader runs ``stick_to_shard=True`` with
``random_shuffle`` instead of ``shuffle_after_epoch`` (DALI 2.4 refuses the two together:
"shuffle_after_epoch and stick_to_shard cannot be both true"); the file list is shuffled once with
DALI's fixed seed, the same on every rank, and a shuffle buffer orders each epoch), so rank ``r``
reads the same contiguous slice every epoch, in a new order: the same samples every epoch, the
union policy above. Nothing is resident either way. With ``drop_last`` the uneven shards are not
cut to ``n // w`` first: a rank one sample longer drops a different one of its own each epoch.

Augmentation draws: DALI's pipeline ``seed`` is ``shard.rank_seed(seed, rank, world_size)``
(``seed`` itself with one rank; distinct per rank otherwise).

DALI as its own best practice (a weak baseline flatters the others):

* random-resized crops use the fused ``fn.decoders.image_random_crop``: the crop window is drawn
  from the JPEG header and only that region is decoded (ROI decode), then resized. Its window
  sampler is DALI's ``RandomCropGenerator`` with ``random_area = Augment.scale``,
  ``random_aspect_ratio = Augment.ratio`` (log-uniform) and ``num_attempts = RRC_TRIES`` (10),
  falling back to a centre crop with the ratio clamped into range: torchvision's definition
  (``tests/test_pipelines.py`` checks the distributions against torchvision and the other adapters).
* ``hw_decoder_load`` (``mixed`` only) on GPUs with a hardware JPEG decoder: see ``hw_jpeg_decoder``.
* ``num_threads`` = ``config.workers`` (at least 1): the same CPU budget the ``torch-jpeg``
  DataLoader gets, so a cell compares pipelines at equal cores; DALI's CPU stage (file reads,
  Huffman decoding for ``mixed``, everything for ``cpu``) runs on these threads.
* ``prefetch_queue_depth`` = ``PREFETCH_DEPTH`` (2, DALI's default): one batch consumed while the
  next is produced. Deeper queues only absorb jitter, which a steady file reader does not have,
  and each slot holds a whole float batch (256 x 3 x 224 x 224 x 4 B = 154 MB on the device).

Files checked at build, before DALI sees them (``pipelines.jpeg_header.check_jpeg_files``): every
file the reader's file list names. DALI 2.4 does not report a file its JPEG parser (nvImageCodec's)
refuses: at batches of 32 or more the process dies of SIGSEGV (exit 139, no error line, no error
row), measured on garbage, on files cut inside their headers (also with an end-of-image marker
appended), on a zeroed segment length and on a frame of 0 components. So each file gets
the check all three JPEG adapters run (``pipelines.jpeg_header``: a frame header of the prepared
size, so a replaced file of another size is refused where DALI would crop it and train on it;
markers that walk as that parser walks them, through every scan to an end-of-image marker at the
end). The first file that fails is an ``InputError`` naming it (exit 2, one line, an error row). Of
300 files with damaged headers (random bytes, cuts with an end-of-image marker appended,
insertions, deletions; 32 and 224 px; batches of 64 on the CPU backend), the 138 that crashed this
adapter were all refused; of those accepted, 126 decoded and 34 failed with DALI's own error, which
``decode_error`` turns into one line naming the file. Inside a scan, DALI's CPU decoder decodes a
stray marker (random bytes that make one) that PIL and TorchCodec refuse; the walk refuses it for
all three. Damage that keeps the markers in place (flipped bits or bytes, a scan cut and an
end-of-image marker appended) passes: DALI's CPU decoder gives the pixels PIL and TorchCodec give
for it, bit for bit, and prints libjpeg's "Corrupt JPEG data" warning. The whole split is checked on
every rank: which files a rank reads is DALI's choice (a new slice of a new shuffle every epoch, or
with fixed shards a slice of the reader's own shuffle of the list).

The check reads every file whole (the walk crosses the scans): about 14 us per file at 32 px and
22 us at 224 px from the page cache on this project's 2-core VM (300 files each; the head-and-tail
read it replaced took 12 and 15 us), so ~50 ms for 2,400 files of 224 px. It counts in
``build_s`` (and so in time to first batch): it is the price of a DALI pipeline that reports a bad
file instead of crashing, which a user running DALI on files they have not checked does not pay.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from bench.datasets.prepared import PreparedDataset
from bench.errors import InputError
from pipelines.base import Augment, Batch, Pipeline, PipelineConfig, Unavailable, register
from pipelines.crops import RRC_TRIES
from pipelines.jpeg_header import check_jpeg_files, jpeg_bytes_per_image
from pipelines.shard import num_batches, rank_seed

PREFETCH_DEPTH = 2
# Share of JPEGs routed to the hardware decoder (NVJPG engines) where there is one. 0.65 is DALI's
# default, tuned by NVIDIA on A100 (ResNet-50 training); DALI measured 0.90 at +1.8% throughput but
# ~40% worse p99 decode latency (NVIDIA/DALI#6366). Set explicitly, so the value is in the code
# identity; tune it on the GPU itself (scripts/gpu-check) before changing it.
HW_DECODER_LOAD = 0.65
# Compute capabilities of the data-centre GPUs with NVJPG hardware JPEG decoders that nvJPEG's hardware
# backend documents: A100/A30/A800 (8.0), H100/H200/H800/GH200 (9.0), B100/B200 (10.0). Other parts
# (8.6: A10, A40, RTX 30xx; 8.9: L4, L40, RTX 40xx) are treated as having none. DALI routes to the
# hardware whenever it finds it (its own default load is 0.65), so this sets the load and the
# buffer hints explicitly where the hardware is expected; it never changes results.
HW_JPEG_CAPABILITIES = {(8, 0), (9, 0), (10, 0)}
HW_JPEG_NAMES = ("A100", "A800", "H100", "H200", "H800", "GH200", "B100", "B200", "GB200")


def hw_jpeg_decoder(name: str, capability: tuple[int, int]) -> bool:
    """Whether a CUDA device has a hardware JPEG decoder DALI's ``mixed`` decoder can use.

    By compute capability (``HW_JPEG_CAPABILITIES``) or, for parts that share a capability with
    decoder-less ones, by name. Only steers ``hw_decoder_load``; DALI itself falls back to the
    CUDA (hybrid) decoder when the hardware is absent, so a wrong answer costs speed, not results.
    """
    return tuple(capability) in HW_JPEG_CAPABILITIES or any(k in name.upper() for k in HW_JPEG_NAMES)


def decoder_options(gpu: bool, hw_jpeg: bool, height: int, width: int) -> dict[str, Any]:
    """Decoder keyword arguments: hardware-decoder settings apply only to the ``mixed`` backend."""
    if not (gpu and hw_jpeg):
        return {}
    # Preallocate the hardware decoder's buffers for the prepared size (every image has it).
    return {"hw_decoder_load": HW_DECODER_LOAD, "preallocate_width_hint": width, "preallocate_height_hint": height}


def _graph(
    file_root: str, file_list: str, aug: Augment, height: int, width: int, shuffle: bool, shuffle_seed: int,
    gpu: bool, decoder_kw: dict[str, Any], shard_id: int = 0, num_shards: int = 1, fixed: bool = False,
) -> tuple[Any, Any]:
    """The DALI graph (called inside ``pipeline_def``): returns ``(images [3,s,s] float, labels)``.

    The reader reads shard ``shard_id`` of ``num_shards``; ``shuffle_seed`` must be the same on every rank.
    """
    from nvidia.dali import fn, types

    # fixed (resident="shard"): the shard never changes; DALI refuses shuffle_after_epoch together with
    # stick_to_shard, so the shard's order comes from random_shuffle's buffer instead.
    order = ({"stick_to_shard": True, "random_shuffle": shuffle, "seed": shuffle_seed} if fixed
             else {"shuffle_after_epoch": shuffle, "shuffle_after_epoch_seed": shuffle_seed})
    jpegs, labels = fn.readers.file(
        file_root=file_root,
        file_list=file_list,
        **order,
        pad_last_batch=True,
        shard_id=shard_id,
        num_shards=num_shards,
        name="Reader",
    )
    decoder = "mixed" if gpu else "cpu"
    if aug.crop == "random-resized":
        # Fused: draw the window from the header, decode only it, then resize it to the output size.
        images = fn.decoders.image_random_crop(
            jpegs, device=decoder, output_type=types.RGB, random_area=list(aug.scale),
            random_aspect_ratio=list(aug.ratio), num_attempts=RRC_TRIES, **decoder_kw,
        )
        return _finish(fn.resize(images, size=[aug.size, aug.size], antialias=True), aug), labels
    images = fn.decoders.image(jpegs, device=decoder, output_type=types.RGB, **decoder_kw)
    if aug.crop == "random-pad":
        # Anchor (x, y) uniform over the zero-padded image: RandomCrop(size, padding=pad).
        starts = list(range(-aug.pad, width + aug.pad - aug.size + 1))
        ax = fn.random.uniform(values=starts, dtype=types.INT32)
        starts_y = list(range(-aug.pad, height + aug.pad - aug.size + 1))
        ay = fn.random.uniform(values=starts_y, dtype=types.INT32)
        anchor = fn.stack(ax, ay)
        images = fn.slice(
            images, anchor, types.Constant([aug.size, aug.size], dtype=types.INT32),
            axis_names="WH", out_of_bounds_policy="pad", fill_values=0,
        )
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
    return fn.crop_mirror_normalize(
        images,
        dtype=types.FLOAT,
        output_layout="CHW",
        mean=[255.0 * m for m in aug.mean],
        std=[255.0 * s for s in aug.std],
        mirror=mirror,
    )


def listed_files(root: Path, file_list: Path) -> tuple[Path, ...]:
    """The files ``readers.file(file_root=root, file_list=file_list)`` reads, in the list's order: each
    non-empty line is a file name relative to ``root``, then whitespace and a label (DALI's format)."""
    try:
        text = file_list.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(f"cannot read DALI's file list ({getattr(e, 'strerror', None) or e})", file_list) from None
    return tuple(Path(f"{root}/{line.strip().rsplit(maxsplit=1)[0]}") for line in text.splitlines() if line.strip())


SCAN_SECONDS = 30.0  # how long a failed decode may spend finding the file DALI could not decode


def _first_undecodable(paths: tuple[Path, ...], budget_s: float = SCAN_SECONDS) -> Path | None:
    """The first of ``paths`` PIL cannot decode (DALI's error does not name the file), or None."""
    import time

    from PIL import Image

    t_end = time.monotonic() + budget_s
    for p in paths:
        try:
            with Image.open(p) as im:
                im.load()
        except Exception:  # noqa: BLE001 - any failure marks the file
            return p
        if time.monotonic() > t_end:
            return None
    return None


def decode_error(e: Exception, paths: tuple[Path, ...], budget_s: float = SCAN_SECONDS) -> InputError | None:
    """A DALI decoder failure as one-line bad input naming the file PIL cannot decode either; None
    for any other error, and for a decoder failure when every file scanned decodes: on a GPU the
    decoder also fails for reasons that are not the data's (a driver too old for nvImageCodec, a
    library of another CUDA, the hardware decoder failing to start, device memory), and those must
    stay errors of the run (exit 1, an error row), not be blamed on the user's files (exit 2)."""
    msg = " ".join(str(e).split())
    if "decoders.image" not in msg and "nvImageCodec" not in msg:
        return None
    cause = msg.split("encountered:", 1)[-1].replace("Current pipeline object is no longer valid.", "").strip()
    bad = _first_undecodable(paths, budget_s)
    return None if bad is None else InputError(f"cannot decode JPEG (DALI: {cause})", bad)


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
        if gpu:
            device_id = self.device.index if self.device.index is not None else torch.cuda.current_device()
            self.hw_jpeg = hw_jpeg_decoder(torch.cuda.get_device_name(device_id),
                                           torch.cuda.get_device_capability(device_id))
        else:
            device_id, self.hw_jpeg = None, False
        # Every file the reader may hand the decoder, checked before DALI sees any (module docstring).
        self._paths = listed_files(split.root, split.file_list)
        check_jpeg_files(self._paths, (h, w))
        pipe_fn = pipeline_def(_graph)
        self.pipe = pipe_fn(
            str(split.root), str(split.file_list), config.augment, h, w, config.shuffle, config.seed, gpu,
            decoder_options(gpu, self.hw_jpeg, h, w), config.rank, config.world_size, config.resident == "shard",
            batch_size=config.batch_size,
            num_threads=max(1, config.workers),
            device_id=device_id,
            seed=rank_seed(config.seed, config.rank, config.world_size),
            prefetch_queue_depth=PREFETCH_DEPTH,
        )
        # PARTIAL in both cases: ``drop_last`` is applied in ``__iter__`` (see the module docstring).
        policy = LastBatchPolicy.PARTIAL
        # Only uneven shards can leave a rank an empty last batch (module docstring).
        self._uneven = self.n % config.world_size != 0 and not config.drop_last
        try:
            self.pipe.build()
            self.iterator = DALIGenericIterator(  # prefetches: a bad file can fail here already
                [self.pipe], ["images", "labels"], reader_name="Reader", last_batch_policy=policy, auto_reset=True
            )
        except RuntimeError as e:
            self._reraise(e)
        self._in_epoch = False

    def _reraise(self, e: RuntimeError):
        """A decode failure is bad input (one line naming the file); anything else propagates."""
        err = decode_error(e, self._paths)
        self.close()
        if err is not None:
            raise err from None
        raise e

    def __len__(self) -> int:
        """Batches per epoch on this rank (the same on every rank)."""
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
        """Drop the pipeline and hand DALI's pooled memory back (DALI keeps freed device and pinned
        memory in its own pools, outside torch's allocator, until asked: the next pipeline built in
        this process, and its memory figures, would otherwise start with it still held)."""
        if getattr(self, "iterator", None) is None and getattr(self, "pipe", None) is None:
            return
        self.iterator = None
        self.pipe = None
        import gc

        gc.collect()  # the pipeline's C++ object (and its buffers) goes with its last reference
        try:
            from nvidia.dali.backend import ReleaseUnusedMemory
        except ImportError:  # an older DALI: its pools stay, as before
            return
        ReleaseUnusedMemory()

    def resident_bytes(self) -> dict[str, int]:
        """DALI's pools are not visible here (use NVML); nothing dataset-sized is held."""
        return {"device": 0, "host": 0}

    def dataset_bytes_per_image(self) -> float | None:
        """The split's JPEG files, mean bytes (``jpeg_header.jpeg_bytes_per_image``)."""
        return jpeg_bytes_per_image(self.data, self.config.split)

    @classmethod
    def libraries(cls) -> dict[str, str | None]:
        """The installed DALI wheels (``nvidia-dali-cuda130 2.4.0``; two CUDA builds: both), from metadata."""
        import importlib.metadata as md

        dali = sorted(f"{d.metadata['Name']} {d.version}" for d in md.distributions()
                      if (d.metadata["Name"] or "").lower().startswith("nvidia-dali"))
        return {"nvidia-dali": ", ".join(dali) or None}
