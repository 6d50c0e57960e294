"""Run metadata (``env.json``): commit, library versions, which PIL, CPU, GPU, driver.

Every run writes one; every value is read, never assumed. Absent facts are recorded
with the reason (``{"available": false, "reason": ...}``), never as zeros.
"""

from __future__ import annotations

import importlib.metadata as md
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

ENV_SCHEMA_VERSION = 1


def pil_info() -> dict[str, Any]:
    """Which PIL is imported: ``Pillow`` or ``pillow-simd``, its version, libjpeg version, SIMD flag."""
    import PIL
    from PIL import features

    flavor = "unknown"
    for dist in ("pillow-simd", "Pillow-SIMD"):
        try:
            md.distribution(dist)
            flavor = "pillow-simd"
            break
        except md.PackageNotFoundError:
            pass
    else:
        try:
            md.distribution("pillow")
            flavor = "Pillow"
        except md.PackageNotFoundError:
            pass
    # pillow-simd releases carry a ".postN" suffix; a cross-check when metadata is ambiguous.
    if flavor == "unknown" and ".post" in PIL.__version__:
        flavor = "pillow-simd"
    return {
        "flavor": flavor,
        "version": PIL.__version__,
        "libjpeg": features.version("jpg"),
        "libjpeg_turbo": bool(features.check_feature("libjpeg_turbo")),
        "module_path": str(Path(PIL.__file__).parent),
    }


def git_info(cwd: str | Path | None = None) -> dict[str, Any]:
    cwd = Path(cwd or Path(__file__).resolve().parent.parent)
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = bool(
            subprocess.run(
                ["git", "status", "--porcelain", "--untracked-files=no"],
                cwd=cwd, capture_output=True, text=True, check=True,
            ).stdout.strip()
        )
        return {"sha": sha, "dirty": dirty}
    except (OSError, subprocess.CalledProcessError) as e:
        return {"sha": None, "dirty": None, "reason": f"git unavailable: {e.__class__.__name__}"}


def _version(dist: str) -> str | None:
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None


def cpu_info() -> dict[str, Any]:
    import psutil

    model = platform.processor() or None
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "model": model,
        "logical_cores": psutil.cpu_count(logical=True),
        "physical_cores": psutil.cpu_count(logical=False),
        "affinity_cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "memory_bytes": psutil.virtual_memory().total,
    }


def gpu_info() -> dict[str, Any]:
    """GPU facts from NVML. No driver (``nvmlInit`` raises) means "no GPU", recorded with the reason."""
    try:
        import pynvml
    except ImportError as e:
        return {"available": False, "reason": f"nvidia-ml-py not importable: {e}"}
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as e:
        return {"available": False, "reason": f"NVML init failed (no driver): {e}"}
    try:
        devices = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            mem = pynvml.nvmlDeviceGetMemoryInfo(h)
            name = pynvml.nvmlDeviceGetName(h)
            devices.append({
                "index": i,
                "name": name.decode() if isinstance(name, bytes) else name,
                "memory_total_bytes": int(mem.total),
                "sm_clock_max_mhz": pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_SM),
                "mem_clock_max_mhz": pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_MEM),
            })
        drv = pynvml.nvmlSystemGetDriverVersion()
        return {
            "available": True,
            "driver": drv.decode() if isinstance(drv, bytes) else drv,
            "devices": devices,
        }
    finally:
        pynvml.nvmlShutdown()


def collect() -> dict[str, Any]:
    """Everything ``env.json`` holds. Imports torch (and DALI if installed)."""
    import torch

    try:
        import nvidia.dali as dali

        dali_version: str | None = dali.__version__
    except ImportError:
        dali_version = None
    return {
        "schema_version": ENV_SCHEMA_VERSION,
        "git": git_info(),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "versions": {
            "inr-bench": _version("inr-bench"),
            "torch": torch.__version__,
            "torchvision": _version("torchvision"),
            "nvidia-dali": dali_version,
            "numpy": _version("numpy"),
            "pandas": _version("pandas"),
            "scikit-image": _version("scikit-image"),
            "cuda_runtime": torch.version.cuda,
            "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        },
        "torch_cuda_available": torch.cuda.is_available(),
        "torch_num_threads": torch.get_num_threads(),
        "pil": pil_info(),
        "cpu": cpu_info(),
        "gpu": gpu_info(),
    }
