"""``inrbench report``: tables and figures from result files only (``build_report``)."""

from bench.report.build import build_report

__all__ = ["build_report"]
