"""Benchmarks and reports: scripts that print figures (not timed tests)."""
