"""Run metadata (``env.json``): commit, code identity, library versions, which PIL and JPEG decoder, CPU, GPU.
``code_identity()`` ties a result to the package files and library versions that produced it (a sweep
cell's identity includes it). An absent fact is recorded with the reason, never as a zero.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata as md
import json
import os
import platform
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import PIL
import psutil
from PIL import features

ENV_SCHEMA_VERSION = 1


def cuda_mismatch(versions: dict[str, Any]) -> str | None:
    """A warning when DALI and torch were built for different CUDA majors (``versions`` as in ``collect()``):
    both run under one driver, but their GPU decoders come from different CUDA releases. Else None."""
    torch_cuda, dali_cuda = versions.get("cuda_runtime"), versions.get("dali_cuda")
    if not torch_cuda or not dali_cuda:
        return None
    major = [str(v).split(".")[0] for v in (torch_cuda, dali_cuda)]
    if major[0] == major[1]:
        return None
    return (f"DALI is built for CUDA {dali_cuda}, torch for CUDA {torch_cuda}: install the DALI wheel of "
            f"torch's CUDA major (nvidia-dali-cuda{major[0]}0; docs/gpu-machines.md)")


def dali_stack_mismatch(names: list[str] | None = None) -> str | None:
    """A warning when the installed DALI wheels and their nvImageCodec / nvCOMP libraries are of different
    CUDA majors (``names``: distribution names; default: this environment's): they share folders. Else None."""
    if names is None:
        from pipelines.base import installed_distributions  # imports torch (the pipelines package)

        names = list(installed_distributions())
    names = sorted({n.lower().replace("_", "-") for n in names})
    dali = {m.group(1) for n in names if (m := re.fullmatch(r"nvidia-dali-cuda(\d+)0", n))}
    libs = {n: m.group(1) for n in names if (m := re.fullmatch(r"nvidia-(?:nvimgcodec|libnvcomp)-cu(\d+)", n))}
    other = sorted(n for n, major in libs.items() if major not in dali)
    if not dali or (len(dali) == 1 and not other):
        return None
    found = ", ".join([f"nvidia-dali-cuda{m}0" for m in sorted(dali)] + other)
    return (f"DALI's CUDA builds are mixed ({found}): they share folders, so its GPU decoder may load another "
            "CUDA's library; uninstall all but one CUDA major's (docs/gpu-machines.md)")


def torch_nvjpeg_decoder() -> dict[str, Any]:
    """Which library ``torch-nvjpeg`` decodes with here (``jpeg_decoder().info()``), or why none can."""
    from pipelines.base import Unavailable
    from pipelines.torch_nvjpeg import jpeg_decoder

    try:
        return jpeg_decoder().info()
    except Unavailable as e:
        return {"available": False, "library": None, "reason": str(e)}


PACKAGE_DIRS = ("bench", "pipelines", "inr")
REPO_ROOT = Path(__file__).resolve().parent.parent


def _git(args: list[str], cwd: Path) -> bytes:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, check=True).stdout


def git_info(cwd: str | Path | None = None) -> dict[str, Any]:
    """``{"sha", "dirty"}`` of the checkout (tracked files), or why git cannot say."""
    cwd = Path(cwd or REPO_ROOT)
    try:
        return {"sha": _git(["rev-parse", "HEAD"], cwd).decode().strip(),
                "dirty": bool(_git(["status", "--porcelain", "--untracked-files=no"], cwd).strip())}
    except (OSError, subprocess.CalledProcessError) as e:
        return {"sha": None, "dirty": None, "reason": f"git unavailable: {e.__class__.__name__}"}


def code_version(root: str | Path | None = None) -> dict[str, Any]:
    """``{"id", "label", "commit", "dirty", "source"}`` of the package folders under ``root``: ``id`` changes
    exactly when a package file changes (committed or not); ``label`` is for people."""
    root = Path(root or REPO_ROOT)
    h = hashlib.sha256()
    try:
        commit = _git(["rev-parse", "HEAD"], root).decode().strip()
        if _git(["rev-parse", "--show-toplevel"], root).decode().strip() != str(root.resolve()):
            raise subprocess.CalledProcessError(1, "git")  # the package is not the checkout's root
        for d in PACKAGE_DIRS:
            h.update(_git(["rev-parse", f"HEAD:{d}"], root))
        diff = _git(["diff", "HEAD", "--binary", "--", *PACKAGE_DIRS], root)
        untracked = [u for u in _git(["ls-files", "--others", "--exclude-standard", "-z", "--", *PACKAGE_DIRS],
                                     root).decode().split("\0") if u]
        h.update(diff)
        for u in sorted(untracked):
            h.update(u.encode() + b"\0")
            h.update((root / u).read_bytes() if (root / u).is_file() else b"")
        dirty = bool(diff or untracked)
        cid = h.hexdigest()[:12]
        label = f"{commit[:10]} + uncommitted {cid[:8]}" if dirty else f"{commit[:10]} (clean)"
        return {"id": cid, "label": label, "commit": commit, "dirty": dirty, "source": "git"}
    except (OSError, subprocess.CalledProcessError):
        pass
    for f in sorted(p for d in PACKAGE_DIRS for p in (root / d).rglob("*")
                    if p.is_file() and "__pycache__" not in p.parts and p.suffix not in (".pyc", ".pyo")):
        h.update(str(f.relative_to(root)).encode() + b"\0")
        h.update(f.read_bytes())
    cid = h.hexdigest()[:12]
    return {"id": cid, "label": f"package files {cid[:8]}", "commit": None, "dirty": None, "source": "files"}


def pipeline_libraries() -> dict[str, dict[str, str | None]]:
    """``{pipeline: {library: version}}`` of every registered pipeline (``Pipeline.libraries``)."""
    import pipelines

    return {name: dict(pipelines.pipeline_class(name).libraries()) for name in pipelines.names()}


def library_versions() -> dict[str, str | None]:
    """torch's version and those of every library a registered pipeline names, from package metadata;
    two pipelines naming one library with different strings: both, ``" | "``-joined."""
    out: dict[str, str | None] = {"torch": _version("torch")}
    for libs in pipeline_libraries().values():
        for lib, version in libs.items():
            if lib in out and out[lib] != version:
                version = " | ".join(sorted({str(out[lib]), str(version)}))
            out[lib] = version
    return out


def code_identity(root: str | Path | None = None) -> dict[str, Any]:
    """``{"id", "code": code_version(), "libraries": library_versions()}``; ``id`` hashes both."""
    code, libs = code_version(root), library_versions()
    ident = hashlib.sha256(json.dumps([code["id"], libs], sort_keys=True).encode()).hexdigest()[:12]
    return {"id": ident, "code": code, "libraries": libs}


def _version(dist: str) -> str | None:
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None


def _dali_init() -> str:
    """The text of ``nvidia/dali/__init__.py`` (version, CUDA build), read without importing DALI: its
    import starts threads and costs every run half a second. ``""`` if DALI is not installed."""
    import importlib.util

    try:
        spec = importlib.util.find_spec("nvidia.dali")
        return Path(spec.origin).read_text() if spec and spec.origin else ""
    except (ImportError, ValueError, OSError):
        return ""


def gpu_info() -> dict[str, Any]:
    """GPU facts from NVML ("no GPU" with the reason when it cannot start). Each field is read on its own:
    one NVML refuses is None with its error under ``errors``, so writing ``env.json`` never fails a run."""
    try:
        import pynvml
    except ImportError as e:
        return {"available": False, "reason": f"nvidia-ml-py not importable: {e}"}
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as e:
        return {"available": False, "reason": f"NVML init failed (no driver): {e}"}

    def read(errors: dict[str, str], name: str, fn: Any, *args: Any) -> Any:
        try:
            v = fn(*args)
        except pynvml.NVMLError as e:
            errors[name] = str(e)
            return None
        return v.decode() if isinstance(v, bytes) else v

    try:
        errors: dict[str, str] = {}
        devices = []
        for i in range(read(errors, "count", pynvml.nvmlDeviceGetCount) or 0):
            dev_errors: dict[str, str] = {}
            dev: dict[str, Any] = {"index": i}
            h = read(dev_errors, "handle", pynvml.nvmlDeviceGetHandleByIndex, i)
            if h is not None:
                mem = read(dev_errors, "memory_total_bytes", pynvml.nvmlDeviceGetMemoryInfo, h)
                dev["name"] = read(dev_errors, "name", pynvml.nvmlDeviceGetName, h)
                dev["memory_total_bytes"] = int(mem.total) if mem is not None else None
                for key, clock in (("sm_clock_max_mhz", pynvml.NVML_CLOCK_SM), ("mem_clock_max_mhz", pynvml.NVML_CLOCK_MEM)):
                    dev[key] = read(dev_errors, key, pynvml.nvmlDeviceGetMaxClockInfo, h, clock)
            devices.append({**dev, "errors": dev_errors} if dev_errors else dev)
        out = {"available": True, "driver": read(errors, "driver", pynvml.nvmlSystemGetDriverVersion), "devices": devices}
        return {**out, "errors": errors} if errors else out
    finally:
        with contextlib.suppress(pynvml.NVMLError):
            pynvml.nvmlShutdown()


def collect(distributed: dict[str, Any] | None = None) -> dict[str, Any]:
    """Everything ``env.json`` holds, of the writing process (rank 0); imports torch (and TorchCodec;
    DALI is read, not imported). ``distributed``: a data-parallel run's shape (``{"world_size": 1}`` for one process)."""
    import torch

    from pipelines.base import installed_distributions

    dali_init = _dali_init()
    m = re.search(r"^__version__\s*=\s*['\"]([^'\"]+)['\"]", dali_init, re.M)
    dali_version = m.group(1) if m else None
    # the CUDA DALI was built with: the line DALI keeps it on (``__cuda_version__ = int('12.9.86'...``),
    # else the major in its wheel's name (nvidia-dali-cuda120)
    m = re.search(r"__cuda_version__\s*=\s*int\('([0-9.]+)'", dali_init)
    dali_cuda = m.group(1) if m else dali_version and next((w.group(1) for n in installed_distributions() if (w := re.fullmatch(
        r"nvidia-dali-cuda(\d\d)\d", n))), None)
    cpu_model = platform.processor() or None
    with contextlib.suppress(OSError):
        cpu_model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                          if line.startswith("model name")), cpu_model)
    info = {
        "schema_version": ENV_SCHEMA_VERSION,
        "git": git_info(),
        "code": code_identity(),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "versions": {
            **{d: _version(d) for d in ("inr-bench", "torchvision", "torchcodec", "numpy", "pandas", "scikit-image")},
            "torch": torch.__version__,
            "nvidia-dali": dali_version,
            "cuda_runtime": torch.version.cuda,  # the CUDA torch was built with
            "dali_cuda": dali_cuda if dali_version else None,  # the CUDA the DALI build was built with
            "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        },
        "torch_cuda_available": torch.cuda.is_available(),
        "torch_num_threads": torch.get_num_threads(),
        "pil": {  # which PIL torch-jpeg decodes with
            "flavor": "pillow-simd" if _version("pillow-simd") else "Pillow",
            "version": PIL.__version__,
            "libjpeg": features.version("jpg"),  # the libjpeg API version (6.2 for libjpeg-turbo's default)
            "libjpeg_turbo": bool(features.check_feature("libjpeg_turbo")),
            "libjpeg_turbo_version": features.version("libjpeg_turbo"),
            "module_path": str(Path(PIL.__file__).parent),
        },
        "pipelines": pipeline_libraries(),  # {pipeline: {library: version}}
        "torch_nvjpeg": torch_nvjpeg_decoder(),  # the JPEG decoder torch-nvjpeg uses
        "cpu": {"model": cpu_model, "logical_cores": psutil.cpu_count(logical=True),
                "physical_cores": psutil.cpu_count(logical=False),
                "affinity_cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
                "memory_bytes": psutil.virtual_memory().total},
        "gpu": gpu_info(),
        "distributed": dict(distributed) if distributed else {"world_size": 1},
    }
    info["warnings"] = [w for w in (cuda_mismatch(info["versions"]), dali_stack_mismatch()) if w]
    return info
