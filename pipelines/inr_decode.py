"""Fast batched SIREN decode at per-image affine-mapped sampling grids (the ``inr`` adapter's kernel).

Same function as ``inr.siren.forward`` at coordinates ``theta @ (u, v, 1)``, computed faster:

* the crop/flip affine map is folded into the *first layer's weights*
  (``W1' = A^T W1``, ``b1' = b1 + t^T W1``), so every image is evaluated on the one shared
  output grid ``(u, v)`` and augmentation costs nothing per pixel;
* ``w0`` is folded into the weights and the ``rgb = 0.5 * out + 0.5`` map into the output
  layer once per batch;
* a channels-first layout: activations ``[B, hidden, P]`` so each layer is a ``bmm``
  with the long pixel axis as the GEMM's N (``[B, out, in] x [B, in, P]``), and the output
  is already ``[B, 3, H, W]``; the first layer (2 inputs) is two broadcast FMAs instead of a GEMM;
* on the CPU images go through in chunks (``cpu_chunk``: ~512 KiB of activations) so they stay in L2; each chunk's
  folded weights are one contiguous row (few guards, contiguous GEMM operands);
  ``compile=True`` fuses bias + sine (+ clamp) into one elementwise kernel per layer with
  ``torch.compile`` (chunks are zero-padded to one fixed shape, so it compiles once).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from inr.siren import fast_sin

Weights = list[tuple[torch.Tensor, torch.Tensor]]


def layer_shapes(arch) -> list[tuple[int, int]]:
    """``(out, in)`` of each linear layer, in the transposed orientation the decoder uses."""
    return [(o, i) for i, o in arch.shapes]


def unpack(flat: torch.Tensor, shapes: list[tuple[int, int]], n: int) -> Weights:
    """One chunk ``flat [F]`` (per layer: ``W^T [n,out,in]`` then ``b^T [n,out,1]``, each contiguous)
    -> ``[(W^T, b^T)]`` views."""
    out, off = [], 0
    for o, i in shapes:
        W = flat[off : off + n * o * i].view(n, o, i)
        off += n * o * i
        b = flat[off : off + n * o].view(n, o, 1)
        off += n * o
        out.append((W, b))
    return out


def pack_chunks(layers: Weights, chunk: int) -> torch.Tensor:
    """Folded ``[(W^T [B,out,in], b^T [B,out,1])]`` -> ``[ceil(B/chunk), F]``: one contiguous row per
    chunk of images (zero-padded to whole chunks), so a chunk is one tensor for the compiled core."""
    n = layers[0][0].shape[0]
    m = -(-n // chunk)
    pad = m * chunk - n
    rows = []
    for W, b in layers:
        for t in (W, b):
            t = F.pad(t, (0, 0, 0, 0, 0, pad)) if pad else t
            rows.append(t.reshape(m, -1))
    return torch.cat(rows, dim=1)


def _net(flat: torch.Tensor, uv: torch.Tensor, shapes: list[tuple[int, int]], n: int,
         sin: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """flat: one chunk of ``n`` images' folded weights (``pack_chunks``); uv: ``[2, P]`` shared grid.
    Returns clamped rgb ``[n, 3, P]``. ``bmm``, then bias + sine as one elementwise pass
    (``torch.compile`` fuses it into a single kernel per layer).
    """
    layers = unpack(flat, shapes, n)
    uv = uv.to(flat.dtype)
    W, b = layers[0]  # in = 2: two broadcast FMAs, fused with the sine (no K=2 GEMM)
    x = sin(W[:, :, 0:1] * uv[0] + W[:, :, 1:2] * uv[1] + b)
    last = len(layers) - 1
    for li, (W, b) in enumerate(layers[1:], start=1):
        x = torch.bmm(W, x) + b
        if li < last:
            x = sin(x)
    return x.clamp(0.0, 1.0)


def _net_eager(flat: torch.Tensor, uv: torch.Tensor, shapes: list[tuple[int, int]], n: int) -> torch.Tensor:
    """The same as ``_net`` with in-place sines (eager mode: fewer passes over memory)."""
    layers = unpack(flat, shapes, n)
    x = uv.to(flat.dtype).unsqueeze(0).expand(n, -1, -1)
    last = len(layers) - 1
    for li, (W, b) in enumerate(layers):
        x = torch.baddbmm(b, W, x)
        if li < last:
            x.sin_()
    return x.clamp_(0.0, 1.0)


def output_grid(size: int, device: torch.device | str | None = None) -> torch.Tensor:
    """float32 ``[2, size*size]``: ``(u, v)`` pixel centres of the output, row-major."""
    t = (torch.arange(size, device=device, dtype=torch.float64) * 2 + 1) / size - 1
    v, u = torch.meshgrid(t, t, indexing="ij")
    return torch.stack([u.reshape(-1), v.reshape(-1)]).float()


def fold_weights(weights: Weights, theta: torch.Tensor, arch, dtype: torch.dtype = torch.float32) -> Weights:
    """Per-layer ``(W [B,in,out], b [B,1,out])`` + ``theta [B,2,3]`` -> ``[(W^T [B,out,in], b^T [B,out,1])]``.

    Layer 0 absorbs the affine coordinate map and ``w0_first``; sine layers absorb ``w0``; the output
    layer absorbs ``rgb = 0.5 * out + 0.5``.
    """
    W1, b1 = weights[0]
    A, t = theta[:, :, :2].to(W1.dtype), theta[:, :, 2:].to(W1.dtype)  # [B,2,2], [B,2,1]
    W1f = torch.bmm(A.transpose(1, 2), W1)  # (x, y) = A (u, v) + t  =>  z = (u, v) A^T W1 + t^T W1 + b1
    b1f = b1 + torch.bmm(t.transpose(1, 2), W1)
    out: Weights = []
    for li, (W, b) in enumerate([(W1f, b1f), *weights[1:]]):
        w0 = arch.omega(li)
        scale, shift = (0.5, 0.5) if w0 is None else (w0, 0.0)
        out.append(((W.transpose(1, 2) * scale).to(dtype), (b.transpose(1, 2) * scale + shift).to(dtype)))
    return out


CPU_ACTIVATION_BYTES = 1 << 19  # one chunk's [n, hidden, P] fp32 activations: ~512 KiB, inside L2


def cpu_chunk(arch, size: int) -> int:
    """Images per chunk on the CPU so a layer's activations stay in L2 (8 for 5x13 at 32x32)."""
    return max(1, CPU_ACTIVATION_BYTES // (arch.hidden * size * size * 4))


class SirenDecoder:
    """Decode ``B`` images at output ``size`` x ``size`` through per-image affine maps ``theta``.

    ``decoder(weights, theta)`` -> float32 ``[B, 3, size, size]`` in [0, 1]; ``theta`` maps output
    normalized coordinates to input ones (``pipelines.crops.crop_theta``; identity = full image).
    """

    def __init__(
        self,
        arch,
        size: int,
        device: torch.device | str,
        compile: bool = False,
        chunk: int | None = None,
        fast_sine: bool = False,
        dtype: torch.dtype = torch.float32,
    ):
        self.arch = arch
        self.size = size
        self.device = torch.device(device)
        self.dtype = dtype
        if chunk is None and self.device.type == "cpu":
            chunk = cpu_chunk(arch, size)
        self.chunk = chunk
        self.uv = output_grid(size, self.device)
        shapes = layer_shapes(arch)
        if compile:
            sin = fast_sin if fast_sine else torch.sin
            self._core = torch.compile(lambda w, uv, n: _net(w, uv, shapes, n, sin), dynamic=False)
        elif fast_sine:
            self._core = lambda w, uv, n: _net(w, uv, shapes, n, fast_sin)
        else:
            self._core = lambda w, uv, n: _net_eager(w, uv, shapes, n)

    @torch.no_grad()
    def __call__(self, weights: Weights, theta: torch.Tensor) -> torch.Tensor:
        n = weights[0][0].shape[0]
        step = self.chunk or n
        chunks = pack_chunks(fold_weights(weights, theta.to(self.device), self.arch, self.dtype), step)
        out = torch.cat([self._core(row, self.uv, step) for row in chunks])[:n]
        return out.float().view(n, 3, self.size, self.size)
