"""`python -m loadtests` end to end, a few seconds each: against a real server on tiny models, and against a
stub that sheds and answers badly (429 must count as shed, a malformed answer as a failure).

Locust runs in its own process (it patches the standard library with gevent on import), as the runner starts it.
"""

from __future__ import annotations

import csv
import json
import struct
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.harness.environment import offline_env
from tests.service.conftest import Server

ROOT = Path(__file__).resolve().parents[2]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
REPORT_FILES = (
    "locust_stats.csv",
    "locust_stats_history.csv",
    "locust_failures.csv",
    "requests.csv",
    "stages.csv",
    "stages_summary.csv",
    "metrics_before.prom",
    "metrics_after.prom",
    "summary.json",
    "summary.md",
)
PLOTS = ("throughput.png", "latency.png", "timeline.png")


def run_loadtest(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = offline_env()
    return subprocess.run(
        [sys.executable, "-m", "loadtests", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )


def assert_png(path: Path) -> None:
    data = path.read_bytes()
    assert len(data) > 5000, f"{path.name} is nearly empty"
    assert data[:8] == PNG_SIGNATURE and data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    assert width > 300 and height > 200


def locust_rows(report: Path, name: str) -> list[dict[str, str]]:
    with (report / name).open(newline="") as stream:
        return list(csv.DictReader(stream))


def test_short_load_against_the_real_server(loadtest_server: Server, tmp_path: Path) -> None:
    report = tmp_path / "report"
    result = run_loadtest(
        "--url",
        loadtest_server.url,
        "--shape",
        "step",
        "--step-users",
        "3",
        "--max-users",
        "6",
        "--step-seconds",
        "2.5",
        "--max-seconds",
        "5",
        "--settle-seconds",
        "0.5",
        "--batch",
        "1-4",
        "--report",
        str(report),
    )
    assert result.returncode == 0, result.stdout + result.stderr + (report / "locust.out").read_text()
    for name in REPORT_FILES:
        assert (report / name).stat().st_size > 0, name
    for name in PLOTS:
        assert_png(report / name)

    summary = json.loads((report / "summary.json").read_text())
    assert summary["run"]["models"] == {"classify": "bert-classification", "ner": "bert-ner", "qa": "bert-qa"}
    assert summary["stages"] == 2 and summary["run"]["stop_reason"] == "schedule completed"
    assert summary["totals"]["failed"] == 0 and summary["totals"]["ok"] > 10  # every answer passed the checks
    assert summary["saturation"]["ok_rps"] > 0 and summary["at_50"]["p99_ms"] > 0
    assert set(summary["endpoints"]) <= {"classify", "ner", "qa"} and "classify" in summary["endpoints"]
    # The server counted what Locust sent between the two scrapes.
    answered = sum(sum(statuses.values()) for statuses in summary["server"]["requests_by_status"].values())
    assert answered >= summary["totals"]["requests"]
    assert "bertserve_requests_total" in (report / "metrics_after.prom").read_text()

    names = {row["Name"] for row in locust_rows(report, "locust_stats.csv")}
    assert {"classify", "Aggregated"} <= names
    assert all(row["Failure Count"] == "0" for row in locust_rows(report, "locust_stats.csv"))
    assert len(locust_rows(report, "locust_stats_history.csv")) >= 3
    with (report / "requests.csv").open(newline="") as stream:
        rows = list(csv.DictReader(stream))
    assert {row["outcome"] for row in rows} == {"ok"} and {int(row["rows"]) for row in rows} <= {1, 2, 3, 4}
    aggregated = next(row for row in locust_rows(report, "locust_stats.csv") if row["Name"] == "Aggregated")
    assert int(aggregated["Request Count"]) == len(rows)  # Locust's final figures and the request log agree
    text = (report / "summary.md").read_text()
    assert "saturation throughput" in text and "python -m loadtests --url" in text


class StubHandler(BaseHTTPRequestHandler):
    """A classify endpoint that sheds every third request and answers every fifth with one result too few."""

    protocol_version = "HTTP/1.1"
    count = 0
    lock = threading.Lock()

    def log_message(self, *args: object) -> None:
        pass

    def _send(self, status: int, body: bytes, content_type: str = "application/json", **headers: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        if self.path == "/v1/models":
            model = {"name": "stub", "status": "ready", "task": "classification", "labels": ["NEG", "POS"]}
            self._send(200, json.dumps({"models": [model]}).encode())
        elif self.path == "/metrics":
            self._send(200, f'bertserve_requests_total{{model="stub"}} {StubHandler.count}\n'.encode(), "text/plain")
        else:
            self._send(404, b'{"error": "not found"}')

    def do_POST(self) -> None:
        inputs = json.loads(self.rfile.read(int(self.headers["Content-Length"])))["inputs"]
        with StubHandler.lock:
            StubHandler.count += 1
            number = StubHandler.count
        if number % 3 == 0:
            self._send(429, b'{"error": "queue full", "error_type": "overloaded"}', **{"Retry-After": "1"})
            return
        answer = [{"label": "POS", "score": 0.75}, {"label": "NEG", "score": 0.25}]
        results = [answer for _ in inputs[: len(inputs) - 1 if number % 5 == 0 else None]]
        self._send(200, json.dumps({"model": "stub", "results": results}).encode())


@pytest.fixture
def stub_url() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), StubHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_shed_and_malformed_answers_are_told_apart(stub_url: str, tmp_path: Path) -> None:
    report = tmp_path / "report"
    result = run_loadtest(
        "--url",
        stub_url,
        "--shape",
        "rate",
        "--rates",
        "60",
        "--stage-seconds",
        "4",
        "--rate-users",
        "4",
        "--max-seconds",
        "4",
        "--max-requests",
        "60",
        "--settle-seconds",
        "0",
        "--batch",
        "2",
        "--report",
        str(report),
    )
    assert result.returncode == 1, result.stdout + result.stderr  # some requests failed
    summary = json.loads((report / "summary.json").read_text())
    assert "--max-requests 60 reached" in summary["run"]["stop_reason"]
    totals = summary["totals"]
    assert 60 <= totals["requests"] < 200  # stopped by the request budget, within a tick
    with (report / "requests.csv").open(newline="") as stream:
        outcomes = Counter(row["outcome"] for row in csv.DictReader(stream))
    assert outcomes["shed"] > 10 and outcomes["fail"] > 5 and outcomes["ok"] > 10
    assert (totals["shed"], totals["failed"]) == (outcomes["shed"], outcomes["fail"])

    stats = {row["Name"]: row for row in locust_rows(report, "locust_stats.csv")}
    assert stats["classify [429 shed]"]["Failure Count"] == "0"  # shed: not a failure
    assert int(stats["classify [429 shed]"]["Request Count"]) == outcomes["shed"]
    assert int(stats["classify"]["Failure Count"]) == outcomes["fail"]
    failures = (report / "locust_failures.csv").read_text()
    assert "malformed answer" in failures and "1 results for 2 inputs" in failures
    for name in PLOTS:
        assert_png(report / name)


def test_refuses_remote_targets_and_bad_options(tmp_path: Path) -> None:
    result = run_loadtest("--url", "http://192.0.2.1:8000", "--report", str(tmp_path / "r"), timeout=30)
    assert result.returncode == 2 and "--allow-remote" in result.stderr
    assert not (tmp_path / "r").exists()
    result = run_loadtest("--url", "http://127.0.0.1:9", "--batch", "0", "--report", str(tmp_path / "r"), timeout=30)
    assert result.returncode == 2 and "batch sizes" in result.stderr
