"""NVML through a faked driver (the real ``pynvml`` module and its error classes, its calls replaced):
a MIG slice (utilization "Not Supported", memory readable), the UUID lookup with NVML's
``GPU-``/``MIG-`` spellings, no index fallback under ``CUDA_VISIBLE_DEVICES``, and ``env.json``'s
GPU facts when NVML refuses a field. Runs on the CPU: ``torch.cuda`` is faked where it is asked.
"""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
import torch

from bench import envinfo, results
from bench.harness import monitors
from bench.harness.monitors import NVML_METRICS, Monitor

pynvml = pytest.importorskip("pynvml")

TORCH_UUID = "5a1c0ffe-0000-4000-8000-00000000abcd"  # how torch prints a device's UUID: no prefix


class FakeNvml:
    """One device known to NVML by ``uuids``; memory used grows by 1 MiB per read."""

    def __init__(self, monkeypatch, uuids, util_error=None, clock_error=None):
        self.uuids, self.by_index, self.used = set(uuids), [], 100 * 2**20
        self.util_error, self.clock_error = util_error, clock_error
        for name in ("nvmlDeviceGetHandleByUUID", "nvmlDeviceGetHandleByIndex", "nvmlDeviceGetMemoryInfo",
                     "nvmlDeviceGetUtilizationRates", "nvmlDeviceGetCount", "nvmlDeviceGetName",
                     "nvmlDeviceGetMaxClockInfo", "nvmlSystemGetDriverVersion"):
            monkeypatch.setattr(pynvml, name, getattr(self, name))
        monkeypatch.setattr(pynvml, "nvmlInit", lambda: None)
        monkeypatch.setattr(pynvml, "nvmlShutdown", lambda: None)
        monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: SimpleNamespace(uuid=TORCH_UUID))
        monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # no synchronize: NVML is the subject
        monkeypatch.setattr(monitors, "_IDLE", {})  # a fresh process: no idle baseline yet

    def nvmlDeviceGetHandleByUUID(self, uuid):
        if uuid not in self.uuids:
            raise pynvml.NVMLError_NotFound()
        return ("uuid", uuid)

    def nvmlDeviceGetHandleByIndex(self, i):
        self.by_index.append(i)
        return ("index", i)

    def nvmlDeviceGetMemoryInfo(self, h):
        self.used += 2**20
        return SimpleNamespace(used=self.used, total=80 * 2**30)

    def nvmlDeviceGetUtilizationRates(self, h):
        if self.util_error is not None:
            raise self.util_error
        return SimpleNamespace(gpu=40)

    def nvmlDeviceGetCount(self):
        return 1

    def nvmlDeviceGetName(self, h):
        return b"NVIDIA H200 MIG 1g.18gb"

    def nvmlDeviceGetMaxClockInfo(self, h, which):
        if self.clock_error is not None:
            raise self.clock_error
        return 1980

    def nvmlSystemGetDriverVersion(self):
        return "580.1"


def _run_monitor(device="cuda:0"):
    mon = Monitor(device=device, period_s=0.02).start()
    mon.mark()
    time.sleep(0.15)
    return mon.stop()


@pytest.mark.parametrize("nvml_uuid", [f"MIG-{TORCH_UUID}", f"GPU-{TORCH_UUID}"])
def test_uuid_found_with_either_nvml_prefix_never_by_index(monkeypatch, nvml_uuid):
    fake = FakeNvml(monkeypatch, [nvml_uuid])
    nv = monitors._Nvml("cuda:0")
    assert nv.handle == ("uuid", nvml_uuid) and nv.reason is None
    assert fake.by_index == []
    nv.close()


def test_mig_slice_keeps_memory_and_drops_utilization_with_the_reason(monkeypatch):
    """MIG: utilization raises NVMLError_NotSupported at start, mark and in every sample; the
    memory metrics are still measured, utilization is absent with NVML's reason (never 0)."""
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    fake = FakeNvml(monkeypatch, [f"MIG-{TORCH_UUID}"], util_error=pynvml.NVMLError_NotSupported())
    res = _run_monitor()
    got = dict((m, v) for m, v, _ in res.metrics())
    assert fake.by_index == []  # the slice itself, not NVML index 0 (the parent GPU, or another one)
    assert got["gpu_mem_used_peak_bytes"] > got["gpu_mem_used_start_bytes"] > got["gpu_mem_idle_bytes"] > 0
    assert got["gpu_mem_over_idle_peak_bytes"] == got["gpu_mem_used_peak_bytes"] - got["gpu_mem_idle_bytes"]
    assert "gpu_util_mean_pct" not in got
    reasons = {m: r for m, _, r in res.unavailable}
    assert "Not Supported" in reasons["gpu_util_mean_pct"]
    assert not {m for m, _ in NVML_METRICS if m != "gpu_util_mean_pct"} & set(reasons)
    assert len(res.samples) >= 3 and all(s[3] is not None and s[4] is None for s in res.samples)


def test_idle_baseline_is_the_processs_first_start_kept_for_every_repeat(monkeypatch):
    """Repeat 1 starts after repeat 0's pipeline closed, with 512 MiB still held by a library
    (``empty_cache`` cannot return it): its baseline is still repeat 0's, so the kept memory counts."""
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    fake = FakeNvml(monkeypatch, [f"GPU-{TORCH_UUID}"])
    first = {m: v for m, v, _ in _run_monitor().metrics()}
    fake.used += 512 * 2**20
    second = {m: v for m, v, _ in _run_monitor().metrics()}
    assert second["gpu_mem_idle_bytes"] == first["gpu_mem_idle_bytes"]
    assert second["gpu_mem_used_start_bytes"] - first["gpu_mem_idle_bytes"] >= 512 * 2**20
    assert second["gpu_mem_over_idle_peak_bytes"] == second["gpu_mem_used_peak_bytes"] - first["gpu_mem_idle_bytes"]
    assert second["gpu_mem_over_idle_peak_bytes"] > 512 * 2**20


def test_no_uuid_match_under_cuda_visible_devices_is_unavailable_not_index(monkeypatch):
    """NVML's index ignores CUDA_VISIBLE_DEVICES: cuda:0 may be NVML's device 3. No match -> absent."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    fake = FakeNvml(monkeypatch, ["GPU-some-other-device"])
    res = _run_monitor()
    assert fake.by_index == []
    assert not {m for m, _, _ in res.metrics()} & {m for m, _ in NVML_METRICS}
    reasons = {m: r for m, _, r in res.unavailable}
    assert all("CUDA_VISIBLE_DEVICES" in reasons[m] for m, _ in NVML_METRICS)


@pytest.mark.parametrize(("visible", "order", "handle"), [
    ("3", "PCI_BUS_ID", ("index", 3)),  # NVML counts in PCI bus order: so does CUDA under this order
    ("1,GPU-known", None, ("uuid", "GPU-known")),  # cuda:1 is the second entry, a UUID NVML knows
    ("3", None, None),  # CUDA's default order (fastest first) need not be NVML's: no guess
])
def test_without_a_torch_uuid_cuda_visible_devices_names_the_gpu(monkeypatch, visible, order, handle):
    """Older torch has no device UUID: the GPU is CUDA_VISIBLE_DEVICES's entry for it, when that entry
    names one NVML device for sure; otherwise the NVML metrics are absent, never another GPU's."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    if order is None:
        monkeypatch.delenv("CUDA_DEVICE_ORDER", raising=False)
    else:
        monkeypatch.setenv("CUDA_DEVICE_ORDER", order)
    FakeNvml(monkeypatch, ["GPU-known"])
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: SimpleNamespace())  # no .uuid
    nv = monitors._Nvml("cuda:1" if "," in visible else "cuda:0")
    assert nv.handle == handle
    assert (nv.reason is None) is (handle is not None)
    nv.close()


def test_no_uuid_match_without_cuda_visible_devices_falls_back_to_the_index(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    fake = FakeNvml(monkeypatch, [])
    nv = monitors._Nvml("cuda:0")
    assert nv.handle == ("index", 0) and fake.by_index == [0]
    nv.close()


def test_env_json_records_nvml_field_errors_and_is_written(monkeypatch, tmp_path):
    """A field NVML refuses is None with its error; env.json is still written (the run's rows follow it)."""
    FakeNvml(monkeypatch, [], clock_error=pynvml.NVMLError_NotSupported())
    gpu = envinfo.gpu_info()
    assert gpu["available"] and gpu["driver"] == "580.1"
    (dev,) = gpu["devices"]
    assert dev["memory_total_bytes"] == 80 * 2**30 and dev["name"] == "NVIDIA H200 MIG 1g.18gb"
    assert dev["sm_clock_max_mhz"] is None and dev["mem_clock_max_mhz"] is None
    assert dev["errors"] == {"sm_clock_max_mhz": "Not Supported", "mem_clock_max_mhz": "Not Supported"}
    path = results.write_env(tmp_path)
    assert path.exists() and '"Not Supported"' in path.read_text()
