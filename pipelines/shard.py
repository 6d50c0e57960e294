"""A rank's share of an epoch: its slice of one seeded global permutation, and its own augmentation seeds.

Every rank draws the *same* global order for epoch ``e`` from ``crops.epoch_generator(seed, e)``
(so the ranks agree without communicating) and keeps its slice with
``torch.utils.data.DistributedSampler``'s semantics, mirrored exactly (``shard``):

* ``drop_last=False``: the order is padded by wrapping around (its first samples again) to
  ``ceil(n / world) * world`` samples, and rank ``r`` takes ``padded[r::world]``. Every sample
  is seen at least once per epoch; ``(-n) % world`` of them (at most ``world - 1``) twice.
* ``drop_last=True``: the order is cut to ``(n // world) * world`` samples first, so
  ``n % world`` (at most ``world - 1``) samples are not seen this epoch (a different set each
  shuffled epoch); then each rank also drops its own partial last batch (``crops.batch_slices``).

Either way every rank gets ``shard_size`` samples, hence the same number of batches (DDP needs it).
With ``world_size == 1`` the shard is the whole order: single-process epochs are unchanged.

Augmentation: the crop/flip draws of rank ``r`` in epoch ``e`` come from ``augment_generator``,
seeded from ``numpy.random.SeedSequence([seed, e], spawn_key=(r,))``: a different spawn key per
rank, and a different one from the order's (``SeedSequence([seed, e])``, no spawn key), so no two
ranks, and no rank and the order, share a stream. With ``world_size == 1`` the draws continue the
order's generator after the permutation, as single-process runs always have.

Fixed shards (``PipelineConfig.resident == "shard"``, ``--resident shard``): rank ``r`` holds only
``fixed_shard``'s samples for the whole run, so a device-resident adapter (``raw``'s pixels,
``inr``'s store, ``torch-nvjpeg``'s JPEG bytes) keeps ~1/world of the split. The shard is
``perm0``'s slice with the same padding (wrap-around to a multiple of ``world``, so every shard
has ``shard_size`` samples; with ``drop_last`` cut to ``(n // world) * world``), where ``perm0``
is one permutation drawn once from ``seed`` (``fixed_generator``; ``arange(n)`` without
``shuffle``). Each epoch, rank ``r`` iterates a fresh permutation of its own shard drawn from the
rank's ``(seed, epoch, rank)`` generator (``augment_generator``), whose later draws are its crops.
The union over the ranks of an epoch is the same as with ``"all"`` (every sample at least once, at
most ``world - 1`` twice; with ``drop_last`` the same ``n % world`` samples are out of *every*
epoch, not a different set each epoch), and the batch counts are the same. The trade-off (DALI's
``stick_to_shard``): samples never move between ranks, so a rank's batches are drawn from a fixed
1/world of the data, a coarser shuffle than DistributedSampler's (with small shards or ordered
data, a rank's gradient sees a biased subset within every epoch). With ``world_size == 1`` the
shard is the whole split and the epochs are ``"all"``'s exactly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from pipelines.base import RESIDENT, PipelineConfig
from pipelines.crops import batch_slices, epoch_generator, epoch_order


def shard_size(n: int, world_size: int, drop_last: bool) -> int:
    """Samples per rank per epoch: ``DistributedSampler.num_samples`` for a dataset of ``n``."""
    if drop_last and n % world_size:
        return math.ceil((n - world_size) / world_size)  # = n // world_size, torch's own expression
    return math.ceil(n / world_size)


def num_batches(n: int, config: PipelineConfig) -> int:
    """Batches per epoch on each rank of ``config`` (the same on every rank), for a split of ``n``."""
    rows = shard_size(n, config.world_size, config.drop_last)
    return len(batch_slices(rows, config.batch_size, config.drop_last))


def shard(order: torch.Tensor, rank: int, world_size: int, drop_last: bool) -> torch.Tensor:
    """int64 ``[shard_size(n, world_size, drop_last)]``: rank ``rank``'s slice of ``order`` (int64 ``[n]``).

    ``DistributedSampler.__iter__`` after its permutation: pad by wrapping (or truncate), then
    ``[rank::world_size]``.
    """
    n = int(order.numel())
    total = shard_size(n, world_size, drop_last) * world_size
    if total > n:
        reps = math.ceil(total / n)
        order = order.repeat(reps)[:total]
    else:
        order = order[:total]
    return order[rank:total:world_size]


def augment_generator(seed: int, epoch: int, rank: int, world_size: int,
                      order_generator: torch.Generator) -> torch.Generator:
    """The CPU generator of rank ``rank``'s augmentation draws in ``epoch``.

    ``world_size == 1``: ``order_generator`` itself (continued after the permutation: today's
    single-process stream). Otherwise seeded from ``SeedSequence([seed, epoch], spawn_key=(rank,))``,
    which collides neither with another rank's nor with the order's generator.
    """
    if world_size == 1:
        return order_generator
    state = np.random.SeedSequence([int(seed), int(epoch)], spawn_key=(int(rank),)).generate_state(2, dtype=np.uint32)
    return torch.Generator().manual_seed(int(state[0]) << 32 | int(state[1]))


def rank_seed(seed: int, rank: int, world_size: int, bits: int = 31) -> int:
    """A ``bits``-bit seed for a library's own per-rank RNG (DALI's pipeline ``seed``).

    ``world_size == 1``: ``seed`` itself (unchanged runs). Otherwise from
    ``SeedSequence([seed], spawn_key=(rank,))``, reduced so that ``result % world_size == rank``:
    two ranks never share one.
    """
    if world_size == 1:
        return int(seed)
    state = np.random.SeedSequence([int(seed)], spawn_key=(int(rank),)).generate_state(2, dtype=np.uint32)
    mixed = (int(state[0]) << 32 | int(state[1])) % (2**bits // world_size)
    return mixed * world_size + rank


def batch_seeds(n: int, rank: int, world_size: int, generator: torch.Generator) -> torch.Tensor:
    """int64 ``[n]`` per-batch seeds below ``2**62`` with ``seed % world_size == rank``: ranks never share one.

    With ``world_size == 1`` exactly ``torch.randint(0, 2**62, (n,), generator=generator)``.
    """
    return torch.randint(0, 2**62 // world_size, (n,), generator=generator) * world_size + rank


# SeedSequence spawn key of the fixed shards' permutation: never a rank (rank_seed's keys are ranks).
FIXED_SHARD_KEY = 2**32 - 1


def fixed_generator(seed: int) -> torch.Generator:
    """The CPU generator of ``perm0``, the fixed shards' one permutation: from ``seed`` only, the same on every rank."""
    state = np.random.SeedSequence([int(seed)], spawn_key=(FIXED_SHARD_KEY,)).generate_state(2, dtype=np.uint32)
    return torch.Generator().manual_seed(int(state[0]) << 32 | int(state[1]))


def fixed_shard(n: int, seed: int, shuffle: bool, rank: int, world_size: int, drop_last: bool) -> torch.Tensor:
    """int64 ``[shard_size(n, world_size, drop_last)]``: the samples rank ``rank`` holds for the whole run
    with ``resident="shard"`` (``shard`` of ``perm0``); ``arange(n)`` with one rank."""
    if world_size == 1:
        return torch.arange(n)
    perm0 = torch.randperm(n, generator=fixed_generator(seed)) if shuffle else torch.arange(n)
    return shard(perm0, rank, world_size, drop_last)


def held_samples(n: int, config: PipelineConfig) -> torch.Tensor:
    """int64 ``[m]``: the samples (split indices) a rank of ``config`` keeps resident: all ``n``, or its fixed shard.

    ``EpochShard.positions`` index into this."""
    if config.resident not in RESIDENT:
        raise ValueError(f"resident must be one of {'|'.join(RESIDENT)}, got {config.resident!r}")
    if config.resident == "all":
        return torch.arange(n)
    return fixed_shard(n, config.seed, config.shuffle, config.rank, config.world_size, config.drop_last)


@dataclass(frozen=True)
class EpochShard:
    """This rank's epoch, on the CPU. indices: int64 ``[shard_size]``, its samples (split indices) in order;
    positions: int64 ``[shard_size]``, the same samples as positions in ``held_samples`` (what a
    pipeline holding only those indexes with; equal to ``indices`` with ``resident="all"``);
    generator: its augmentation draws."""

    indices: torch.Tensor
    generator: torch.Generator
    positions: torch.Tensor | None = None

    def __post_init__(self) -> None:
        if self.positions is None:
            object.__setattr__(self, "positions", self.indices)


def epoch_shard(n: int, seed: int, epoch: int, shuffle: bool, rank: int = 0, world_size: int = 1,
                drop_last: bool = False, resident: str = "all") -> EpochShard:
    """Rank ``rank``'s share of epoch ``epoch`` over ``n`` samples (see the module docstring)."""
    if resident not in RESIDENT:
        raise ValueError(f"resident must be one of {'|'.join(RESIDENT)}, got {resident!r}")
    if resident == "shard" and world_size > 1:
        held = fixed_shard(n, seed, shuffle, rank, world_size, drop_last)
        g = augment_generator(seed, epoch, rank, world_size, epoch_generator(seed, epoch))
        positions = epoch_order(held.numel(), g, shuffle)
        return EpochShard(held[positions], g, positions)
    g = epoch_generator(seed, epoch)
    order = epoch_order(n, g, shuffle)
    if world_size > 1:
        order = shard(order, rank, world_size, drop_last)
    return EpochShard(order, augment_generator(seed, epoch, rank, world_size, g))


def config_epoch(n: int, config: PipelineConfig, epoch: int) -> EpochShard:
    """``epoch_shard`` with everything from ``config`` (rank, world, seed, shuffle, drop_last, resident)."""
    return epoch_shard(n, config.seed, epoch, config.shuffle, config.rank, config.world_size, config.drop_last,
                       config.resident)
