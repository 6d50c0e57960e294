"""Hand-written forward + backward of many SIRENs at once, for fitting (no autograd).

Internal layout ("theta"): layer ``l`` of all images is one tensor ``T [B, out, in + 1]``
= ``[W^T | b]`` (bias as the last column). Activations are channel-major ``[B, ch + 1, P]``
with a constant row of ones last, so each layer is *one* batched matmul with the bias
included and its weight-and-bias gradient is one batched matmul too. The first layer's
input (coordinates + ones, ``[3, P]``) is shared by all images: its forward is three broadcast
multiply-adds, its gradient one GEMM per image. Every GEMM is per image, of a shape that does not
depend on ``B``, so an image's numbers do not depend on the rows beside it (with MKL's strict
reproducibility mode, ``bench.cli``; docs/measurement.md). Per sine layer and iteration this is
3 matmuls + ``sin`` + ``cos`` (in place) + one multiply: about the least memory traffic
eager PyTorch allows. Buffers are allocated once per chunk and reused.

Maths are those of ``inr.siren.forward_train`` (``sin(w0 * (x W + b))``, output
``rgb = 0.5 * (x W + b) + 0.5``), and gradients are exact (tested against autograd).
"""

from __future__ import annotations

import torch

from inr.siren import SirenArch, Weights


def to_theta(weights: Weights) -> list[torch.Tensor]:
    """``[(W [B, in, out], b [B, 1, out])]`` -> ``[T [B, out, in + 1]]`` (new contiguous tensors)."""
    return [torch.cat([W.transpose(1, 2), b.transpose(1, 2)], dim=2).contiguous() for W, b in weights]


def from_theta(thetas: list[torch.Tensor]) -> Weights:
    """Inverse of ``to_theta`` (contiguous copies)."""
    return [(T[:, :, :-1].transpose(1, 2).contiguous(), T[:, :, -1:].transpose(1, 2).contiguous()) for T in thetas]


def mask_theta(masks: list[torch.Tensor | None], shapes: list[tuple[int, int]], B: int, device) -> list[torch.Tensor | None]:
    """Keep-masks ``[B, in, out]`` -> float ``[B, out, in + 1]`` (bias column always 1)."""
    out = []
    for m, (_, o) in zip(masks, shapes, strict=True):
        if m is None:
            out.append(None)
        else:
            mt = m.to(device, torch.float32).transpose(1, 2)
            out.append(torch.cat([mt, torch.ones(B, o, 1, device=device)], dim=2).contiguous())
    return out


def first_layer_input(coords: torch.Tensor) -> torch.Tensor:
    """Coordinates ``[P, 2]`` -> ``a0 [3, P]`` float32 (the coordinates and a row of ones, for the bias):
    the first layer's input, shared by every image (``SirenEngine.a0``; the compiled step's ``a0``)."""
    P = coords.shape[0]
    return torch.cat([coords.t().to(torch.float32), torch.ones(1, P, device=coords.device)], dim=0).contiguous()


class SirenEngine:
    """Forward (keeping what backward needs) and backward for ``B`` images at ``P`` shared points.

    ``mm_dtype``: optional lower precision (bf16) for the matmul inputs of layers 1..L and of
    their gradients; activations, sines and gradients stay float32. The first layer stays fp32
    in both directions: its input is the coordinates, and bf16 (8 bits of mantissa) steps near
    1.0 are 1/128, i.e. about one pixel at 224 px, times ``w0_first`` = 30 inside the sine.
    """

    def __init__(self, arch: SirenArch, coords: torch.Tensor, B: int, mm_dtype: torch.dtype | None = None,
                 backward: bool = True):
        """``backward=False``: forward only (``forward(..., need_grad=False)``, no ``backward``), with two
        activation buffers used in turn and one pre-activation buffer instead of both per layer, and no
        gradient buffers: ``L * (2h + 1) + 2h + 3`` floats per pixel and image become ``3h + 5``."""
        self.arch, self.B = arch, B
        dev = coords.device
        P = coords.shape[0]
        self.P = P
        self.a0 = first_layer_input(coords)  # [3, P]
        self.mm_dtype = mm_dtype
        self.has_backward = backward
        self.scale = [arch.omega(li) or 0.5 for li in range(arch.num_linear)]
        self.acts: list[torch.Tensor] = []  # [B, h + 1, P] per sine layer (two, in turn, forward only), last row ones
        self.cos: list[torch.Tensor] = []  # [B, h, P]: z, then cos(z) after forward (one z buffer, forward only)
        hidden = arch.shapes[:-1]
        for k, (_, o) in enumerate(hidden if backward else hidden[:2]):
            a = torch.empty(B, o + 1, P, device=dev)
            a[:, o].fill_(1.0)
            self.acts.append(a)
            if backward or k == 0:
                self.cos.append(torch.empty(B, o, P, device=dev))
        self.out = torch.empty(B, arch.out_features, P, device=dev)
        # two ping-pong buffers for the activation gradients (fresh large allocations cost page faults)
        self.gbuf = [torch.empty(B, arch.hidden, P, device=dev) for _ in range(2 if backward else 0)]
        self.scaled: list[torch.Tensor] = []
        self.x0 = self.a0  # the first layer's input of the last forward

    def _mm(self, a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        if self.mm_dtype is None:
            return torch.matmul(a, b, out=out) if out is not None else torch.matmul(a, b)
        r = torch.matmul(a.to(self.mm_dtype), b.to(self.mm_dtype)).float()
        if out is not None:
            out.copy_(r)
            return out
        return r

    def forward(self, thetas: list[torch.Tensor], need_grad: bool = True, a0: torch.Tensor | None = None) -> torch.Tensor:
        """``thetas`` (``[B, out, in + 1]`` per layer) -> RGB ``[B, 3, P]`` (a reused buffer).

        a0: the first layer's input for this pass, ``[B, 3, P]`` (each row its own ``P`` pixels: coordinates
        and ones, ``inr.subsample``) instead of the engine's shared ``[3, P]``; ``backward`` uses it too."""
        if need_grad and not self.has_backward:
            raise ValueError("this engine was built forward-only (backward=False): forward(..., need_grad=False)")
        L = self.arch.layers
        self.scaled = []
        x = self.x0 = self.a0 if a0 is None else a0
        for li in range(L):
            T = thetas[li] * self.scale[li]
            self.scaled.append(T)
            z = self.cos[li % len(self.cos)]
            if li == 0:
                # [B, h, 3] @ [3, P] with K = 3: three fused multiply-adds beat a tiny-K matmul;
                # always fp32 (the coordinates: see ``mm_dtype``)
                x0, x1 = (x[:, 0:1], x[:, 1:2]) if x.dim() == 3 else (x[0], x[1])  # [B, 1, P] or [P]
                torch.mul(T[:, :, 0:1], x0, out=z).addcmul_(T[:, :, 1:2], x1).add_(T[:, :, 2:3])
            else:
                self._mm(T, x, out=z)  # [B, h, in+1] @ [B, in+1, P] (first layer: @ [3, P], broadcast)
            a = self.acts[li % len(self.acts)]
            torch.sin(z, out=a[:, :-1])
            if need_grad:
                z.cos_()
            x = a
        T = thetas[L] * 0.5
        T[:, :, -1] += 0.5
        self.scaled.append(T)
        return self._mm(T, x, out=self.out)

    def backward(self, grad_out: torch.Tensor) -> list[torch.Tensor]:
        """d(loss)/d(thetas) from d(loss)/d(rgb) ``[B, 3, P]`` (consumed) of the last ``forward``."""
        if not self.has_backward:
            raise ValueError("this engine was built forward-only (backward=False)")
        L = self.arch.layers
        grads: list[torch.Tensor] = [None] * (L + 1)  # type: ignore[list-item]
        g = grad_out
        for li in range(L, -1, -1):
            x = self.x0 if li == 0 else self.acts[li - 1]
            # [B, out, in+1]; the first layer's gradient against the coordinates stays fp32, one GEMM per image
            # (a shared [3, P] input expanded, not folded into one [B * h, P] GEMM whose shape depends on B)
            xt = x.transpose(-1, -2)
            gT = torch.bmm(g, xt.expand(g.shape[0], -1, -1)) if li == 0 else self._mm(g, xt)
            gT.mul_(self.scale[li])
            grads[li] = gT
            if li > 0:
                T = self.scaled[li]
                ga = self._mm(T[:, :, :-1].transpose(1, 2).contiguous(), g, out=self.gbuf[li % 2])  # [B, in, P]
                ga.mul_(self.cos[li - 1])
                g = ga
        return grads
