"""``ByteBudget``: a semaphore counted in bytes, so decode threads share a memory budget.

A thread asks for the bytes its image will need (estimated from the header) before
decoding it and gives them back after. A request larger than the whole budget waits
until the budget is idle and then runs alone, so one big image never deadlocks and a
few big images are never decoded at once.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager


class ByteBudget:
    def __init__(self, total: int):
        if total < 1:
            raise ValueError(f"budget must be >= 1 byte, got {total}")
        self.total = int(total)
        self.free = int(total)
        self._cond = threading.Condition()

    @contextmanager
    def hold(self, nbytes: int) -> Iterator[None]:
        """Wait until ``nbytes`` (at most the whole budget) are free, hold them for the block."""
        n = min(max(int(nbytes), 0), self.total)
        with self._cond:
            self._cond.wait_for(lambda: self.free >= n)
            self.free -= n
        try:
            yield
        finally:
            with self._cond:
                self.free += n
                self._cond.notify_all()
