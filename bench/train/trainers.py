"""Trainer registry: the training-method axis (``dense``, ``expand``; docs/training-methods.md).
A trainer has ``loop.Trainer``'s interface and owns any change of the model between epochs."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from bench.train.expand import ExpandConfig, ExpandTrainer
from bench.train.loop import TrainConfig, Trainer

# method -> (the schedule type it needs, or None; its trainer class)
_TRAINERS: dict[str, tuple[type | None, type[Trainer]]] = {"dense": (None, Trainer),
                                                           "expand": (ExpandConfig, ExpandTrainer)}


def trainer_names() -> list[str]:
    return sorted(_TRAINERS)


def check_method(method: str, method_config: Any, train_epochs: int) -> None:
    """``ValueError`` unless ``method`` is registered, ``method_config`` is of its type (``None`` for
    dense) and a schedule's epochs equal ``train_epochs`` (warm-up + measured)."""
    if method not in _TRAINERS:
        raise ValueError(f"unknown training method {method!r}; known: {', '.join(trainer_names())}")
    want = _TRAINERS[method][0]
    if want is None and method_config is not None:
        raise ValueError(f"method {method!r} takes no schedule")
    if want is not None and not isinstance(method_config, want):
        raise ValueError(f"method {method!r} needs a {want.__name__} (--schedule)")
    epochs = getattr(method_config, "epochs", None)
    if epochs is not None and epochs != train_epochs:
        raise ValueError(f"the schedule trains {epochs} epochs but the run trains {train_epochs} "
                         "(warm-up + measured epochs)")


def create_trainer(method: str, model: nn.Module, cfg: TrainConfig, device: str | torch.device,
                   total_steps: int, method_config: Any = None, ddp: bool = False) -> Trainer:
    """The trainer of ``method``; ``ddp``: data-parallel across the initialized process group."""
    if method not in _TRAINERS:
        raise KeyError(f"unknown training method {method!r}; known: {', '.join(trainer_names())}")
    want, cls = _TRAINERS[method]
    extra = () if want is None else (method_config,)
    return cls(model, cfg, device, total_steps, *extra, ddp=ddp)
