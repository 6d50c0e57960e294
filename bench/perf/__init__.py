"""Benchmarks that print figures (`inrbench perf TARGET`). One module per target.

Each target module defines ``HELP``, ``add_arguments(parser)`` and ``run(args) -> int``
(like a command module) and accepts ``--json`` for machine-readable output.
"""

# target -> module
TARGETS: dict[str, str] = {
    "encode": "bench.perf.encode",
    "decode": "bench.perf.decode",
    "expand": "bench.perf.expand",
}
