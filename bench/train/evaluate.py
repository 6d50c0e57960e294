"""Test accuracy on the ORIGINAL pixels whatever fed training (centre square, resize, normalize).
Data parallel: each rank evaluates its ``eval_slice`` and every rank returns the whole ``EvalResult``."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist

from bench.train.loop import autocast_for, rank_and_world
from pipelines.base import Augment


def eval_transform(images: np.ndarray | torch.Tensor, augment: Augment,
                   device: str | torch.device = "cpu") -> torch.Tensor:
    """uint8 ``[N, H, W, 3]`` -> float32 ``[N, 3, size, size]`` normalized, on ``device``; ``augment`` is an
    evaluation transform (centre crop, no flip)."""
    from torchvision.transforms.v2 import functional as F

    if augment.crop != "center" or augment.flip:
        raise ValueError(f"eval_transform needs a centre crop without flip, got {augment}")
    x = torch.from_numpy(np.array(images, copy=True)).to(device)  # a copy: memmaps are read-only
    if x.dtype != torch.uint8 or x.ndim != 4 or x.shape[-1] != 3:
        raise ValueError(f"expected uint8 [N,H,W,3], got {x.dtype} {tuple(x.shape)}")
    x = x.permute(0, 3, 1, 2)
    side = min(x.shape[-2:])
    x = F.center_crop(x, [side, side])
    if side != augment.size:
        x = F.resize(x, [augment.size, augment.size], antialias=True)
    x = x.float().div_(255.0)
    return F.normalize(x, mean=list(augment.mean), std=list(augment.std))


@dataclass(frozen=True)
class EvalResult:
    accuracy: float  # fraction in [0, 1]
    loss: float  # mean cross-entropy
    images: int
    predictions: np.ndarray | None = None  # [N] int64 predicted class per image, in input order


def eval_slice(n: int, rank: int, world_size: int) -> slice:
    """Rank ``rank``'s contiguous share of ``n`` evaluation images (sizes differ by at most one)."""
    bounds = [0, *np.cumsum([len(a) for a in np.array_split(np.arange(n), world_size)]).tolist()]
    return slice(bounds[rank], bounds[rank + 1])


@torch.no_grad()
def evaluate(model: torch.nn.Module, images: np.ndarray, labels: np.ndarray, train_augment: Augment,
             device: str | torch.device, batch_size: int = 500, amp: str = "auto") -> EvalResult:
    """Top-1 accuracy, loss and predictions of ``model`` on uint8 ``images [N, H, W, 3]``, ``labels [N]``
    (the whole split's, also when data-parallel)."""
    dev = torch.device(device)
    aug = Augment.eval_for(train_augment)
    model.eval()
    total = int(labels.shape[0])
    if total == 0:
        raise ValueError("evaluation split is empty")
    rank, world = rank_and_world()
    if world > 1:
        for b in model.buffers():
            dist.broadcast(b, src=0)
    part = eval_slice(total, rank, world)
    correct, loss_sum, preds = 0, 0.0, []
    for i in range(part.start, part.stop, batch_size):
        j = min(i + batch_size, part.stop)
        x = eval_transform(images[i:j], aug, dev)
        y = torch.as_tensor(np.asarray(labels[i:j]), dtype=torch.int64, device=dev)
        with autocast_for(dev, amp):  # type: ignore[arg-type]
            logits = model(x).float()
        loss_sum += float(torch.nn.functional.cross_entropy(logits, y, reduction="sum"))
        pred = logits.argmax(1)
        correct += int((pred == y).sum())
        preds.append(pred.cpu())
    mine = torch.cat(preds).numpy().astype(np.int64) if preds else np.zeros(0, np.int64)
    n = part.stop - part.start
    if world > 1:
        sums = torch.tensor([correct, loss_sum, n], dtype=torch.float64, device=dev)
        dist.all_reduce(sums)
        correct, loss_sum, n = int(round(sums[0].item())), float(sums[1].item()), int(round(sums[2].item()))
        every: list = [None] * world
        dist.all_gather_object(every, mine)
        mine = np.concatenate(every).astype(np.int64)
    return EvalResult(accuracy=correct / n, loss=loss_sum / n, images=n, predictions=mine)
