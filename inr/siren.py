"""Batched SIREN: ``B`` per-image networks, one batched matmul per layer: ``L`` layers ``sin(w0 (x W + b))``
and a linear ``h -> 3`` output; weights ``(W [B, in, out], b [B, 1, out])``; pixel-centre coordinates
in [-1, 1], row-major (docs/inr-codec.md, "The SIREN and the fit loop")."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch

Weights = list[tuple[torch.Tensor, torch.Tensor]]
HALF_PI = 0.5 * math.pi


@dataclass(frozen=True)
class SirenArch:
    """``layers`` sine layers of width ``hidden`` plus the output layer; ``w0_first`` / ``w0``: sine frequencies."""

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

    @property
    def scales(self) -> tuple[float, ...]:
        """What each layer's ``W`` and ``b`` are multiplied by: ``w0_first``, ``w0``..., 0.5 (the rgb map)."""
        return (self.w0_first,) + (self.w0,) * (self.layers - 1) + (0.5,)

    def omega(self, layer: int) -> float | None:
        """Sine frequency of linear layer ``layer``; ``None`` for the output layer."""
        return None if layer == self.layers else self.scales[layer]

    def to_dict(self) -> dict:
        return asdict(self)

    @staticmethod
    def from_dict(d: dict) -> SirenArch:
        return SirenArch(int(d["layers"]), int(d["hidden"]), float(d["w0"]), float(d["w0_first"]),
                         int(d.get("in_features", 2)), int(d.get("out_features", 3)))

    def __str__(self) -> str:
        return f"SIREN {self.layers}x{self.hidden} (w0_first={self.w0_first:g}, w0={self.w0:g}, {self.params_per_image} params/image)"


def fast_sin(x: torch.Tensor) -> torch.Tensor:
    """sin by range reduction to ``[-pi, pi]`` and an odd degree-11 polynomial (abs error ~1e-6); for compiled code."""
    r = x - torch.round(x * (1.0 / (2.0 * math.pi))) * (2.0 * math.pi)
    r2 = r * r
    p = r2 * -2.5052108385441720e-08 + 2.7557319223985893e-06
    p = p * r2 - 1.9841269841269841e-04
    p = p * r2 + 8.3333333333333333e-03
    p = p * r2 - 1.6666666666666667e-01
    return r + r * r2 * p


def net(layers: Weights, x: torch.Tensor, sin=torch.sin, keep: bool = False, mm=None):
    """The SIREN forward, channel-major: folded ``layers`` ``(W [B, out, in], b [B, out, 1])`` (``fold``), ``x``
    ``[>=2, P]`` shared or ``[B, >=2, P]`` per image (rows 0, 1: the coordinates) -> (rgb ``[B, 3, P]``, and with
    ``keep`` the sine and cosine ``[B, h, P]`` of every sine layer, for a backward). ``mm``: a lower-precision bmm."""
    W, b = layers[0]  # in = 2: two broadcast multiply-adds, no K=2 GEMM
    x0, x1 = (x[:, 0:1], x[:, 1:2]) if x.dim() == 3 else (x[0], x[1])
    z = W[:, :, 0:1] * x0 + W[:, :, 1:2] * x1 + b
    acts: list[torch.Tensor] = []
    coss: list[torch.Tensor] = []
    for W, b in layers[1:]:
        if keep:
            a = sin(z)
            acts.append(a)
            coss.append(sin(z + HALF_PI) if sin is not torch.sin else z.cos_())
        else:
            a = z.sin_() if sin is torch.sin else sin(z)
        z = torch.baddbmm(b, W, a) if mm is None and not keep else (mm or torch.bmm)(W, a) + b  # + b: fused
    return z, acts, coss


def fold(weights: Weights, arch: SirenArch, dtype: torch.dtype | None = None) -> Weights:
    """``[(W [B, in, out], b [B, 1, out])]`` -> ``net``'s ``[(W^T [B, out, in], b^T [B, out, 1])]``, scaled."""
    out = []
    for li, ((W, b), s) in enumerate(zip(weights, arch.scales, strict=True)):
        shift = 0.5 if li == arch.layers else 0.0
        out.append(((W.transpose(1, 2) * s).to(dtype or W.dtype), (b.transpose(1, 2) * s + shift).to(dtype or b.dtype)))
    return out


def fold_theta(thetas: list[torch.Tensor], scales: tuple[float, ...]) -> Weights:
    """Thetas ``[B, out, in + 1]`` -> ``net``'s folded layers (views times the scales)."""
    out = [(T[:, :, :-1] * s, T[:, :, -1:] * s) for T, s in zip(thetas, scales, strict=True)]
    out[-1] = (out[-1][0], out[-1][1] + 0.5)
    return out


@torch.no_grad()
def forward(weights: Weights, coords: torch.Tensor, arch: SirenArch) -> torch.Tensor:
    """``B`` SIRENs at ``coords`` ``[P, 2]`` (shared) or ``[B, P, 2]`` -> rgb ``[B, P, 3]`` on the [0, 1] scale (unclamped)."""
    x = coords.to(weights[0][0].dtype).transpose(-1, -2)
    return net(fold(weights, arch), x)[0].transpose(1, 2)


def decode_images(weights: Weights, arch: SirenArch, image_size: tuple[int, int], coords: torch.Tensor | None = None) -> torch.Tensor:
    """``[B, 3, H, W]`` float images on the [0, 1] scale (unclamped) on the full pixel grid."""
    h, w = image_size
    if coords is None:
        coords = coord_grid(h, w, device=weights[0][0].device)
    return forward(weights, coords, arch).transpose(1, 2).reshape(-1, 3, h, w)


def psnr8(rgb: torch.Tensor, t01: torch.Tensor) -> torch.Tensor:
    """PSNR ``[B]`` float32 of ``rgb`` clamped and rounded to 8 bits against ``t01`` (same shape, targets / 255)."""
    q = torch.round(rgb.clamp(0.0, 1.0) * 255.0) - t01 * 255.0
    return 10.0 * torch.log10(65025.0 / (q * q).flatten(1).mean(dim=1))


def psnr_from_rgb(rgb: torch.Tensor, target255: torch.Tensor) -> torch.Tensor:
    """``psnr8`` in float64 against targets in 0..255 (the ``bench.metrics`` convention): ``[B]``."""
    q = torch.round(rgb.detach().float().clamp(0.0, 1.0).mul_(255.0))
    mse = q.sub_(target255).pow_(2).flatten(1).mean(dim=1, dtype=torch.float64)
    return 10.0 * torch.log10(65025.0 / mse)  # inf where identical


def coord_grid(h: int, w: int, device: torch.device | str | None = None, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Pixel-centre coordinates ``[H*W, 2]`` as ``(x, y)``, row-major (pixel ``(i, j)`` at ``i*W + j``)."""
    xs = (torch.arange(w, device=device, dtype=torch.float64) * 2 + 1) / w - 1
    ys = (torch.arange(h, device=device, dtype=torch.float64) * 2 + 1) / h - 1
    yy, xx = torch.meshgrid(ys, xs, indexing="ij")
    return torch.stack([xx.reshape(-1), yy.reshape(-1)], dim=1).to(dtype)


def init_weights(arch: SirenArch, n: int, seed: int = 0, first_index: int = 0, device: torch.device | str | None = None) -> Weights:
    """SIREN init of ``n`` images, image ``k`` seeded by ``(seed, first_index + k)``: first layer ``U(+-1/fan_in)``,
    later ``U(+-sqrt(6/fan_in)/w0)``, biases alike. Float32 ``[(W [n, in, out], b [n, 1, out])]``."""
    shapes = arch.shapes
    out = [(torch.empty(n, i, o), torch.empty(n, 1, o)) for i, o in shapes]
    bounds = [1.0 / i if li == 0 else math.sqrt(6.0 / i) / arch.w0 for li, (i, _) in enumerate(shapes)]
    g = torch.Generator()
    for k in range(n):
        g.manual_seed((int(seed) * 1_000_003 + first_index + k) & 0x7FFF_FFFF_FFFF_FFFF)
        for (W, b), bound in zip(out, bounds, strict=True):
            W[k].uniform_(-bound, bound, generator=g)
            b[k].uniform_(-bound, bound, generator=g)
    return [(W.to(device), b.to(device)) for W, b in out]


def to_theta(weights: Weights) -> list[torch.Tensor]:
    """``[(W [B, in, out], b [B, 1, out])]`` -> ``[T [B, out, in + 1]]`` (contiguous float32 copies)."""
    return [torch.cat([W.transpose(1, 2), b.transpose(1, 2)], dim=2).float().contiguous() for W, b in weights]


def from_theta(thetas: list[torch.Tensor]) -> Weights:
    """Inverse of ``to_theta`` (contiguous copies)."""
    return [(T[:, :, :-1].transpose(1, 2).contiguous(), T[:, :, -1:].transpose(1, 2).contiguous()) for T in thetas]


def first_layer_input(coords: torch.Tensor) -> torch.Tensor:
    """Coordinates ``[P, 2]`` -> ``a0 [3, P]`` float32: the coordinates and a row of ones (the bias's input)."""
    return torch.cat([coords.t().float(), torch.ones(1, coords.shape[0], device=coords.device)]).contiguous()
