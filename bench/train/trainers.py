"""Trainer registry: the training-method axis of the harness (beside the backbone registry).

``create_trainer(method, model, cfg, device, total_steps, method_config)`` -> an object with
``model``, ``device``, ``step(batch)``, ``end_epoch() -> mean loss`` and ``epoch_metrics()``
(``bench.train.loop.Trainer``'s interface). The harness only asks the trainer; the trainer owns
any change of the model (growth) between epochs.

- ``dense``: the backbone as built, trained by ``loop.Trainer`` (no method config).
- ``expand``: network expansion (``bench.train.expand``): a sub-network grown to the dense model
  following an ``ExpandConfig`` schedule whose epochs add up to the run's training epochs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from bench.train.expand import ExpandConfig, ExpandTrainer
from bench.train.loop import TrainConfig, Trainer

_TRAINERS: dict[str, Callable[..., Any]] = {}
_CONFIG_TYPES: dict[str, type | None] = {}


def register_trainer(name: str, config_type: type | None = None):
    def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
        if name in _TRAINERS:
            raise ValueError(f"trainer {name!r} already registered")
        _TRAINERS[name] = fn
        _CONFIG_TYPES[name] = config_type
        return fn

    return deco


def trainer_names() -> list[str]:
    return sorted(_TRAINERS)


def check_method(method: str, method_config: Any, train_epochs: int) -> None:
    """``ValueError`` unless ``method`` is registered, ``method_config`` is of its type (``None``
    for dense) and, for a schedule, its epochs equal ``train_epochs`` (warm-up + measured)."""
    if method not in _TRAINERS:
        raise ValueError(f"unknown training method {method!r}; known: {', '.join(trainer_names())}")
    want = _CONFIG_TYPES[method]
    if want is None and method_config is not None:
        raise ValueError(f"method {method!r} takes no schedule")
    if want is not None and not isinstance(method_config, want):
        raise ValueError(f"method {method!r} needs a {want.__name__} (--schedule)")
    epochs = getattr(method_config, "epochs", None)
    if epochs is not None and epochs != train_epochs:
        raise ValueError(f"the schedule trains {epochs} epochs but the run trains {train_epochs} "
                         "(warm-up + measured epochs)")


def create_trainer(method: str, model: nn.Module, cfg: TrainConfig, device: str | torch.device,
                   total_steps: int, method_config: Any = None, ddp: bool = False) -> Any:
    """``ddp``: train data-parallel across the initialized process group (``loop.Trainer``)."""
    if method not in _TRAINERS:
        raise KeyError(f"unknown training method {method!r}; known: {', '.join(trainer_names())}")
    return _TRAINERS[method](model, cfg, device, total_steps, method_config, ddp=ddp)


@register_trainer("dense")
def _dense(model: nn.Module, cfg: TrainConfig, device: str | torch.device, total_steps: int, _: Any,
           ddp: bool = False) -> Any:
    return Trainer(model, cfg, device, total_steps, ddp=ddp)


def _expand_config_type() -> type:
    return ExpandConfig


@register_trainer("expand", config_type=_expand_config_type())
def _expand(model: nn.Module, cfg: TrainConfig, device: str | torch.device, total_steps: int, expand: Any,
            ddp: bool = False) -> Any:
    return ExpandTrainer(model, cfg, device, total_steps, expand, ddp=ddp)
