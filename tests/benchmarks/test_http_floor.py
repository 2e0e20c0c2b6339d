"""The HTTP floor benchmark end to end: its three servers, each in its own process, loaded for a moment."""

from __future__ import annotations

import math

import pytest

from benchmarks.http_floor import SERVERS, main


def test_every_server_answers_every_request_and_reports_its_cpu(capsys: pytest.CaptureFixture[str]) -> None:
    report = main(["--seconds", "0.5", "--warmup-seconds", "0.2", "--rounds", "1", "--connections", "2"])
    assert set(report) == set(SERVERS)
    for kind, figures in report.items():
        for name in ("requests_per_s", "cpu_us_per_request"):
            assert math.isfinite(figures[name]) and figures[name] > 0, (kind, name)
    printed = capsys.readouterr().out
    assert "| server | requests/s | CPU µs per request |" in printed
    assert all(f"| {kind} |" in printed for kind in SERVERS)
