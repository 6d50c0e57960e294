"""Network expansion (CVPR 2023, the seeds' second system): train a sub-network of the dense
backbone and grow it into the dense model during training.

The sub-network computes with genuinely smaller tensors: ``subnet(dense, width, depth)`` rebuilds
every ``Conv2d``/``BatchNorm2d``/``Linear`` with ``round(width x channels)`` hidden channels (the
image's 3 input channels and the classifier's outputs stay), and keeps the first ``depth``
residual blocks of each ResNet stage (``layer1..4``; the first, downsampling block always stays).
For ``small-cnn`` (four conv/BN/ReLU layers, no residual stages) ``depth`` (1..4) counts the conv
layers kept, from the first; each later layer is a parameter-free ``SkippedLayer`` that computes
what that layer's identity initialization computes (below): its stride's subsampling
``x[:, :, ::s, ::s]``, channels unchanged; the classifier reads the last kept layer's channels. The
dense small-cnn (depth 4) is exactly ``small_cnn``.

Growth at a stage boundary (``grow``), CNN strategy (the paper's CNN code is not public; this is
this project's design, after Net2Net-style zero-outgoing growth and torchvision's
``zero_init_residual``):

- width: trained weights are copied into the leading slices of the wider tensors; the new slices
  come from the dense model's initialization, except every weight from a NEW input channel to an
  OLD output channel, which is zero. Old channels therefore see exactly what they saw before
  (BatchNorm is per channel, in train and eval mode); new channels are ignored downstream until
  those zero weights learn. The classifier's columns for new features are zero too, so the logits
  are preserved **exactly** in real arithmetic; in floating point up to summation order
  (tests: max |diff| <= 1e-4 x max |logit| on a fixed batch).
- depth: a new BasicBlock/Bottleneck is appended at the end of its stage with the dense
  initialization and its last BatchNorm scale (and shift) zero: the residual branch outputs 0, and
  the block returns ``relu(x) = x`` (its input is a ReLU output, >= 0): the identity, exactly.
- small-cnn depth (Net2DeeperNet, Chen et al. 2016): a skipped layer is inserted as an identity
  conv/BN/ReLU. Its 3x3 conv has, for each channel ``j`` the old model carried there (the old
  classifier's inputs), the identity kernel (center tap ``w[j, j, 1, 1] = 1``, all else 0 in that
  row; with padding 1 and stride ``s`` that is ``x[:, :, ::s, ::s]``: what the skipped layer
  computed); its other output channels keep the dense initialization and, like width growth's new
  channels, reach old outputs downstream only through zero weights. The BatchNorm of the identity
  channels gets running mean 0, running variance 1, scale ``sqrt(1 + eps)``, shift 0, so in eval
  mode BN(x) = x (up to one float32 rounding, ~1e-7 relative), and ReLU(x) = x on its input, a
  ReLU output (>= 0; the first layer, whose input is the image, is always kept). Eval-mode logits
  are therefore preserved (tests: <= 1e-5 relative on a fixed batch). In training mode BatchNorm
  normalizes with batch statistics instead, so the new layer outputs ``relu(sqrt(1 + eps) x (x -
  mean_B) / sqrt(var_B + eps))`` per channel, the identity only where the batch mean is 0 and
  variance 1: no bound holds in general, the train-mode function right after depth growth is NOT
  preserved (Net2DeeperNet's caveat for BatchNorm); the running statistics then move from (0, 1)
  toward the batch statistics at BatchNorm's momentum.
- optimizer: momentum (any per-parameter state tensor shaped like the parameter) is copied into
  the leading slice of the new tensor, zero elsewhere; new parameters join the same param group;
  the learning-rate schedule is kept (``restart_lr=False``) or restarted as a cosine over the
  remaining steps.

ViT (``vit-tiny``, ``bench.train.vit``): depth only, as in the public DeiT code. The sub-network
keeps the first ``depth`` blocks; the trainer keeps an EMA of the model (decay 0.99, updated after
every step); at growth the deeper model interleaves the current blocks with EMA copies
(``[b0, ema0, b1, ema1, ...]``), drop-path rates are re-spread linearly over the new depth, the
EMA is rebuilt from the grown model, the optimizer state of the carried-over blocks follows them
to their new indices (the EMA copies start with none). The function is NOT preserved (measured
bound in ``bench.train.vit``); a ViT stage with width < 1 is refused.
"""

from __future__ import annotations

import copy
import math
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import nn

from bench.train.backbones import SmallCNN
from bench.train.loop import TrainConfig, Trainer
from bench.train.vit import ModelEma, ViT, grow_vit, interleave_plan, vit_subnet


@dataclass(frozen=True)
class Stage:
    """One stage of a schedule: ``width`` fraction of the dense channels (0, 1], ``depth`` residual
    blocks per ResNet stage, transformer blocks of a ViT or conv layers of small-cnn (``None`` = the
    dense depth), trained for ``epochs`` epochs."""

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

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# ------------------------------------------------------------------------------------------ subnets

def _blocks_sequences(model: nn.Module) -> dict[str, nn.Sequential]:
    """name -> the Sequential of residual blocks of a ResNet stage (``layer1..4``); {} otherwise."""
    from torchvision.models.resnet import BasicBlock, Bottleneck

    return {n: m for n, m in model.named_modules()
            if isinstance(m, nn.Sequential) and len(m) and all(isinstance(b, BasicBlock | Bottleneck) for b in m)}


SMALL_CNN_LAYERS = 4  # conv/BN/ReLU layers of small_cnn: its dense depth


class SkippedLayer(nn.Module):
    """A small-cnn conv layer the sub-network skips: the stride's subsampling, what the layer's
    identity initialization computes at growth (see the module docstring)."""

    def __init__(self, stride: int):
        super().__init__()
        self.stride = stride

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x[:, :, ::self.stride, ::self.stride] if self.stride > 1 else x

    def extra_repr(self) -> str:
        return f"stride={self.stride}"


def _is_small_cnn(model: nn.Module) -> bool:
    return isinstance(model, SmallCNN)


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


def _is_vit(model: nn.Module) -> bool:
    return isinstance(model, ViT)


def dense_depth(model: nn.Module) -> int | None:
    """Blocks per ResNet stage of the dense model (all stages equal), a ViT's blocks, or ``None``
    (no residual stages)."""
    if _is_vit(model):
        return len(model.blocks)
    if _is_small_cnn(model):
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
    if _is_vit(dense):
        if any(s.width != 1.0 for s in cfg.stages):
            raise ValueError("width growth is not implemented for the ViT (depth only): use width 1 in every stage")
        depths = [s.depth if s.depth is not None else full for s in cfg.stages]
        for a, b in zip(depths, depths[1:], strict=False):
            if a is not None and b is not None and b <= full:
                interleave_plan(a, b)  # refuses more than doubling
    for s in cfg.stages:
        if _is_small_cnn(dense) and s.depth is not None and not 1 <= s.depth <= SMALL_CNN_LAYERS:
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
    if _is_vit(dense):
        if width != 1.0:
            raise ValueError("width growth is not implemented for the ViT (depth only)")
        return vit_subnet(dense, depth)
    m = copy.deepcopy(dense)
    if depth is not None and not _is_small_cnn(m):
        for seq in _blocks_sequences(m).values():
            for i in range(len(seq) - 1, depth - 1, -1):
                del seq[i]
    if width != 1.0:
        _scale_width(m, width)
    if depth is not None and _is_small_cnn(m):
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
    """The model at ``width``/``depth``: ``template`` (the dense initialization) sliced, with ``old``'s
    tensors in the leading slices, zero weights from new input channels to old outputs, new
    residual blocks' last BatchNorm zeroed and new small-cnn layers set to the identity on the old
    model's channels. See the module docstring for the bound."""
    from torchvision.models.resnet import BasicBlock, Bottleneck

    new = subnet(template, width, depth)
    old_sd = old.state_dict()
    new_blocks = set()
    for seq_name, seq in _blocks_sequences(new).items():
        for i, block in enumerate(seq):
            if f"{seq_name}.{i}.conv1.weight" not in old_sd:
                new_blocks.add(f"{seq_name}.{i}.")
                last_bn = block.bn3 if isinstance(block, Bottleneck) else block.bn2
                assert isinstance(block, BasicBlock | Bottleneck)
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
    if _is_small_cnn(new):
        _init_inserted_layers(old, new)
    return new


def _init_inserted_layers(old: nn.Module, new: nn.Module) -> None:
    """Layers of small-cnn ``new`` that are ``SkippedLayer`` in ``old``: identity on the channels
    ``old`` carried (its classifier's inputs), dense initialization elsewhere (module docstring)."""
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


# ----------------------------------------------------------------------------------------- trainer

EMA_DECAY = 0.99  # ViT depth growth's EMA, updated every step (see bench.train.vit)


class ExpandTrainer(Trainer):
    """``Trainer`` whose model grows at stage boundaries (``ExpandConfig``).

    ``end_epoch()`` counts epochs; the growth due after a stage's last epoch runs at the first
    ``step`` of the next epoch, so its cost lands in that epoch's time. ``epoch_metrics`` reports
    the stage that trained the epoch just run. Autorange epochs past the schedule stay dense.
    Data parallel (``ddp``): ``grow`` assigns ``self.model``, which re-wraps the grown module in
    DDP on every rank at the same step (the optimizer's param group takes the new parameters).
    """

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
        if not _is_vit(self.model):
            return None

        return ModelEma(self.model, EMA_DECAY)

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
        if _is_vit(old_model):
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
            if op is None or op not in self.opt.state:
                continue
            st = {}
            for k, v in self.opt.state[op].items():
                if torch.is_tensor(v) and v.shape == op.shape:
                    nv = torch.zeros_like(p)
                    nv[tuple(slice(0, n) for n in v.shape)] = v
                    st[k] = nv
                else:
                    st[k] = v
            new_state[p] = st
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
