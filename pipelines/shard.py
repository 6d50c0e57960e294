"""A rank's share of an epoch: its ``DistributedSampler`` slice of one permutation seeded by ``(seed, e)``,
and its own augmentation draws; ``resident="shard"`` keeps a ``fixed_shard`` per rank (coarser shuffle)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from pipelines.base import PipelineConfig
from pipelines.crops import batch_slices

# SeedSequence spawn key of the fixed shards' permutation: never a rank.
FIXED_SHARD_KEY = 2**32 - 1


def _entropy(entropy: list[int], spawn_key: tuple[int, ...] = ()) -> int:
    """64 well-mixed bits from ``SeedSequence(entropy, spawn_key=spawn_key)``."""
    state = np.random.SeedSequence([int(v) for v in entropy], spawn_key=spawn_key).generate_state(2, dtype=np.uint32)
    return int(state[0]) << 32 | int(state[1])


def _seeded(entropy: list[int], spawn_key: tuple[int, ...] = ()) -> torch.Generator:
    return torch.Generator().manual_seed(_entropy(entropy, spawn_key))


def epoch_generator(seed: int, epoch: int) -> torch.Generator:
    """The generator of epoch ``epoch``'s global order: from ``(seed, epoch)`` only, not ``seed + epoch``."""
    return _seeded([seed, epoch])


def epoch_order(n: int, generator: torch.Generator, shuffle: bool) -> torch.Tensor:
    """int64 ``[n]``: a permutation of ``0..n-1`` when ``shuffle``, else ``arange(n)``."""
    return torch.randperm(n, generator=generator) if shuffle else torch.arange(n)


def shard_size(n: int, world_size: int, drop_last: bool) -> int:
    """Samples per rank per epoch: ``DistributedSampler.num_samples`` for a dataset of ``n``."""
    return n // world_size if drop_last else math.ceil(n / world_size)


def num_batches(n: int, config: PipelineConfig) -> int:
    """Batches per epoch on each rank of ``config`` (the same on every rank), for a split of ``n``."""
    rows = shard_size(n, config.world_size, config.drop_last)
    return len(batch_slices(rows, config.batch_size, config.drop_last))


def shard(order: torch.Tensor, rank: int, world_size: int, drop_last: bool) -> torch.Tensor:
    """int64 ``[shard_size]``: rank ``rank``'s slice of ``order`` (int64 ``[n]``), ``DistributedSampler``'s."""
    n = int(order.numel())
    total = shard_size(n, world_size, drop_last) * world_size
    return order.repeat(math.ceil(total / n))[:total][rank::world_size] if total > n else order[rank:total:world_size]


def augment_generator(seed: int, epoch: int, rank: int, world_size: int,
                      order_generator: torch.Generator) -> torch.Generator:
    """Rank ``rank``'s augmentation generator in ``epoch``: ``order_generator`` itself with one rank,
    else seeded from ``SeedSequence([seed, epoch], spawn_key=(rank,))``."""
    return order_generator if world_size == 1 else _seeded([seed, epoch], (int(rank),))


def rank_seed(seed: int, rank: int, world_size: int, bits: int = 31) -> int:
    """A ``bits``-bit seed for a library's own per-rank RNG (DALI's): ``seed`` with one rank, else one
    with ``result % world_size == rank``, so two ranks never share one."""
    if world_size == 1:
        return int(seed)
    return _entropy([seed], (int(rank),)) % (2**bits // world_size) * world_size + rank


def batch_seeds(n: int, rank: int, world_size: int, generator: torch.Generator) -> torch.Tensor:
    """int64 ``[n]`` per-batch seeds below ``2**62`` with ``seed % world_size == rank``: ranks never share one."""
    return torch.randint(0, 2**62 // world_size, (n,), generator=generator) * world_size + rank


def fixed_shard(n: int, seed: int, shuffle: bool, rank: int, world_size: int, drop_last: bool) -> torch.Tensor:
    """int64 ``[shard_size]``: the samples rank ``rank`` holds for the whole run with ``resident="shard"``
    (``shard`` of one permutation drawn from ``seed`` alone); ``arange(n)`` with one rank."""
    if world_size == 1:
        return torch.arange(n)
    perm0 = epoch_order(n, _seeded([seed], (FIXED_SHARD_KEY,)), shuffle)
    return shard(perm0, rank, world_size, drop_last)


def held_samples(n: int, config: PipelineConfig) -> torch.Tensor:
    """int64 ``[M]``: the split indices a rank of ``config`` keeps resident (all ``n``, or its fixed shard)."""
    if config.resident == "all":
        return torch.arange(n)
    return fixed_shard(n, config.seed, config.shuffle, config.rank, config.world_size, config.drop_last)


@dataclass(frozen=True)
class EpochShard:
    """This rank's epoch, on the CPU. indices: int64 ``[shard_size]``, its split indices in order;
    positions: the same samples as positions in ``held_samples`` (what an adapter holding only those
    indexes with); generator: its augmentation draws."""

    indices: torch.Tensor
    generator: torch.Generator
    positions: torch.Tensor


def epoch_shard(n: int, seed: int, epoch: int, shuffle: bool, rank: int = 0, world_size: int = 1,
                drop_last: bool = False, resident: str = "all") -> EpochShard:
    """Rank ``rank``'s share of epoch ``epoch`` over ``n`` samples (module docstring)."""
    g = epoch_generator(seed, epoch)
    if resident == "shard" and world_size > 1:
        held = fixed_shard(n, seed, shuffle, rank, world_size, drop_last)
        g = augment_generator(seed, epoch, rank, world_size, g)
        positions = epoch_order(held.numel(), g, shuffle)
        return EpochShard(held[positions], g, positions)
    order = epoch_order(n, g, shuffle)
    if world_size > 1:
        order = shard(order, rank, world_size, drop_last)
    return EpochShard(order, augment_generator(seed, epoch, rank, world_size, g), order)


def config_epoch(n: int, config: PipelineConfig, epoch: int) -> EpochShard:
    """``epoch_shard`` with everything from ``config``."""
    return epoch_shard(n, config.seed, epoch, config.shuffle, config.rank, config.world_size, config.drop_last,
                       config.resident)
