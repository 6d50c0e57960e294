"""``inrbench report``: tables and figures from result files only (``bench.report.build.build_report``)."""
