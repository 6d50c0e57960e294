"""A small Vision Transformer (``vit-tiny``, after DeiT: 4x4 patches, class token, pre-norm blocks) and
``grow_vit``, its depth growth by EMA interleaving (docs/training-methods.md, "Growth in detail")."""

from __future__ import annotations

import copy
import math

import torch
import torch.nn.functional as F
from torch import nn


class DropPath(nn.Module):
    """Stochastic depth: zero a sample's residual branch with probability ``p`` (train only),
    scaling the kept ones by ``1 / (1 - p)``."""

    def __init__(self, p: float = 0.0):
        super().__init__()
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0.0:
            return x
        keep = 1.0 - self.p
        mask = x.new_empty((x.shape[0],) + (1,) * (x.ndim - 1)).bernoulli_(keep)
        return x * mask / keep


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        if dim % heads:
            raise ValueError(f"dim {dim} is not divisible by {heads} heads")
        self.heads = heads
        self.scale = (dim // heads) ** -0.5
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, c = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        attn = ((q * self.scale) @ k.transpose(-2, -1)).softmax(dim=-1)
        return self.proj((attn @ v).transpose(1, 2).reshape(b, n, c))


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, mlp_ratio: float, drop_path: float):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = Attention(dim, heads)
        self.norm2 = nn.LayerNorm(dim)
        hidden = int(dim * mlp_ratio)
        self.mlp = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim))
        self.drop_path = DropPath(drop_path)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.drop_path(self.attn(self.norm1(x)))
        return x + self.drop_path(self.mlp(self.norm2(x)))


class ViT(nn.Module):
    """Class-token ViT for small images; ``blocks`` is an ``nn.ModuleList`` (depth growth edits it)."""

    def __init__(self, num_classes: int, image_size: int = 32, patch: int = 4, dim: int = 96, depth: int = 6,
                 heads: int = 3, mlp_ratio: float = 2.0, drop_path: float = 0.1):
        super().__init__()
        self.drop_path_rate = drop_path
        self.grid = image_size // patch
        self.patch_embed = nn.Conv2d(3, dim, patch, patch)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos_embed = nn.Parameter(torch.zeros(1, 1 + self.grid * self.grid, dim))
        nn.init.trunc_normal_(self.pos_embed, std=0.02)
        nn.init.trunc_normal_(self.cls_token, std=0.02)
        self.blocks = nn.ModuleList(Block(dim, heads, mlp_ratio, 0.0) for _ in range(depth))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.trunc_normal_(m.weight, std=0.02)
                nn.init.zeros_(m.bias)
        respread_drop_path(self)

    def _pos(self, gh: int, gw: int) -> torch.Tensor:
        if gh == gw == self.grid:
            return self.pos_embed
        cls, grid = self.pos_embed[:, :1], self.pos_embed[:, 1:]
        c = grid.shape[-1]
        grid = grid.reshape(1, self.grid, self.grid, c).permute(0, 3, 1, 2)
        grid = F.interpolate(grid, size=(gh, gw), mode="bilinear", align_corners=False)
        return torch.cat([cls, grid.permute(0, 2, 3, 1).reshape(1, gh * gw, c)], dim=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(x)
        gh, gw = x.shape[-2:]
        x = x.flatten(2).transpose(1, 2)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + self._pos(gh, gw)
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.norm(x)[:, 0])


def respread_drop_path(model: ViT) -> None:
    """Drop-path rates linear from 0 (first block) to ``model.drop_path_rate`` (last block)."""
    n = len(model.blocks)
    for i, blk in enumerate(model.blocks):
        blk.drop_path.p = model.drop_path_rate * i / (n - 1) if n > 1 else 0.0


def vit_subnet(dense: ViT, depth: int | None) -> ViT:
    """A copy of ``dense`` keeping its first ``depth`` blocks (drop-path re-spread)."""
    m = copy.deepcopy(dense)
    if depth is not None:
        m.blocks = nn.ModuleList(list(m.blocks)[:depth])
    respread_drop_path(m)
    return m


def interleave_plan(old_depth: int, new_depth: int) -> list[tuple[str, int]]:
    """The grown block list as ``("cur" | "ema", source index)``: every current block, each followed
    by its EMA copy when chosen (``n = new - old`` copies spread evenly; ``n = old``: all)."""
    n = new_depth - old_depth
    if n < 0:
        raise ValueError(f"cannot shrink the ViT from depth {old_depth} to {new_depth}")
    if n > old_depth:
        raise ValueError(f"ViT depth growth by EMA interleaving at most doubles the depth: "
                         f"{old_depth} -> {new_depth} (add a stage in between)")
    chosen = {math.floor(i * old_depth / n) for i in range(n)} if n else set()
    plan: list[tuple[str, int]] = []
    for i in range(old_depth):
        plan.append(("cur", i))
        if i in chosen:
            plan.append(("ema", i))
    return plan


def grow_vit(old: ViT, ema: ViT, depth: int) -> tuple[ViT, dict[str, str]]:
    """(the model at ``depth``: ``old``'s blocks interleaved with copies of ``ema``'s, sharing no tensors with
    ``old``; new parameter name -> ``old``'s name of each parameter carried over, EMA copies not)."""
    plan = interleave_plan(len(old.blocks), depth)
    new = copy.deepcopy(old)
    new.blocks = nn.ModuleList(copy.deepcopy(old.blocks[i] if src == "cur" else ema.blocks[i]) for src, i in plan)
    respread_drop_path(new)
    for p in new.parameters():  # the EMA's copies were frozen
        p.requires_grad_(True)
    names = {n: n for n, _ in new.named_parameters() if not n.startswith("blocks.")}
    names.update({f"blocks.{j}.{p}": f"blocks.{i}.{p}" for j, (src, i) in enumerate(plan) if src == "cur"
                  for p, _ in new.blocks[j].named_parameters()})
    return new, names


class ModelEma:
    """Exponential moving average of a model's parameters and buffers: after each optimizer step
    ``ema <- decay x ema + (1 - decay) x param`` (one fused ``_foreach_lerp_``)."""

    def __init__(self, model: nn.Module, decay: float = 0.99):
        if not 0 <= decay < 1:
            raise ValueError(f"EMA decay must be in [0, 1), got {decay}")
        self.decay = decay
        self.module = copy.deepcopy(model).eval()
        for p in self.module.parameters():
            p.requires_grad_(False)

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        ema_p = list(self.module.parameters())
        torch._foreach_lerp_(ema_p, [p.detach() for p in model.parameters()], 1.0 - self.decay)
        for e, b in zip(self.module.buffers(), model.buffers(), strict=True):
            e.copy_(b)
