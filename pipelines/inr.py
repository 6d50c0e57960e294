"""``inr``: the dataset resident on the device as per-image SIREN weights (Rapid-INR), decoded per batch.

The store is loaded onto the device once. An epoch is a permutation of indices; each batch
gathers and dequantizes only its images' weights and decodes them in one batched pass.
Augmentation is folded into the coordinates: each image's crop and flip are an affine map of
its sampling grid (``pipelines.crops.crop_theta``), evaluated directly at the output size — no
decode-then-crop (``pipelines.inr_decode`` folds the map into the first layer's weights). The
network is evaluated at the exact crop coordinates (no edge clamp: the outer half pixel of a
crop touching the border is the network's own smooth continuation); for ``random-pad``
samples outside the image are zero (black before normalization), as with
``RandomCrop(padding=pad)``.

Sharding: rank ``config.rank`` iterates its slice of the epoch's global permutation and draws its
crops from its own generator (``pipelines.shard.epoch_shard``); every rank holds the whole store, or
with ``config.resident == "shard"`` only its fixed shard's images (``shard.held_samples``): the
store is loaded and verified on the CPU, and ``StoredINR.select`` repacks those images' codes onto
the device (the whole store passes through host memory once, at build).

Host syncs: none in an epoch's steady state. Crops are drawn on the CPU, turned into ``theta``
there and copied with ``pipelines.crops.to_device`` (pinned, non-blocking on CUDA), as is the
epoch's order; the store's gather/dequantize and the decode are queued kernels. The one documented
exception: the first batch ever on a device builds the normalization constants
(``crops.norm_constants``).
"""

from __future__ import annotations

from pathlib import Path

import torch

from bench.datasets.identity import check_store_shape, check_store_source
from bench.datasets.prepared import PreparedDataset
from pipelines.base import PipelineConfig, Unavailable, register
from pipelines.crops import Crops, crop_theta, normalize_, to_device
from pipelines.device_epoch import DeviceEpochPipeline
from pipelines.inr_decode import SirenDecoder
from pipelines.shard import held_samples


def inside_mask(theta: torch.Tensor, size: int) -> torch.Tensor:
    """float32 ``[B, 1, size, size]``: 1 where an output pixel samples inside the image (random-pad)."""
    t = (torch.arange(size, device=theta.device, dtype=theta.dtype) * 2 + 1) / size - 1
    x = theta[:, 0, 0:1] * t + theta[:, 0, 2:3]  # [B, size] input x of each output column
    y = theta[:, 1, 1:2] * t + theta[:, 1, 2:3]  # [B, size] input y of each output row
    eps = 1e-4
    return ((y.abs() <= 1 + eps)[:, :, None] & (x.abs() <= 1 + eps)[:, None, :]).to(theta.dtype).unsqueeze(1)


@register("inr")
class InrPipeline(DeviceEpochPipeline):
    """Holds the ``inr.store.StoredINR`` (quantized weights, labels) on ``config.device``: all the images,
    or the rank's fixed shard (``shard.held_samples``; image ``k`` held is sample ``held[k]``)."""

    needs_store = True

    def __init__(self, data: PreparedDataset, config: PipelineConfig, store: Path | None = None):
        super().__init__(data, config, store)
        if store is None:
            raise Unavailable("inr needs a store file (--store)")
        try:
            from inr.store import load
        except ImportError as e:
            raise Unavailable(f"the INR codec cannot be imported: {e}") from None
        self.device = torch.device(config.device)
        self.stored = load(Path(store), self.device if config.resident == "all" else "cpu")
        split = data.split(config.split)
        n = len(split)
        check_store_shape(self.stored, n, split.image_size, store)
        check_store_source(self.stored, data, config.split, allow_unverified=config.allow_unverified_store)
        if config.resident != "all":
            self.stored = self.stored.select(held_samples(n, config), self.device)
        self.labels = self.stored.labels.to(self.device, torch.int64)
        self.n = n
        self.height, self.width = self.stored.image_size
        # Compiled on the CPU: the polynomial sine (fused, ~3e-5 from torch.sin); CUDA's sine is already cheap.
        fast = config.compile and self.device.type == "cpu"
        self.decoder = SirenDecoder(self.stored.arch, config.augment.size, self.device, compile=config.compile, fast_sine=fast)

    def decode(self, idx: torch.Tensor, crops: Crops) -> torch.Tensor:
        """Images ``idx`` int64 ``[B]`` decoded at ``crops``: float ``[B, 3, size, size]`` in [0, 1].

        One batched pass: gather + dequantize the images' weights, fold each crop/flip into its
        first layer, evaluate on the shared output grid. ``random-pad`` zeroes the padding.
        """
        theta = to_device(crop_theta(crops, self.height, self.width), self.device)
        x = self.decoder(self.stored.weights(idx), theta)
        if self.config.augment.crop == "random-pad":
            x = x.mul_(inside_mask(theta, self.config.augment.size))
        return x

    def render(self, positions: torch.Tensor, positions_dev: torch.Tensor, crops: Crops) -> torch.Tensor:
        return normalize_(self.decode(positions_dev, crops), self.config.augment, value_range=1.0)

    def close(self) -> None:
        self.stored = None
        self.labels = None
        self.decoder = None

    def resident_bytes(self) -> dict[str, int]:
        """``device``: the store (codes, scales, masks) + labels on ``config.device`` (even the CPU)."""
        if self.stored is None or self.labels is None:
            return {"device": 0, "host": 0}
        labels = self.labels.numel() * self.labels.element_size()
        return {"device": int(self.stored.resident_bytes()) + labels, "host": 0}

    def dataset_bytes_per_image(self) -> float | None:
        """The store file's bytes (header amortized) / the split's images (``inrbench inspect``'s
        bytes/image): one ``stat``, whatever ``resident`` holds."""
        return Path(self.store).stat().st_size / self.n if self.store is not None and self.n else None
