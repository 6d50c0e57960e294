"""Test accuracy on the ORIGINAL pixels, whatever pipeline fed training.

The test split is read from the prepared dataset's uint8 array (``split.images``, never a
decoded JPEG or INR reconstruction) and transformed with the evaluation transform
``Augment.eval_for(train_augment)``: centre crop of the largest square, resize to ``size``
(bilinear, antialiased), scale to [0, 1], normalize with mean/std.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from bench.train.loop import autocast_for
from pipelines.base import Augment


def eval_transform(images: np.ndarray | torch.Tensor, augment: Augment,
                   device: str | torch.device = "cpu") -> torch.Tensor:
    """uint8 ``[N, H, W, 3]`` -> float32 ``[N, 3, size, size]`` normalized, on ``device``.

    ``augment`` must be an evaluation transform (centre crop, no flip).
    """
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


@torch.no_grad()
def evaluate(model: torch.nn.Module, images: np.ndarray, labels: np.ndarray, train_augment: Augment,
             device: str | torch.device, batch_size: int = 500, amp: str = "auto") -> EvalResult:
    """Top-1 accuracy, loss and per-image predictions of ``model`` on uint8 ``images [N, H, W, 3]``,
    ``labels [N]``."""
    dev = torch.device(device)
    aug = Augment.eval_for(train_augment)
    model.eval()
    correct, loss_sum, n, preds = 0, 0.0, int(labels.shape[0]), []
    if n == 0:
        raise ValueError("evaluation split is empty")
    for i in range(0, n, batch_size):
        x = eval_transform(images[i:i + batch_size], aug, dev)
        y = torch.as_tensor(np.asarray(labels[i:i + batch_size]), dtype=torch.int64, device=dev)
        with autocast_for(dev, amp):  # type: ignore[arg-type]
            logits = model(x).float()
        loss_sum += float(torch.nn.functional.cross_entropy(logits, y, reduction="sum"))
        pred = logits.argmax(1)
        correct += int((pred == y).sum())
        preds.append(pred.cpu())
    return EvalResult(accuracy=correct / n, loss=loss_sum / n, images=n,
                      predictions=torch.cat(preds).numpy().astype(np.int64))
