"""Batched SIREN: many small per-image networks evaluated with one batched matmul per layer.

Conventions (the whole ``inr`` package uses them):

* Architecture ``L x h`` = ``L`` sine layers (``in -> h``, then ``h -> h``) plus one linear
  ``h -> 3`` output layer, i.e. ``L + 1`` linear layers in total.
* Layer ``l`` computes ``z = x @ W + b`` with ``W [in, out]`` and ``b [1, out]``; sine layers
  output ``sin(w0_l * z)`` (``w0_first`` for layer 0, ``w0`` for the other sine layers).
  ``w0`` is a constant, not folded into the stored weights.
* The network is fitted to targets in ``[-1, 1]`` (``target = 2 * rgb - 1``); the RGB image
  is ``rgb = 0.5 * out + 0.5`` (no clamp here; ``bench.metrics`` clamps and rounds).
* Coordinates are pixel centres, ``x_j = (2j + 1) / W - 1``, ``y_i = (2i + 1) / H - 1``
  (the ``grid_sample(align_corners=False)`` convention), stored as ``(x, y)`` pairs in
  row-major pixel order, so an affine map of these coordinates is a crop/flip/resize.
* Weights of a batch of ``B`` images: a list over layers of ``(W [B, in, out], b [B, 1, out])``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

Weights = list[tuple[torch.Tensor, torch.Tensor]]


@dataclass(frozen=True)
class SirenArch:
    """Architecture of every per-image SIREN in a set.

    layers: number of sine layers (the output layer is extra); hidden: width;
    w0 / w0_first: sine frequency of the hidden layers / of the first layer.
    """

    layers: int
    hidden: int
    w0: float = 30.0
    w0_first: float = 30.0
    in_features: int = 2
    out_features: int = 3

    def __post_init__(self) -> None:
        if self.layers < 1 or self.hidden < 1:
            raise ValueError(f"SirenArch needs layers >= 1 and hidden >= 1, got {self.layers}x{self.hidden}")
        if not (0 < self.w0 < math.inf and 0 < self.w0_first < math.inf):
            raise ValueError(f"w0 and w0_first must be > 0 and finite, got {self.w0}, {self.w0_first}")

    @property
    def shapes(self) -> list[tuple[int, int]]:
        """``(in, out)`` of each of the ``layers + 1`` linear layers."""
        dims = [self.in_features] + [self.hidden] * self.layers + [self.out_features]
        return list(zip(dims[:-1], dims[1:], strict=True))

    @property
    def num_linear(self) -> int:
        return self.layers + 1

    @property
    def params_per_image(self) -> int:
        return sum(i * o + o for i, o in self.shapes)

    def omega(self, layer: int) -> float | None:
        """Sine frequency of linear layer ``layer``; ``None`` for the (identity) output layer."""
        if layer == self.layers:
            return None
        return self.w0_first if layer == 0 else self.w0

    def to_dict(self) -> dict:
        return {
            "layers": self.layers,
            "hidden": self.hidden,
            "w0": self.w0,
            "w0_first": self.w0_first,
            "in_features": self.in_features,
            "out_features": self.out_features,
        }

    @staticmethod
    def from_dict(d: dict) -> SirenArch:
        return SirenArch(
            layers=int(d["layers"]),
            hidden=int(d["hidden"]),
            w0=float(d["w0"]),
            w0_first=float(d["w0_first"]),
            in_features=int(d.get("in_features", 2)),
            out_features=int(d.get("out_features", 3)),
        )

    def __str__(self) -> str:
        return f"SIREN {self.layers}x{self.hidden} (w0_first={self.w0_first:g}, w0={self.w0:g}, {self.params_per_image} params/image)"


def fast_sin(x: torch.Tensor) -> torch.Tensor:
    """sin via range reduction to ``[-pi, pi]`` and an odd degree-11 Taylor polynomial.

    Max abs error ~1e-6 on ``[-pi, pi]``, ~|x| * 4e-6 beyond (float32 range reduction): far below
    one 8-bit level. Only worth it when compiled (eager it is several passes over memory).
    """
    r = x - torch.round(x * (1.0 / (2.0 * math.pi))) * (2.0 * math.pi)
    r2 = r * r
    p = r2 * -2.5052108385441720e-08 + 2.7557319223985893e-06
    p = p * r2 - 1.9841269841269841e-04
    p = p * r2 + 8.3333333333333333e-03
    p = p * r2 - 1.6666666666666667e-01
    return r + r * r2 * p


def psnr_from_rgb(rgb: torch.Tensor, target255: torch.Tensor, exact: bool = True) -> torch.Tensor:
    """Float RGB and float targets in 0..255 (same shape ``[B, ...]``) -> ``[B]`` PSNR float64.

    The ``bench.metrics`` convention (clamp, round to 8 bits). ``exact=False`` sums the squared
    errors in float32 (relative error ~1e-7: fine for choosing the best iterate, cheaper).
    """
    q = torch.round(rgb.detach().float().clamp(0.0, 1.0).mul_(255.0))
    d = q.sub_(target255).pow_(2).flatten(1)
    mse = d.mean(dim=1, dtype=torch.float64) if exact else d.mean(dim=1).double()
    return 10.0 * torch.log10(65025.0 / mse)  # inf where identical


def coord_grid(h: int, w: int, device: torch.device | str | None = None, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Pixel-centre coordinates ``[H*W, 2]`` as ``(x, y)``, row-major (pixel ``(i, j)`` at ``i*W + j``).

    ``x_j = (2j+1)/W - 1``, ``y_i = (2i+1)/H - 1``; non-square images keep their own spacing.
    """
    xs = (torch.arange(w, device=device, dtype=torch.float64) * 2 + 1) / w - 1
    ys = (torch.arange(h, device=device, dtype=torch.float64) * 2 + 1) / h - 1
    yy, xx = torch.meshgrid(ys, xs, indexing="ij")
    return torch.stack([xx.reshape(-1), yy.reshape(-1)], dim=1).to(dtype)


def init_weights(
    arch: SirenArch, n: int, seed: int = 0, first_index: int = 0, device: torch.device | str | None = None
) -> Weights:
    """SIREN init for ``n`` images: weights of image ``k`` depend only on ``(seed, first_index + k)``.

    First layer ``U(-1/fan_in, 1/fan_in)``; later layers ``U(-sqrt(6/fan_in)/w0, +)``; biases use
    the same bound as their weights (as in ``nn.Linear``-style SIREN code). Returns float32
    ``[(W [n, in, out], b [n, 1, out]), ...]``. Per-image seeding makes a fit independent of
    how images are chunked.
    """
    shapes = arch.shapes
    out: list[tuple[torch.Tensor, torch.Tensor]] = [
        (torch.empty(n, i, o), torch.empty(n, 1, o)) for i, o in shapes
    ]
    bounds = []
    for li, (fan_in, _) in enumerate(shapes):
        if li == 0:
            bounds.append(1.0 / fan_in)
        else:
            bounds.append(math.sqrt(6.0 / fan_in) / arch.w0)
    g = torch.Generator()
    for k in range(n):
        g.manual_seed((int(seed) * 1_000_003 + first_index + k) & 0x7FFF_FFFF_FFFF_FFFF)
        for (W, b), bound in zip(out, bounds, strict=True):
            W[k].uniform_(-bound, bound, generator=g)
            b[k].uniform_(-bound, bound, generator=g)
    return [(W.to(device), b.to(device)) for W, b in out]


def rgb_affine(W: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Fold ``rgb = 0.5 * out + 0.5`` into the output layer (cheaper than on ``[B, P, 3]``)."""
    return W * 0.5, b * 0.5 + 0.5


@torch.no_grad()
def forward(weights: Weights, coords: torch.Tensor, arch: SirenArch) -> torch.Tensor:
    """Evaluate ``B`` SIRENs at ``P`` points: fast inference path (no autograd, in-place sine).

    Args:
        weights: per layer ``(W [B, in, out], b [B, 1, out])`` (float32, or half on CUDA).
        coords: ``[P, 2]`` shared by all images, or ``[B, P, 2]`` per image.
    Returns:
        ``[B, P, 3]`` RGB on the ``[0, 1]`` scale (not clamped).
    """
    B = weights[0][0].shape[0]
    x = coords if coords.dim() == 3 else coords.unsqueeze(0).expand(B, -1, -1)
    x = x.to(weights[0][0].dtype)
    for li, (W, b) in enumerate(weights):
        w0 = arch.omega(li)
        if w0 is None:
            Wr, br = rgb_affine(W, b)
            return torch.baddbmm(br, x, Wr)
        # sin(w0 * (x W + b)) == sin(x (w0 W) + w0 b): scale the small weights, not the activations.
        x = torch.baddbmm(b * w0, x, W * w0)
        x.sin_()
    raise AssertionError("unreachable")


def forward_train(weights: Weights, coords: torch.Tensor, arch: SirenArch) -> torch.Tensor:
    """Autograd-friendly twin of ``forward`` (same ops, out-of-place sine): ``[B, P, 3]`` RGB scale.

    Because both fold ``w0`` and the RGB mapping into the weights identically, the PSNR seen
    while fitting (fp32) equals the PSNR of decoding the kept weights with ``forward``.
    """
    B = weights[0][0].shape[0]
    x = coords if coords.dim() == 3 else coords.unsqueeze(0).expand(B, -1, -1)
    for li, (W, b) in enumerate(weights):
        w0 = arch.omega(li)
        if w0 is None:
            Wr, br = rgb_affine(W, b)
            return torch.baddbmm(br, x, Wr)
        x = torch.sin(torch.baddbmm(b * w0, x, W * w0))
    raise AssertionError("unreachable")


def decode_images(weights: Weights, arch: SirenArch, image_size: tuple[int, int], coords: torch.Tensor | None = None) -> torch.Tensor:
    """``[B, 3, H, W]`` float images in ``[0, 1]`` scale (unclamped) on the full pixel grid."""
    h, w = image_size
    if coords is None:
        coords = coord_grid(h, w, device=weights[0][0].device)
    out = forward(weights, coords, arch)
    return out.view(out.shape[0], h, w, 3).permute(0, 3, 1, 2).contiguous()
