"""Resumable meta-init: each candidate's Reptile state, weights and validation kept in its work folder,
bit-exact on resume on CPU. Test hook ``INRBENCH_TEST_META_KILL=C:S[:kill]`` stops after C's step S."""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import torch

from bench import workdir
from bench.atomic import atomic_open, atomic_write_json
from bench.datasets.prepared import sha256_array
from bench.workdir import WORK_JSON

CHECKPOINT_EVERY_S = 30.0
STATE_KEYS = frozenset({"step", "theta", "numpy", "torch", "cuda", "seconds"})  # what a resume reads from a state
TARGET = "validation_random.pt"


def work_path(out: str | Path) -> Path:
    return workdir.work_path(out, "meta-init")


def meta_job(cfg, arch, lr: float, iterations: int, device: torch.device, images: np.ndarray,
             identity: dict) -> dict:
    """What the checkpoints depend on: config, arch, lr, iterations, device type and the train images."""
    from dataclasses import asdict

    job = {"config": asdict(cfg), "arch": arch.to_dict(), "lr": float(lr),
           "iterations": int(iterations), "device": torch.device(device).type,
           "images": {**identity, "pixels_sha256": sha256_array(np.ascontiguousarray(images))}}
    return json.loads(json.dumps(job, default=str))


def _injected_failure(where: str) -> None:
    """Test hook: ``INRBENCH_TEST_META_KILL=WHERE[:kill]`` stops the run at ``where``."""
    want = os.environ.get("INRBENCH_TEST_META_KILL")
    if not want:
        return
    point, kill = (want[:-5], True) if want.endswith(":kill") else (want, False)
    if point != where:
        return
    if kill:  # as the OOM killer or a lost node would: no handler runs
        import signal

        os.kill(os.getpid(), signal.SIGKILL)
    raise KeyboardInterrupt(f"injected stop at {where} (INRBENCH_TEST_META_KILL)")


class NoCheckpoints:
    """Meta-training that keeps nothing (a library call without a work folder): every query finds nothing."""

    def trained(self, j: int) -> tuple[list, dict] | None:
        return None

    def save_trained(self, j: int, weights: list, info: dict) -> None:
        pass

    def state(self, j: int) -> dict | None:
        return None

    def step_done(self, j: int, step: int, state: Callable[[], dict]) -> None:
        pass

    def target(self) -> dict | None:
        return None

    def save_target(self, curve: np.ndarray, seconds: float) -> None:
        pass

    def validated(self, j: int) -> dict | None:
        return None

    def save_validated(self, j: int, row: dict) -> None:
        pass


class MetaWork(NoCheckpoints):
    """The work folder of one meta-init job (``open_work``)."""

    def __init__(self, folder: Path, every_s: float | None = None) -> None:
        self.folder = folder
        self.every_s = CHECKPOINT_EVERY_S if every_s is None else every_s
        self._last = time.monotonic()
        self.saves, self.save_seconds = 0, 0.0  # what checkpointing cost (inr.meta records it)

    def _path(self, j: int, what: str) -> Path:
        return self.folder / f"candidate_{j}.{what}"

    def _save(self, path: Path, obj: dict) -> None:
        t0 = time.perf_counter()
        with atomic_open(path) as f:
            torch.save(obj, f)
        self.saves += 1
        self.save_seconds += time.perf_counter() - t0
        self._last = time.monotonic()

    @staticmethod
    def _load(path: Path) -> dict | None:
        """A checkpoint file, or None when it is missing or unreadable (then recomputed)."""
        try:
            d = torch.load(path, map_location="cpu", weights_only=True)
        except FileNotFoundError:
            return None
        except Exception:  # noqa: BLE001 - a damaged checkpoint is recomputed, as encode refits a bad shard
            return None
        return d if isinstance(d, dict) else None

    def trained(self, j: int) -> tuple[list, dict] | None:
        d = self._load(self._path(j, "trained.pt"))
        if d is None or not {"weights", "info"} <= set(d):
            return None
        return [(W, b) for W, b in d["weights"]], d["info"]

    def save_trained(self, j: int, weights: list, info: dict) -> None:
        self._save(self._path(j, "trained.pt"), {"weights": [(W.cpu(), b.cpu()) for W, b in weights], "info": info})
        with contextlib.suppress(FileNotFoundError):
            self._path(j, "state.pt").unlink()

    def state(self, j: int) -> dict | None:
        self._last = time.monotonic()  # a candidate (re)starts: the next checkpoint is every_s from now
        d = self._load(self._path(j, "state.pt"))
        return d if d is not None and STATE_KEYS <= set(d) else None  # incomplete: the candidate restarts

    def step_done(self, j: int, step: int, state: Callable[[], dict]) -> None:
        if time.monotonic() - self._last >= self.every_s:
            self._save(self._path(j, "state.pt"), state())
        _injected_failure(f"{j + 1}:{step}")

    def target(self) -> dict | None:
        d = self._load(self.folder / TARGET)
        return d if d is not None and {"curve", "seconds"} <= set(d) else None

    def save_target(self, curve: np.ndarray, seconds: float) -> None:
        self._save(self.folder / TARGET, {"curve": torch.from_numpy(np.ascontiguousarray(curve)), "seconds": seconds})

    def validated(self, j: int) -> dict | None:
        try:
            row = json.loads(self._path(j, "validation.json").read_text())
        except (OSError, ValueError):
            return None
        return row if isinstance(row, dict) else None

    def save_validated(self, j: int, row: dict) -> None:
        _injected_failure(f"{j + 1}:validation")
        atomic_write_json(self._path(j, "validation.json"), row)

    def resume_point(self, candidates: int, outer_steps: int) -> str | None:
        """Where a rerun picks up (``candidate 2 of 4 at outer step 150 of 300``), or None: nothing kept yet."""
        if not [p for p in self.folder.iterdir() if p.name != WORK_JSON]:
            return None
        for j in range(candidates):  # what loads, as the run will load it (a damaged file is redone)
            if self.trained(j) is None:
                st = self.state(j)
                step = int(st["step"]) if st is not None else 0
                return f"candidate {j + 1} of {candidates} at outer step {step} of {outer_steps}"
            if candidates > 1 and self.validated(j) is None:
                return f"candidate {j + 1} of {candidates} at its validation fit"
        return f"candidate {candidates} of {candidates}, all trained" + (" and validated" if candidates > 1 else "")


@contextlib.contextmanager
def open_work(folder: Path, job: dict, every_s: float | None = None) -> Iterator[MetaWork]:
    """Create ``folder`` for ``job`` or check an existing one (``bench.workdir``); removed if the body fails
    with nothing kept."""
    kept = lambda f: "the checkpoints" if any(p.name != WORK_JSON for p in f.iterdir()) else None  # noqa: E731
    with workdir.opened(Path(folder), "meta-init", job, kept):
        yield MetaWork(Path(folder), every_s)


def remove_work(folder: Path) -> None:
    workdir.remove(folder, "meta-init")
