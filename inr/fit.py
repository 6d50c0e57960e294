"""Batched encoder: fit one SIREN per image, many images at once.

Every image's parameters are slices of stacked tensors (``W [B, in, out]``, ``b [B, 1, out]``);
the loss is the *sum over images* of each image's mean squared error, so each image receives
exactly the gradient it would get alone and Adam (elementwise) treats it independently: a
batched fit is the per-image fit, computed with batched matmuls.

The loop keeps, per image, the weights with the best PSNR seen so far, measured with the
``bench.metrics`` convention (clamp, round to 8 bits, PSNR vs the uint8 original) on exactly
the weights that are kept (after masking / fake quantization when those are in play).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace

import numpy as np
import torch

from bench.errors import InputError
from bench.metrics import psnr_per_image
from inr.early_stop import drain_sizes, optimize_queue
from inr.engine import SirenEngine, first_layer_input, from_theta, mask_theta, to_theta
from inr.fast_step import ADAM_BETAS, compiled_iteration, compiled_step
from inr.meta import load_init
from inr.siren import SirenArch, Weights, coord_grid, forward, init_weights, psnr_from_rgb
from inr.subsample import pixels_per_step

# Mixed precision for fitting: bf16 only. bf16 keeps fp32's exponent range, so the tiny gradients
# of a per-image mean over P pixels (``2 / (3P) * err``: ~1e-7 at 224 px) need no loss scaling;
# fp16 would flush them to zero without it, and the hand-written backward (``inr.engine``) has
# none. bf16 runs at fp16's dense rate on the GPUs this targets (A100/H100/H200), so fp16 is dropped.
AUTOCAST = {"none": None, "bf16": torch.bfloat16}
STEPS = ("eager", "compiled")
# the compiled step's chunk on the CPU: its working set (activations and cosines of every layer) must stay in a
# core's L2; larger chunks run at two speeds from one process to the next (docs/encoding-cost.md, section 1)
COMPILED_CPU_BATCH_CAP = 8
AUTOCAST_EVAL_EVERY = 10  # keep-best interval under bf16 when ``eval_every`` is 0 (auto)


@dataclass(frozen=True)
class FitConfig:
    """How to fit: architecture, optimizer schedule, chunking and numerics.

    lr: Adam peak learning rate, cosine-annealed to ``lr * lr_final_factor`` over ``iterations``.
    batch: images fitted together (one chunk); 0 = automatic from ``memory_budget_mb``
    (0 = 60% of free CUDA memory, 2 GiB on CPU; capped at ``cpu_batch_cap`` on CPU, where
    cache-sized chunks are fastest).
    eval_every: check PSNR / keep-best every this many iterations (and always at the end); 0 = auto:
    every iteration in fp32 (keep-best reuses the training forward: no extra pass), every
    ``AUTOCAST_EVAL_EVERY`` under bf16 (keep-best needs its own fp32 forward there).
    autocast: "none" or "bf16": matmuls in bf16 (the first layer, whose inputs are the
    coordinates, stays fp32); keep-best PSNR is measured with an fp32 forward. Honoured on the
    CPU too (slow there unless the CPU has bf16 matmul units; meant for CUDA).
    cpu_workers: chunks fitted concurrently on the CPU, one thread each (0: torch's thread count).
    step: "eager" (``inr.engine``, the reference) or "compiled" (``inr.fast_step``: torch.compile,
    polynomial sine, fused bias + sine; fp32 only).
    init: a learned initialization (``inrbench meta-init``) to start every image from instead of
    the seeded random init; init_sha256: its file's sha256 (checked when loading; recorded).
    target_psnr: early stop (0 = off; fp32 only): an image stops fitting at the first check (every
    ``inr.early_stop.STOP_CHECK_EVERY`` of its iterations) where its best PSNR so far is at least this
    many dB, keeps those weights, and the next image takes its row (continuous batching). The schedule
    stays the ``iterations``-long cosine: a stopped image has run a prefix of it. Images that never
    get there run all ``iterations``.
    pixel_fraction: each fit step sees this fraction of each image's pixels (``inr.subsample``: a new
    subset every step, chosen by ``seed`` and the image's index; 1 = all). Its keep-best runs on every pixel:
    the start weights, each early-stop check and the schedule's end (``inr.early_stop``), with or without
    ``target_psnr``.
    fp32 only; the fit stage only (prune fine-tuning and QAT see every pixel).
    """

    arch: SirenArch
    iterations: int = 5000
    lr: float = 1e-3
    lr_final_factor: float = 0.0
    seed: int = 0
    batch: int = 0
    memory_budget_mb: int = 0
    cpu_batch_cap: int = 32
    cpu_workers: int = 0
    eval_every: int = 0
    autocast: str = "none"
    step: str = "eager"
    init: str = ""
    init_sha256: str = ""
    target_psnr: float = 0.0
    pixel_fraction: float = 1.0

    def __post_init__(self) -> None:
        if self.iterations < 1:
            raise ValueError(f"iterations must be >= 1, got {self.iterations}")
        if not 0 < self.lr < float("inf"):
            raise ValueError(f"lr must be > 0 and finite, got {self.lr}")
        if not 0.0 <= self.lr_final_factor <= 1.0:
            raise ValueError(f"lr_final_factor must be in [0, 1], got {self.lr_final_factor}")
        if self.batch < 0 or self.memory_budget_mb < 0 or self.eval_every < 0 or self.cpu_batch_cap < 1 or self.cpu_workers < 0:
            raise ValueError("batch >= 0, memory_budget_mb >= 0, eval_every >= 0, cpu_batch_cap >= 1 required")
        if self.autocast == "fp16":
            raise ValueError("autocast fp16 is not supported (no loss scaling in the hand-written backward: "
                             "its gradients underflow fp16); use bf16")
        if self.autocast not in AUTOCAST:
            raise ValueError(f"autocast must be one of {sorted(AUTOCAST)}, got {self.autocast!r}")
        if self.step not in STEPS:
            raise ValueError(f"step must be one of {list(STEPS)}, got {self.step!r}")
        if self.step == "compiled" and self.autocast != "none":
            raise ValueError("the compiled fit step is fp32 only (autocast none)")
        if not 0.0 <= self.target_psnr < float("inf"):
            raise ValueError(f"target_psnr must be >= 0 dB (0: off) and finite, got {self.target_psnr}")
        if self.target_psnr and self.autocast != "none":
            raise ValueError("early stop (target_psnr) runs in fp32 only (autocast none)")
        if not 0.0 < self.pixel_fraction <= 1.0:
            raise ValueError(f"pixel_fraction must be in (0, 1], got {self.pixel_fraction}")
        if self.pixel_fraction < 1.0 and self.autocast != "none":
            raise ValueError("a subsampled fit (pixel_fraction < 1) runs in fp32 only (autocast none)")

    @property
    def eval_interval(self) -> int:
        """Iterations between keep-best evaluations (``eval_every``, or the auto choice when 0)."""
        return self.eval_every or (1 if self.autocast == "none" else AUTOCAST_EVAL_EVERY)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["arch"] = self.arch.to_dict()
        del d["init"]  # the init's path is not part of what was computed, its hash is
        return d

    @staticmethod
    def from_dict(d: dict) -> FitConfig:
        d = dict(d)
        d["arch"] = SirenArch.from_dict(d["arch"])
        return FitConfig(**d)


# The paper's configurations (REFERENCE.md) plus a CPU-sized demo.
PRESETS: dict[str, FitConfig] = {
    "cifar10": FitConfig(arch=SirenArch(5, 13), iterations=5000, lr=1e-3),
    "flowers102": FitConfig(arch=SirenArch(10, 32), iterations=5000, lr=5e-4),
    "mini-imagenet": FitConfig(arch=SirenArch(10, 40), iterations=5000, lr=5e-4),
    "demo": FitConfig(arch=SirenArch(5, 13), iterations=300, lr=3e-3),
}


def preset(name: str, **overrides) -> FitConfig:
    """A preset by name, with optional field overrides (``layers``/``hidden``/``w0`` go to the arch)."""
    if name not in PRESETS:
        raise InputError(f"unknown preset {name!r} (known: {', '.join(PRESETS)})")
    cfg = PRESETS[name]
    arch_keys = {"layers", "hidden", "w0", "w0_first"}
    arch_over = {k: v for k, v in overrides.items() if k in arch_keys and v is not None}
    rest = {k: v for k, v in overrides.items() if k not in arch_keys and v is not None}
    if arch_over:
        if "w0" in arch_over and "w0_first" not in arch_over:
            arch_over["w0_first"] = arch_over["w0"]
        cfg = replace(cfg, arch=replace(cfg.arch, **arch_over))
    return replace(cfg, **rest) if rest else cfg


@dataclass
class FitResult:
    """weights: float32 ``[(W [N, in, out], b [N, 1, out]), ...]`` on CPU; psnr: float64 ``[N]`` (dB)."""

    weights: Weights
    psnr: np.ndarray
    config: FitConfig
    extra: dict = field(default_factory=dict)


def as_image_array(images, where: str = "images") -> np.ndarray:
    """Validate ``[N, H, W, 3]`` uint8 (array, tensor, or a sequence of ``[H, W, 3]``)."""
    if isinstance(images, torch.Tensor):
        images = images.cpu().numpy()
    if isinstance(images, (list, tuple)):
        sizes = sorted({tuple(np.asarray(im).shape) for im in images})
        if len(sizes) > 1:
            raise InputError(f"images have mixed sizes {sizes}; resize them to one size first (inrbench prepare)", where)
        images = np.stack([np.asarray(im) for im in images]) if images else np.zeros((0, 1, 1, 3), np.uint8)
    a = np.asarray(images)
    if a.dtype != np.uint8 or a.ndim != 4 or a.shape[-1] != 3:
        raise InputError(f"expected uint8 [N, H, W, 3] images, got {a.dtype} {tuple(a.shape)}", where)
    return a


def fit_bytes_per_image(arch: SirenArch, pixels: int, step: str = "eager") -> int:
    """Device bytes one image needs while fitting with ``step`` (activation-sized buffers + loss/PSNR
    temporaries and targets + Adam).

    eager: the ``inr.engine.SirenEngine`` buffers (activations with their ones row and cosines of every layer,
    the output, two gradient buffers). compiled: what the ``inr.fast_step`` graph keeps for its backward (the
    sine and the cosine of every layer) and its ``[B, h, P]`` temporaries (a pre-activation or a matmul output,
    the gradient flowing back and its product with the cosine): about as much. The larger of the two, so that
    a chunk sized for a compiled fit also fits the eager stages that reuse it (``inr.encode``: prune, QAT).
    """
    if step not in STEPS:
        raise ValueError(f"step must be one of {list(STEPS)}, got {step!r}")
    L, h = arch.layers, arch.hidden
    floats = 2 * L * (h + 1) + 2 * h + 24
    if step == "compiled":
        floats = max(floats, 2 * L * h + 3 * h + 24)
    return pixels * 4 * floats + arch.params_per_image * 4 * 8


def cuda_free_bytes(device: torch.device) -> int:
    """Bytes a new allocation on ``device`` can use: the driver's free memory (``cudaMemGetInfo``)
    plus what torch's caching allocator holds reserved but unallocated (its cached-free blocks,
    which the driver counts as used). Without the second term each later chunk would shrink."""
    free, _ = torch.cuda.mem_get_info(device)
    cached_free = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    return int(free) + max(0, int(cached_free))


def auto_batch(cfg: FitConfig, n: int, pixels: int, device: torch.device) -> int:
    """Images per chunk: an explicit ``cfg.batch``, else what the memory budget allows.

    Budget: ``memory_budget_mb``, or when it is 0, 60% of the free memory of a CUDA device
    (``cuda_free_bytes``: driver-free plus torch's cached-free blocks; 2 GiB on CPU, where
    chunks are also capped at ``cpu_batch_cap``: cache-sized is fastest).
    """
    if cfg.batch:
        return max(1, min(cfg.batch, n))
    budget = cfg.memory_budget_mb * 2**20
    if not budget:
        if device.type == "cuda":
            budget = int(0.6 * cuda_free_bytes(device))
        else:
            budget = 2 * 2**30
    b = max(1, int(budget // fit_bytes_per_image(cfg.arch, pixels, cfg.step)))
    if device.type != "cuda":
        b = min(b, cfg.cpu_batch_cap, compiled_cpu_cap(cfg.pixel_fraction) if cfg.step == "compiled" else cfg.cpu_batch_cap)
    return max(1, min(b, n))


def compiled_cpu_cap(pixel_fraction: float = 1.0) -> int:
    """The compiled step's CPU chunk cap: ``COMPILED_CPU_BATCH_CAP`` rows of every pixel; a subsampled step
    (``pixel_fraction``) keeps the same working set with ``1 / pixel_fraction`` times as many rows. Development
    measurement, 64 images x 1,000 steps of 1/8 at 5x13/32 px, 2 workers: chunks of 8, 16 and 32 took 1.44, 1.02
    and 0.83 s (twice each, within 0.02 s); ``cpu_batch_cap`` (32) bounds it."""
    return COMPILED_CPU_BATCH_CAP * max(1, int(1.0 / pixel_fraction + 1e-9))


def _make_adam(params: list[torch.Tensor], lr: float) -> torch.optim.Optimizer:
    """Adam: fused on CUDA; ``foreach`` on the CPU, whose fused kernel rounds a tensor's last elements (the tail of
    its vector loop) otherwise than the rest, so an image's update would depend on how many images its chunk holds."""
    if params[0].device.type == "cpu":
        return torch.optim.Adam(params, lr=lr, foreach=True)
    try:
        return torch.optim.Adam(params, lr=lr, fused=True)
    except (RuntimeError, TypeError, ValueError):  # pragma: no cover - older torch / unsupported device
        return torch.optim.Adam(params, lr=lr, foreach=True)


def _optimize_chunk(
    weights: Weights,
    targets: torch.Tensor,
    coords: torch.Tensor,
    arch: SirenArch,
    iterations: int,
    lr: float,
    lr_final_factor: float = 0.0,
    eval_every: int = 0,
    masks: Sequence[torch.Tensor | None] | None = None,
    transform: Callable[[Weights, list | None], Weights] | None = None,
    autocast: str = "none",
    step: str = "eager",
    threads: int = 0,
) -> tuple[Weights, torch.Tensor]:
    """One chunk of ``optimize`` (same arguments), on one engine (``step`` "eager") or with the
    compiled step (``inr.fast_step``, compiled for ``threads`` CPU threads)."""
    dev = targets.device
    B = targets.shape[0]
    thetas = [T.to(dev, torch.float32) for T in to_theta([(W.detach(), b.detach()) for W, b in weights])]
    if masks is not None:  # on the device once: ``transform`` gets them every iteration (no host copy there)
        masks = [None if m is None else m.to(dev) for m in masks]
    mts = mask_theta(list(masks), arch.shapes, B, dev) if masks is not None else [None] * arch.num_linear
    for T, m in zip(thetas, mts, strict=True):
        if m is not None:
            T.mul_(m)
    best = [T.clone() for T in thetas]
    best_p = torch.full((B,), -math.inf, dtype=torch.float64, device=dev)
    t255 = targets.permute(0, 2, 1).to(torch.float32)  # [B, 3, P]
    t01 = t255 / 255.0
    P = t255.shape[2]
    coords = coords.to(dev, torch.float32)
    if autocast not in AUTOCAST:
        raise ValueError(f"autocast must be one of {sorted(AUTOCAST)}, got {autocast!r}")
    ac_dtype = AUTOCAST[autocast]
    eval_every = eval_every or (1 if ac_dtype is None else AUTOCAST_EVAL_EVERY)
    fast = eng = None
    if step == "compiled":
        if ac_dtype is not None:
            raise ValueError("the compiled fit step is fp32 only (autocast none)")
        # no engine: the compiled graph keeps its own activations (an engine's buffers would about double the memory
        # ``auto_batch`` budgets); the final evaluation builds a forward-only one once the loop is done
        a0 = first_layer_input(coords)
        fast = compiled_step(arch, B, P, dev, threads or torch.get_num_threads())
        if fused_iteration(masks, transform, eval_every):
            return _optimize_chunk_fused(thetas, best, best_p, t01.contiguous(), a0, arch, iterations, lr, lr * lr_final_factor,
                                         threads or torch.get_num_threads(), coords, targets)
        t01c = t01.contiguous()  # the layout the step was compiled for (``fast_step.warm``)
    else:
        eng = SirenEngine(arch, coords, B, mm_dtype=ac_dtype)
    opt = _make_adam(thetas, lr)
    lr_min = lr * lr_final_factor

    def keep_best(psnr: torch.Tensor, cur: list[torch.Tensor]) -> None:
        better = psnr > best_p  # no host sync: the copies are tiny next to the fit
        best_p.copy_(torch.where(better, psnr, best_p))
        for b, T in zip(best, cur if transform is None else thetas, strict=True):
            b.copy_(torch.where(better.view(-1, 1, 1), T, b))

    def current() -> list[torch.Tensor]:
        if transform is None:
            return thetas
        return to_theta(transform(from_theta(thetas), masks))

    def evaluate_fp32(cur: list[torch.Tensor]) -> None:
        e = eng if eng is not None else SirenEngine(arch, coords, B, backward=False)
        e.mm_dtype = None
        keep_best(psnr_from_rgb(e.forward(cur, need_grad=False), t255), cur)
        e.mm_dtype = ac_dtype

    with torch.no_grad():
        for it in range(iterations):
            cur = current()
            evaluate = it % eval_every == 0
            if fast is not None:
                grads, psnr = fast(cur, a0, t01c)
                if evaluate:
                    keep_best(psnr.double(), cur)
            else:
                if evaluate and ac_dtype is not None:
                    evaluate_fp32(cur)
                rgb = eng.forward(cur)
                if evaluate and ac_dtype is None:
                    keep_best(psnr_from_rgb(rgb, t255, exact=False), cur)
                grad_out = rgb.sub_(t01).mul_(2.0 / (3 * P))  # d/d rgb of sum_b mean (rgb - t)^2
                grads = eng.backward(grad_out)
            for T, g, m in zip(thetas, grads, mts, strict=True):
                T.grad = g if m is None else g.mul_(m)
            for grp in opt.param_groups:
                grp["lr"] = lr_min + 0.5 * (lr - lr_min) * (1.0 + math.cos(math.pi * it / iterations))
            opt.step()
            for T, m in zip(thetas, mts, strict=True):
                T.grad = None
                if m is not None:
                    T.mul_(m)
        evaluate_fp32(current())
        kept = from_theta(best)
        # report the PSNR of decoding the kept weights with ``siren.forward`` (the decoder everyone uses)
        dec = forward(transform(kept, masks) if transform is not None else kept, coords, arch)
        best_p = psnr_from_rgb(dec, targets.to(torch.float32))
    return kept, best_p


def fused_iteration(masks, transform, eval_every: int) -> bool:
    """Whether the compiled path runs whole iterations in one graph (``inr.fast_step.compiled_iteration``):
    no masks, no transform, keep-best every iteration."""
    return masks is None and transform is None and eval_every in (0, 1)


def _optimize_chunk_fused(thetas, best, best_p, t01, a0, arch, iterations, lr, lr_min, threads, coords, targets):
    """``_optimize_chunk`` with each iteration (step, keep-best, Adam) one compiled graph.

    The schedule's factors go in as 0-d device tensors made by ``torch.full`` (a fill kernel taking the value as
    an argument): ``torch.tensor(x, device=cuda)`` would copy from pageable host memory and wait for the
    copy, a stream sync per iteration. Tensors, not Python floats, so the graph is not recompiled per value."""
    dev = t01.device
    B, _, P = t01.shape
    fn = compiled_iteration(arch, B, P, dev, threads)
    m = [torch.zeros_like(T) for T in thetas]
    v = [torch.zeros_like(T) for T in thetas]
    b1, b2 = ADAM_BETAS
    with torch.no_grad():
        for it in range(iterations):
            lr_t = lr_min + 0.5 * (lr - lr_min) * (1.0 + math.cos(math.pi * it / iterations))
            t = it + 1
            fn(thetas, m, v, best, best_p, a0, t01, torch.full((), lr_t / (1.0 - b1**t), dtype=torch.float32, device=dev),
               torch.full((), math.sqrt(1.0 - b2**t), dtype=torch.float32, device=dev))
        # the weights after the last update are a candidate too (as in the eager loop's final evaluation)
        eng = SirenEngine(arch, coords, B, backward=False)
        psnr = psnr_from_rgb(eng.forward(thetas, need_grad=False), targets.permute(0, 2, 1).to(torch.float32))
        better = psnr > best_p
        for b, T in zip(best, thetas, strict=True):
            b.copy_(torch.where(better.view(-1, 1, 1), T, b))
        kept = from_theta(best)
        best_p = psnr_from_rgb(forward(kept, coords, arch), targets.to(torch.float32))
    return kept, best_p


def cpu_workers(requested: int = 0) -> int:
    """Chunks fitted concurrently on the CPU: ``requested``, or torch's thread count when 0."""
    return max(1, requested or torch.get_num_threads())


def optimize(
    weights: Weights,
    targets: torch.Tensor,
    coords: torch.Tensor,
    arch: SirenArch,
    iterations: int,
    lr: float,
    lr_final_factor: float = 0.0,
    eval_every: int = 0,
    masks: Sequence[torch.Tensor | None] | None = None,
    transform: Callable[[Weights, list | None], Weights] | None = None,
    autocast: str = "none",
    chunk: int = 0,
    workers: int = 0,
    step: str = "eager",
    stop_at: torch.Tensor | None = None,
    report: dict | None = None,
    pixel_fraction: float = 1.0,
    seed: int = 0,
    first_index: int = 0,
) -> tuple[Weights, torch.Tensor]:
    """Adam + cosine schedule for ``B`` images; returns the best weights per image and their PSNR.

    Args:
        weights: starting point ``[(W [B, in, out], b [B, 1, out])]`` (copied, not modified).
        targets: uint8 ``[B, P, 3]``; coords: ``[P, 2]``.
        masks: per layer a ``[B, in, out]`` 0/1 mask for ``W`` (or None): masked weights
            are zero before, during and after fitting (gradients masked, weights re-masked).
        transform: ``transform(weights, masks)`` is applied to the weights inside the forward
            (e.g. straight-through fake quantization; per image; called with the chunk's
            weights and masks); the kept weights are the *untransformed* ones whose transform
            scored best, and the returned PSNR is that of ``transform(kept, masks)``.
        eval_every: keep-best every this many iterations (and at the end); 0 = auto (1 in fp32,
            ``AUTOCAST_EVAL_EVERY`` under bf16, where each evaluation is an extra fp32 forward).
        autocast: "bf16" runs the matmuls in bf16 (the first layer, on the coordinates, stays
            fp32); the keep-best PSNR is then measured with a float32 forward.
        chunk: images per chunk (0: from the memory budget, see ``auto_batch``). Images are
            independent, so chunking changes nothing but speed and memory.
        workers: on the CPU, chunks fitted concurrently, each on one thread (0: torch's thread
            count). One thread per chunk avoids the per-op synchronization of intra-op
            threads, which dominates on small tensors and on shared cores.
        stop_at: early stop, ``[B]`` PSNR targets in dB (``inf``: never): an image stops at the first
            check (every ``inr.early_stop.STOP_CHECK_EVERY`` of its iterations) where its best PSNR
            reaches its target and keeps those weights; the next image takes its row
            (``inr.early_stop``: continuous batching). fp32 only; not with ``masks`` or ``transform``.
        report: if given, ``report["iterations_run"]`` is set to the iterations each image ran
            (int64 ``[B]`` ndarray).
        pixel_fraction: each step on this fraction of each image's pixels (``inr.subsample``; runs in
            ``inr.early_stop``'s loop, with ``stop_at`` or without: then no image stops early). The subsets
            are chosen by ``seed`` and each image's index ``first_index + k``. fp32 only; not with ``masks``
            or ``transform``.
    The starting weights are the first keep-best candidate (a fine-tune never returns worse).
    Returns:
        (best weights float32 on ``targets.device``, best PSNR ``[B]`` float64: the
        ``bench.metrics`` PSNR of decoding them with ``siren.forward``).
    """
    B = targets.shape[0]
    dev = targets.device
    if not chunk:
        chunk = auto_batch(FitConfig(arch=arch, step=step, pixel_fraction=pixel_fraction), max(B, 1), targets.shape[1],
                           dev)
    ranges = [(s, min(B, s + chunk)) for s in range(0, B, chunk)] or [(0, 0)]

    n_workers = min(cpu_workers(workers), len(ranges)) if dev.type == "cpu" else 1
    step_threads = 1 if n_workers > 1 else torch.get_num_threads()
    if pixel_fraction < 1.0 and stop_at is None:  # the subsampled loop is the early-stop loop: no image stops
        stop_at = torch.full((B,), math.inf, dtype=torch.float64)
    if stop_at is not None:
        per_step = pixels_per_step(targets.shape[1], pixel_fraction) if pixel_fraction < 1.0 else 0
        per_step = per_step if per_step < targets.shape[1] else 0  # rounded up to every pixel: the all-pixel loop
        return _optimize_early_stop(weights, targets, coords, arch, iterations, lr, lr_final_factor, masks, transform,
                                    autocast, min(chunk, max(B, 1)), n_workers, step, step_threads, stop_at, report,
                                    per_step, seed, first_index)

    def one(se: tuple[int, int]) -> tuple[Weights, torch.Tensor]:
        s, e = se
        return _optimize_chunk(
            [(W[s:e], b[s:e]) for W, b in weights], targets[s:e], coords, arch, iterations, lr, lr_final_factor,
            eval_every, None if masks is None else [None if m is None else m[s:e] for m in masks], transform, autocast,
            step, step_threads,
        )

    if step == "compiled" and B:
        from inr.fast_step import warm

        warm(arch, [(e - s, targets.shape[1]) for s, e in ranges], dev, step_threads,
             fused=fused_iteration(masks, transform, eval_every))
    if n_workers > 1:
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            with ThreadPoolExecutor(n_workers) as ex:
                results = list(ex.map(one, ranges))
        finally:
            torch.set_num_threads(threads)
    else:
        results = [one(r) for r in ranges]
    if report is not None:
        report["iterations_run"] = np.full(B, iterations, dtype=np.int64)
    if len(results) == 1:
        return results[0]
    kept = [(torch.cat([r[0][li][0] for r in results]), torch.cat([r[0][li][1] for r in results])) for li in range(arch.num_linear)]
    return kept, torch.cat([r[1] for r in results])


def _optimize_early_stop(weights, targets, coords, arch, iterations, lr, lr_final_factor, masks, transform, autocast,
                         chunk, workers, step, threads, stop_at, report, per_step=0, seed=0,
                         first_index=0) -> tuple[Weights, torch.Tensor]:
    """``optimize`` with ``stop_at`` (or subsampled steps: ``per_step`` pixels, 0 = all):
    ``inr.early_stop.optimize_queue``, then the decoded PSNR of what it kept."""
    if masks is not None or transform is not None:
        raise ValueError("early stop (stop_at) and subsampled steps are for the plain fit: not with masks or a "
                         "transform")
    if autocast != "none":
        raise ValueError(f"early stop (stop_at) and subsampled steps run in fp32 only, not autocast {autocast!r}")
    dev = targets.device
    B = targets.shape[0]
    if step == "compiled" and B:
        from inr.fast_step import warm

        warm(arch, [(x, targets.shape[1]) for x in drain_sizes(chunk, step)], dev, threads, fused=True, per_row=True,
             per_step=per_step)
    thetas0 = [T.to(dev, torch.float32).contiguous() for T in to_theta([(W.detach(), b.detach()) for W, b in weights])]
    kept_t, ran = optimize_queue(thetas0, targets, coords.to(dev, torch.float32), arch, iterations, lr,
                                    lr * lr_final_factor, torch.as_tensor(stop_at, dtype=torch.float64), chunk, workers,
                                    step, threads, per_step, first_index + np.arange(B, dtype=np.int64), seed)
    if report is not None:
        report["iterations_run"] = ran.numpy()
    kept = from_theta(kept_t)
    # the PSNR of decoding the kept weights with ``siren.forward`` (the decoder everyone uses), chunk by chunk
    with torch.no_grad():
        p = [psnr_from_rgb(forward([(W[s:s + chunk], b[s:s + chunk]) for W, b in kept], coords.to(dev), arch),
                            targets[s:s + chunk].to(torch.float32)) for s in range(0, B, max(chunk, 1))]
    return kept, torch.cat(p) if p else torch.zeros(0, dtype=torch.float64, device=dev)


def images_to_targets(images: np.ndarray, device: torch.device | str = "cpu") -> torch.Tensor:
    """uint8 ``[B, H, W, 3]`` -> uint8 ``[B, H*W, 3]`` on ``device`` (row-major, matches ``coord_grid``)."""
    t = torch.from_numpy(np.array(images, dtype=np.uint8, copy=True))
    return t.reshape(t.shape[0], -1, 3).to(device)


def decode_psnr(weights: Weights, images: np.ndarray, arch: SirenArch, batch: int = 256, device=None) -> np.ndarray:
    """PSNR ``[N]`` of decoding ``weights`` with ``siren.forward``, via ``bench.metrics``.

    Runs on ``device`` (default: the weights' device); only the PSNR values come back.
    """
    n, h, w, _ = images.shape
    dev = torch.device(device) if device is not None else weights[0][0].device
    coords = coord_grid(h, w, device=dev)
    out = []
    for s in range(0, n, batch):
        ws = [(W[s : s + batch].to(dev), b[s : s + batch].to(dev)) for W, b in weights]
        rgb = forward(ws, coords, arch).view(-1, h, w, 3)
        ref = torch.from_numpy(np.array(images[s : s + batch], dtype=np.uint8, copy=True)).to(dev)
        out.append(psnr_per_image(rgb, ref).cpu())
    return torch.cat(out).numpy() if out else np.zeros(0)


def fit(
    images,
    config: FitConfig,
    device: torch.device | str = "cpu",
    first_index: int = 0,
    progress: Callable[[int, np.ndarray], None] | None = None,
    stop_at: np.ndarray | None = None,
) -> FitResult:
    """Fit one SIREN per image.

    Args:
        images: uint8 ``[N, H, W, 3]`` (ndarray, tensor or memmap); mixed sizes are refused.
        config: ``FitConfig``; the init of image ``k`` is seeded by ``(config.seed, first_index + k)``.
        progress: called after each chunk with ``(images finished, their PSNR [n])``.
        stop_at: per-image early-stop targets ``[N]`` in dB (``inf``: never), in place of
            ``config.target_psnr`` (e.g. each image's PSNR from another fit, for a like-for-like saving).
    Returns:
        ``FitResult`` with float32 CPU weights ``[(W [N, in, out], b [N, 1, out])]`` and PSNR ``[N]``
        measured by decoding the kept weights (``bench.metrics`` convention);
        ``extra["iterations_run"]``: int64 ``[N]``, the iterations each image ran.
    """
    imgs = as_image_array(images)
    dev = torch.device(device)
    n, h, w, _ = imgs.shape
    arch = config.arch
    coords = coord_grid(h, w, device=dev)
    chunk = auto_batch(config, max(n, 1), h * w, dev)
    workers = cpu_workers(config.cpu_workers) if dev.type == "cpu" else 1
    step = chunk * workers * (2 if workers > 1 else 1)  # images per progress report
    if stop_at is not None or config.target_psnr or config.pixel_fraction < 1.0:
        step *= 8  # early stop refills chunks from a queue: a longer queue, a shorter drain at its end
    parts: list[Weights] = []
    psnrs: list[np.ndarray] = []
    ran: list[np.ndarray] = []
    if stop_at is None and config.target_psnr:
        stop_at = np.full(n, config.target_psnr, dtype=np.float64)
    if stop_at is not None and np.shape(stop_at) != (n,):
        raise ValueError(f"stop_at needs one target per image ({n}), got shape {np.shape(stop_at)}")
    start = None
    if config.init or config.init_sha256:
        start = load_init(config.init, arch, config.init_sha256).weights
    for s in range(0, n, step):
        e = min(n, s + step)
        if start is None:
            w0 = init_weights(arch, e - s, seed=config.seed, first_index=first_index + s, device=dev)
        else:  # the learned init: the same starting point for every image
            w0 = [(W.expand(e - s, -1, -1).to(dev), b.expand(e - s, -1, -1).to(dev)) for W, b in start]
        tg = images_to_targets(imgs[s:e], dev)
        rep: dict = {}
        best, _ = optimize(
            w0, tg, coords, arch, config.iterations, config.lr, config.lr_final_factor,
            config.eval_interval, autocast=config.autocast, chunk=chunk, workers=workers, step=config.step,
            stop_at=None if stop_at is None else torch.as_tensor(stop_at[s:e], dtype=torch.float64, device=dev),
            report=rep, pixel_fraction=config.pixel_fraction, seed=config.seed, first_index=first_index + s,
        )
        ran.append(rep["iterations_run"])
        p = decode_psnr(best, imgs[s:e], arch)
        best_cpu = [(W.cpu(), b.cpu()) for W, b in best]
        parts.append(best_cpu)
        psnrs.append(p)
        if progress is not None:
            progress(e - s, p)
    weights = concat_weights(parts, arch)
    return FitResult(weights=weights, psnr=np.concatenate(psnrs) if psnrs else np.zeros(0), config=config,
                     extra={"iterations_run": np.concatenate(ran) if ran else np.zeros(0, np.int64)})


def concat_weights(parts: Sequence[Weights], arch: SirenArch) -> Weights:
    """Concatenate chunks of weights along the image axis (empty -> zero-image tensors)."""
    if not parts:
        return [(torch.zeros(0, i, o), torch.zeros(0, 1, o)) for i, o in arch.shapes]
    return [
        (torch.cat([p[li][0] for p in parts]), torch.cat([p[li][1] for p in parts]))
        for li in range(arch.num_linear)
    ]
