"""Benchmarks that print figures (`inrbench perf TARGET`): one module per target, like a command module,
each with ``--json``."""

TARGETS: dict[str, str] = {
    "encode": "bench.perf.encode",
    "decode": "bench.perf.decode",
    "expand": "bench.perf.expand",
}
