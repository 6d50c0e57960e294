"""inr-bench: the harness (datasets, timing protocol, monitors, training, sweeps, reports)."""

__version__ = "0.1.0"
