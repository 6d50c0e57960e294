"""Early stop with continuous batching: fit a queue of images in chunks that stay full.

``inr.fit.optimize(..., stop_at=...)`` (``FitConfig.target_psnr``, ``inrbench encode --target-psnr``)
runs here. Each worker fits a chunk of ``chunk`` rows. An image leaves its row when its best PSNR so
far reaches its target, or when it has run the whole schedule; the next image of the queue then
takes the row, starting at its own iteration 0. Every row therefore has its own iteration count,
its own point on the cosine schedule and its own Adam bias correction: ``torch.optim.Adam``'s update
``T -= lr_t / bc1 * m / (sqrt(v) / sqrt(bc2) + eps)`` with per-row ``[B, 1, 1]`` factors.

Targets are checked every ``STOP_CHECK_EVERY`` passes (one host sync), and images enter rows only
at those passes, so each image is checked after exactly 25, 50, ... of its own iterations whichever
worker or row fits it: where an image stops does not depend on the others. An image that finishes
the schedule between checks keeps its weights at once and its row idles until the next check (at
most 24 passes: 0.5% of a 5,000-iteration schedule, 7% of a 300-iteration one), unless no row is
fitting any more: then the check comes at once (and the next ones count from it).

When the queue is empty the chunk drains: the eager step cuts its tensors to the rows still
fitting; the compiled step (``inr.fast_step.compiled_queue_iteration``) shrinks through
``bucket_sizes`` (one graph each, compiled before the fit), padding rows holding a size.

Subsampled steps (``FitConfig.pixel_fraction``, ``inr.subsample``) run in this loop too, with or without
targets: each pass, each row takes Adam's step on ``per_step`` of its image's pixels (chosen by the image
and its own iteration). Their loss is not the image's, so keep-best is an all-pixel forward pass
(``inr.fast_step.compiled_check`` or a forward-only engine) of the start weights, of every row at each
check, and of a row that has just run the whole schedule (that row only): an image is measured at the
same iterations whatever its chunk-mates do.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass

import numpy as np
import torch

from inr import subsample
from inr.engine import SirenEngine, first_layer_input
from inr.fast_step import compiled_check, compiled_queue_iteration, compiled_sub_iteration
from inr.siren import SirenArch, psnr_from_rgb

STOP_CHECK_EVERY = 25
BUCKET_HALVINGS = 3  # a compiled chunk drains to 1/8 at most: four graphs per chunk shape, all compiled up front
# (a GPU chunk holds thousands of images: one graph per halving down to 1 would cost minutes of compilation)


def bucket_sizes(B: int) -> list[int]:
    """Chunk sizes the compiled step drains through: ``B``, then up to ``BUCKET_HALVINGS`` halvings
    (each one compiled graph); below the last, finished rows ride along."""
    out = [B]
    while out[-1] > 1 and len(out) <= BUCKET_HALVINGS:
        out.append((out[-1] + 1) // 2)
    return out


class Queue:
    """Image indices ``0..n-1`` handed out in order to the workers (thread-safe)."""

    def __init__(self, n: int):
        self.n, self._next, self._lock = n, 0, threading.Lock()

    def take(self, k: int) -> list[int]:
        with self._lock:
            a = self._next
            self._next = min(self.n, a + max(k, 0))
            return list(range(a, self._next))


@dataclass
class Shared:
    """What the workers read (start weights, targets) and write (results), indexed by image.

    thetas0 / kept: per layer ``[N, out, in + 1]`` (``inr.engine`` layout) on the device; targets: uint8
    ``[N, P, 3]``; stop_at: float64 ``[N]`` (dB); ran: int64 ``[N]`` on the CPU (iterations run); ids: int64
    ``[N]`` on the CPU, each image's index in the whole encode, and seed: the fit's seed (together they choose
    the pixels of a subsampled step, ``inr.subsample``).
    """

    thetas0: list[torch.Tensor]
    targets: torch.Tensor
    stop_at: torch.Tensor
    kept: list[torch.Tensor]
    ran: torch.Tensor
    queue: Queue
    lock: threading.Lock
    ids: np.ndarray
    seed: int = 0

    @staticmethod
    def make(thetas0: list[torch.Tensor], targets: torch.Tensor, stop_at: torch.Tensor, ids: np.ndarray | None = None,
             seed: int = 0) -> Shared:
        n = targets.shape[0]
        ids = np.arange(n, dtype=np.int64) if ids is None else np.asarray(ids, dtype=np.int64)
        return Shared(thetas0, targets, stop_at.to(targets.device, torch.float64), [T.clone() for T in thetas0],
                      torch.zeros(n, dtype=torch.int64), Queue(n), threading.Lock(), ids, seed)


def _index(a: np.ndarray, dev: torch.device) -> torch.Tensor:
    """Host indices (int64 ``[k]``) as a tensor on ``dev``. On CUDA through pinned memory, asynchronously:
    ``torch.from_numpy(a).to(cuda)`` copies from pageable memory and waits for the copy (a stream sync)."""
    t = torch.from_numpy(a)
    return t.pin_memory().to(dev, non_blocking=True) if dev.type == "cuda" else t.to(dev)


def fit_queue(sh: Shared, coords: torch.Tensor, arch: SirenArch, iterations: int, lr: float, lr_min: float,
              chunk: int, step: str = "eager", threads: int = 1, per_step: int = 0) -> None:
    """One worker: fit images from ``sh.queue`` in a chunk of ``chunk`` rows until the queue is empty
    and every row is done; results go to ``sh.kept`` and ``sh.ran``.

    per_step: pixels each step sees (``inr.subsample``; 0 or ``P``: all). A subsampled step's loss is over its
    pixels only, so keep-best moves to an all-pixel forward pass at each check and when a row completes the
    schedule (each image's kept weights are the best of those passes); a row runs ``iterations`` steps, not
    ``iterations + 1`` (the all-pixel loop's last pass only measures)."""
    from inr.fast_step import _adam, _keep_best, schedule

    dev = sh.targets.device
    P = sh.targets.shape[1]
    img = np.array(sh.queue.take(chunk), dtype=np.int64)  # the image each row fits (-1: none)
    if not len(img):
        return
    B = len(img)
    live = np.ones(B, dtype=bool)
    it = np.zeros(B, dtype=np.int64)  # updates applied to each row's weights (host copy: no sync to read it)
    it_dev = torch.zeros(B, dtype=torch.float64, device=dev)  # the same, where the Adam factors are computed
    sched = _index(np.array([lr, lr_min, iterations], dtype=np.float64), dev)  # (peak lr, final lr, length): ``fast_step.schedule``
    ix = _index(img, dev)
    thetas = [T[ix].contiguous() for T in sh.thetas0]
    m = [torch.zeros_like(T) for T in thetas]
    v = [torch.zeros_like(T) for T in thetas]
    best = [T.clone() for T in thetas]
    best_p = torch.full((B,), -math.inf, dtype=torch.float64, device=dev)
    t255 = sh.targets[ix].permute(0, 2, 1).to(torch.float32).contiguous()  # [B, 3, P]
    t01 = t255 / 255.0
    target = sh.stop_at[ix].clone()
    coords = coords.to(dev, torch.float32)
    a0 = first_layer_input(coords)
    sizes = drain_sizes(B, step)
    sub = 0 < per_step < P
    order = maps = None
    if sub:
        maps = [_index(x, dev) for x in subsample.cycle_maps(P, sh.seed)]
        order = subsample.orders(sh.ids[img], P, sh.seed, dev)  # [B, P]; drawn on an accelerator
    fn = eng = chk = None

    def build(B: int) -> None:
        nonlocal fn, eng, chk
        if step == "compiled":  # no engine: the graph keeps its own activations (``inr.fit.fit_bytes_per_image``)

            if sub:
                fn = compiled_sub_iteration(arch, B, P, per_step, dev, threads)
                chk = compiled_check(arch, B, P, dev, threads)
            else:
                fn = compiled_queue_iteration(arch, B, P, dev, threads)
        elif sub:
            eng = SirenEngine(arch, coords[:per_step], B)  # buffers for the subset; each pass brings its pixels
            chk = SirenEngine(arch, coords, B, backward=False)
        else:
            eng = SirenEngine(arch, coords, B)

    build(B)
    passes = 0

    def record(rows: np.ndarray, ran: np.ndarray) -> None:
        r, k = _index(rows, dev), _index(img[rows], dev)
        with sh.lock:
            for K, T in zip(sh.kept, best, strict=True):
                K[k] = T[r]
            sh.ran[torch.from_numpy(img[rows])] = torch.from_numpy(ran)
        live[rows] = False
        img[rows] = -1

    def measure(rows: np.ndarray | None) -> None:
        """A subsampled fit's keep-best: an all-pixel forward pass of the weights as they are, kept by ``rows``
        (indices) or every row where they beat the best so far (only the rows due a measurement: an image's
        measurements do not depend on its chunk-mates)."""
        mask = torch.ones(len(img), dtype=torch.bool, device=dev)
        if rows is not None:
            flags = np.zeros(len(img), dtype=bool)
            flags[rows] = True
            mask = _index(flags, dev)
        if step == "compiled":
            chk(thetas, best, best_p, a0, t01, mask)
        else:
            _keep_best(thetas, best, best_p, psnr_from_rgb(chk.forward(thetas, need_grad=False), t255, exact=False),
                       mask)

    def pass_all() -> np.ndarray:
        """Every pixel: keep-best of the weights this pass measures, then Adam. Returns the rows whose measured
        weights had run the whole schedule (done: their update is discarded); a row runs ``iterations + 1``
        passes."""
        nonlocal passes
        if fn is not None:  # step, keep-best and Adam (at each row's point of the schedule) in one graph
            fn(thetas, m, v, best, best_p, a0, t01, it_dev, sched)
        else:
            step_size, sqrt_bc2 = schedule(it_dev, sched)
            rgb = eng.forward(thetas)
            _keep_best(thetas, best, best_p, psnr_from_rgb(rgb, t255, exact=False))
            _adam(thetas, eng.backward(rgb.sub_(t01).mul_(2.0 / (3 * P))), m, v, step_size, sqrt_bc2)
        passes += 1
        full = np.nonzero(live & (it == iterations))[0]
        it[:] += 1
        it_dev.add_(1.0)
        return full

    def pass_sub() -> np.ndarray:
        """``per_step`` pixels a row: Adam on them, then the all-pixel keep-best (``measure``) of the rows due
        one: every row at a check, a row that has just run the whole schedule. Fresh rows (the start, a refill)
        have their start weights measured first. Returns the rows that have run the whole schedule; a row runs
        ``iterations`` passes."""
        nonlocal passes, fresh
        if fresh is not None:
            measure(fresh)
            fresh = None
        if fn is not None:  # gather, step and Adam (at each row's point of the schedule) in one graph
            fn(thetas, m, v, a0, t01, order, it_dev, *maps, sched)
        else:
            step_size, sqrt_bc2 = schedule(it_dev, sched)
            a0s, t01s = subsample.gather(a0, t01, subsample.window(order, it_dev, per_step, *maps))
            rgb = eng.forward(thetas, a0=a0s)
            _adam(thetas, eng.backward(rgb.sub_(t01s).mul_(2.0 / (3 * per_step))), m, v, step_size, sqrt_bc2)
        passes += 1
        it[:] += 1
        it_dev.add_(1.0)
        full = np.nonzero(live & (it == iterations))[0]
        if not passes % STOP_CHECK_EVERY:
            measure(None)
        elif len(full):
            measure(full)
        return full

    fresh: np.ndarray | None = np.arange(B)  # rows whose start weights a subsampled pass measures first
    with torch.no_grad():
        while True:
            full = pass_sub() if sub else pass_all()
            if len(full):
                record(full, np.full(len(full), iterations, dtype=np.int64))
            if passes % STOP_CHECK_EVERY and live.any():
                continue
            # a check: every STOP_CHECK_EVERY passes, or at once when no row is fitting any more (every image
            # in the chunk ran the whole schedule). Counting passes from here keeps checks at multiples of the
            # interval of every image's own iterations: images enter rows only here, and none is left mid-way.
            passes = 0
            reached = np.nonzero(live & (best_p >= target).cpu().numpy())[0]  # the one host sync of a check
            if len(reached):
                record(reached, it[reached].copy())
            free = np.nonzero(~live)[0]
            new = np.array(sh.queue.take(len(free)), dtype=np.int64)
            if len(new):  # refill: the next images start at their iteration 0
                # (constants by index_fill_: ``x[r] = 0.0`` copies the 0-d value to the device and waits for it)
                rows = free[: len(new)]
                r, k = _index(rows, dev), _index(new, dev)
                for T, T0, mi, vi, bt in zip(thetas, sh.thetas0, m, v, best, strict=True):
                    T[r] = T0[k]
                    bt[r] = T0[k]
                    mi.index_fill_(0, r, 0.0)
                    vi.index_fill_(0, r, 0.0)
                best_p.index_fill_(0, r, -math.inf)
                t255[r] = sh.targets[k].permute(0, 2, 1).to(torch.float32)
                t01[r] = t255[r] / 255.0
                target[r] = sh.stop_at[k]
                if sub:
                    order[r] = subsample.orders(sh.ids[new], P, sh.seed, dev)
                    fresh = rows
                img[rows], it[rows], live[rows] = new, 0, True
                it_dev.index_fill_(0, r, 0.0)
            n_live = int(live.sum())
            if n_live == 0:
                return
            size = min((x for x in sizes if x >= n_live), default=sizes[-1]) if fn is not None else n_live
            if size >= B:
                continue
            # the queue is empty: drain on a smaller chunk (padding rows repeat a live row and stay dead)
            keep_np = np.concatenate([np.nonzero(live)[0], np.repeat(np.nonzero(live)[0][:1], size - n_live)])
            keep = _index(keep_np, dev)
            thetas, m, v, best = ([T[keep].contiguous() for T in ts] for ts in (thetas, m, v, best))
            best_p, t255, t01, target, it_dev = (x[keep].contiguous() for x in (best_p, t255, t01, target, it_dev))
            if sub:
                order = order[keep].contiguous()
                if fresh is not None:  # the refilled rows, where the drain put them
                    fresh = np.nonzero(np.isin(keep_np[:n_live], fresh))[0]
            img, it, live = img[keep_np], it[keep_np], live[keep_np]
            live[n_live:] = False
            img[n_live:] = -1
            B = size
            build(B)


def drain_sizes(chunk: int, step: str) -> list[int]:
    """The chunk sizes a worker that starts with ``chunk`` rows runs at: the compiled step's
    ``bucket_sizes`` (the graphs to compile up front), or any size for the eager step (listed: ``chunk``)."""
    return bucket_sizes(chunk) if step == "compiled" else [chunk]


def optimize_queue(thetas0: list[torch.Tensor], targets: torch.Tensor, coords: torch.Tensor, arch: SirenArch,
                   iterations: int, lr: float, lr_min: float, stop_at: torch.Tensor, chunk: int, workers: int,
                   step: str, threads: int, per_step: int = 0, ids: np.ndarray | None = None,
                   seed: int = 0) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Fit ``N`` images (start weights ``[N, out, in + 1]`` per layer, uint8 targets ``[N, P, 3]``) with early
    stop at ``stop_at`` ``[N]`` dB, ``workers`` chunks of ``chunk`` rows at once (CPU threads; one on a GPU),
    each step on ``per_step`` pixels (0: all; ``fit_queue``), chosen by ``seed`` and the images' ``ids`` (int64
    ``[N]``, default ``0..N-1``).
    Returns (kept weights per layer ``[N, out, in + 1]``, iterations run ``[N]`` int64 on the CPU)."""
    sh = Shared.make(thetas0, targets, stop_at, ids, seed)
    n = targets.shape[0]
    n_workers = max(1, min(workers, -(-n // max(chunk, 1))))
    if n_workers == 1:
        fit_queue(sh, coords, arch, iterations, lr, lr_min, min(chunk, n), step, threads, per_step)
    else:
        from concurrent.futures import ThreadPoolExecutor

        old = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            with ThreadPoolExecutor(n_workers) as ex:
                for f in [ex.submit(fit_queue, sh, coords, arch, iterations, lr, lr_min, chunk, step, 1, per_step)
                          for _ in range(n_workers)]:
                    f.result()
        finally:
            torch.set_num_threads(old)
    return sh.kept, sh.ran

