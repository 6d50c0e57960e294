"""Seeded index helpers shared by sources: per-class ratio splits, ``--limit`` subsets."""

from __future__ import annotations

import numpy as np


def ratio_split(labels: np.ndarray, held_out: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Sorted int64 indices (kept, held out) of int labels ``[N]``: ``round(held_out * n_c)`` of each class
    held out, at least one kept and (with two or more) one held out per class. Deterministic in ``seed``."""
    labels = np.asarray(labels)
    rng = np.random.default_rng(seed)
    first, second = [], []
    for c in np.unique(labels):
        idx = np.flatnonzero(labels == c)
        idx = idx[rng.permutation(idx.size)]
        k = int(round(held_out * idx.size))
        k = min(max(k, 1 if idx.size >= 2 else 0), idx.size - 1) if idx.size >= 1 else 0
        second.append(idx[:k])
        first.append(idx[k:])
    cat = lambda parts: np.sort(np.concatenate(parts)).astype(np.int64) if parts else np.zeros(0, np.int64)  # noqa: E731
    return cat(first), cat(second)


def limit_indices(n: int, limit: int | None, seed: int) -> np.ndarray:
    """All of ``range(n)``, or a seeded subset of ``limit`` of them in ascending order."""
    if limit is None or limit >= n:
        return np.arange(n, dtype=np.int64)
    rng = np.random.default_rng(seed)
    return np.sort(rng.choice(n, size=limit, replace=False)).astype(np.int64)
