"""``inr``: the dataset resident on the device as per-image SIREN weights (Rapid-INR), decoded per batch
with each crop and flip folded into the sampling coordinates (``random-pad`` outside samples are 0)."""

from __future__ import annotations

from pathlib import Path

import torch

from bench.datasets.identity import check_store_shape, check_store_source
from bench.datasets.prepared import PreparedSplit
from pipelines.base import Unavailable, register
from pipelines.crops import Crops, crop_theta, normalize_, to_device
from pipelines.device_epoch import DeviceEpochPipeline, nbytes
from pipelines.inr_decode import SirenDecoder


def inside_mask(theta: torch.Tensor, size: int) -> torch.Tensor:
    """float32 ``[B, 1, size, size]``: 1 where an output pixel samples inside the image (random-pad)."""
    t = (torch.arange(size, device=theta.device, dtype=theta.dtype) * 2 + 1) / size - 1
    x = theta[:, 0, 0:1] * t + theta[:, 0, 2:3]  # [B, size] input x of each output column
    y = theta[:, 1, 1:2] * t + theta[:, 1, 2:3]  # [B, size] input y of each output row
    eps = 1e-4
    return ((y.abs() <= 1 + eps)[:, :, None] & (x.abs() <= 1 + eps)[:, None, :]).to(theta.dtype).unsqueeze(1)


@register("inr")
class InrPipeline(DeviceEpochPipeline):
    """Holds the ``inr.store.StoredINR`` (quantized weights, labels) on ``config.device``."""

    needs_store = True
    releases = ("stored", "decoder")

    def load(self, split: PreparedSplit, held: torch.Tensor) -> torch.Tensor:
        if self.store is None:
            raise Unavailable("inr needs a store file (--store)")
        try:
            from inr.store import load
        except ImportError as e:
            raise Unavailable(f"the INR codec cannot be imported: {e}") from None
        cfg = self.config
        self.stored = load(Path(self.store), self.device if cfg.resident == "all" else "cpu")
        check_store_shape(self.stored, self.n, split.image_size, self.store)
        check_store_source(self.stored, self.data, cfg.split, allow_unverified=cfg.allow_unverified_store)
        if cfg.resident != "all":
            self.stored = self.stored.select(held, self.device)
        # on the CPU a compiled decoder also takes the fused polynomial sine; CUDA's sine is cheap already
        fast = cfg.compile and self.device.type == "cpu"
        self.decoder = SirenDecoder(self.stored.arch, cfg.augment.size, self.device, compile=cfg.compile, fast_sine=fast)
        return self.stored.labels.to(self.device, torch.int64)

    def decode(self, idx: torch.Tensor, crops: Crops) -> torch.Tensor:
        """Held images ``idx`` int64 ``[B]`` at ``crops``: float ``[B, 3, size, size]`` in [0, 1]."""
        theta = to_device(crop_theta(crops, self.height, self.width), self.device)
        x = self.decoder(self.stored.weights(idx), theta)
        if self.config.augment.crop == "random-pad":
            x = x.mul_(inside_mask(theta, self.config.augment.size))
        return x

    def render(self, positions: torch.Tensor, positions_dev: torch.Tensor, crops: Crops) -> torch.Tensor:
        return normalize_(self.decode(positions_dev, crops), self.config.augment, value_range=1.0)

    def resident_bytes(self) -> dict[str, int]:
        """``device``: the store (codes, scales, masks) and labels on ``config.device`` (even the CPU)."""
        if self.stored is None:
            return {"device": 0, "host": 0}
        return {"device": int(self.stored.resident_bytes()) + nbytes(self.labels), "host": 0}

    def dataset_bytes_per_image(self) -> float | None:
        """The store file's bytes (header amortized) / the split's images: one ``stat``."""
        return Path(self.store).stat().st_size / self.n if self.n else None
