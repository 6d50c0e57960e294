"""The timing protocol: a device-synchronizing clock and a timed epoch.

Every clock read first synchronizes the device (``torch.cuda.synchronize`` on CUDA), so
asynchronous kernels queued by a pipeline or a model are inside the interval they belong
to; then ``time.perf_counter_ns``. A timed epoch reads the clock around every ``next()``
(the data wait: the pipeline producing a batch that is ready on the device) and around
every step (the compute). Time-to-first-batch is the first wait of an epoch.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np


class DeviceClock:
    """``now()`` = ``sync()`` then ``now_ns()``; both injectable (a fake clock in tests).

    ``reads`` counts clock reads, ``syncs`` counts synchronizations (equal unless a sync
    raised); the invariant "synchronized before every read" is what tests check.
    """

    def __init__(self, sync: Callable[[], None] | None = None,
                 now_ns: Callable[[], int] = time.perf_counter_ns):
        self._sync = sync or (lambda: None)
        self._now_ns = now_ns
        self.reads = 0
        self.syncs = 0

    def now(self) -> int:
        self._sync()
        self.syncs += 1
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
    """One epoch's clock samples (nanoseconds).

    wait_ns[i]: from the end of step i-1 (or the epoch start) until batch i was ready;
    compute_ns[i]: step i. ``total_ns`` spans ``iter()`` to the end of the last step,
    so it also includes creating the iterator and detecting the end of the epoch.
    """

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
    """Iterate ``batches`` once, calling ``step(batch)`` on each, reading ``clock`` around both.

    With ``step_sync=False`` only the epoch boundaries are read (no per-step synchronization,
    so pipeline/compute overlap on the device is not disturbed); ``wait_ns``/``compute_ns``
    stay empty except the first batch (time-to-first-batch is always measured).
    """
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


def median_iqr(samples: Iterable[float]) -> tuple[float, float]:
    """(median, q75 - q25) of the samples (linear interpolation, as ``pandas.quantile``)."""
    a = np.asarray(list(samples), dtype=float)
    if a.size == 0:
        return float("nan"), float("nan")
    q25, q50, q75 = np.percentile(a, [25, 50, 75])
    return float(q50), float(q75 - q25)
