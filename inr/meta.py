"""Learned initialization: one SIREN start for every image, meta-learned by Reptile on train images only;
``select_init`` keeps the best seed. File: ``torch.save`` dict read with ``weights_only=True``."""

from __future__ import annotations

import contextlib
import hashlib
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from bench.atomic import atomic_write_bytes
from bench.errors import InputError, older_artifact
from bench.stats import geometric_mean_ci
from inr.loop import Loop, run
from inr.meta_work import NoCheckpoints, meta_job, open_work
from inr.siren import SirenArch, Weights, coord_grid, from_theta, init_weights, to_theta

FORMAT = "inr-bench meta-init v2"
TRAIN_SPLIT = "train"
NO_CHECKPOINTS = NoCheckpoints()


@dataclass(frozen=True)
class MetaConfig:
    """Reptile settings. inner_lr 0 = the preset's fit lr; images: the seeded subset of the train split.

    candidates > 1: train that many inits (seeds ``seed, seed + 1, ...``) and keep the one that saves the
    most fit iterations on ``validation`` images set aside from the subset (``select_init``)."""

    outer_steps: int = 300
    inner_steps: int = 8
    meta_batch: int = 16
    inner_lr: float = 0.0
    outer_lr: float = 1.0
    pixels: int = 4096
    images: int = 1024
    seed: int = 0
    candidates: int = 1
    validation: int = 16

    def __post_init__(self) -> None:
        if min(self.outer_steps, self.inner_steps, self.meta_batch, self.pixels, self.images, self.candidates,
               self.validation) < 1:
            raise ValueError("outer_steps, inner_steps, meta_batch, pixels, images, candidates and validation must "
                             "be >= 1")
        if not (0 <= self.inner_lr < math.inf and 0 < self.outer_lr <= 1.0):
            raise ValueError(f"inner_lr >= 0 and 0 < outer_lr <= 1 required, got {self.inner_lr}, {self.outer_lr}")


@dataclass
class LearnedInit:
    """weights: float32 ``[(W [1, in, out], b [1, 1, out])]``; its ``content_sha256`` (or '')."""

    arch: SirenArch
    weights: Weights
    meta: dict
    sha256: str = ""


@contextlib.contextmanager
def _cpu_threads(device: torch.device, n: int = 1):
    """One torch thread on the CPU (many small ops; it also fixes the result)."""
    old = torch.get_num_threads()
    if device.type == "cpu" and n:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)


def meta_train(images: np.ndarray, arch: SirenArch, lr: float, cfg: MetaConfig = MetaConfig(),
               device: str | torch.device = "cpu", progress=None, work: NoCheckpoints = NO_CHECKPOINTS,
               candidate: int = 0) -> tuple[Weights, dict]:
    """Reptile on uint8 ``[N, H, W, 3]`` train images -> (init ``[(W [1, in, out], b [1, 1, out])]``, info).
    Deterministic per seed and device; ``work`` (``inr.meta_work``) resumes candidate ``candidate`` bit for bit."""
    dev = torch.device(device)
    n, h, w, _ = images.shape
    rng = np.random.default_rng(cfg.seed)
    theta = [T.to(dev) for T in to_theta(init_weights(arch, 1, seed=cfg.seed, device=dev))]
    first, spent = 0, 0.0
    st = work.state(candidate)
    if st is not None:  # everything an outer step draws from: the init so far and the generators
        first, spent = int(st["step"]), float(st["seconds"])
        theta = [T.to(dev) for T in st["theta"]]
        rng.bit_generator.state = st["numpy"]
        torch.set_rng_state(st["torch"])
        if dev.type == "cuda" and st.get("cuda") is not None:
            torch.cuda.set_rng_state(st["cuda"], dev)
    coords = coord_grid(h, w, device=dev)
    P = h * w
    Ps = min(P, cfg.pixels)
    B = min(cfg.meta_batch, n)
    inner_lr = cfg.inner_lr or lr
    inner = Loop(cfg.inner_steps, inner_lr, lr_final_factor=1.0, chunk=B, workers=1, keep_last=True)
    t0 = time.perf_counter()

    def state(step: int) -> dict:
        return {"step": step, "theta": [T.cpu() for T in theta], "numpy": rng.bit_generator.state,
                "torch": torch.get_rng_state(), "cuda": torch.cuda.get_rng_state(dev) if dev.type == "cuda" else None,
                "seconds": spent + time.perf_counter() - t0}

    with torch.no_grad(), _cpu_threads(dev):
        for step in range(first, cfg.outer_steps):
            idx = np.sort(rng.choice(n, B, replace=False))
            tg = torch.from_numpy(np.asarray(images[idx], dtype=np.uint8).reshape(B, P, 3)).to(dev)
            pix = torch.arange(Ps, device=dev)
            if Ps < P:  # a random subset of pixel positions, shared by the batch
                pix = torch.from_numpy(np.sort(rng.choice(P, Ps, replace=False))).to(dev)
            adapted, _, _ = run([T.expand(B, -1, -1) for T in theta], tg[:, pix], coords[pix], arch, inner)
            eps = cfg.outer_lr * (1.0 - step / cfg.outer_steps)
            for T, A in zip(theta, adapted, strict=True):
                T.add_(A.mean(dim=0, keepdim=True).sub_(T), alpha=eps)
            if progress is not None:
                progress(step + 1)
            work.step_done(candidate, step + 1, lambda s=step + 1: state(s))
    seconds = spent + time.perf_counter() - t0
    info = {"method": "reptile", "config": asdict(cfg), "inner_lr_used": inner_lr, "seconds": seconds,
            "image_iterations": cfg.outer_steps * B * cfg.inner_steps, "pixels_per_step": Ps}
    return [(W.cpu(), b.cpu()) for W, b in from_theta(theta)], info


def meta_init_dataset(ds, arch: SirenArch, lr: float, cfg: MetaConfig = MetaConfig(), split: str = TRAIN_SPLIT,
                      device: str | torch.device = "cpu", progress=None, iterations: int = 0,
                      work: str | Path | None = None, on_resume=None) -> tuple[Weights, dict]:
    """``meta_train`` (or ``select_init`` when ``cfg.candidates > 1``, validation fits of ``iterations``) on a seeded
    subset of the *train* split (asserted); ``work``: a work folder to checkpoint in and resume from."""
    if cfg.candidates > 1 and iterations < 1:
        raise ValueError("choosing among candidate inits needs the fit's iterations")
    assert split == TRAIN_SPLIT, f"meta-init trains on the train split only, not {split!r}"
    s = ds.split(TRAIN_SPLIT)
    n_all = len(s)
    if n_all < 1:
        raise InputError("the train split has no images to meta-train on", ds.root)
    k = min(cfg.images, n_all)
    if cfg.candidates > 1 and k - cfg.validation < cfg.meta_batch:  # meta-init refuses it first, naming its flags
        raise InputError(f"choosing among {cfg.candidates} candidate inits on {cfg.validation} validation images "
                         f"leaves {max(k - cfg.validation, 0)} of {k} train images to meta-train on, fewer than the "
                         f"meta-batch ({cfg.meta_batch})", ds.root)
    idx = np.sort(np.random.default_rng(cfg.seed + 7919).choice(n_all, k, replace=False))
    imgs = np.asarray(s.images[idx])
    record = dict(split=TRAIN_SPLIT, num_images=int(k), split_count=int(n_all),
                  indices_sha256=hashlib.sha256(idx.astype(np.int64).tobytes()).hexdigest())
    with contextlib.ExitStack() as stack:
        ckpt = NO_CHECKPOINTS
        if work is not None:
            job = meta_job(cfg, arch, lr, iterations if cfg.candidates > 1 else 0, torch.device(device), imgs, record)
            ckpt = stack.enter_context(open_work(Path(work), job))
            where = ckpt.resume_point(cfg.candidates, cfg.outer_steps)
            if where is not None and on_resume is not None:
                on_resume(f"meta-init: resuming {where} (work folder {work})")
        if cfg.candidates > 1:
            weights, info = select_init(imgs, arch, lr, cfg, iterations, device, progress, ckpt)
        else:
            weights, info = _train_candidate(imgs, arch, lr, cfg, device, progress, ckpt, 0)
    info.update(record, dataset=str(ds.root), image_size=[int(x) for x in s.images.shape[1:3]])
    return weights, info


def _train_candidate(images: np.ndarray, arch: SirenArch, lr: float, cfg: MetaConfig, device, progress,
                     work: NoCheckpoints, j: int) -> tuple[Weights, dict]:
    """Candidate ``j``'s ``meta_train`` (``cfg`` carries its seed), or its weights kept in ``work``."""
    done = work.trained(j)
    if done is not None:
        return done
    weights, info = meta_train(images, arch, lr, cfg, device, progress, work, j)
    work.save_trained(j, weights, info)
    return weights, info


def select_init(images: np.ndarray, arch: SirenArch, lr: float, cfg: MetaConfig, iterations: int,
                device: str | torch.device = "cpu", progress=None,
                work: NoCheckpoints = NO_CHECKPOINTS) -> tuple[Weights, dict]:
    """Best of ``cfg.candidates`` inits (seeds ``cfg.seed + j``), each trained without ``cfg.validation`` held-aside
    train images and judged by its geometric-mean iteration saving on them (``per_image_saving``) against the
    seeded random init's PSNR; ties keep the lower seed. ``work`` keeps and reuses every stage's result."""
    from dataclasses import replace

    n = len(images)
    v = min(cfg.validation, n - 1)
    if v < 1:
        raise InputError(f"choosing among {cfg.candidates} candidate inits needs at least 2 train images, got {n}")
    val = np.sort(np.random.default_rng(cfg.seed + 104729).choice(n, v, replace=False))
    rest = np.setdiff1d(np.arange(n), val)
    kept = work.target()
    if kept is None:
        t0 = time.perf_counter()
        target = fit_curve(images[val], arch, iterations, lr, seed=cfg.seed, device=device, per_image=True)
        seconds = time.perf_counter() - t0
        work.save_target(target, seconds)
    else:
        target, seconds = kept["curve"].numpy(), float(kept["seconds"])
    rows, best = [], None
    for j in range(cfg.candidates):
        c = replace(cfg, seed=cfg.seed + j, candidates=1)
        w, info = _train_candidate(images[rest], arch, lr, c, device, progress, work, j)
        row = work.validated(j)
        if row is None:
            t0 = time.perf_counter()
            pi = per_image_saving(target, fit_curve(images[val], arch, iterations, lr, start=w, device=device,
                                                    per_image=True))
            row = {"seed": c.seed, "validation_saving": float(pi["geomean"]), "never": int(pi["never"]),
                   "seconds": info["seconds"], "validation_seconds": time.perf_counter() - t0}
            work.save_validated(j, row)
        seconds += row["seconds"] + row["validation_seconds"]
        rows.append({k: row[k] for k in ("seed", "validation_saving", "never", "seconds")})
        if best is None or row["validation_saving"] > best[0]:
            best = (row["validation_saving"], w, info)
    _, weights, info = best
    info = {**info, "config": asdict(cfg), "seconds": seconds,
            "image_iterations": cfg.candidates * info["image_iterations"] + (cfg.candidates + 1) * v * iterations,
            "selection": {"candidates": rows, "chosen_seed": info["config"]["seed"], "validation_images": int(v),
                          "iterations": int(iterations), "meta_train_images": int(len(rest))}}
    return weights, info


def save_init(path: str | Path, arch: SirenArch, weights: Weights, meta: dict) -> str:
    """Write the init file (atomically); returns its ``content_sha256``. The caller claims ``path`` (bench.outputs)."""
    import io

    buf = io.BytesIO()
    d = {"format": FORMAT, "arch": arch.to_dict(), "meta": meta,
         "weights": [(W.detach().cpu().contiguous(), b.detach().cpu().contiguous()) for W, b in weights]}
    torch.save(d, buf)
    atomic_write_bytes(path, buf.getvalue())
    return content_sha256(d)


def _untimed(x):
    """``x`` without its timings (keys ``seconds`` and ``*_seconds``, at any depth)."""
    if isinstance(x, dict):
        return {k: _untimed(v) for k, v in x.items() if not (k == "seconds" or str(k).endswith("_seconds"))}
    if isinstance(x, list | tuple):
        return [_untimed(v) for v in x]
    return x


def content_sha256(d: dict) -> str:
    """An init file's identity: sha256 of its format, architecture, record without timings and weights' bytes."""
    import json

    h = hashlib.sha256(json.dumps({"format": d.get("format"), "arch": d.get("arch"), "meta": _untimed(d.get("meta", {})),
                                   "weights": [[(str(t.dtype), list(t.shape)) for t in wb] for wb in d["weights"]]},
                                  sort_keys=True, default=str).encode())
    for wb in d["weights"]:
        for t in wb:
            h.update(t.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def load_init(path: str | Path, arch: SirenArch | None = None, expect_sha256: str = "") -> LearnedInit:
    """Read an init file; refuse (``InputError``, one line) a file that is not one, was changed since
    ``expect_sha256`` was recorded, or was trained for another architecture than ``arch``."""
    if not path:
        raise InputError("this fit configuration names a learned init (init_sha256) but no init file to load")
    p = Path(path)
    try:
        data = p.read_bytes()
    except OSError as e:
        raise InputError(f"cannot read the init file: {e.strerror or e}", p) from None
    import io

    try:
        d = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception:  # noqa: BLE001 - any unreadable file is the same user error
        d = None
    version = str(d.get("format")).removeprefix(FORMAT[:-1]) if isinstance(d, dict) else ""
    if version.isdigit() and int(version) < int(FORMAT[-1]):
        raise older_artifact(p, version, "rerun `inrbench meta-init`")
    if not isinstance(d, dict) or d.get("format") != FORMAT:
        raise InputError("not a learned initialization written by `inrbench meta-init`", p)
    try:
        sha = content_sha256(d)
    except (KeyError, TypeError, ValueError, AttributeError):
        raise InputError("init file's weights are not a list of (W, b) tensors", p) from None
    if expect_sha256 and sha != expect_sha256:
        raise InputError(f"init file has sha256 {sha[:12]}..., not the {expect_sha256[:12]}... recorded for this encode", p)
    got = SirenArch.from_dict(d["arch"])
    if arch is not None and got != arch:
        raise InputError(f"init file is for {got.layers}x{got.hidden} (w0_first {got.w0_first:g}, w0 {got.w0:g}), "
                         f"not the encode's {arch.layers}x{arch.hidden} (w0_first {arch.w0_first:g}, w0 {arch.w0:g})", p)
    weights = [(W.float(), b.float()) for W, b in d["weights"]]
    if [tuple(W.shape[1:]) for W, _ in weights] != list(got.shapes):
        raise InputError("init file's weights do not match its architecture", p)
    return LearnedInit(arch=got, weights=weights, meta=d.get("meta", {}), sha256=sha)


def fit_curve(images: np.ndarray, arch: SirenArch, iterations: int, lr: float, start: Weights | None = None,
              seed: int = 0, device: str | torch.device = "cpu", per_image: bool = False) -> np.ndarray:
    """Mean best-so-far PSNR after ``0..iterations`` steps of the eager fit: ``[iterations + 1]`` dB; with
    ``per_image`` ``[iterations + 1, N]``. ``start``: a learned init, else the seeded random init."""
    dev = torch.device(device)
    n, h, w, _ = images.shape
    ws = init_weights(arch, n, seed=seed, device=dev) if start is None else [
        (W.expand(n, -1, -1), b.expand(n, -1, -1)) for W, b in start]
    tg = torch.from_numpy(np.array(images, dtype=np.uint8).reshape(n, h * w, 3)).to(dev)
    with _cpu_threads(dev, 1 if n * h * w <= 1 << 15 else 0):  # big images: all threads
        _, _, hist = run([T.to(dev) for T in to_theta(ws)], tg, coord_grid(h, w, device=dev), arch,
                         Loop(iterations, lr, chunk=n, workers=1, history=True))
    curve = hist.cpu().numpy()
    return curve if per_image else curve.mean(axis=1)


def iterations_to_reach(curve: np.ndarray, target: float) -> int | None:
    """First iteration whose best-so-far mean PSNR reaches ``target`` (None: never)."""
    hit = np.nonzero(curve >= target)[0]
    return int(hit[0]) if len(hit) else None


def per_image_saving(random: np.ndarray, learned: np.ndarray) -> dict:
    """Per image of ``[iterations + 1, N]`` curves: the first iteration the learned curve reaches the random curve's
    final PSNR (never: ``iterations + 1``) and ``iterations / it``; their geometric mean with a 95% interval."""
    iters = random.shape[0] - 1
    its = []
    for i in range(random.shape[1]):
        k = iterations_to_reach(learned[:, i], float(random[-1, i]))
        its.append(iters + 1 if k is None else max(k, 1))
    savings = [iters / k for k in its]
    iv = geometric_mean_ci(savings)
    return {"iterations": its, "savings": savings, "never": sum(k > iters for k in its),
            "geomean": iv.value, "lo": iv.lo, "hi": iv.hi, "n": iv.n}


def init_record(path: str | Path, sha256: str) -> dict:
    """What a store records about the learned init it was fitted from (``meta["init"]``)."""
    rec = {"sha256": sha256, "path": str(path)}
    try:
        li = load_init(path, None, sha256)
        m = li.meta
        rec.update({k: m.get(k) for k in ("method", "split", "num_images", "dataset", "seconds", "image_iterations")})
        sel = m.get("selection")
        if sel:  # meta-init --candidates: which seed was kept, of how many, on how many validation images
            rec["selection"] = {"candidates": len(sel["candidates"]), "chosen_seed": sel["chosen_seed"],
                                "validation_images": sel["validation_images"],
                                "validation_saving": max(c["validation_saving"] for c in sel["candidates"])}
    except InputError:
        pass
    return rec
