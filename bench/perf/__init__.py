"""Benchmarks that print figures (`inrbench perf TARGET`): one module per target, each a command module
(``HELP``, ``add_arguments``, ``run``) with ``--json``."""

TARGETS: dict[str, str] = {
    "encode": "bench.perf.encode",
    "decode": "bench.perf.decode",
    "expand": "bench.perf.expand",
}
