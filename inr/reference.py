"""The reference design, one image at a time (as in Rapid-INR / COIN): a plain ``nn.Module``.

Used as the baseline of ``inrbench perf encode`` and as the ground truth the batched SIREN is
tested against. Same maths as ``inr.siren``: ``Linear -> sin(w0 * .)`` per sine layer, a
linear output layer, targets ``2 * rgb - 1``; a fresh model and optimizer per image, Adam
with ``CosineAnnealingLR``, full-image MSE, and the best state dict (by the clamped, 8-bit
PSNR of each iteration) kept, as the reference code does.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn

from inr.siren import SirenArch, coord_grid


class Sine(nn.Module):
    def __init__(self, w0: float):
        super().__init__()
        self.w0 = w0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sin(self.w0 * x)


def make_siren(arch: SirenArch) -> nn.Sequential:
    """One image's SIREN as ``nn.Sequential`` with the SIREN init (``nn.Linear`` stores ``W^T``)."""
    mods: list[nn.Module] = []
    for li, (i, o) in enumerate(arch.shapes):
        lin = nn.Linear(i, o)
        bound = 1.0 / i if li == 0 else math.sqrt(6.0 / i) / arch.w0
        with torch.no_grad():
            lin.weight.uniform_(-bound, bound)
            lin.bias.uniform_(-bound, bound)
        mods.append(lin)
        w0 = arch.omega(li)
        if w0 is not None:
            mods.append(Sine(w0))
    return nn.Sequential(*mods)


def load_weights(model: nn.Sequential, W: torch.Tensor, b: torch.Tensor, layer: int) -> None:
    """Copy one image's ``W [in, out]``, ``b [1, out]`` of ``layer`` into the module."""
    lin = [m for m in model if isinstance(m, nn.Linear)][layer]
    with torch.no_grad():
        lin.weight.copy_(W.t())
        lin.bias.copy_(b.reshape(-1))


def rgb(model: nn.Sequential, coords: torch.Tensor) -> torch.Tensor:
    """``[P, 2]`` -> ``[P, 3]`` RGB scale (``0.5 * out + 0.5``)."""
    return model(coords) * 0.5 + 0.5


def fit_one(image: np.ndarray, arch: SirenArch, iterations: int, lr: float, device: str = "cpu") -> tuple[nn.Sequential, float]:
    """Fit one uint8 ``[H, W, 3]`` image the reference way; returns (best model, best PSNR)."""
    h, w, _ = image.shape
    coords = coord_grid(h, w, device=device)
    target = torch.from_numpy(np.ascontiguousarray(image)).to(device).reshape(-1, 3).float() / 255.0 * 2 - 1
    model = make_siren(arch).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=iterations)
    loss_fn = nn.MSELoss()
    best_psnr, best_state = -math.inf, None
    for _ in range(iterations):
        out = model(coords)
        loss = loss_fn(out, target)
        with torch.no_grad():
            q = torch.round((out * 0.5 + 0.5).clamp(0, 1) * 255)
            mse = (q - (target * 0.5 + 0.5) * 255).round().pow(2).mean()
            psnr = float(10 * torch.log10(255.0**2 / mse))
        if psnr > best_psnr:
            best_psnr = psnr
            best_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
    if best_state is not None:
        model.load_state_dict(best_state)
    return model, best_psnr
