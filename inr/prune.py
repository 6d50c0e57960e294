"""Magnitude pruning of per-image SIRENs (weights only): exactly ``round(r * in * out)`` smallest ``|w|`` of every
layer of every image, masks bool ``[N, in, out]`` (True = kept), fine-tuned by the eager loop with the masks held.
Iterative: ``rounds`` steps to ``ratio``; dynamic: per image, the last ratio within ``budget_db`` of its PSNR."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass

import numpy as np
import torch

from inr.fit import images_to_targets, optimize
from inr.loop import Loop
from inr.siren import SirenArch, Weights, coord_grid


@dataclass(frozen=True)
class PruneConfig:
    """ratio: target fraction of weights pruned (iterative mode); budget_db: when set, dynamic mode.

    finetune_iterations per round at learning rate ``lr`` (cosine-annealed within the round).
    """

    ratio: float = 0.0
    rounds: int = 2
    finetune_iterations: int = 200
    lr: float = 2e-3
    budget_db: float | None = None
    max_ratio: float = 0.6
    step: float = 0.05

    def __post_init__(self) -> None:
        # backstops: ``inrbench encode`` checks its flags first and names them
        if not 0.0 <= self.ratio < 1.0:
            raise ValueError(f"the prune ratio must be in [0, 1), got {self.ratio}")
        if not 0.0 < self.max_ratio < 1.0 or not 0.0 < self.step < 1.0:
            raise ValueError(f"the dynamic prune max_ratio and step must be in (0, 1), got {self.max_ratio}, {self.step}")
        if self.rounds < 1 or self.finetune_iterations < 0 or not 0 < self.lr < float("inf"):
            raise ValueError(f"rounds >= 1, finetune_iterations >= 0 and a finite lr > 0 required, got "
                             f"{self.rounds}, {self.finetune_iterations}, {self.lr}")
        if self.budget_db is not None and not 0 <= self.budget_db < float("inf"):
            raise ValueError(f"budget_db must be a finite number >= 0, got {self.budget_db}")

    @property
    def enabled(self) -> bool:
        return self.ratio > 0 or self.budget_db is not None

    def to_dict(self) -> dict:
        return asdict(self)


def magnitude_masks(weights: Weights, ratio: float | torch.Tensor) -> list[torch.Tensor]:
    """Keep-masks bool ``[N, in, out]`` pruning exactly ``round(ratio * in * out)`` smallest ``|W|`` per image.

    ``ratio``: a float, or float ``[N]`` (one ratio per image).
    """
    masks = []
    for W, _ in weights:
        n, i, o = W.shape
        r = torch.as_tensor(ratio, dtype=torch.float64).expand(n)
        k = torch.round(r * (i * o)).to(torch.int64).to(W.device)  # [N]
        order = torch.argsort(W.detach().abs().reshape(n, -1), dim=1, stable=True)
        rank = torch.empty_like(order)
        rank.scatter_(1, order, torch.arange(i * o, device=W.device).expand(n, -1).contiguous())
        masks.append((rank >= k.unsqueeze(1)).view(n, i, o))
    return masks


def apply_masks(weights: Weights, masks: list[torch.Tensor]) -> Weights:
    return [(W * m, b) for (W, b), m in zip(weights, masks, strict=True)]


def _finetune(weights: Weights, masks, targets, coords, arch, cfg: PruneConfig, chunk: int = 0, workers: int = 0):
    """Fine-tune masked weights (the eager loop); the pruned starting point is the first keep-best candidate."""
    loop = Loop(cfg.finetune_iterations, cfg.lr, chunk=chunk, workers=workers)
    return optimize(apply_masks(weights, masks), targets, coords, arch, loop, masks=masks)[:2]


def prune_iterative(
    weights: Weights, images: np.ndarray, arch: SirenArch, cfg: PruneConfig, device="cpu", chunk: int = 0, workers: int = 0
) -> tuple[Weights, list[torch.Tensor], torch.Tensor]:
    """Prune to ``cfg.ratio`` in ``cfg.rounds`` rounds with fine-tuning; weights ``[(W [N, in, out], b)]``,
    images uint8 ``[N, H, W, 3]``. Returns (pruned weights, masks bool ``[N, in, out]``, PSNR ``[N]``)."""
    dev = torch.device(device)
    n, h, w, _ = images.shape
    coords = coord_grid(h, w, device=dev)
    targets = images_to_targets(images, dev)
    cur = [(W.to(dev), b.to(dev)) for W, b in weights]
    masks: list[torch.Tensor] = []
    psnr = torch.zeros(n, dtype=torch.float64)
    for r in range(1, cfg.rounds + 1):
        masks = magnitude_masks(cur, cfg.ratio * r / cfg.rounds)
        cur, psnr = _finetune(cur, masks, targets, coords, arch, cfg, chunk, workers)
    return [(W.cpu(), b.cpu()) for W, b in cur], [m.cpu() for m in masks], psnr.cpu()


def prune_dynamic(
    weights: Weights,
    images: np.ndarray,
    arch: SirenArch,
    cfg: PruneConfig,
    base_psnr: torch.Tensor | np.ndarray,
    device="cpu",
    progress: Callable[[float, int], None] | None = None,
    chunk: int = 0,
    workers: int = 0,
) -> tuple[Weights, list[torch.Tensor], torch.Tensor, torch.Tensor]:
    """Per image, prune as far as the PSNR stays within ``cfg.budget_db`` of ``base_psnr``.

    Returns (weights, masks, PSNR ``[N]``, ratio ``[N]`` reached per image).
    """
    assert cfg.budget_db is not None
    dev = torch.device(device)
    n, h, w, _ = images.shape
    coords = coord_grid(h, w, device=dev)
    base = torch.as_tensor(np.asarray(base_psnr), dtype=torch.float64)
    acc_w = [(W.clone().cpu(), b.clone().cpu()) for W, b in weights]
    acc_m = [torch.ones_like(W, dtype=torch.bool) for W, _ in acc_w]
    acc_p = base.clone()
    ratio = torch.zeros(n, dtype=torch.float64)
    active = torch.ones(n, dtype=torch.bool)
    steps = int(np.floor(cfg.max_ratio / cfg.step + 1e-9))
    for s in range(1, steps + 1):
        idx = torch.nonzero(active).flatten()
        if idx.numel() == 0:
            break
        r = s * cfg.step
        sub = [(W[idx].to(dev), b[idx].to(dev)) for W, b in acc_w]
        masks = magnitude_masks(sub, r)
        tw, tp = _finetune(sub, masks, images_to_targets(images[idx.numpy()], dev), coords, arch, cfg, chunk, workers)
        ok = (base[idx] - tp.cpu()) <= cfg.budget_db
        good = idx[ok]
        for li in range(len(acc_w)):
            acc_w[li][0][good] = tw[li][0][ok].cpu()
            acc_w[li][1][good] = tw[li][1][ok].cpu()
            acc_m[li][good] = masks[li][ok].cpu()
        acc_p[good] = tp.cpu()[ok]
        ratio[good] = r
        active[idx[~ok]] = False
        if progress is not None:
            progress(r, int(ok.sum()))
    return acc_w, acc_m, acc_p, ratio
