"""One training step: SGD Nesterov, cosine per step, cross-entropy, bf16 autocast on CUDA, on any
``Batch`` (float ``[B, 3, S, S]``, int64 ``[B]``). ``ddp=True``: DDP; a new ``model`` re-wraps it,
which every rank must do at the same step."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.distributed as dist
from torch import nn

Amp = Literal["auto", "bf16", "off"]


@dataclass(frozen=True)
class TrainConfig:
    """Optimizer and precision. ``amp="auto"``: bf16 autocast on CUDA, fp32 elsewhere."""

    lr: float = 0.1
    momentum: float = 0.9
    nesterov: bool = True
    weight_decay: float = 5e-4
    label_smoothing: float = 0.0
    amp: Amp = "auto"

    def __post_init__(self) -> None:
        for name, ok, want in (("lr", 0 < self.lr < math.inf, "> 0 and finite"), ("momentum", 0 <= self.momentum < 1,
                               "in [0, 1)"), ("weight_decay", 0 <= self.weight_decay < math.inf, ">= 0"),
                               ("label_smoothing", 0 <= self.label_smoothing < 1, "in [0, 1)"),
                               ("amp", self.amp in ("auto", "bf16", "off"), "auto|bf16|off")):
            if not ok:
                raise ValueError(f"{name} must be {want}, got {getattr(self, name)!r}")


def autocast_for(device: torch.device, amp: Amp):
    """The autocast context for ``device``: bf16 on CUDA (``auto`` or ``bf16``), else disabled."""
    use = amp == "bf16" or (amp == "auto" and device.type == "cuda")
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=use)


class Trainer:
    """Model + SGD + cosine schedule over ``total_steps`` steps; ``step`` never synchronizes the device
    (the loss is summed there and read once per epoch by ``end_epoch``)."""

    def __init__(self, model: nn.Module, cfg: TrainConfig, device: str | torch.device, total_steps: int,
                 ddp: bool = False):
        if total_steps < 1:
            raise ValueError(f"total_steps must be >= 1, got {total_steps}")
        self.device = torch.device(device)
        self.cfg = cfg
        self.ddp = ddp
        self.model = model.to(self.device)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=cfg.lr, momentum=cfg.momentum,
                                   nesterov=cfg.nesterov and cfg.momentum > 0,
                                   weight_decay=cfg.weight_decay)
        self.sched = torch.optim.lr_scheduler.CosineAnnealingLR(self.opt, T_max=total_steps)
        self.loss_fn = nn.CrossEntropyLoss(label_smoothing=cfg.label_smoothing)
        self.total_steps = total_steps
        self.steps_done = 0
        self._loss_sum = torch.zeros((), device=self.device)
        self._loss_n = 0
        self._input_shape: tuple[int, ...] | None = None
        self._metrics_cache: tuple[nn.Module, list[tuple[str, float, str]]] | None = None

    @property
    def model(self) -> nn.Module:
        """The module being trained (never the DDP wrapper)."""
        return self._model

    @model.setter
    def model(self, module: nn.Module) -> None:
        self._model = module
        self._forward = wrap_ddp(module, self.device) if self.ddp else module

    def step(self, batch: Any) -> None:
        self._forward.train()
        self._input_shape = tuple(batch.images.shape[1:])
        with autocast_for(self.device, self.cfg.amp):
            logits = self._forward(batch.images)
            loss = self.loss_fn(logits.float(), batch.labels)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()
        if self.steps_done < self.total_steps:  # never step the cosine past its end
            self.sched.step()
        self.steps_done += 1
        self._loss_sum += loss.detach()
        self._loss_n += 1

    def end_epoch(self) -> float:
        """Mean training loss over the steps since the last call (synchronizes once)."""
        mean = float(self._loss_sum.item()) / max(1, self._loss_n)
        self._loss_sum.zero_()
        self._loss_n = 0
        return mean

    def stage_info(self) -> dict[str, float]:
        """Method-specific per-epoch numbers (the expand trainer's stage); none for dense."""
        return {}

    def epoch_metrics(self) -> list[tuple[str, float, str]]:
        """(metric, value, unit) rows of the model that trained the epoch just run: ``model_params``,
        ``model_flops_per_image`` (forward, ``forward_flops``) and ``stage_info()``; counted once per model."""
        if self._input_shape is None:
            return []
        if self._metrics_cache is None or self._metrics_cache[0] is not self.model:
            self._metrics_cache = (self.model, [("model_params", float(sum(p.numel() for p in self.model.parameters())), "1"),
                                                ("model_flops_per_image", float(forward_flops(self.model, self._input_shape, self.device)), "flop")])
        return self._metrics_cache[1] + [(k, float(v), "1") for k, v in self.stage_info().items()]


def rank_and_world() -> tuple[int, int]:
    """(rank, world size) of the initialized process group of more than one process, else (0, 1)."""
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def wrap_ddp(module: nn.Module, device: torch.device) -> nn.Module:
    """``module`` in ``DistributedDataParallel`` in a group of more than one process, else ``module``."""
    if rank_and_world()[1] == 1:
        return module
    from torch.nn.parallel import DistributedDataParallel

    ids = [device.index if device.index is not None else torch.cuda.current_device()] if device.type == "cuda" else None
    return DistributedDataParallel(module, device_ids=ids)


@torch.no_grad()
def forward_flops(model: nn.Module, input_shape: tuple[int, ...], device: torch.device) -> int:
    """Forward FLOPs (2 per multiply-add, ``FlopCounterMode``) of ``model`` on one input ``[1, *input_shape]``,
    in eval mode (BatchNorm statistics untouched)."""
    from torch.utils.flop_counter import FlopCounterMode

    was_training = model.training
    model.eval()
    try:
        with FlopCounterMode(display=False) as fc:
            model(torch.zeros((1, *input_shape), device=device))
    finally:
        model.train(was_training)
    return int(fc.get_total_flops())
