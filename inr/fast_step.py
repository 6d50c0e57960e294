"""A compiled fit step: ``torch.compile`` of the forward, loss gradient, backward and PSNR of ``B`` SIRENs.

The same maths as ``inr.engine.SirenEngine`` (the eager reference), written as one pure function
so that inductor can fuse what the decoder (``pipelines.inr_decode``) fuses:

* channels-first activations ``[B, hidden, P]`` (the pixel axis is the GEMMs' long N);
* weights and biases kept apart (``T[:, :, :-1]`` / ``T[:, :, -1:]`` of the engine's theta layout),
  so bias + sine + cosine are one fused elementwise kernel per layer (no ones row to append);
* the polynomial sine of the decoder (``fast_sin``) in the forward *and* its cosine
  (``fast_sin(z + pi/2)``) for the backward, computed in the same pass;
* the first layer (2 inputs) as broadcast FMAs fused with the sine, its gradient one small
  product; the loss gradient and the keep-best PSNR fused into the output layer's epilogue.

Per chunk shape (``B``, ``P``, arch) the function is compiled once (``dynamic=False``); on the CPU
it is compiled with the thread count it will run under (inductor bakes the OpenMP team size in),
and with inductor's C++ wrapper (``cpp_wrapper``): the whole graph is then one C++ call that releases
the GIL, so the encoder's worker threads (one chunk each, ``inr.fit.optimize``) run their graphs at
the same time. With the default Python wrapper each generated kernel holds the GIL while it runs, and
the workers take turns (docs/encoding-cost.md, section 1).
"""

from __future__ import annotations

import math
import threading

import torch

from inr.siren import SirenArch, fast_sin

HALF_PI = 0.5 * math.pi
_LOCK = threading.Lock()
_CACHE: dict = {}


def _forward(thetas: list[torch.Tensor], a0: torch.Tensor, scales: tuple[float, ...], sin_fn, keep: bool):
    """The SIRENs' forward: thetas ``[B, out, in + 1]`` per layer, a0 ``[3, P]`` (coords + ones, shared by every
    row) or ``[B, 3, P]`` (each row its own pixels: ``inr.subsample``) -> rgb ``[B, 3, P]``, and when ``keep``
    what the backward needs: the sine and cosine of every sine layer ``[B, h, P]`` and the scaled weights."""
    L = len(thetas) - 1
    acts: list[torch.Tensor] = []
    coss: list[torch.Tensor] = []
    Ws: list[torch.Tensor] = []
    x0, x1 = (a0[:, 0:1], a0[:, 1:2]) if a0.dim() == 3 else (a0[0], a0[1])  # [B, 1, P] or [P]
    T0 = thetas[0] * scales[0]
    z = T0[:, :, 0:1] * x0 + T0[:, :, 1:2] * x1 + T0[:, :, 2:3]
    x = sin_fn(z)
    if keep:
        acts.append(x)
        coss.append(sin_fn(z + HALF_PI))
    for li in range(1, L):
        T = thetas[li] * scales[li]
        W, b = T[:, :, :-1], T[:, :, -1:]
        Ws.append(W)
        z = torch.bmm(W, x) + b
        x = sin_fn(z)
        if keep:
            acts.append(x)
            coss.append(sin_fn(z + HALF_PI))
    T = thetas[L]
    W, b = T[:, :, :-1] * 0.5, T[:, :, -1:] * 0.5 + 0.5
    Ws.append(W)
    return torch.bmm(W, x) + b, acts, coss, Ws


def _psnr8(rgb: torch.Tensor, t01: torch.Tensor) -> torch.Tensor:
    """PSNR ``[B]`` float32 of the 8-bit ``rgb [B, 3, P]`` against ``t01 [B, 3, P]`` (the ``bench.metrics`` convention)."""
    q = torch.round(rgb.clamp(0.0, 1.0) * 255.0) - t01 * 255.0
    mse = (q * q).flatten(1).mean(dim=1)
    return 10.0 * torch.log10(65025.0 / mse)


def _step(thetas: list[torch.Tensor], a0: torch.Tensor, t01: torch.Tensor, scales: tuple[float, ...],
          sin_fn) -> tuple[list[torch.Tensor], torch.Tensor]:
    """thetas ``[B, out, in + 1]`` per layer, a0 ``[3, P]`` (coords + ones) or ``[B, 3, P]`` (per row), t01
    ``[B, 3, P]`` targets in [0, 1].

    Returns (gradients of ``sum_b mean (rgb - t)^2`` w.r.t. thetas, PSNR ``[B]`` float32 of the 8-bit rgb).
    """
    L = len(thetas) - 1
    P = a0.shape[-1]
    rgb, acts, coss, Ws = _forward(thetas, a0, scales, sin_fn, keep=True)
    psnr = _psnr8(rgb, t01)
    g = (rgb - t01) * (2.0 / (3 * P))
    grads: list[torch.Tensor] = [None] * (L + 1)  # type: ignore[list-item]
    for li in range(L, 0, -1):
        xin = acts[li - 1]
        s = 0.5 if li == L else scales[li]
        gW = torch.bmm(g, xin.transpose(1, 2))
        gb = g.sum(dim=2, keepdim=True)
        grads[li] = torch.cat([gW, gb], dim=2) * s
        g = torch.bmm(Ws[li - 1].transpose(1, 2), g) * coss[li - 1]
    gW = torch.matmul(g, a0.transpose(-1, -2))  # [B, h, 3]: coordinates and the ones row (bias) at once
    grads[0] = gW * scales[0]
    return grads, psnr


ADAM_BETAS = (0.9, 0.999)
ADAM_EPS = 1e-8


def _iteration(thetas, m, v, best, best_p, a0, t01, step_size, sqrt_bc2, scales, sin_fn) -> None:
    """One whole fit iteration in place: step (``_step``), keep-best of the weights it measured, then
    Adam (``_adam``). ``step_size`` (``lr / bc1``) and ``sqrt_bc2`` are 0-d tensors (no recompilation per
    iteration), or ``[B, 1, 1]`` with one value per row (``inr.early_stop``: every image at its own iteration)."""
    grads, psnr = _step(thetas, a0, t01, scales, sin_fn)
    _keep_best(thetas, best, best_p, psnr)
    _adam(thetas, grads, m, v, step_size, sqrt_bc2)


def schedule(it: torch.Tensor, sched: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row at its iteration ``it`` (float64 ``[B]``, whole numbers): ``lr_t / bc1`` and ``sqrt(bc2)`` as float32
    ``[B, 1, 1]``, the cosine schedule and ``torch.optim.Adam``'s bias corrections; ``sched``: float64 ``[3]``
    = (peak lr, final lr, schedule length). Tensor maths only: eager (``inr.early_stop``) or inside a graph."""
    b1, b2 = ADAM_BETAS
    lr, lr_min, n = sched[0], sched[1], sched[2]
    lr_t = lr_min + 0.5 * (lr - lr_min) * (1.0 + torch.cos(it * (math.pi / n)))
    step = lr_t / (1.0 - torch.pow(b1, it + 1.0))
    bc2 = torch.sqrt(1.0 - torch.pow(b2, it + 1.0))
    return step.float().view(-1, 1, 1), bc2.float().view(-1, 1, 1)


def _queue_iteration(thetas, m, v, best, best_p, a0, t01, it, sched, scales, sin_fn) -> None:
    """``_iteration`` with every row at its own iteration ``it [B]`` (``inr.early_stop``), the schedule's factors
    computed in the graph (``schedule``): no eager ops per pass."""
    _iteration(thetas, m, v, best, best_p, a0, t01, *schedule(it, sched), scales, sin_fn)


def _keep_best(thetas, best, best_p, psnr, rows: torch.Tensor | None = None) -> None:
    """Rows whose ``psnr [B]`` beats ``best_p [B]`` (float64) keep ``thetas`` in ``best`` (only ``rows``, bool
    ``[B]``, when given)."""
    better = psnr.double() > best_p
    if rows is not None:
        better = better & rows
    best_p.copy_(torch.where(better, psnr.double(), best_p))
    for T, bt in zip(thetas, best, strict=True):
        bt.copy_(torch.where(better.view(-1, 1, 1), T, bt))


def _adam(thetas, grads, m, v, step_size, sqrt_bc2) -> None:
    """``torch.optim.Adam``'s update in place: ``T -= lr / bc1 * m / (sqrt(v) / sqrt(bc2) + eps)``."""
    b1, b2 = ADAM_BETAS
    for T, g, mi, vi in zip(thetas, grads, m, v, strict=True):
        mi.mul_(b1).add_(g, alpha=1.0 - b1)
        vi.mul_(b2).addcmul_(g, g, value=1.0 - b2)
        T.sub_(step_size * mi / (vi.sqrt() / sqrt_bc2 + ADAM_EPS))


def _sub_iteration(thetas, m, v, a0, t01, order, it, maps_a, maps_b, sched, per_step, scales, sin_fn) -> None:
    """A fit iteration on a subset of each row's pixels (``inr.subsample``), in place: gather the ``per_step``
    pixels of each row's next window (order ``[B, P]``, it float64 ``[B]``: its iterations run), step on them,
    Adam at each row's point of the schedule (``schedule``). No keep-best: a subset's PSNR is not the image's
    (``_check`` measures all pixels)."""
    from inr import subsample

    a0s, t01s = subsample.gather(a0, t01, subsample.window(order, it, per_step, maps_a, maps_b))
    grads, _ = _step(thetas, a0s, t01s, scales, sin_fn)
    _adam(thetas, grads, m, v, *schedule(it, sched))


def _check(thetas, best, best_p, a0, t01, rows, scales, sin_fn) -> None:
    """Keep-best on every pixel: a forward-only pass of ``thetas`` (a0 ``[3, P]``, t01 ``[B, 3, P]``), its PSNR
    against ``best_p``; of ``rows`` (bool ``[B]``), those that improve keep ``thetas`` in ``best``."""
    rgb, *_ = _forward(thetas, a0, scales, sin_fn, keep=False)
    _keep_best(thetas, best, best_p, _psnr8(rgb, t01), rows)


def _sine_setup(arch: SirenArch, fast_sine: bool):
    """Per-layer scales and the sine used by ``_step``/``_iteration`` (shared by every variant)."""
    scales = tuple(float(arch.omega(li) or 0.5) for li in range(arch.num_linear))
    return scales, (fast_sin if fast_sine else torch.sin)


def _compiled(kind: str, arch: SirenArch, B: int, P: int, device, threads: int, fast_sine: bool, make):
    """``torch.compile(make(scales, sin_fn))`` once per kind, chunk shape, device and CPU thread count (cached)."""
    key = (kind, arch, B, P, str(device), fast_sine, threads if torch.device(device).type == "cpu" else 0)
    with _LOCK:
        fn = _CACHE.get(key)
        if fn is None:
            _raise_recompile_limit()
            options = {"cpp_wrapper": True} if torch.device(device).type == "cpu" else {}  # GIL released: see above
            fn = torch.compile(make(*_sine_setup(arch, fast_sine)), dynamic=False, fullgraph=True, options=options)
            _CACHE[key] = fn
    return fn


def compiled_iteration(arch: SirenArch, B: int, P: int, device: torch.device, threads: int, fast_sine: bool = True):
    """The compiled ``_iteration`` for one chunk shape and thread count (cached)."""

    def make(scales, sin_fn):
        def it(thetas, m, v, best, best_p, a0, t01, step_size, sqrt_bc2):
            _iteration(thetas, m, v, best, best_p, a0, t01, step_size, sqrt_bc2, scales, sin_fn)

        return it

    return _compiled("iteration", arch, B, P, device, threads, fast_sine, make)


def compiled_sub_iteration(arch: SirenArch, B: int, P: int, per_step: int, device: torch.device, threads: int,
                           fast_sine: bool = True):
    """The compiled ``_sub_iteration`` (``per_step`` of ``P`` pixels a step) for one chunk shape (cached)."""

    def make(scales, sin_fn):
        def it(thetas, m, v, a0, t01, order, its, maps_a, maps_b, sched):
            _sub_iteration(thetas, m, v, a0, t01, order, its, maps_a, maps_b, sched, per_step, scales, sin_fn)

        return it

    return _compiled(f"sub-iteration-{per_step}", arch, B, P, device, threads, fast_sine, make)


def compiled_queue_iteration(arch: SirenArch, B: int, P: int, device: torch.device, threads: int,
                             fast_sine: bool = True):
    """The compiled ``_queue_iteration`` (every row at its own iteration) for one chunk shape (cached)."""

    def make(scales, sin_fn):
        def it(thetas, m, v, best, best_p, a0, t01, its, sched):
            _queue_iteration(thetas, m, v, best, best_p, a0, t01, its, sched, scales, sin_fn)

        return it

    return _compiled("queue-iteration", arch, B, P, device, threads, fast_sine, make)


def compiled_check(arch: SirenArch, B: int, P: int, device: torch.device, threads: int, fast_sine: bool = True):
    """The compiled ``_check`` (all-pixel keep-best) for one chunk shape (cached)."""

    def make(scales, sin_fn):
        def check(thetas, best, best_p, a0, t01, rows):
            _check(thetas, best, best_p, a0, t01, rows, scales, sin_fn)

        return check

    return _compiled("check", arch, B, P, device, threads, fast_sine, make)


def _raise_recompile_limit() -> None:
    from torch import _dynamo

    cfg = _dynamo.config
    limit = "recompile_limit" if hasattr(cfg, "recompile_limit") else "cache_size_limit"
    setattr(cfg, limit, max(getattr(cfg, limit), 64))  # one graph per chunk shape, never a silent eager fallback


def compiled_step(arch: SirenArch, B: int, P: int, device: torch.device, threads: int, fast_sine: bool = True):
    """The compiled step for one chunk shape run with ``threads`` CPU threads (cached; compiled on first call)."""

    def make(scales, sin_fn):
        def step(thetas, a0, t01):
            return _step(thetas, a0, t01, scales, sin_fn)

        return step

    return _compiled("step", arch, B, P, device, threads, fast_sine, make)


def eager_step(arch: SirenArch, fast_sine: bool = False):
    """The uncompiled twin of ``compiled_step`` (for tests and for measuring what compilation buys)."""
    scales, sin_fn = _sine_setup(arch, fast_sine)
    return lambda thetas, a0, t01: _step(thetas, a0, t01, scales, sin_fn)


def warm(arch: SirenArch, shapes: list[tuple[int, int]], device: torch.device, threads: int, fused: bool = False,
         per_row: bool = False, per_step: int = 0) -> None:
    """Compile the step for each ``(B, P)`` before worker threads use it (compilation is not thread-parallel).
    ``per_row``: the fused iteration as ``inr.early_stop`` calls it, every row at its own iteration
    (``compiled_queue_iteration``). ``per_step``: the subsampled iteration on that many pixels (per row) and the
    all-pixel check instead (``inr.subsample``)."""
    from inr.subsample import MAPS

    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with torch.no_grad():
            for B, P in sorted(set(shapes)):
                thetas = [torch.zeros(B, o, i + 1, device=device) for i, o in arch.shapes]
                a0 = torch.ones(3, P, device=device)
                t01 = torch.zeros(B, 3, P, device=device)
                zeros = [[torch.zeros_like(T) for T in thetas] for _ in range(3)]
                best_p = torch.zeros(B, dtype=torch.float64, device=device)
                its = torch.zeros(B, dtype=torch.float64, device=device)
                sched = torch.full((3,), 100.0, dtype=torch.float64, device=device)  # (a fill: no host copy)
                if per_step:  # the subsampled loop (always per row) and its all-pixel check
                    maps = torch.ones(MAPS, dtype=torch.int64, device=device)
                    order = torch.arange(P, device=device).expand(B, P).contiguous()
                    compiled_sub_iteration(arch, B, P, per_step, device, threads)(
                        thetas, zeros[0], zeros[1], a0, t01, order, its, maps, maps.clone(), sched)
                    compiled_check(arch, B, P, device, threads)(thetas, zeros[2], best_p, a0, t01,
                                                                torch.ones(B, dtype=torch.bool, device=device))
                elif fused and per_row:
                    compiled_queue_iteration(arch, B, P, device, threads)(thetas, *zeros, best_p, a0, t01, its, sched)
                elif fused:
                    compiled_iteration(arch, B, P, device, threads)(
                        thetas, *zeros, best_p, a0, t01, *(torch.full((), x, device=device) for x in (1e-3, 1.0)))
                else:
                    compiled_step(arch, B, P, device, threads)(thetas, a0, t01)
    finally:
        torch.set_num_threads(old)
