"""Batched SIREN decode at per-image affine grids (the ``inr`` adapter's kernel): the crop/flip map is
folded into the first layer (``W1' = A^T W1``, ``b1' = b1 + t^T W1``); CPU chunks sized to stay in L2."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from inr.siren import Weights, fast_sin, fold, net

CPU_ACTIVATION_BYTES = 1 << 19  # one chunk's [n, hidden, P] fp32 activations: ~512 KiB, inside L2


def output_grid(size: int, device: torch.device | str | None = None) -> torch.Tensor:
    """float32 ``[2, size*size]``: ``(u, v)`` pixel centres of the output, row-major."""
    t = (torch.arange(size, device=device, dtype=torch.float64) * 2 + 1) / size - 1
    v, u = torch.meshgrid(t, t, indexing="ij")
    return torch.stack([u.reshape(-1), v.reshape(-1)]).float()


def fold_weights(weights: Weights, theta: torch.Tensor, arch, dtype: torch.dtype = torch.float32) -> Weights:
    """``[(W [B, in, out], b [B, 1, out])]`` + ``theta [B, 2, 3]`` -> ``net``'s folded layers, the map in layer 0."""
    W1, b1 = weights[0]
    A, t = theta[:, :, :2].to(W1.dtype), theta[:, :, 2:].to(W1.dtype)  # (x, y) = A (u, v) + t
    return fold([(torch.bmm(A.transpose(1, 2), W1), b1 + torch.bmm(t.transpose(1, 2), W1)), *weights[1:]], arch, dtype)


def cpu_chunk(arch, size: int) -> int:
    """Images per chunk on the CPU so a layer's activations stay in L2 (8 for 5x13 at 32x32)."""
    return max(1, CPU_ACTIVATION_BYTES // (arch.hidden * size * size * 4))


def pack_chunks(layers: Weights, chunk: int) -> torch.Tensor:
    """Folded layers ``[B, ...]`` -> ``[ceil(B / chunk), F]``: one contiguous zero-padded row per chunk."""
    n = layers[0][0].shape[0]
    m = -(-n // chunk)
    return torch.cat([F.pad(t, (0, 0, 0, 0, 0, m * chunk - n)).reshape(m, -1) for W, b in layers for t in (W, b)], 1)


def unpack(flat: torch.Tensor, arch, n: int) -> Weights:
    """One ``pack_chunks`` row -> ``n`` images' folded layers (views)."""
    out, off = [], 0
    for i, o in arch.shapes:
        out.append((flat[off:off + n * o * i].view(n, o, i), flat[off + n * o * i:off + n * o * (i + 1)].view(n, o, 1)))
        off += n * o * (i + 1)
    return out


class SirenDecoder:
    """``decoder(weights, theta)`` -> float32 ``[B, 3, size, size]`` in [0, 1]; ``theta [B, 2, 3]`` maps output
    coordinates to input ones (``pipelines.crops.crop_theta``; identity = the full image)."""

    def __init__(self, arch, size: int, device: torch.device | str, compile: bool = False, chunk: int | None = None,
                 fast_sine: bool = False, dtype: torch.dtype = torch.float32):
        self.arch, self.size, self.device, self.dtype = arch, size, torch.device(device), dtype
        self.chunk = cpu_chunk(arch, size) if chunk is None and self.device.type == "cpu" else chunk
        self.uv = output_grid(size, self.device)
        sin = fast_sin if fast_sine else torch.sin

        def core(flat: torch.Tensor, uv: torch.Tensor, n: int) -> torch.Tensor:
            return net(unpack(flat, arch, n), uv.to(flat.dtype), sin)[0].clamp(0.0, 1.0)

        self._core = torch.compile(core, dynamic=False) if compile else core

    @torch.no_grad()
    def __call__(self, weights: Weights, theta: torch.Tensor) -> torch.Tensor:
        n = weights[0][0].shape[0]
        step = self.chunk or n
        chunks = pack_chunks(fold_weights(weights, theta.to(self.device), self.arch, self.dtype), step)
        out = torch.cat([self._core(row, self.uv, step) for row in chunks])[:n]
        return out.float().view(n, 3, self.size, self.size)
