"""Resumable meta-init: what a killed ``inrbench meta-init`` has done, kept in a work folder beside its output.

The folder is hidden, ``.<OUT name>.inrbench-meta-init.work`` beside ``--out`` (``work_path``; named as
``prepare``'s work folder is), and holds, each file written atomically (temp + rename)::

    work.json                 what the folder is for (its marker and fingerprint): kind "meta-init-work",
                              schema_version, job; a folder without it is never used nor removed
    candidate_J.state.pt      candidate J's (from 0) Reptile state mid-training (rewritten every ``every_s``
                              seconds): the outer step reached, the init's weights, the numpy generator
                              of the batch / pixel draws, torch's CPU (and CUDA) generator states, seconds
    candidate_J.trained.pt    candidate J's finished weights and info (its state file is then removed)
    validation_random.pt      --candidates > 1: the validation images' fit curves from random init
    candidate_J.validation.json  candidate J's validation result (its row in info["selection"])

The job (``meta_job``) is the ``MetaConfig``, the architecture, the lr, the fit iterations (those of
the validation fits; 0 without ``--candidates``), the device
type and the identity of the train images (count, their pixels' sha256, the subset's indices): a rerun
whose job differs is refused (one line, exit 2, as ``inrbench encode`` refuses another encode's shards).

A Reptile outer step draws its randomness only from the numpy generator whose state is saved (the
inner Adam is new every step, the init of each candidate comes from its own seeded generator), so a
run resumed from the state of any outer step computes, on the CPU, bit for bit the weights the
uninterrupted run does. The validation results (``--candidates``) are those of the same machine,
device and thread count (fits of large images use every torch thread), as for ``inrbench encode``;
a candidate's weights do not depend on the thread count (Reptile runs on one). Saving the state costs a few
milliseconds (the init is small): every 30 s, and at the end of each candidate, which keeps
checkpoints far below 1% of the time.

Test hook (read in one place, ``_injected_failure``): ``INRBENCH_TEST_META_KILL=C:S`` stops the run
after candidate C's (1-based) outer step S, once a checkpoint due there is written, as Ctrl-C would
(``KeyboardInterrupt``); ``C:validation`` stops it after candidate C's validation fit, before its
result is saved; a ``:kill`` suffix makes the process SIGKILL itself instead.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import torch

from bench.atomic import atomic_open, atomic_write_json, create_marked_dir
from bench.datasets.prepared import sha256_array
from bench.errors import InputError
from bench.jsontext import diff_keys
from bench.outputs import TEMP_TAG, _is_own_temp

WORK_SUFFIX = f".{TEMP_TAG}meta-init.work"  # the folder is ".<OUT name>" + WORK_SUFFIX (bench.sweep.cells mirrors it)
WORK_KIND = "meta-init-work"
WORK_SCHEMA = 1
WORK_JSON = "work.json"
CHECKPOINT_EVERY_S = 30.0
STATE_KEYS = frozenset({"step", "theta", "numpy", "torch", "cuda", "seconds"})  # what a resume reads from a state
TARGET = "validation_random.pt"


def work_path(out: str | Path) -> Path:
    """The work folder of the init file ``out``: ``.<name>.inrbench-meta-init.work`` beside it."""
    out = Path(out)
    return out.with_name(f".{out.name}{WORK_SUFFIX}")


def meta_job(cfg, arch, lr: float, iterations: int, device: torch.device, images: np.ndarray,
             identity: dict) -> dict:
    """What the checkpoints depend on (``work.json``'s job); ``identity``: the train subset's count and hashes."""
    from dataclasses import asdict

    job = {"config": asdict(cfg), "arch": arch.to_dict(), "lr": float(lr),
           "iterations": int(iterations), "device": torch.device(device).type,
           "images": {**identity, "pixels_sha256": sha256_array(np.ascontiguousarray(images))}}
    return json.loads(json.dumps(job, default=str))


def _injected_failure(where: str) -> None:
    """Test hook: ``INRBENCH_TEST_META_KILL=WHERE[:kill]`` stops the run at ``where`` (see the module docstring)."""
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
    """The work folder of one meta-init job (opened by ``open_work``); see the module docstring."""

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
        """A checkpoint file, or None when it is missing or unreadable (recomputed: each is written atomically,
        so only a damaged disk leaves a bad one)."""
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


def _marker(folder: Path) -> dict | None:
    """``folder``'s ``work.json`` when it marks a meta-init work folder, else None."""
    try:
        doc = json.loads((folder / WORK_JSON).read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) and doc.get("kind") == WORK_KIND else None


@contextlib.contextmanager
def open_work(folder: Path, job: dict, every_s: float | None = None) -> Iterator[MetaWork]:
    """Create ``folder`` for ``job``, or check that an existing one holds checkpoints of this very job
    (else one ``InputError`` line naming what differs). If the body fails before anything was kept in
    a folder this call created, the folder is removed: nothing there to resume (``inr.encode.fresh_work``)."""
    if folder.is_symlink() or (folder.exists() and not folder.is_dir()):
        raise InputError("exists and is not a meta-init work folder; refusing to use or remove it", folder)
    doc = {"kind": WORK_KIND, "written_by": "inr-bench", "schema_version": WORK_SCHEMA, "job": job}
    folder.parent.mkdir(parents=True, exist_ok=True)
    created = create_marked_dir(folder, WORK_JSON, doc)  # the folder and its work.json appear together
    old = None if created else _marker(folder)
    if not created and old is None:
        raise InputError("exists and is not a meta-init work folder (no work.json of inrbench meta-init); "
                         "refusing to use or remove it (an empty one may be left by an older inr-bench "
                         "killed while creating it: delete it to start over)", folder)
    elif not created:
        was = {"schema_version": old.get("schema_version"), "job": old.get("job")}
        if was != {"schema_version": WORK_SCHEMA, "job": job}:
            diff = sorted(diff_keys(was, {"schema_version": WORK_SCHEMA, "job": job}))
            raise InputError(f"holds the checkpoints of a meta-init with other settings ({', '.join(diff[:6])} "
                             f"{'differs' if len(diff) == 1 else 'differ'}); delete it to start over, or rerun with those settings to resume", folder)
        for c in folder.iterdir():  # a killed writer's temp file (the --out lock is held: none is live)
            if _is_own_temp(c.name) and c.is_file():
                c.unlink()
    try:
        yield MetaWork(folder, every_s)
    except BaseException:
        if created and folder.is_dir() and {p.name for p in folder.iterdir()} <= {WORK_JSON}:
            shutil.rmtree(folder, ignore_errors=True)
        raise


def remove_work(folder: Path) -> None:
    """Remove a meta-init work folder once its init file is written; never a folder without the marker."""
    if folder.is_dir() and not folder.is_symlink() and _marker(folder) is not None:
        shutil.rmtree(folder, ignore_errors=True)
