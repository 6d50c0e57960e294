"""``--device`` specs: one validator for every command (``encode``, ``perf``, ``bench``).

Accepted: ``cpu``, ``cuda``, ``cuda:N``, ``auto`` (``cuda`` when CUDA is available, else
``cpu``). Anything else, or ``cuda:N`` past this machine's CUDA devices, is an ``InputError``
(one line, exit 2), never a traceback from inside torch.

A machine without CUDA at all: ``cuda`` / ``cuda:0`` are refused too, unless the caller passes
``missing_cuda_ok=True`` (``bench``: such a run is a ``skip`` row, so a sweep written for a GPU
machine still runs its CPU cells here). ``cuda:N`` with N >= 1 names a device this machine does
not have either way: refused.
"""

from __future__ import annotations

import re

from bench.errors import InputError

SPEC = re.compile(r"^(cpu|cuda)(?::(\d+))?$")
ACCEPTED = "cpu, cuda, cuda:N or auto"


def resolve_device(spec: str, *, missing_cuda_ok: bool = False, option: str = "--device") -> str:
    """``spec`` -> a device string torch accepts and this machine has (``auto`` resolved)."""
    import torch

    spec = str(spec).strip()
    if spec == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    m = SPEC.match(spec)
    if m is None:
        raise InputError(f"{option} {spec!r}: not a device (expected {ACCEPTED})")
    kind, index = m.group(1), None if m.group(2) is None else int(m.group(2))
    if kind == "cpu":
        if index not in (None, 0):
            raise InputError(f"{option} {spec!r}: there is one CPU device (use cpu)")
        return "cpu"
    if not torch.cuda.is_available():
        if missing_cuda_ok and index in (None, 0):
            return spec
        raise InputError(f"{option} {spec}: no CUDA device here (torch.cuda.is_available() is False)")
    count = torch.cuda.device_count()
    if index is not None and index >= count:
        raise InputError(f"{option} {spec}: this machine has {count} CUDA device(s) (cuda:0..cuda:{count - 1})")
    return spec
