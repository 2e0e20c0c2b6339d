"""Benchmarks and reports: scripts that print figures (not timed tests)."""

import bertcore.no_telemetry  # noqa: F401  (before any onnxruntime import: it calls home unless told not to)
