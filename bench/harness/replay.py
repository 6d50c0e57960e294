"""Cached-batch replay (the ``replay`` mode's source: the model alone on a few batches drawn before the
measured region) and a batch counter that shows no batch is drawn from the pipeline while replay is timed."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from pipelines.base import Batch


class CountingSource:
    """Wraps an iterable of batches and counts the batches drawn from it (``drawn``)."""

    def __init__(self, source: Iterable[Any]):
        self.source = source
        self.drawn = 0

    def __iter__(self) -> Iterator[Any]:
        for b in self.source:
            self.drawn += 1
            yield b


def cache_batches(source: Iterable[Batch], limit: int) -> list[Batch]:
    """The first ``limit`` batches of ``source``, cloned (adapters may reuse buffers): images float
    ``[B, 3, S, S]``, labels int64 ``[B]``, on the pipeline's device."""
    if limit < 1:
        raise ValueError(f"replay needs at least one cached batch, got {limit}")
    cached: list[Batch] = []
    for b in source:
        cached.append(Batch(images=b.images.clone(), labels=b.labels.clone()))
        if len(cached) >= limit:
            break
    if not cached:
        raise RuntimeError("the pipeline yielded no batch to cache for replay")
    return cached


class ReplayBatches:
    """An epoch of ``steps`` batches cycling through ``cached`` (no pipeline involved)."""

    def __init__(self, cached: list[Batch], steps: int):
        if not cached or steps < 1:
            raise ValueError("replay needs cached batches and steps >= 1")
        self.cached = cached
        self.steps = steps

    def __len__(self) -> int:
        return self.steps

    def __iter__(self) -> Iterator[Batch]:
        for i in range(self.steps):
            yield self.cached[i % len(self.cached)]
