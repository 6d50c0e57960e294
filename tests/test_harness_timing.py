"""The clock synchronizes the device before every read; a timed epoch splits wait and compute."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from bench.harness.timing import DeviceClock, timed_epoch


class FakeDevice:
    """A device with pending work: time advances only when the host waits (synchronizes)."""

    def __init__(self):
        self.t = 0
        self.pending = 0  # ns of queued, unfinished device work
        self.log: list[str] = []

    def enqueue(self, ns: int) -> None:
        self.pending += ns

    def sync(self) -> None:
        self.log.append("sync")
        self.t += self.pending
        self.pending = 0

    def now_ns(self) -> int:
        self.log.append("read")
        return self.t


@dataclass
class B:
    labels: torch.Tensor


def test_sync_happens_before_every_read():
    dev = FakeDevice()
    clock = DeviceClock(sync=dev.sync, now_ns=dev.now_ns)

    def batches():
        for _ in range(3):
            dev.enqueue(1_000)  # the pipeline's async work to produce a batch
            yield B(torch.zeros(4))

    t = timed_epoch(batches(), step=lambda b: dev.enqueue(5_000), clock=clock)
    # every read is immediately preceded by a sync
    assert dev.log.count("read") == clock.reads == 1 + 2 * 3 + 1
    for i, ev in enumerate(dev.log):
        if ev == "read":
            assert i > 0 and dev.log[i - 1] == "sync"
    # because of the sync, queued device work lands in the interval it belongs to
    assert t.wait_ns == [1_000, 1_000, 1_000]
    assert t.compute_ns == [5_000, 5_000, 5_000]
    assert t.total_ns == 18_000 and t.ttfb_ns == 1_000
    assert t.images == 12 and t.steps == 3
    assert t.images_per_s == pytest.approx(12 / 18e-6)


def test_without_sync_async_work_would_be_misattributed():
    """The same fake device read without synchronizing: compute shows as 0 (why we sync)."""
    dev = FakeDevice()
    clock = DeviceClock(sync=None, now_ns=dev.now_ns)
    t = timed_epoch([B(torch.zeros(2))], step=lambda b: dev.enqueue(5_000), clock=clock)
    assert t.compute_ns == [0]


def test_no_step_sync_reads_only_first_batch_and_boundaries():
    dev = FakeDevice()
    clock = DeviceClock(sync=dev.sync, now_ns=dev.now_ns)
    t = timed_epoch([B(torch.zeros(2))] * 5, step=lambda b: dev.enqueue(10), clock=clock, step_sync=False)
    assert clock.reads == 4 and len(t.wait_ns) == 1 and t.total_ns == 50 and t.images == 10
