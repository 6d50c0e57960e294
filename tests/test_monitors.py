"""Monitors: a child burning one core reads ~1 core busy; reaped workers' CPU time still counts.

Tolerance: 0.6 .. 1.4 cores busy for one burning child, and within 0.15 cores of the
kernel's own rusage accounting (the machine has 2 cores shared with other jobs, so the
child may get less than a core; the rusage comparison holds regardless).
"""

from __future__ import annotations

import multiprocessing as mp
import resource
import time

import pytest

from bench.harness.monitors import NVML_METRICS, Monitor


def _burn(seconds: float) -> None:
    end = time.perf_counter() + seconds
    x = 0
    while time.perf_counter() < end:
        x += 1


def _burn_cpu(cpu_seconds: float) -> None:
    end = time.process_time() + cpu_seconds
    x = 0
    while time.process_time() < end:
        x += 1


def _rusage_cpu() -> float:
    """CPU seconds of this process + its reaped children, from the kernel (independent truth)."""
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime


def test_child_burning_one_core_reads_about_one_core():
    """The monitor's cores-busy equals the kernel's own accounting within 0.15 cores, and is
    ~1 core (0.6 .. 1.4) whenever the kernel says the child got its core. When other jobs
    steal the CPU (2 shared cores) the child gets less, and only the accounting check applies.
    """
    ctx = mp.get_context("fork")
    cpu0 = _rusage_cpu()
    t0 = time.perf_counter()
    mon = Monitor(device="cpu", period_s=0.05).start()
    child = ctx.Process(target=_burn, args=(1.5,))
    child.start()
    child.join()
    res = mon.stop()
    t1 = time.perf_counter()
    # the kernel's figure, less the monitor's own reads (which the monitor excludes by design)
    truth = (_rusage_cpu() - cpu0 - res.monitor_cpu_seconds) / res.wall_s
    # the region holds the child's 1.5 s and lies inside this thread's own clock around it (forking and joining
    # take longer on a busy machine: no fixed upper bound)
    assert 1.4 < res.wall_s <= t1 - t0, (res.wall_s, t1 - t0)
    assert abs(res.cores_busy - truth) <= 0.15, (res.cores_busy, truth)
    if truth >= 0.8:  # the child got (nearly) its core: the headline reading
        assert 0.6 <= res.cores_busy <= 1.4, res.cores_busy
    # else: other jobs took the cores; the accounting check above is the one that holds
    busy = sorted(s[1] for s in res.samples)
    assert len(busy) >= 10
    assert res.rss_peak_bytes > 10 * 2**20  # this python + torch at least
    names = {m for m, _, _ in res.metrics()}
    assert {"cpu_cores_busy", "cpu_cores_busy_max", "cpu_seconds", "host_rss_peak_bytes"} <= names


def test_exited_worker_cpu_time_is_counted():
    """A worker that finishes and is reaped inside the region: its CPU seconds still count."""
    ctx = mp.get_context("fork")
    mon = Monitor(device="cpu", period_s=0.05).start()
    child = ctx.Process(target=_burn_cpu, args=(0.8,))
    child.start()
    child.join()
    time.sleep(0.2)
    res = mon.stop()
    assert 0.75 <= res.cpu_seconds <= 1.3, res.cpu_seconds


def test_idle_reads_near_zero_and_gpu_metrics_absent_with_reason():
    mon = Monitor(device="cpu", period_s=0.05).start()
    time.sleep(0.5)
    res = mon.stop()
    assert res.cores_busy < 0.3
    names = {m for m, _, _ in res.metrics()}
    assert not names & {m for m, _ in NVML_METRICS}  # absent, never zeros
    reasons = {m: r for m, _, r in res.unavailable}
    assert "cpu" in reasons["gpu_mem_used_peak_bytes"]
    assert "torch_peak_allocated_bytes" in reasons


def test_bad_period_and_double_start():
    with pytest.raises(ValueError):
        Monitor(period_s=0)
    mon = Monitor(period_s=0.05).start()
    with pytest.raises(RuntimeError):
        mon.start()
    mon.stop()


def test_no_driver_nvml_gives_reason_not_handle():
    pynvml = pytest.importorskip("pynvml")
    try:
        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
        pytest.skip("an NVIDIA driver is present: the no-driver path cannot be exercised here")
    except pynvml.NVMLError:
        pass
    from bench.harness.monitors import _Nvml

    nv = _Nvml("cuda:0")
    assert nv.handle is None and "NVML init failed" in nv.reason


def _sleep(seconds: float) -> None:
    time.sleep(seconds)


def test_pss_counts_shared_pages_once_and_monitor_cost_is_excluded():
    """A forked idle child shares its parent's pages: the RSS sum double-counts them, PSS does not.
    PSS is read every 0.1 s here (expensive); that cost is the monitor's, not the workload's."""
    child = mp.get_context("fork").Process(target=_sleep, args=(1.5,))
    child.start()
    try:
        time.sleep(0.2)
        res = Monitor(device="cpu", period_s=0.05, pss_period_s=0.1).start()
        time.sleep(0.8)
        res = res.stop()
    finally:
        child.join()
    assert res.pss_peak_bytes is not None and res.pss_peak_bytes > 10 * 2**20
    assert res.pss_peak_bytes < 0.8 * res.rss_peak_bytes, (res.pss_peak_bytes, res.rss_peak_bytes)
    assert res.monitor_cpu_seconds > 0.0
    assert res.cores_busy < 0.3, res.cores_busy  # both processes sleep; the monitor's reads excluded


def test_other_busy_arithmetic():
    from bench.harness.monitors import other_busy

    assert other_busy(system_busy_s=3.0, tree_cpu_s=1.0, wall_s=2.0) == pytest.approx(1.0)
    assert other_busy(system_busy_s=0.99, tree_cpu_s=1.0, wall_s=2.0) == 0.0  # counter jitter, not < 0


def test_other_cores_busy_sees_a_process_outside_the_tree(tmp_path):
    """A busy loop started outside this process tree (re-parented away from us) shows as other
    load while the measured region only sleeps; the tree itself reads ~0 cores busy."""
    import subprocess
    import sys

    pid_file = tmp_path / "pid"
    code = "import os, time\nend = time.time() + 4\nwhile time.time() < end: pass"
    subprocess.run(["bash", "-c", f'{sys.executable} -c "{code}" > /dev/null 2>&1 & echo $! > {pid_file}'],
                   check=True)  # bash exits at once: the loop is nobody's child in our tree
    try:
        time.sleep(0.3)
        mon = Monitor("cpu", period_s=0.05).start()
        mon.mark()
        time.sleep(1.5)
        res = mon.stop()
    finally:
        import os
        import signal

        try:
            os.kill(int(pid_file.read_text()), signal.SIGKILL)
        except (OSError, ValueError):
            pass
    assert res.cores_busy < 0.2
    assert res.other_cores_busy is not None and res.other_cores_busy > 0.5, res.other_cores_busy
    assert ("other_cores_busy", res.other_cores_busy, "cores") in res.metrics()


def test_other_cores_busy_needs_half_a_second():
    from bench.harness.monitors import OTHER_MIN_WALL_S

    assert OTHER_MIN_WALL_S == 0.5
    for _ in range(20):  # a 0.05 s region; on a busy machine stop() can return late: measure again
        mon = Monitor("cpu", period_s=0.05).start()
        mon.mark()
        time.sleep(0.05)
        res = mon.stop()
        if res.wall_s < OTHER_MIN_WALL_S:
            break
    assert res.wall_s < OTHER_MIN_WALL_S, res.wall_s
    assert res.other_cores_busy is None
    assert any(m == "other_cores_busy" and "too short" in why for m, _, why in res.unavailable)
