"""The result-row metric names a report reads (written by ``inrbench bench``), first match wins."""

from __future__ import annotations

PIPELINE_ORDER = ("raw", "torch-jpeg", "torch-nvjpeg", "dali", "inr")
MODE_ORDER = ("loader", "replay", "train")
BASELINES = ("torch-jpeg", "dali")

EPOCH_S = ("epoch_s",)
IMAGES_PER_S = ("images_per_s",)
DATA_WAIT_S = ("data_wait_s",)
COMPUTE_S = ("compute_s",)
TTFB_S = ("time_to_first_batch_s", "ttfb_s")  # build + first batch; the test fixture has only ttfb_s
CPU_BUSY = ("cpu_cores_busy",)
OTHER_BUSY = ("other_cores_busy",)
RSS_PEAK = ("host_rss_peak_bytes",)
GPU_MEM_NVML = ("gpu_mem_used_peak_bytes",)
GPU_MEM_TORCH = ("torch_peak_allocated_bytes",)
ACCURACY = ("test_acc",)
TEST_IMAGES = ("test_images",)
IMAGES_PER_CPU_S = ("images_per_cpu_s",)


def first_present(metrics, names: tuple[str, ...]) -> str | None:
    """The first of ``names`` that occurs in ``metrics`` (any iterable of metric names)."""
    have = set(metrics)
    return next((n for n in names if n in have), None)
