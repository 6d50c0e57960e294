"""Resource monitors sampled by a background thread around a measured region (CPU, RSS/PSS, NVML, CUDA
allocator); an unreadable metric is absent with the reason, never 0 (docs/measurement.md).
Use: ``mon = Monitor(...).start(); mon.mark(); res = mon.stop(); res.metrics(), res.unavailable``."""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import psutil

NVML_METRICS = (("gpu_mem_used_peak_bytes", "bytes"), ("gpu_mem_used_start_bytes", "bytes"),
                ("gpu_util_mean_pct", "%"), ("gpu_mem_idle_bytes", "bytes"),
                ("gpu_mem_over_idle_peak_bytes", "bytes"))
TORCH_METRICS = (("torch_peak_allocated_bytes", "bytes"), ("torch_peak_reserved_bytes", "bytes"))
# NVML "used" at a run's first ``Monitor.start`` on each GPU (``_Nvml.key``): the idle baseline, kept for
# every repeat so memory libraries keep after a pipeline closes (nvJPEG, cuBLAS) counts in each
_IDLE: dict[str, int] = {}


def forget_idle() -> None:
    """Drop the idle baselines (``run_bench`` calls it first: a run's repeats share one)."""
    _IDLE.clear()


def _tree(root: Any) -> list[Any]:
    procs = [root]
    try:
        procs += root.children(recursive=True)
    except psutil.Error:
        pass
    return procs


def _pss(pid: int) -> int | None:
    """Proportional set size of ``pid`` in bytes (``smaps_rollup``), None if unreadable."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        return None
    return None


def _tree_pss(root: Any) -> int | None:
    vals = [_pss(p.pid) for p in _tree(root)]
    if vals[0] is None:  # not even our own: no smaps_rollup here (not Linux, or too old a kernel)
        return None
    return sum(v for v in vals if v is not None)


def _tree_cpu_rss(root: Any) -> tuple[float, int, int]:
    """(cpu seconds, rss bytes, process count) summed over ``root`` and its live descendants."""
    cpu, rss, n = 0.0, 0, 0
    procs = _tree(root)
    for p in procs:
        try:
            with p.oneshot():
                t = p.cpu_times()
                m = p.memory_info()
        except psutil.Error:  # exited between listing and reading: its time is in the parent soon
            continue
        cpu += t.user + t.system + getattr(t, "children_user", 0.0) + getattr(t, "children_system", 0.0)
        rss += m.rss
        n += 1
    return cpu, rss, n


class _Nvml:
    """A handle on one GPU through NVML (by UUID; never a guessed index under ``CUDA_VISIBLE_DEVICES``),
    or ``reason`` why there is none. ``errors``: each field's last NVML error (MIG: no utilization)."""

    FIELDS = ("memory", "utilization")

    def __init__(self, device: str):
        self.handle: Any = None
        self.reason: str | None = None
        self.key: str | None = None  # its UUID or NVML index: the idle baseline's key
        self.errors: dict[str, str] = {}
        self._pynvml: Any = None
        import torch

        dev = torch.device(device)
        if dev.type != "cuda":
            self.reason = f"device is {dev.type}, not cuda: no GPU metrics"
            return
        try:
            import pynvml
        except ImportError as e:
            self.reason = f"nvidia-ml-py not importable: {e}"
            return
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as e:
            self.reason = f"NVML init failed (no driver): {e}"
            return
        self._pynvml = pynvml
        idx = dev.index if dev.index is not None else torch.cuda.current_device()
        uuid = None
        try:
            uuid = str(torch.cuda.get_device_properties(idx).uuid)
        except Exception:
            pass
        bare = uuid[4:] if uuid and uuid.startswith(("GPU-", "MIG-")) else uuid
        for u in dict.fromkeys((uuid, f"GPU-{bare}", f"MIG-{bare}")) if uuid else ():  # NVML's spellings
            try:
                self.handle, self.key = pynvml.nvmlDeviceGetHandleByUUID(u), u
                return
            except pynvml.NVMLError:
                pass
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        if visible is not None:
            entries = [e.strip() for e in visible.split(",") if e.strip()]  # indices or UUIDs
            entry = entries[idx] if 0 <= idx < len(entries) else None
            try:  # a number is NVML's index only in PCI bus order
                if entry is not None and entry.isdigit() and os.environ.get("CUDA_DEVICE_ORDER") == "PCI_BUS_ID":
                    self.handle, self.key = pynvml.nvmlDeviceGetHandleByIndex(int(entry)), f"index:{entry}"
                    return
                if entry is not None and not entry.isdigit():
                    self.handle, self.key = pynvml.nvmlDeviceGetHandleByUUID(entry), entry
                    return
            except pynvml.NVMLError:
                pass
            self.reason = (f"NVML has no device with the UUID of cuda:{idx} ({uuid}) or CUDA_VISIBLE_DEVICES's entry "
                           f"for it ({entry}; a number is NVML's index only with CUDA_DEVICE_ORDER=PCI_BUS_ID): "
                           f"NVML's index {idx} may be another GPU")
            self.close()
            return
        try:
            self.handle, self.key = pynvml.nvmlDeviceGetHandleByIndex(idx), f"index:{idx}"
        except pynvml.NVMLError as e:
            self.reason = f"NVML has no handle for cuda:{idx}: {e}"
            self.close()

    def sample(self) -> tuple[int | None, int | None]:
        """(memory used bytes, GPU utilization %), each None when NVML refuses it (``errors`` says why)."""
        p = self._pynvml
        reads = (lambda h: p.nvmlDeviceGetMemoryInfo(h).used, lambda h: p.nvmlDeviceGetUtilizationRates(h).gpu)
        out: list[int | None] = []
        for name, read in zip(self.FIELDS, reads, strict=True):
            try:
                out.append(int(read(self.handle)))
            except p.NVMLError as e:
                self.errors[name] = str(e)
                out.append(None)
        return out[0], out[1]

    def close(self) -> None:
        if self._pynvml is not None:
            try:
                self._pynvml.nvmlShutdown()
            except Exception:
                pass
            self._pynvml = None
            self.handle = None


def _system_busy_seconds() -> float | None:
    """Busy CPU seconds so far (all but idle and iowait) over the CPUs this process may run on, or None."""
    try:
        per = psutil.cpu_times(percpu=True)
        cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else range(len(per))
        total = 0.0
        for i in cpus:
            if i < len(per):
                t = per[i]
                total += sum(t) - t.idle - getattr(t, "iowait", 0.0)
        return total
    except (OSError, AttributeError, RuntimeError):
        return None


OTHER_MIN_WALL_S = 0.5  # the CPU counters tick every 10 ms: shorter regions read mostly rounding


def other_busy(system_busy_s: float, tree_cpu_s: float, wall_s: float) -> float:
    """Cores kept busy outside the tree: (system busy seconds - the tree's) / wall, clipped at 0."""
    return max(0.0, (system_busy_s - tree_cpu_s) / wall_s)


@dataclass
class MonitorResult:
    """What a ``Monitor`` saw over [mark, stop]; ``samples``: per period ``(t_s, cores_busy, rss bytes,
    nvml_used_bytes or None, gpu_util_pct or None)``."""

    wall_s: float
    cpu_seconds: float  # the tree's CPU over the region, the monitor's own CPU excluded
    rss_peak_bytes: int
    cores_busy_max: float
    monitor_cpu_seconds: float = 0.0
    pss_peak_bytes: int | None = None
    samples: list[tuple[float, float, int, int | None, int | None]] = field(default_factory=list)
    nvml: dict[str, float] = field(default_factory=dict)
    torch_cuda: dict[str, float] = field(default_factory=dict)
    unavailable: list[tuple[str, str, str]] = field(default_factory=list)
    other_cores_busy: float | None = None  # cores busy outside the tree, on this process's CPUs

    @property
    def cores_busy(self) -> float:
        return self.cpu_seconds / self.wall_s if self.wall_s > 0 else float("nan")

    def metrics(self) -> list[tuple[str, float, str]]:
        out = [
            ("cpu_cores_busy", self.cores_busy, "cores"),
            ("cpu_cores_busy_max", self.cores_busy_max, "cores"),
            ("cpu_seconds", self.cpu_seconds, "s"),
            ("host_rss_peak_bytes", float(self.rss_peak_bytes), "bytes"),
            ("monitor_cpu_seconds", self.monitor_cpu_seconds, "s"),
        ]
        if self.pss_peak_bytes is not None:
            out.append(("host_pss_peak_bytes", float(self.pss_peak_bytes), "bytes"))
        if self.other_cores_busy is not None:
            out.append(("other_cores_busy", self.other_cores_busy, "cores"))
        units = dict(NVML_METRICS + TORCH_METRICS)
        out += [(k, v, units[k]) for k, v in {**self.nvml, **self.torch_cuda}.items()]
        return out


class Monitor:
    """Samples the process tree of ``pid`` (default: this process) every ``period_s`` seconds."""

    def __init__(self, device: str = "cpu", period_s: float = 0.1, pid: int | None = None,
                 pss_period_s: float = 1.0):
        if period_s <= 0 or pss_period_s <= 0:
            raise ValueError(f"periods must be > 0, got {period_s}, {pss_period_s}")
        self.pss_period_s = pss_period_s
        self.device = device
        self.period_s = period_s
        self._proc = psutil.Process(pid or os.getpid())
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._nvml: _Nvml | None = None

    def start(self) -> Monitor:
        import torch

        if self._thread is not None:
            raise RuntimeError("monitor already started")
        self._nvml = _Nvml(self.device)
        self._cuda = torch.device(self.device).type == "cuda" and torch.cuda.is_available()
        if self._cuda:
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        self._samples: list[tuple[float, float, int, int | None, int | None]] = []
        self._nvml_start = self._nvml.sample() if self._nvml.handle is not None else (None, None)
        self._nvml_idle = self._nvml_start[0]
        if self._nvml_idle is not None and self._nvml.key is not None:
            self._nvml_idle = _IDLE.setdefault(self._nvml.key, self._nvml_idle)
        self._lock = threading.Lock()
        self._own_cpu0 = 0.0
        self._t0 = time.perf_counter()
        self._own_cpu = 0.0
        self._pss_peak = _tree_pss(self._proc)
        self._pss_next = self._t0 + self.pss_period_s
        self._cpu0, rss, _ = _tree_cpu_rss(self._proc)
        self._sys0 = _system_busy_seconds()
        self._rss_peak = rss
        self._last = (self._t0, self._cpu0)
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="inrbench-monitor", daemon=True)
        self._thread.start()
        return self

    def mark(self) -> Monitor:
        """Begin the measured region now (one CPU/RSS reading): samples and peaks restart, the idle baseline stays."""
        import torch

        if self._thread is None:
            raise RuntimeError("monitor not started")
        if self._cuda:
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        with self._lock:
            now = time.perf_counter()
            cpu, rss, _ = _tree_cpu_rss(self._proc)
            cpu -= self._own_cpu
            self._samples = []
            self._nvml_start = self._nvml.sample() if self._nvml is not None and self._nvml.handle is not None else (None, None)
            self._t0 = now
            self._own_cpu0 = self._own_cpu
            self._cpu0 = cpu
            self._sys0 = _system_busy_seconds()
            self._last = (now, cpu)
            self._rss_peak = rss
            if self._pss_peak is not None:
                self._pss_peak = 0
                self._pss_next = now  # the sampler thread reads it at its next tick
        return self

    def _sample(self) -> None:
        with self._lock:
            if self._pss_peak is not None and time.perf_counter() >= self._pss_next:
                c0 = time.thread_time()
                self._pss_next += self.pss_period_s
                self._pss_peak = max(self._pss_peak, _tree_pss(self._proc) or 0)
                self._own_cpu += time.thread_time() - c0  # before the CPU reading that subtracts it
            c0 = time.thread_time()
            self._sample_cpu()
            self._own_cpu += time.thread_time() - c0

    def _sample_cpu(self) -> None:
        now = time.perf_counter()
        cpu, rss, _ = _tree_cpu_rss(self._proc)
        cpu -= self._own_cpu  # the monitor's own work so far is not the workload's
        t_prev, cpu_prev = self._last
        busy = (cpu - cpu_prev) / (now - t_prev) if now > t_prev else 0.0
        self._last = (now, cpu)
        self._rss_peak = max(self._rss_peak, rss)
        used = util = None
        if self._nvml is not None and self._nvml.handle is not None:
            try:
                used, util = self._nvml.sample()
            except Exception:
                pass
        self._samples.append((now - self._t0, busy, rss, used, util))

    def _loop(self) -> None:
        next_t = time.perf_counter() + self.period_s
        while not self._stop.wait(max(0.0, next_t - time.perf_counter())):
            self._sample()
            next_t += self.period_s
            now = time.perf_counter()
            if next_t < now:  # fell behind (a loaded machine): skip missed ticks, keep the grid
                next_t += self.period_s * (1 + int((now - next_t) / self.period_s))

    def stop(self) -> MonitorResult:
        import torch

        if self._thread is None:
            raise RuntimeError("monitor not started")
        self._stop.set()
        self._thread.join()
        self._thread = None
        if self._pss_peak is not None:
            self._pss_next = time.perf_counter()  # one last PSS reading at the end
        self._sample()  # the tail interval, so the region is covered end to end
        sys_end = _system_busy_seconds()
        t_end, cpu_end = self._last
        res = MonitorResult(
            wall_s=t_end - self._t0,
            cpu_seconds=cpu_end - self._cpu0,
            rss_peak_bytes=self._rss_peak,
            cores_busy_max=max((s[1] for s in self._samples), default=float("nan")),
            samples=list(self._samples),
            monitor_cpu_seconds=self._own_cpu - self._own_cpu0,
            pss_peak_bytes=self._pss_peak,
        )
        if self._sys0 is None or sys_end is None:
            res.unavailable.append(("other_cores_busy", "cores", "no per-CPU counters here (psutil.cpu_times)"))
        elif res.wall_s < OTHER_MIN_WALL_S:
            res.unavailable.append(("other_cores_busy", "cores", f"measured region {res.wall_s:.2f} s, under "
                                    f"{OTHER_MIN_WALL_S} s: too short to tell other load from the counters' ticks"))
        else:
            res.other_cores_busy = other_busy(sys_end - self._sys0, res.cpu_seconds + res.monitor_cpu_seconds,
                                              res.wall_s)
        if self._pss_peak is None:
            res.unavailable.append(("host_pss_peak_bytes", "bytes", "no /proc/PID/smaps_rollup here (Linux only)"))
        nv = self._nvml
        assert nv is not None
        if nv.handle is not None:
            used = [s[3] for s in self._samples if s[3] is not None]
            util = [s[4] for s in self._samples if s[4] is not None]
            if self._nvml_start[0] is not None:
                res.nvml["gpu_mem_used_start_bytes"] = float(self._nvml_start[0])
                used.append(self._nvml_start[0])
            if used:
                res.nvml["gpu_mem_used_peak_bytes"] = float(max(used))
                if self._nvml_idle is not None:
                    res.nvml["gpu_mem_idle_bytes"] = float(self._nvml_idle)
                    res.nvml["gpu_mem_over_idle_peak_bytes"] = float(max(used) - self._nvml_idle)
            if util:
                res.nvml["gpu_util_mean_pct"] = float(sum(util) / len(util))
            for m, u in NVML_METRICS:
                if m not in res.nvml:
                    err = nv.errors.get("utilization" if m == "gpu_util_mean_pct" else "memory")
                    res.unavailable.append((m, u, f"every NVML sample failed: {err}" if err else "every NVML sample failed"))
        else:
            res.unavailable += [(m, u, nv.reason or "NVML unavailable") for m, u in NVML_METRICS]
        nv.close()
        if self._cuda:
            torch.cuda.synchronize(self.device)
            res.torch_cuda = {
                "torch_peak_allocated_bytes": float(torch.cuda.max_memory_allocated(self.device)),
                "torch_peak_reserved_bytes": float(torch.cuda.max_memory_reserved(self.device)),
            }
        else:
            res.unavailable += [(m, u, f"device {self.device} is not cuda: no torch allocator stats")
                                for m, u in TORCH_METRICS]
        return res

    def close(self) -> None:
        """Stop the sampler thread if it runs (a failed region), discarding its result. Idempotent."""
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
        if self._nvml is not None:
            self._nvml.close()

    def __enter__(self) -> Monitor:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        if self._thread is not None:
            self.result = self.stop()
