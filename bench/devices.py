"""``--device`` specs for every command: ``cpu``, ``cuda``, ``cuda:N``, ``auto``; others exit 2.
``missing_cuda_ok=True`` lets ``cuda``/``cuda:0`` through without CUDA (``bench`` records a skip row)."""

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
