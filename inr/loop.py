"""The fit loop: Adam on ``B`` SIRENs at once, one image per row, eager or compiled step; each row has its
own iteration count, so its numbers do not depend on its chunk-mates (docs/inr-codec.md, "The SIREN and the fit loop")."""

from __future__ import annotations

import contextlib
import ctypes
import functools
import math
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace

import numpy as np
import torch

from inr import subsample
from inr.siren import (
    SirenArch,
    fast_sin,
    first_layer_input,
    fold_theta,
    from_theta,
    net,
    psnr8,
    to_theta,
)

STOP_CHECK_EVERY = 25
BUCKET_HALVINGS = 3  # a compiled chunk drains to 1/8 at most: four graphs per chunk shape
ADAM_BETAS = (0.9, 0.999)
ADAM_EPS = 1e-8


def _bf16(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.bmm(a.bfloat16(), b.bfloat16()).float()


AUTOCAST = {"none": None, "bf16": _bf16}  # the matmul of layers 1..L (the first layer, on coordinates, stays fp32)
STEPS = ("eager", "compiled")
_LOCK = threading.Lock()
_CACHE: dict = {}


@dataclass(frozen=True)
class Loop:
    """How to fit. lr: peak, cosine-annealed to ``lr * lr_final_factor`` over ``iterations`` (1: constant).
    eval_every: keep-best every this many of a row's iterations (0: 1 in fp32, 10 under bf16); per_step: pixels a
    step sees (0: all; ``inr.subsample``, chosen by ``seed`` and the image id); keep_last: return the weights after
    the last step instead of the best (Reptile); history: record each image's best PSNR after every iteration."""

    iterations: int
    lr: float
    lr_final_factor: float = 0.0
    step: str = "eager"
    autocast: str = "none"
    eval_every: int = 0
    per_step: int = 0
    chunk: int = 1
    workers: int = 1
    threads: int = 0
    seed: int = 0
    keep_last: bool = False
    history: bool = False

    def __post_init__(self) -> None:
        if self.step not in STEPS or self.autocast not in AUTOCAST:
            raise ValueError(f"step must be one of {list(STEPS)} and autocast one of {sorted(AUTOCAST)}")
        if self.step == "compiled" and (self.autocast != "none" or self.interval > 1 or self.history):
            raise ValueError("the compiled fit step is fp32 only (autocast none), keep-best every iteration")

    @property
    def interval(self) -> int:
        return self.eval_every or (1 if self.autocast == "none" else 10)


def bucket_sizes(B: int) -> list[int]:
    """Chunk sizes the compiled step drains through: ``B`` and up to ``BUCKET_HALVINGS`` halvings."""
    out = [B]
    while out[-1] > 1 and len(out) <= BUCKET_HALVINGS:
        out.append((out[-1] + 1) // 2)
    return out


def schedule(it: torch.Tensor, sched: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows at iterations ``it`` (float64 ``[B]``); ``sched`` float64 ``[3]`` (peak lr, final lr, length) ->
    ``lr_t / bc1`` and ``sqrt(bc2)`` float32 ``[B, 1, 1]`` (cosine schedule, ``torch.optim.Adam``'s corrections)."""
    b1, b2 = ADAM_BETAS
    lr_t = sched[1] + 0.5 * (sched[0] - sched[1]) * (1.0 + torch.cos(it * (math.pi / sched[2])))
    step = lr_t / (1.0 - torch.pow(b1, it + 1.0))
    return step.float().view(-1, 1, 1), torch.sqrt(1.0 - torch.pow(b2, it + 1.0)).float().view(-1, 1, 1)


def _step(thetas, a0, t01, scales, sin=torch.sin, mm=None):
    """Gradients of ``sum_b mean (rgb - t)^2`` w.r.t. thetas ``[B, out, in + 1]`` and PSNR ``[B]`` (float32), for a0
    ``[3, P]`` (coordinates and ones) or ``[B, 3, P]`` and t01 ``[B, 3, P]``. Every GEMM is per image."""
    layers = fold_theta(thetas, scales)
    rgb, acts, coss = net(layers, a0, sin, keep=True, mm=mm)
    bmm = mm or torch.bmm
    psnr = psnr8(rgb, t01)
    g = rgb.sub_(t01).mul_(2.0 / (3 * a0.shape[-1]))
    grads = [None] * len(thetas)
    for li in range(len(thetas) - 1, 0, -1):
        gW = bmm(g, acts[li - 1].transpose(1, 2))
        grads[li] = torch.cat([gW, g.sum(dim=2, keepdim=True)], dim=2).mul_(scales[li])
        g = bmm(layers[li][0].transpose(1, 2), g).mul_(coss[li - 1])
    grads[0] = torch.bmm(g, a0.transpose(-1, -2).expand(g.shape[0], -1, -1)).mul_(scales[0])
    return grads, psnr


def _keep_best(thetas, best, best_p, psnr, rows=None) -> None:
    """Rows (of bool ``rows``, or all) whose ``psnr`` beats ``best_p`` (float64 ``[B]``) keep ``thetas`` in ``best``."""
    better = psnr.double() > best_p
    if rows is not None:
        better = better & rows
    best_p.copy_(torch.where(better, psnr.double(), best_p))
    for T, bt in zip(thetas, best, strict=True):
        bt.copy_(torch.where(better.view(-1, 1, 1), T, bt))


def _pass(thetas, m, v, best, best_p, it, a0, t01, sched, rows, order, maps, mts, scales, sin, mm, per_step, keep,
          transform=None):
    """One pass in place: the step (on each row's ``per_step`` pixels when set), keep-best of the weights it
    measured (``keep``: rows bool ``[B]`` or all), Adam at each row's iteration ``it``, ``it += 1``."""
    cur = thetas if transform is None else transform(thetas, mts)
    if per_step:
        a0, t01 = subsample.gather(a0, t01, subsample.window(order, it, per_step, *maps))
    grads, psnr = _step(cur, a0, t01, scales, sin, mm)
    if keep:
        _keep_best(thetas, best, best_p, psnr, rows)
    if mts is not None:
        grads = [g if mk is None else g * mk for g, mk in zip(grads, mts, strict=True)]
    step_size, sqrt_bc2 = schedule(it, sched)
    b1, b2 = ADAM_BETAS
    for T, g, mi, vi in zip(thetas, grads, m, v, strict=True):  # torch.optim.Adam's update
        mi.mul_(b1).add_(g, alpha=1.0 - b1)
        vi.mul_(b2).addcmul_(g, g, value=1.0 - b2)
        T.sub_(step_size * mi / (vi.sqrt() / sqrt_bc2 + ADAM_EPS))
    it.add_(1.0)


def _check(thetas, best, best_p, a0, t01, rows, scales, sin, transform=None, mts=None) -> None:
    """Keep-best of ``rows`` (bool ``[B]``) by an all-pixel fp32 forward."""
    cur = thetas if transform is None else transform(thetas, mts)
    _keep_best(thetas, best, best_p, psnr8(net(fold_theta(cur, scales), a0, sin)[0], t01), rows)


def _compiled(kind: str, arch: SirenArch, B: int, P: int, device, threads: int, per_step: int = 0):
    """``torch.compile`` of ``_pass`` or ``_check`` for one chunk shape, device and CPU thread count (cached). On the
    CPU with inductor's C++ wrapper: the graph is one call that releases the GIL, so workers run at once."""
    dev = torch.device(device)
    key = (kind, arch, B, P, str(dev), per_step, threads if dev.type == "cpu" else 0)
    with _LOCK:
        fn = _CACHE.get(key)
        if fn is None:
            from torch import _dynamo

            cfg = _dynamo.config
            limit = "recompile_limit" if hasattr(cfg, "recompile_limit") else "cache_size_limit"
            setattr(cfg, limit, max(getattr(cfg, limit), 64))  # one graph per shape, never a silent eager fallback
            s = arch.scales
            if kind == "pass":
                def f(thetas, m, v, best, best_p, it, a0, t01, sched, order, maps):
                    _pass(thetas, m, v, best, best_p, it, a0, t01, sched, None, order, maps, None, s, fast_sin, None,
                          per_step, not per_step)
            else:
                def f(thetas, best, best_p, a0, t01, rows):
                    _check(thetas, best, best_p, a0, t01, rows, s, fast_sin)
            options = {"cpp_wrapper": True} if dev.type == "cpu" else {}
            fn = _CACHE[key] = torch.compile(f, dynamic=False, fullgraph=True, options=options)
    return fn


class _Shared:
    """The images of one ``run`` (indexed by image): start thetas, uint8 targets ``[N, P, 3]``, stop targets, masks
    (theta layout), ids (pixel choice); results: kept thetas, iterations run, history. A thread-safe queue."""

    def __init__(self, thetas0, targets, stop_at, mts, ids, loop):
        n = targets.shape[0]
        self.thetas0, self.targets, self.stop_at, self.mts, self.ids = thetas0, targets, stop_at, mts, ids
        self.kept = [T.clone() for T in thetas0]
        self.ran = torch.zeros(n, dtype=torch.int64)
        self.hist = (torch.full((loop.iterations + 1, n), -math.inf, dtype=torch.float64, device=targets.device)
                     if loop.history else None)
        self.n, self.next, self.lock = n, 0, threading.Lock()

    def take(self, k: int) -> np.ndarray:
        with self.lock:
            a = self.next
            self.next = min(self.n, a + k)
            return np.arange(a, self.next, dtype=np.int64)


def _index(a: np.ndarray, dev: torch.device) -> torch.Tensor:
    """Host indices on ``dev`` (on CUDA through pinned memory, without a stream sync)."""
    t = torch.from_numpy(np.ascontiguousarray(a))
    return t.pin_memory().to(dev, non_blocking=True) if dev.type == "cuda" else t.to(dev)


def _worker(sh: _Shared, coords: torch.Tensor, arch: SirenArch, loop: Loop, transform, threads: int) -> None:
    """Fit images from ``sh``'s queue in a chunk of ``loop.chunk`` rows until none is left."""
    dev, P = sh.targets.device, sh.targets.shape[1]
    compiled = loop.step == "compiled"
    sub = 0 < loop.per_step < P
    per_step = loop.per_step if sub else 0
    measured = sub or loop.autocast != "none" or loop.keep_last  # keep-best by ``_check``, not the step's PSNR
    every = STOP_CHECK_EVERY if sub else loop.interval
    mm = AUTOCAST[loop.autocast]
    sin = fast_sin if compiled else torch.sin
    scales = arch.scales
    B = loop.chunk
    img = np.full(B, -1, dtype=np.int64)  # the image each row fits (-1: none)
    live = np.zeros(B, dtype=bool)
    it = np.zeros(B, dtype=np.int64)  # host copy of the rows' iterations (no sync to read it)
    it_dev = torch.zeros(B, dtype=torch.float64, device=dev)
    sched = _index(np.array([loop.lr, loop.lr * loop.lr_final_factor, loop.iterations], dtype=np.float64), dev)
    thetas = [torch.zeros(B, o, i + 1, device=dev) for i, o in arch.shapes]
    m, v, best = ([torch.zeros_like(T) for T in thetas] for _ in range(3))
    mts = None if sh.mts is None else [None if M is None else torch.ones_like(T) for M, T in zip(sh.mts, thetas, strict=True)]
    best_p = torch.full((B,), -math.inf, dtype=torch.float64, device=dev)
    t01 = torch.zeros(B, 3, P, device=dev)
    target = torch.full((B,), math.inf, dtype=torch.float64, device=dev)
    a0 = first_layer_input(coords.to(dev, torch.float32))
    maps = tuple(_index(x, dev) for x in subsample.cycle_maps(P, loop.seed)) if sub else ()
    order = torch.zeros(B, P, dtype=torch.int64, device=dev) if sub else None
    tf = None if transform is None else (lambda ts, mk: to_theta(transform(from_theta(ts), _wmasks(mk))))
    fn = chk = None

    def build(B: int) -> None:
        nonlocal fn, chk
        if compiled:
            fn = _compiled("pass", arch, B, P, dev, threads, per_step)
            chk = _compiled("check", arch, B, P, dev, threads) if sub else None

    build(B)

    def rows_mask(rows: np.ndarray) -> torch.Tensor:
        flags = np.zeros(len(img), dtype=bool)
        flags[rows] = True
        return _index(flags, dev)

    def measure(rows: np.ndarray) -> None:
        if not len(rows) or loop.keep_last:
            return
        if chk is not None:
            chk(thetas, best, best_p, a0, t01, rows_mask(rows))
        else:
            _check(thetas, best, best_p, a0, t01, rows_mask(rows), scales, sin, tf, mts)

    def record(rows: np.ndarray, ran: np.ndarray) -> None:
        r, k = _index(rows, dev), _index(img[rows], dev)
        with sh.lock:
            for K, T in zip(sh.kept, thetas if loop.keep_last else best, strict=True):
                K[k] = T[r]
            sh.ran[torch.from_numpy(img[rows])] = torch.from_numpy(ran)
        live[rows] = False
        img[rows] = -1

    def one_pass() -> np.ndarray:
        """A pass; returns the rows that have run the whole schedule (all pixels: their last pass only measures)."""
        full = np.nonzero(live & (it == loop.iterations))[0] if not measured else None
        keep = not measured and (every == 1 or bool(((it % every == 0) | (it == loop.iterations))[live].any()))
        rows = None if every == 1 or measured else rows_mask(np.nonzero((it % every == 0) | (it == loop.iterations))[0])
        if fn is not None:
            fn(thetas, m, v, best, best_p, it_dev, a0, t01, sched, order, maps)
        else:
            _pass(thetas, m, v, best, best_p, it_dev, a0, t01, sched, rows, order, maps, mts, scales, sin, mm,
                  per_step, keep, tf)
        if sh.hist is not None:
            lv = np.nonzero(live)[0]
            sh.hist[_index(it[lv], dev), _index(img[lv], dev)] = best_p[_index(lv, dev)]
        it[:] += 1
        if measured:
            full = np.nonzero(live & (it == loop.iterations))[0]
            due = live & ((it % every == 0) | (it == loop.iterations))
            measure(np.arange(len(img)) if np.array_equal(due, live) and due.any() else np.nonzero(due)[0])
        return full

    passes = 0
    with torch.no_grad():
        while True:
            if live.any():
                full = one_pass()
                passes += 1
                if len(full):
                    record(full, np.full(len(full), loop.iterations, dtype=np.int64))
                if passes % STOP_CHECK_EVERY and live.any():
                    continue
            # a check: every STOP_CHECK_EVERY passes, or at once when no row is fitting; images enter rows only here,
            # so every image is checked after 25, 50, ... of its own iterations
            passes = 0
            if sh.stop_at is not None:
                reached = np.nonzero(live & (best_p >= target).cpu().numpy())[0]  # the one host sync of a check
                if len(reached):
                    record(reached, it[reached].copy())
            free = np.nonzero(~live)[0]
            new = sh.take(len(free))
            if len(new):
                rows = free[: len(new)]
                r, k = _index(rows, dev), _index(new, dev)
                for T, T0, mi, vi, bt in zip(thetas, sh.thetas0, m, v, best, strict=True):
                    T[r] = T0[k]
                    bt[r] = T0[k]
                    mi.index_fill_(0, r, 0.0)
                    vi.index_fill_(0, r, 0.0)
                for mk, M in zip(mts or [], sh.mts or [], strict=True):
                    if M is not None:
                        mk[r] = M[k]
                best_p.index_fill_(0, r, -math.inf)
                t01[r] = sh.targets[k].permute(0, 2, 1).float() / 255.0
                if sh.stop_at is not None:
                    target[r] = sh.stop_at[k]
                if sub:
                    order[r] = subsample.orders(sh.ids[new], P, loop.seed, dev)
                img[rows], it[rows], live[rows] = new, 0, True
                it_dev.index_fill_(0, r, 0.0)
                if measured:  # the start weights are the first candidate
                    measure(rows)
            n_live = int(live.sum())
            if n_live == 0:
                return
            size = min((x for x in bucket_sizes(loop.chunk) if x >= n_live), default=B) if compiled else n_live
            if size != B:  # drain to a smaller chunk (padding rows repeat a live row and stay dead)
                keep_np = np.concatenate([np.nonzero(live)[0], np.repeat(np.nonzero(live)[0][:1], size - n_live)])
                keep = _index(keep_np, dev)
                thetas, m, v, best = ([T[keep].contiguous() for T in ts] for ts in (thetas, m, v, best))
                if mts is not None:
                    mts = [None if mk is None else mk[keep].contiguous() for mk in mts]
                best_p, t01, target, it_dev = (x[keep].contiguous() for x in (best_p, t01, target, it_dev))
                if sub:
                    order = order[keep].contiguous()
                img, it, live = img[keep_np], it[keep_np], live[keep_np]
                live[n_live:] = False
                img[n_live:] = -1
                B = size
                build(B)


def _wmasks(mts):
    """Theta-layout float masks -> bool ``[B, in, out]`` per layer (for a transform)."""
    return None if mts is None else [None if mk is None else mk[:, :, :-1].transpose(1, 2) > 0 for mk in mts]


def warm_sizes(loop: Loop, n: int, stops: bool, sub: bool) -> list[int]:
    """The chunk sizes a compiled run needs: every drain size with stops or subsampled steps, else the full chunk
    and the one that holds the queue's remainder."""
    sizes = bucket_sizes(loop.chunk)
    if stops or sub:
        return sizes
    need = {loop.chunk} if n >= loop.chunk else set()
    if n % loop.chunk:
        need.add(min(x for x in sizes if x >= n % loop.chunk))
    return sorted(need)


@functools.cache
def _keep_freed_memory() -> None:
    """The eager step allocates its activations afresh every pass: glibc would hand those megabytes back to the
    kernel and fault them in again each pass (as much system time as compute). Keep freed memory in the heap."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-1, 1 << 30)  # M_TRIM_THRESHOLD: return free heap top only beyond 1 GiB
        libc.mallopt(-3, 32 << 20)  # M_MMAP_THRESHOLD: blocks up to 32 MiB (glibc's most) from the heap


def run(thetas0: list[torch.Tensor], targets: torch.Tensor, coords: torch.Tensor, arch: SirenArch, loop: Loop,
        stop_at: torch.Tensor | None = None, masks=None, transform=None, ids: np.ndarray | None = None):
    """Fit thetas ``[N, out, in + 1]`` per layer to uint8 ``[N, P, 3]`` at ``coords`` ``[P, 2]``; stop_at float64
    ``[N]`` dB, masks bool ``[N, in, out]``, ids int64 ``[N]``. Returns (thetas, iterations int64 ``[N]``,
    history float64 ``[iterations + 1, N]`` or None)."""
    dev = targets.device
    n = targets.shape[0]
    if n == 0:
        return [T.clone() for T in thetas0], torch.zeros(0, dtype=torch.int64), None
    mts = None
    if masks is not None:
        mts = [None if mk is None else torch.cat([mk.to(dev).float().transpose(1, 2), torch.ones(n, o, 1, device=dev)], 2)
               for mk, (_, o) in zip(masks, arch.shapes, strict=True)]
        thetas0 = [T if mk is None else T * mk for T, mk in zip(thetas0, mts, strict=True)]
    chunk = max(1, min(loop.chunk, n))
    workers = max(1, min(loop.workers, -(-n // chunk))) if dev.type == "cpu" else 1
    threads = 1 if workers > 1 else (loop.threads or torch.get_num_threads())
    if loop.step == "compiled" and (masks is not None or transform is not None):
        raise ValueError("the compiled fit step runs the plain fit: no masks, no transform")
    loop = replace(loop, chunk=chunk)
    ids = np.arange(n, dtype=np.int64) if ids is None else np.asarray(ids, dtype=np.int64)
    stop = None if stop_at is None else torch.as_tensor(stop_at, dtype=torch.float64).to(dev)
    sh = _Shared([T.to(dev, torch.float32).contiguous() for T in thetas0], targets, stop, mts, ids, loop)
    if dev.type == "cpu" and loop.step == "eager":
        _keep_freed_memory()
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        if loop.step == "compiled":  # compile before the workers start (compilation is not thread-parallel)
            sub = 0 < loop.per_step < targets.shape[1]
            for size in warm_sizes(loop, n, stop is not None, sub):
                _warm(arch, size, targets.shape[1], dev, threads, loop.per_step if sub else 0, loop.seed)
        if workers == 1:
            _worker(sh, coords, arch, loop, transform, threads)
        else:
            with ThreadPoolExecutor(workers) as ex:
                for f in [ex.submit(_worker, sh, coords, arch, loop, transform, 1) for _ in range(workers)]:
                    f.result()
    finally:
        torch.set_num_threads(old)
    return sh.kept, sh.ran, sh.hist


def _warm(arch: SirenArch, B: int, P: int, dev, threads: int, per_step: int, seed: int) -> None:
    """Run each compiled graph of one chunk shape once on zeros (compiles it)."""
    with torch.no_grad():
        thetas = [torch.zeros(B, o, i + 1, device=dev) for i, o in arch.shapes]
        m, v, best = ([torch.zeros_like(T) for T in thetas] for _ in range(3))
        best_p = torch.zeros(B, dtype=torch.float64, device=dev)
        a0, t01 = torch.ones(3, P, device=dev), torch.zeros(B, 3, P, device=dev)
        sched = torch.full((3,), 100.0, dtype=torch.float64, device=dev)
        maps = tuple(_index(x, dev) for x in subsample.cycle_maps(P, seed)) if per_step else ()
        order = torch.arange(P, device=dev).expand(B, P).contiguous() if per_step else None
        _compiled("pass", arch, B, P, dev, threads, per_step)(
            thetas, m, v, best, best_p, torch.zeros(B, dtype=torch.float64, device=dev), a0, t01, sched, order, maps)
        if per_step:
            _compiled("check", arch, B, P, dev, threads)(thetas, best, best_p, a0, t01,
                                                         torch.ones(B, dtype=torch.bool, device=dev))
