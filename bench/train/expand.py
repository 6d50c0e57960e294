"""Network expansion (CVPR 2023): train a sub-network (``subnet``) and grow it into the dense model
(``grow_module``, function preserving for CNNs; the ViT by EMA interleaving). docs/training-methods.md."""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from bench.train.backbones import SmallCNN
from bench.train.loop import TrainConfig, Trainer
from bench.train.vit import ModelEma, ViT, grow_vit, interleave_plan, vit_subnet


@dataclass(frozen=True)
class Stage:
    """``width``: fraction of the dense channels (0, 1]; ``depth``: blocks per ResNet stage, ViT blocks or
    small-cnn conv layers (``None``: the dense depth); trained for ``epochs`` epochs."""

    width: float
    epochs: int
    depth: int | None = None

    def __post_init__(self) -> None:
        if not 0 < self.width <= 1:
            raise ValueError(f"stage width must be in (0, 1], got {self.width}")
        if self.epochs < 1:
            raise ValueError(f"stage epochs must be >= 1, got {self.epochs}")
        if self.depth is not None and self.depth < 1:
            raise ValueError(f"stage depth must be >= 1, got {self.depth}")


@dataclass(frozen=True)
class ExpandConfig:
    """A growth schedule: stages in training order (non-decreasing width and depth), the last one
    the dense model; ``restart_lr``: restart the cosine schedule at each growth (default: keep)."""

    stages: tuple[Stage, ...]
    restart_lr: bool = False

    def __post_init__(self) -> None:
        if not self.stages:
            raise ValueError("an expand schedule needs at least one stage")
        last = self.stages[-1]
        if last.width != 1.0:
            raise ValueError(f"the schedule must end at the dense model (width 1), ends at width {last.width}")
        for a, b in zip(self.stages, self.stages[1:], strict=False):
            if b.width < a.width or (a.depth or math.inf) > (b.depth or math.inf):
                raise ValueError(f"stages must not shrink: {a} then {b}")

    @property
    def epochs(self) -> int:
        return sum(s.epochs for s in self.stages)

    @classmethod
    def parse(cls, text: str, restart_lr: bool = False) -> ExpandConfig:
        """``"0.5:1:2,0.75:2:1,1:2:1"`` (width:depth:epochs per stage; depth ``-`` = dense) -> config."""
        stages = []
        for part in text.split(","):
            f = part.strip().split(":")
            if len(f) != 3:
                raise ValueError(f"schedule stage {part!r} is not WIDTH:DEPTH:EPOCHS")
            try:
                stages.append(Stage(width=float(f[0]), depth=None if f[1] in ("-", "") else int(f[1]),
                                    epochs=int(f[2])))
            except ValueError as e:
                raise ValueError(f"schedule stage {part!r}: {e}") from None
        return cls(stages=tuple(stages), restart_lr=restart_lr)


# ------------------------------------------------------------------------------------------ subnets

def _blocks_sequences(model: nn.Module) -> dict[str, nn.Sequential]:
    """name -> the Sequential of residual blocks of a ResNet stage (``layer1..4``); {} otherwise."""
    from torchvision.models.resnet import BasicBlock, Bottleneck

    return {n: m for n, m in model.named_modules()
            if isinstance(m, nn.Sequential) and len(m) and all(isinstance(b, BasicBlock | Bottleneck) for b in m)}


SMALL_CNN_LAYERS = 4  # conv/BN/ReLU layers of small_cnn: its dense depth


class SkippedLayer(nn.Module):
    """A small-cnn conv layer the sub-network skips: the stride's subsampling, which the layer's identity
    initialization at growth computes."""

    def __init__(self, stride: int):
        super().__init__()
        self.stride = stride

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x[:, :, ::self.stride, ::self.stride] if self.stride > 1 else x


def _small_cnn_subnet(m: nn.Module, depth: int) -> None:
    """Skip conv layers ``depth..`` of the (already width-scaled) small-cnn ``m`` in place; the
    classifier keeps the leading columns, one per channel of the last kept layer."""
    if not 1 <= depth <= SMALL_CNN_LAYERS:
        raise ValueError(f"small-cnn depth must be in 1..{SMALL_CNN_LAYERS} (conv layers kept), got {depth}")
    if depth == SMALL_CNN_LAYERS:
        return
    for i in range(depth, SMALL_CNN_LAYERS):
        m[i] = SkippedLayer(m[i][0].stride[0])
    fc = m[-1]
    new = nn.Linear(m[depth - 1][0].out_channels, fc.out_features, bias=fc.bias is not None)
    _copy_leading(new, fc)
    m[-1] = new


def dense_depth(model: nn.Module) -> int | None:
    """Blocks per ResNet stage of the dense model (all stages equal), a ViT's blocks, or ``None``
    (no residual stages)."""
    if isinstance(model, ViT):
        return len(model.blocks)
    if isinstance(model, SmallCNN):
        return SMALL_CNN_LAYERS
    seqs = _blocks_sequences(model)
    if not seqs:
        return None
    depths = {len(s) for s in seqs.values()}
    if len(depths) != 1:
        raise ValueError(f"stages of unequal depth {sorted(depths)}: depth growth needs equal stages")
    return depths.pop()


def check_schedule(cfg: ExpandConfig, dense: nn.Module) -> None:
    """``ValueError`` unless every stage fits ``dense`` and the last one IS ``dense``."""
    full = dense_depth(dense)
    if isinstance(dense, ViT):
        if any(s.width != 1.0 for s in cfg.stages):
            raise ValueError("width growth is not implemented for the ViT (depth only): use width 1 in every stage")
        depths = [s.depth if s.depth is not None else full for s in cfg.stages]
        for a, b in zip(depths, depths[1:], strict=False):
            if a is not None and b is not None and b <= full:
                interleave_plan(a, b)  # refuses more than doubling
    for s in cfg.stages:
        if isinstance(dense, SmallCNN) and s.depth is not None and not 1 <= s.depth <= SMALL_CNN_LAYERS:
            raise ValueError(f"small-cnn stage depth {s.depth} is not in 1..{SMALL_CNN_LAYERS} "
                             "(conv layers kept; the others are inserted as identity layers at growth)")
        if s.depth is not None and full is None:
            raise ValueError(f"stage depth {s.depth} given, but this backbone has no residual stages to grow "
                             "(use depth '-': width growth only)")
        if s.depth is not None and full is not None and s.depth > full:
            raise ValueError(f"stage depth {s.depth} exceeds the dense model's {full} blocks per stage")
    last = cfg.stages[-1].depth
    if full is not None and last is not None and last != full:
        raise ValueError(f"the schedule must end at the dense model (depth {full}), ends at depth {last}")


def _scaled(n: int, width: float) -> int:
    return max(1, int(round(n * width)))


def subnet(dense: nn.Module, width: float, depth: int | None) -> nn.Module:
    """A new module with the structure of ``dense`` at ``width``/``depth`` (parameters sliced from
    ``dense``: leading channels, first blocks). ``width=1, depth=None`` is a copy of ``dense``."""
    if isinstance(dense, ViT):
        if width != 1.0:
            raise ValueError("width growth is not implemented for the ViT (depth only)")
        return vit_subnet(dense, depth)
    m = copy.deepcopy(dense)
    if depth is not None and not isinstance(m, SmallCNN):
        for seq in _blocks_sequences(m).values():
            for i in range(len(seq) - 1, depth - 1, -1):
                del seq[i]
    if width != 1.0:
        _scale_width(m, width)
    if depth is not None and isinstance(m, SmallCNN):
        _small_cnn_subnet(m, depth)
    return m


def _scale_width(m: nn.Module, width: float) -> None:
    for name, mod in list(m.named_modules()):
        new: nn.Module | None = None
        if isinstance(mod, nn.Conv2d):
            cin = mod.in_channels if mod.in_channels == 3 else _scaled(mod.in_channels, width)
            if mod.groups != 1:
                raise ValueError(f"grouped convolution {name} is not supported by width growth")
            new = nn.Conv2d(cin, _scaled(mod.out_channels, width), mod.kernel_size, mod.stride, mod.padding,
                            mod.dilation, bias=mod.bias is not None)
        elif isinstance(mod, nn.BatchNorm2d):
            new = nn.BatchNorm2d(_scaled(mod.num_features, width), mod.eps, mod.momentum)
        elif isinstance(mod, nn.Linear):
            new = nn.Linear(_scaled(mod.in_features, width), mod.out_features, bias=mod.bias is not None)
        if new is not None:
            _copy_leading(new, mod)
            parent, _, attr = name.rpartition(".")
            setattr(m.get_submodule(parent) if parent else m, attr, new)


def _copy_leading(dst: nn.Module, src: nn.Module) -> None:
    with torch.no_grad():
        for k, t in dst.state_dict().items():
            s = src.state_dict()[k]
            t.copy_(s[tuple(slice(0, n) for n in t.shape)] if t.ndim else s)


def grow_module(old: nn.Module, template: nn.Module, width: float, depth: int | None) -> nn.Module:
    """The model at ``width``/``depth``: ``template`` (the dense initialization) sliced, with ``old``'s tensors
    in the leading slices, zero weights from new inputs to old outputs, new residual blocks' last
    BatchNorm zeroed and new small-cnn layers the identity on the old model's channels."""
    from torchvision.models.resnet import Bottleneck

    new = subnet(template, width, depth)
    old_sd = old.state_dict()
    for seq_name, seq in _blocks_sequences(new).items():
        for i, block in enumerate(seq):
            if f"{seq_name}.{i}.conv1.weight" not in old_sd:
                last_bn = block.bn3 if isinstance(block, Bottleneck) else block.bn2
                nn.init.zeros_(last_bn.weight)
                nn.init.zeros_(last_bn.bias)
    with torch.no_grad():
        for k, t in new.state_dict().items():
            if k not in old_sd:
                continue
            o = old_sd[k]
            if t.ndim == 0:
                t.copy_(o)
                continue
            lead = tuple(slice(0, n) for n in o.shape)
            t[lead] = o
            if k.endswith("weight") and t.ndim >= 2 and t.shape[1] > o.shape[1]:
                t[: o.shape[0], o.shape[1]:] = 0  # new inputs -> old outputs: zero
    if isinstance(new, SmallCNN):
        _init_inserted_layers(old, new)
    return new


def _init_inserted_layers(old: nn.Module, new: nn.Module) -> None:
    """Layers of small-cnn ``new`` that ``old`` skipped: the identity on the channels ``old`` carried (its
    classifier's inputs), the dense initialization elsewhere."""
    carried = old[-1].in_features
    with torch.no_grad():
        for i in range(SMALL_CNN_LAYERS):
            if not isinstance(old[i], SkippedLayer) or isinstance(new[i], SkippedLayer):
                continue
            conv, bn = new[i][0], new[i][1]
            conv.weight[:carried] = 0
            idx = torch.arange(carried)
            conv.weight[idx, idx, 1, 1] = 1.0
            bn.running_mean[:carried] = 0
            bn.running_var[:carried] = 1
            bn.weight[:carried] = math.sqrt(1 + bn.eps)
            bn.bias[:carried] = 0


def _padded(t: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``t`` in the leading slice of zeros shaped as ``like``."""
    out = torch.zeros_like(like)
    out[tuple(slice(0, n) for n in t.shape)] = t
    return out


# ----------------------------------------------------------------------------------------- trainer

EMA_DECAY = 0.99  # ViT depth growth's EMA, updated every step


class ExpandTrainer(Trainer):
    """``Trainer`` whose model grows at stage boundaries: the growth due after a stage's last epoch runs at
    the next ``step``, inside that epoch's time; epochs past the schedule stay dense. Under DDP every rank
    grows (and re-wraps) at the same step."""

    def __init__(self, model: nn.Module, cfg: TrainConfig, device: str | torch.device, total_steps: int,
                 expand: ExpandConfig, ddp: bool = False):
        check_schedule(expand, model)
        self.expand = expand
        self.template = model.to(torch.device(device))
        self.stage = 0
        self._epochs_done = 0
        self._grow_pending = False
        first = expand.stages[0]
        super().__init__(subnet(self.template, first.width, first.depth), cfg, device, total_steps, ddp=ddp)
        self.ema = self._new_ema()

    def _new_ema(self) -> Any:
        """A fresh EMA of the model for ViT depth growth (``None`` for CNNs: they need none)."""
        return ModelEma(self.model, EMA_DECAY) if isinstance(self.model, ViT) else None

    def step(self, batch: Any) -> None:
        if self._grow_pending:
            self.grow()
        super().step(batch)
        if self.ema is not None:
            self.ema.update(self.model)

    def end_epoch(self) -> float:
        loss = super().end_epoch()
        self._epochs_done += 1
        bounds = [sum(s.epochs for s in self.expand.stages[:i + 1]) for i in range(len(self.expand.stages))]
        if self.stage < len(self.expand.stages) - 1 and self._epochs_done >= bounds[self.stage]:
            self._grow_pending = True
        return loss

    def stage_info(self) -> dict[str, float]:
        s = self.expand.stages[self.stage]
        return {"expand_stage": self.stage, "expand_width": s.width,
                "expand_depth": s.depth if s.depth is not None else (dense_depth(self.template) or 0)}

    def grow(self) -> None:
        """Move to the next stage now: new model, optimizer state carried over, schedule kept/restarted."""
        if self.stage >= len(self.expand.stages) - 1:
            raise RuntimeError("already at the dense model")
        self._grow_pending = False
        self.stage += 1
        s = self.expand.stages[self.stage]
        old_model = self.model
        if isinstance(old_model, ViT):
            depth = s.depth if s.depth is not None else dense_depth(self.template)
            new_model, old_names = grow_vit(old_model, self.ema.module, depth)
            new_model = new_model.to(self.device)
        else:
            new_model = grow_module(old_model, self.template, s.width, s.depth).to(self.device)
            old_names = {n: n for n, _ in new_model.named_parameters()}
        old_params = dict(old_model.named_parameters())
        group = self.opt.param_groups[0]
        new_state: dict[torch.Tensor, dict[str, Any]] = {}
        for name, p in new_model.named_parameters():
            op = old_params.get(old_names.get(name, ""))
            if op is not None and op in self.opt.state:  # momentum into the leading slice, zero elsewhere
                new_state[p] = {k: _padded(v, p) if torch.is_tensor(v) and v.shape == op.shape else v
                                for k, v in self.opt.state[op].items()}
        self.opt.state.clear()
        group["params"] = list(new_model.parameters())
        for p, st in new_state.items():
            self.opt.state[p] = st
        self.model = new_model
        self.ema = self._new_ema()
        if self.expand.restart_lr:
            remaining = max(1, self.total_steps - self.steps_done)
            group["lr"] = group["initial_lr"] = self.cfg.lr
            self.sched = torch.optim.lr_scheduler.CosineAnnealingLR(self.opt, T_max=remaining)
            self.total_steps = self.steps_done + remaining
        self._metrics_cache = None
