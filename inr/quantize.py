"""Layer-wise affine quantization: each layer's ``M = [W; b]`` ``[in + 1, out]`` as codes ``q in [0, 2^bits - 1]``,
``lo + q * step`` with float16 ``lo`` (rounded down) and ``step`` (up) per image and layer, or per output column;
``|w - dequant(quant(w))| <= step / 2``. Pruned weights are not coded (decode to 0); ``bits == 32`` is float32.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from bench.errors import InputError
from inr.siren import SirenArch, Weights

FLOAT_BITS = 32
VALID_BITS = tuple(range(4, 17)) + (FLOAT_BITS,)


@dataclass(frozen=True)
class QuantConfig:
    """Bit width per linear layer (``len == arch.num_linear``) and the scale granularity."""

    bits: tuple[int, ...]
    per_channel: bool = False

    def __post_init__(self) -> None:
        bad = [b for b in self.bits if b not in VALID_BITS]
        if bad or not self.bits:
            raise ValueError(f"bit widths must be 4..16 or 32 (float), got {list(self.bits)}")

    @property
    def is_float(self) -> bool:
        return all(b == FLOAT_BITS for b in self.bits)

    def to_dict(self) -> dict:
        return {"bits": list(self.bits), "per_channel": self.per_channel}


def parse_bits(spec: str | int | Sequence[int], num_linear: int) -> tuple[int, ...]:
    """``"8"`` (all layers), ``"16:8:16"`` (first:hidden:last) or ``"16,8,8,8,8,16"`` (every layer)."""
    if isinstance(spec, int):
        vals = [spec] * num_linear
    elif isinstance(spec, str):
        s = spec.strip().lower()
        try:
            if s in ("fp32", "float", "32"):
                vals = [FLOAT_BITS] * num_linear
            elif ":" in s:
                f, h, last = (int(x) for x in s.split(":"))
                vals = [f] + [h] * (num_linear - 2) + [last]
            elif "," in s:
                vals = [int(x) for x in s.split(",")]
            else:
                vals = [int(s)] * num_linear
        except ValueError:
            raise InputError(f"--bits {spec!r}: expected N, FIRST:HIDDEN:LAST or a comma list of {num_linear} widths") from None
    else:
        vals = [int(x) for x in spec]
    if len(vals) != num_linear:
        raise InputError(f"--bits {spec!r}: {len(vals)} widths for {num_linear} layers")
    bad = [b for b in vals if b not in VALID_BITS]
    if bad:
        raise InputError(f"--bits {spec!r}: widths must be 4..16 or 32, got {bad}")
    return tuple(vals)


def layer_matrix(W: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``W [N, in, out]``, ``b [N, 1, out]`` -> ``M [N, in + 1, out]``."""
    return torch.cat([W, b], dim=1)


def keep_matrix(mask: torch.Tensor | None, shape: tuple[int, int, int], device=None) -> torch.Tensor:
    """Bool ``[N, in + 1, out]``: which entries of ``M`` are coded (mask rows + the bias row)."""
    n, r, o = shape
    if mask is None:
        return torch.ones(shape, dtype=torch.bool, device=device)
    return torch.cat([mask.bool().to(device), torch.ones(n, 1, o, dtype=torch.bool, device=device)], dim=1)


def _next_half(x: torch.Tensor, up: bool) -> torch.Tensor:
    """The float16 neighbour of float16 ``x`` towards +inf (``up``) or -inf, by bit arithmetic
    (same as ``torch.nextafter``, which not every device implements for half). No host copy: the
    smallest subnormal goes in as a Python scalar (``torch.tensor(..., device=cuda)`` would wait for its copy)."""
    i = x.contiguous().view(torch.int16)
    away = (x > 0) if up else (x < 0)  # moving away from zero: magnitude + 1 ulp
    step = torch.where(away, i + 1, i - 1)
    return torch.where(x == 0, 0x0001 if up else -0x7FFF, step).view(torch.float16)  # +-smallest subnormal


def scales(M: torch.Tensor, keep: torch.Tensor, bits: int, per_channel: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Float16 ``lo, step`` of shape ``[N, C]`` covering the kept entries of ``M [N, R, out]``."""
    big = torch.finfo(torch.float32).max
    lo = torch.where(keep, M, torch.full_like(M, big))
    hi = torch.where(keep, M, torch.full_like(M, -big))
    if per_channel:
        lo, hi = lo.amin(dim=1), hi.amax(dim=1)
    else:
        lo, hi = lo.flatten(1).amin(dim=1, keepdim=True), hi.flatten(1).amax(dim=1, keepdim=True)
    lo = torch.where(lo > hi, torch.zeros_like(lo), lo)  # a column with nothing kept
    hi = torch.maximum(hi, lo)
    levels = float(2**bits - 1)
    lo16 = lo.half()
    lo16 = torch.where(lo16.float() > lo, _next_half(lo16, up=False), lo16)
    step16 = ((hi - lo16.float()) / levels).half()
    return lo16, _widen(lo16, step16, hi, levels, stop_early=hi.device.type == "cpu")


def _widen(lo16: torch.Tensor, step16: torch.Tensor, hi: torch.Tensor, levels: float, stop_early: bool) -> torch.Tensor:
    """``step16`` raised by up to 4 float16 ulps until each grid ``lo16 + step16 * levels`` covers ``hi``.
    ``stop_early`` on CPU only: on a GPU reading ``short.any()`` is a host sync per layer and iteration."""
    for _ in range(4):
        short = lo16.float() + step16.float() * levels < hi
        if stop_early and not bool(short.any()):
            break
        step16 = torch.where(short, _next_half(step16, up=True), step16)
    return step16


def _bcast(s: torch.Tensor) -> torch.Tensor:
    """``[N, C]`` -> ``[N, 1, C]`` (broadcasts over the rows of ``M``)."""
    return s.float().unsqueeze(1)


def quantize_matrix(M: torch.Tensor, keep: torch.Tensor, lo: torch.Tensor, step: torch.Tensor, bits: int) -> torch.Tensor:
    """Integer codes int64 ``[N, R, out]`` in ``[0, 2^bits - 1]`` (0 where not kept)."""
    st = _bcast(step)
    safe = torch.where(st > 0, st, torch.ones_like(st))
    q = torch.round((M - _bcast(lo)) / safe).clamp_(0, 2**bits - 1)
    q = torch.where(st > 0, q, torch.zeros_like(q))
    return torch.where(keep, q, torch.zeros_like(q)).to(torch.int64)


def dequantize_matrix(q: torch.Tensor, keep: torch.Tensor | None, lo: torch.Tensor, step: torch.Tensor) -> torch.Tensor:
    """Float32 ``[N, R, out]`` = ``lo + q * step``, 0 where not kept."""
    M = torch.addcmul(_bcast(lo), q.float(), _bcast(step))
    return M if keep is None else M * keep


def float_codes(M: torch.Tensor) -> torch.Tensor:
    """Float32 values -> their bit patterns as non-negative int64 (the ``bits == 32`` 'codes')."""
    return M.float().contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF


def float_from_codes(q: torch.Tensor) -> torch.Tensor:
    return q.to(torch.int64).to(torch.int32).view(torch.float32)  # wraps to the same 32 bits


def fake_quantize(weights: Weights, cfg: QuantConfig, masks: Sequence[torch.Tensor | None] | None = None) -> Weights:
    """Straight-through fake quantization (forward: dequant(quant(w)); backward: identity)."""
    out = []
    for li, (W, b) in enumerate(weights):
        bits = cfg.bits[li]
        if bits == FLOAT_BITS:
            out.append((W, b))
            continue
        M = layer_matrix(W, b)
        with torch.no_grad():
            keep = keep_matrix(None if masks is None else masks[li], tuple(M.shape), M.device)
            lo, step = scales(M.detach(), keep, bits, cfg.per_channel)
            Mq = dequantize_matrix(quantize_matrix(M.detach(), keep, lo, step, bits), keep, lo, step)
        Ms = M + (Mq - M).detach()
        out.append((Ms[:, :-1], Ms[:, -1:]))
    return out


@dataclass
class QLayer:
    """One quantized layer for ``N`` images (CPU): codes int64 ``[N, in + 1, out]`` (float32 bits when
    ``bits == 32``), 0 where pruned; lo, step float16 ``[N, C]`` or None; mask bool ``[N, in, out]`` or None."""

    bits: int
    codes: torch.Tensor
    lo: torch.Tensor | None
    step: torch.Tensor | None
    mask: torch.Tensor | None

    def dequantize(self) -> tuple[torch.Tensor, torch.Tensor]:
        keep = None if self.mask is None else keep_matrix(self.mask, tuple(self.codes.shape), self.codes.device)
        if self.bits == FLOAT_BITS:
            M = float_from_codes(self.codes)
            M = M if keep is None else M * keep
        else:
            M = dequantize_matrix(self.codes, keep, self.lo, self.step)
        return M[:, :-1].contiguous(), M[:, -1:].contiguous()


def quantize(weights: Weights, cfg: QuantConfig, masks: Sequence[torch.Tensor | None] | None = None) -> list[QLayer]:
    """Quantize float weights ``[(W [N, in, out], b [N, 1, out])]`` -> one ``QLayer`` per layer."""
    out = []
    for li, (W, b) in enumerate(weights):
        M = layer_matrix(W.detach().float().cpu(), b.detach().float().cpu())
        mask = None if masks is None or masks[li] is None else masks[li].detach().cpu().bool()
        keep = keep_matrix(mask, tuple(M.shape))
        bits = cfg.bits[li]
        if bits == FLOAT_BITS:
            M = M * keep
            out.append(QLayer(bits, float_codes(M) * keep, None, None, mask))
        else:
            lo, step = scales(M, keep, bits, cfg.per_channel)
            out.append(QLayer(bits, quantize_matrix(M, keep, lo, step, bits), lo, step, mask))
    return out


def dequantize(layers: Sequence[QLayer]) -> Weights:
    return [ql.dequantize() for ql in layers]


def check_arch(layers: Sequence[QLayer], arch: SirenArch) -> None:
    for ql, (i, o) in zip(layers, arch.shapes, strict=True):
        if tuple(ql.codes.shape[1:]) != (i + 1, o):
            raise ValueError(f"layer codes {tuple(ql.codes.shape)} do not match arch layer {(i, o)}")
