"""A run whose epochs yield more images than the split holds reports nothing: all ranks' ``images`` per
measured epoch must fit ``EpochBound``, else one ``error`` row (a rank-ignoring adapter inflates images/s)."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pipelines.base import PipelineConfig
from pipelines.crops import batch_slices
from pipelines.shard import shard_size

GUIDE = "docs/adding-a-pipeline.md"


@dataclass(frozen=True)
class EpochBound:
    """The most images ``pipeline`` may load in one epoch of a ``split_images``-image split, all ranks together."""

    pipeline: str
    split_images: int
    world_size: int = 1
    batch_size: int = 1
    drop_last: bool = False

    @classmethod
    def of(cls, pipeline: str, split_images: int, pipe: PipelineConfig) -> EpochBound:
        return cls(pipeline, split_images, pipe.world_size, pipe.batch_size, pipe.drop_last)

    @property
    def per_rank(self) -> int:
        """One rank's images per epoch: its shard (``shard.shard_size``) in ``batch_slices``."""
        rows = shard_size(self.split_images, self.world_size, self.drop_last)
        return sum(s.stop - s.start for s in batch_slices(rows, self.batch_size, self.drop_last))

    @property
    def images(self) -> int:
        return self.world_size * self.per_rank

    def check(self, per_rank_rows: Sequence[Sequence[dict[str, Any]]]) -> str | None:
        """The error reason for the first loaded epoch whose ``images`` (summed over the ranks' ok
        rows, one list per rank) exceed ``images``; None when every epoch fits."""
        images: dict[tuple[int, int], float] = defaultdict(float)
        drawn: dict[tuple[int, int], float] = defaultdict(float)
        for rows in per_rank_rows:
            for row in rows:
                key = _key(row)
                if key is None or row["status"] != "ok":
                    continue
                if row["metric"] == "images":
                    images[key] += float(row["value"])
                elif row["metric"] == "pipeline_batches":
                    drawn[key] += float(row["value"])
        for (rep, ep), total in sorted(images.items()):
            if total <= self.images or drawn.get((rep, ep), 1.0) == 0:
                continue
            if self.world_size == 1:
                return (f"pipeline {self.pipeline}: loaded {total:.0f} images in epoch {ep} (repeat {rep}) "
                        f"of a {self.split_images}-image split (at most {self.images}); an epoch yields "
                        f"every sample once ({GUIDE})")
            return (f"pipeline {self.pipeline}: ranks loaded {total:.0f} images in epoch {ep} (repeat {rep}) "
                    f"of a {self.split_images}-image split (at most {self.images} over {self.world_size} "
                    f"ranks); an adapter must shard by config.rank/world_size ({GUIDE})")
        return None


def _key(row: dict[str, Any]) -> tuple[int, int] | None:
    """``(repeat, epoch)`` of a per-epoch row; None for a per-repeat or per-run one."""
    rep, ep = row.get("repeat"), row.get("epoch")
    if any(v is None or (isinstance(v, float) and math.isnan(v)) for v in (rep, ep)):
        return None
    return int(rep), int(ep)
