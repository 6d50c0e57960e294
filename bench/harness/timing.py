"""The timing protocol: a clock that synchronizes the device before every read (so queued kernels fall in
their interval), and a timed epoch reading it around every ``next()`` (data wait) and step (compute)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any


class DeviceClock:
    """``now()`` = ``sync()`` then ``now_ns()``, both injectable (tests); ``reads`` counts the reads."""

    def __init__(self, sync: Callable[[], None] | None = None,
                 now_ns: Callable[[], int] = time.perf_counter_ns):
        self._sync = sync or (lambda: None)
        self._now_ns = now_ns
        self.reads = 0

    def now(self) -> int:
        self._sync()
        t = self._now_ns()
        self.reads += 1
        return t


def clock_for(device: str) -> DeviceClock:
    """The clock for a torch device string: synchronizes that CUDA device, no-op on CPU."""
    import torch

    dev = torch.device(device)
    if dev.type == "cuda":
        return DeviceClock(sync=lambda: torch.cuda.synchronize(dev))
    return DeviceClock()


@dataclass
class EpochTiming:
    """One epoch's clock samples (ns): ``wait_ns[i]`` from the end of step i-1 until batch i was ready,
    ``compute_ns[i]`` step i, ``total_ns`` from ``iter()`` to the end of the epoch."""

    total_ns: int = 0
    wait_ns: list[int] = field(default_factory=list)
    compute_ns: list[int] = field(default_factory=list)
    images: int = 0
    steps: int = 0
    step_images: list[int] = field(default_factory=list)  # per timed step (as wait_ns)

    @property
    def ttfb_ns(self) -> int | None:
        return self.wait_ns[0] if self.wait_ns else None

    @property
    def seconds(self) -> float:
        return self.total_ns / 1e9

    @property
    def images_per_s(self) -> float:
        return self.images / self.seconds if self.total_ns > 0 else float("nan")


def batch_size_of(batch: Any) -> int:
    """Images in a ``Batch`` (its ``labels`` length)."""
    return int(batch.labels.shape[0])


def timed_epoch(batches: Iterable[Any], step: Callable[[Any], Any], clock: DeviceClock,
                step_sync: bool = True) -> EpochTiming:
    """Iterate ``batches`` once, calling ``step(batch)`` on each, reading ``clock`` around both; with
    ``step_sync=False`` only around the first batch and the epoch's ends (no overlap disturbed)."""
    t = EpochTiming()
    t0 = clock.now()
    it = iter(batches)
    prev = t0
    first = True
    for batch in it:
        if step_sync or first:
            t1 = clock.now()
            t.wait_ns.append(t1 - prev)
        step(batch)
        t.images += batch_size_of(batch)
        t.steps += 1
        if step_sync or first:
            t2 = clock.now()
            t.compute_ns.append(t2 - t1)
            t.step_images.append(batch_size_of(batch))
            prev = t2
        first = False
    t.total_ns = clock.now() - t0
    return t
