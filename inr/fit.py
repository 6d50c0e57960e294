"""The encoder's fit: one SIREN per image, many at once (``inr.loop``): the loss sums per-image MSEs, so
each image gets its lone gradient; each keeps its best 8-bit PSNR weights."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace

import numpy as np
import torch

from bench.errors import InputError
from bench.metrics import psnr_per_image
from inr.loop import AUTOCAST, STEPS, Loop, run
from inr.meta import load_init
from inr.siren import (
    SirenArch,
    Weights,
    coord_grid,
    forward,
    from_theta,
    init_weights,
    psnr_from_rgb,
    to_theta,
)
from inr.subsample import pixels_per_step

# the compiled step's CPU chunk: its working set (activations and cosines of every layer) stays in a core's L2
COMPILED_CPU_BATCH_CAP = 8


@dataclass(frozen=True)
class FitConfig:
    """How to fit: Adam lr cosine to ``lr * lr_final_factor``; ``batch`` 0 sizes chunks from memory; ``step``
    eager or compiled; ``init``: learned init; ``target_psnr`` early stop (0 off). docs/inr-codec.md."""

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
            raise ValueError("autocast fp16 is not supported (its gradients underflow without loss scaling); use bf16")
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
        """Iterations between keep-best evaluations (``eval_every``, or 1 in fp32 and 10 under bf16)."""
        return Loop(1, 1.0, autocast=self.autocast, eval_every=self.eval_every).interval

    def loop(self, pixels: int, chunk: int, workers: int) -> Loop:
        """This fit's ``inr.loop.Loop`` for images of ``pixels`` pixels."""
        per_step = pixels_per_step(pixels, self.pixel_fraction) % pixels  # every pixel: 0, the all-pixel loop
        return Loop(self.iterations, self.lr, self.lr_final_factor, self.step, self.autocast, self.eval_every,
                    per_step, chunk, workers, seed=self.seed)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["arch"] = self.arch.to_dict()
        del d["init"]  # the init's path is not part of what was computed, its hash is
        return d

    @staticmethod
    def from_dict(d: dict) -> FitConfig:
        return FitConfig(**{**d, "arch": SirenArch.from_dict(d["arch"])})


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
    """Device bytes one image needs while fitting: the activations and cosines of every layer, temporaries, targets
    and Adam (the compiled graph's about the same; the larger, so eager stages fit a chunk sized for it)."""
    if step not in STEPS:
        raise ValueError(f"step must be one of {list(STEPS)}, got {step!r}")
    L, h = arch.layers, arch.hidden
    floats = 2 * L * (h + 1) + 2 * h + 24
    if step == "compiled":
        floats = max(floats, 2 * L * h + 3 * h + 24)
    return pixels * 4 * floats + arch.params_per_image * 4 * 8


def cuda_free_bytes(device: torch.device) -> int:
    """The driver's free memory plus what torch's caching allocator holds reserved but unallocated."""
    free, _ = torch.cuda.mem_get_info(device)
    return int(free) + max(0, int(torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)))


def auto_batch(cfg: FitConfig, n: int, pixels: int, device: torch.device) -> int:
    """Images per chunk: ``cfg.batch``, else what the memory budget allows (capped on the CPU, where cache-sized
    chunks are fastest; the compiled step at ``COMPILED_CPU_BATCH_CAP`` rows of every pixel)."""
    if cfg.batch:
        return max(1, min(cfg.batch, n))
    budget = cfg.memory_budget_mb * 2**20
    if not budget:
        budget = int(0.6 * cuda_free_bytes(device)) if device.type == "cuda" else 2 * 2**30
    b = max(1, int(budget // fit_bytes_per_image(cfg.arch, pixels, cfg.step)))
    if device.type != "cuda":
        b = min(b, cfg.cpu_batch_cap)
        if cfg.step == "compiled":  # a subsampled step keeps the working set with 1 / fraction times the rows
            b = min(b, COMPILED_CPU_BATCH_CAP * max(1, int(1.0 / cfg.pixel_fraction + 1e-9)))
    return max(1, min(b, n))


def cpu_workers(requested: int = 0) -> int:
    """Chunks fitted concurrently on the CPU: ``requested``, or torch's thread count when 0."""
    return max(1, requested or torch.get_num_threads())


def optimize(weights: Weights, targets: torch.Tensor, coords: torch.Tensor, arch: SirenArch, loop: Loop,
             stop_at: torch.Tensor | None = None, masks=None, transform=None,
             ids: np.ndarray | None = None) -> tuple[Weights, torch.Tensor, np.ndarray]:
    """``inr.loop.run`` from ``weights`` ``[(W [B, in, out], b [B, 1, out])]`` (not modified) to uint8 targets
    ``[B, P, 3]`` at coords ``[P, 2]``; ``loop.chunk`` 0: from the memory budget, ``loop.workers`` 0: torch's threads.
    Returns (kept weights, their PSNR ``[B]`` float64 decoded by ``siren.forward`` (of ``transform(kept)`` when
    given), iterations run int64 ``[B]``)."""
    B, P = targets.shape[:2]
    dev = targets.device
    if not loop.chunk:
        fc = FitConfig(arch=arch, step=loop.step, pixel_fraction=1.0 if not loop.per_step else loop.per_step / P)
        loop = replace(loop, chunk=auto_batch(fc, max(B, 1), P, dev))
    loop = replace(loop, workers=cpu_workers(loop.workers) if dev.type == "cpu" else 1)
    thetas0 = [T.to(dev) for T in to_theta([(W.detach(), b.detach()) for W, b in weights])]
    kept_t, ran, _ = run(thetas0, targets, coords.to(dev, torch.float32), arch, loop, stop_at, masks, transform, ids)
    kept = from_theta(kept_t)
    dec = kept if transform is None else transform(kept, None if masks is None else [None if m is None else m.to(dev).bool() for m in masks])
    c = max(loop.chunk, 1)
    with torch.no_grad():
        p = [psnr_from_rgb(forward([(W[s:s + c], b[s:s + c]) for W, b in dec], coords.to(dev), arch),
                           targets[s:s + c].float()) for s in range(0, B, c)]
    return kept, torch.cat(p) if p else torch.zeros(0, dtype=torch.float64, device=dev), ran.numpy()


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


def fit(images, config: FitConfig, device: torch.device | str = "cpu", first_index: int = 0,
        progress: Callable[[int, np.ndarray], None] | None = None, stop_at: np.ndarray | None = None) -> FitResult:
    """Fit one SIREN per uint8 image ``[N, H, W, 3]``; image ``k`` is seeded by ``(config.seed, first_index + k)``.
    progress: ``(images finished, their PSNR [n])`` per group; stop_at: per-image early-stop targets ``[N]`` (dB)
    in place of ``config.target_psnr``. Returns float32 CPU weights, decoded PSNR ``[N]`` and
    ``extra["iterations_run"]`` (int64 ``[N]``)."""
    imgs = as_image_array(images)
    dev = torch.device(device)
    n, h, w, _ = imgs.shape
    arch = config.arch
    coords = coord_grid(h, w, device=dev)
    chunk = auto_batch(config, max(n, 1), h * w, dev)
    workers = cpu_workers(config.cpu_workers) if dev.type == "cpu" else 1
    loop = config.loop(h * w, chunk, workers)
    group = chunk * workers * (2 if workers > 1 else 1)  # images per progress report
    if stop_at is None and config.target_psnr:
        stop_at = np.full(n, config.target_psnr, dtype=np.float64)
    if stop_at is not None and np.shape(stop_at) != (n,):
        raise ValueError(f"stop_at needs one target per image ({n}), got shape {np.shape(stop_at)}")
    if stop_at is not None or loop.per_step:
        group *= 8  # rows refill from a queue: a longer queue, a shorter drain at its end
    start = load_init(config.init, arch, config.init_sha256).weights if config.init or config.init_sha256 else None
    parts: list[Weights] = []
    psnrs: list[np.ndarray] = []
    ran: list[np.ndarray] = []
    for s in range(0, n, group):
        e = min(n, s + group)
        if start is None:
            w0 = init_weights(arch, e - s, seed=config.seed, first_index=first_index + s, device=dev)
        else:  # the learned init: the same starting point for every image
            w0 = [(W.expand(e - s, -1, -1).to(dev), b.expand(e - s, -1, -1).to(dev)) for W, b in start]
        stop = None if stop_at is None else torch.as_tensor(stop_at[s:e], dtype=torch.float64)
        best, _, r = optimize(w0, images_to_targets(imgs[s:e], dev), coords, arch, loop, stop,
                              ids=first_index + s + np.arange(e - s, dtype=np.int64))
        ran.append(r)
        p = decode_psnr(best, imgs[s:e], arch)
        parts.append([(W.cpu(), b.cpu()) for W, b in best])
        psnrs.append(p)
        if progress is not None:
            progress(e - s, p)
    return FitResult(weights=concat_weights(parts, arch), psnr=np.concatenate(psnrs) if psnrs else np.zeros(0),
                     config=config, extra={"iterations_run": np.concatenate(ran) if ran else np.zeros(0, np.int64)})


def concat_weights(parts: Sequence[Weights], arch: SirenArch) -> Weights:
    """Concatenate chunks of weights along the image axis (empty -> zero-image tensors)."""
    if not parts:
        return [(torch.zeros(0, i, o), torch.zeros(0, 1, o)) for i, o in arch.shapes]
    return [
        (torch.cat([p[li][0] for p in parts]), torch.cat([p[li][1] for p in parts]))
        for li in range(arch.num_linear)
    ]
