"""`python -m loadtests` end to end, a few seconds each: against a real server on tiny models (one of them a
regression head behind an API key), and against stubs that shed and answer badly (429 must count as shed, a
malformed answer as a failure), fail their first requests (a failure while a stage settles is still a failure),
or are not bertserve at all; and the user mistakes that must end in one line and exit status 2.

Locust runs in its own process (it patches the standard library with gevent on import), as the runner starts it.
"""

from __future__ import annotations

import csv
import json
import signal
import struct
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from loadtests.payloads import parse_batch_sizes
from loadtests.runner import check_batch_limit
from loadtests.urls import API_KEY_ENV
from tests.harness.environment import offline_env
from tests.loadtests.conftest import LOADTEST_API_KEY, REGRESSION_MODEL
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


def run_loadtest(
    *args: str, timeout: float = 60, env: dict[str, str] | None = None, module: str = "loadtests"
) -> subprocess.CompletedProcess[str]:
    environment = offline_env(env)
    if env is None or API_KEY_ENV not in env:
        environment.pop(API_KEY_ENV, None)
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def assert_one_line_error(result: subprocess.CompletedProcess[str], *fragments: str) -> None:
    """Exit status 2, and stderr one `error: ...` line holding each fragment (no traceback)."""
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for fragment in fragments:
        assert fragment in lines[0], result.stderr


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
        "1",
        "--max-users",
        "2",
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
    assert summary["saturation"]["ok_rps"] > 0 and summary["at_90"]["p99_ms"] > 0
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
    # every stage sends every endpoint, its single user's too (a class per endpoint gave 1 user classify alone)
    with (report / "stages.csv").open(newline="") as stream:
        stages = [(float(row["start_epoch"]), float(row["end_epoch"])) for row in csv.DictReader(stream)]
    for start, end in stages:
        sent = Counter(row["endpoint"] for row in rows if start <= float(row["start_epoch"]) < end)
        assert set(sent) == {"classify", "ner", "qa"} and max(sent.values()) - min(sent.values()) <= 2, sent
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


class FailFirstHandler(StubHandler):
    """A classify endpoint whose first FAIL_FIRST requests get HTTP 500; every later one a good answer."""

    FAIL_FIRST = 5
    count = 0
    lock = threading.Lock()

    def do_POST(self) -> None:
        inputs = json.loads(self.rfile.read(int(self.headers["Content-Length"])))["inputs"]
        with FailFirstHandler.lock:
            FailFirstHandler.count += 1
            number = FailFirstHandler.count
        if number <= self.FAIL_FIRST:
            self._send(500, b'{"error": "warming up"}')
            return
        answer = [{"label": "POS", "score": 0.75}, {"label": "NEG", "score": 0.25}]
        self._send(200, json.dumps({"model": "stub", "results": [answer for _ in inputs]}).encode())


def models_answer(body: object) -> type[StubHandler]:
    """A server that answers `body` to GET /v1/models: another kind of server than bertserve."""

    class OtherServer(StubHandler):
        def do_GET(self) -> None:
            self._send(200, json.dumps(body).encode())

    return OtherServer


@pytest.fixture
def serve() -> Iterator[Callable[[type[BaseHTTPRequestHandler]], str]]:
    """Start a local HTTP server with the handler class; its URL (stopped at the end of the test)."""
    servers: list[ThreadingHTTPServer] = []

    def start(handler: type[BaseHTTPRequestHandler]) -> str:
        server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}"

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


@pytest.fixture
def stub_url(serve: Callable[[type[BaseHTTPRequestHandler]], str]) -> str:
    return serve(StubHandler)


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


def test_a_closed_loop_waits_the_retry_after_of_a_429(stub_url: str, tmp_path: Path) -> None:
    """Sent again at once after a 429, 3 users made 566 requests/s of 429s: the shed rate measured the test's own
    retries. The stub sheds every third request with Retry-After: 1."""
    report = tmp_path / "report"
    args = ("--step-users", "1", "--max-users", "1", "--step-seconds", "4", "--max-seconds", "4", "--batch", "1")
    result = run_loadtest("--url", stub_url, *args, "--settle-seconds", "0", "--report", str(report))
    assert result.returncode in (0, 1), result.stdout + result.stderr  # 1: the stub's malformed answers
    with (report / "requests.csv").open(newline="") as stream:
        rows = list(csv.DictReader(stream))
    shed = [float(row["start_epoch"]) for row in rows if row["outcome"] == "shed"]
    assert 1 <= len(shed) <= 5 and len(rows) <= 16, len(rows)  # a second's pause after each 429
    for when in shed:
        after = [float(row["start_epoch"]) for row in rows if float(row["start_epoch"]) > when]
        assert not after or min(after) - when >= 0.9, (when, min(after))


def test_refuses_remote_targets_and_bad_options(tmp_path: Path) -> None:
    result = run_loadtest("--url", "http://192.0.2.1:8000", "--report", str(tmp_path / "r"), timeout=30)
    assert result.returncode == 2 and "--allow-remote" in result.stderr
    assert not (tmp_path / "r").exists()
    result = run_loadtest("--url", "http://127.0.0.1:9", "--batch", "0", "--report", str(tmp_path / "r"), timeout=30)
    assert result.returncode == 2 and "batch sizes" in result.stderr


def test_a_batch_past_the_servers_input_limit_is_refused_before_the_run() -> None:
    """A server started with --max-inputs-per-request 8 answered every request of `--batch 16` 422: the run went on,
    a list of failures. /v1/models gives each model's limit."""
    models = [{"name": "sst2", "limits": {"max_inputs_per_request": 8}}, {"name": "other", "limits": {}}]
    with pytest.raises(ValueError, match=r"--batch 16: requests of up to 16 inputs, but model sst2 takes 8 at most"):
        check_batch_limit(parse_batch_sizes("16"), ["sst2"], models)
    check_batch_limit(parse_batch_sizes("2-8"), ["sst2"], models)
    check_batch_limit(parse_batch_sizes("16"), ["other"], models)  # a server that gives no limit: not judged


def test_failures_while_a_stage_settles_still_count(
    serve: Callable[[type[BaseHTTPRequestHandler]], str], tmp_path: Path
) -> None:
    """The first 5 requests fail (HTTP 500), all inside the first stage's 2 settling seconds (10 requests/s):
    they stay out of the stage figures, but the totals, the summary and the exit status count them."""
    FailFirstHandler.count = 0
    report = tmp_path / "report"
    result = run_loadtest(
        "--url",
        serve(FailFirstHandler),
        "--shape",
        "rate",
        "--rates",
        "10",
        "--stage-seconds",
        "5",
        "--rate-users",
        "2",
        "--max-seconds",
        "5",
        "--settle-seconds",
        "2",
        "--batch",
        "1",
        "--report",
        str(report),
    )
    assert result.returncode == 1, result.stdout + result.stderr  # some requests failed
    with (report / "requests.csv").open(newline="") as stream:
        outcomes = Counter(row["outcome"] for row in csv.DictReader(stream))
    assert outcomes["fail"] == FailFirstHandler.FAIL_FIRST and outcomes["ok"] > 10
    summary = json.loads((report / "summary.json").read_text())
    totals = summary["totals"]
    assert (totals["failed"], totals["ok"], totals["requests"]) == (5, outcomes["ok"], sum(outcomes.values()))
    assert totals["outside_stages"]["failed"] == 5  # all of them in the settling seconds
    assert sum(stage["failed"] for stage in summary["stage_figures"]) == 0  # left out of the stage figures
    text = (report / "summary.md").read_text()
    assert ", 5 failed" in text and "5 failed" in text.split("- totals:")[1].splitlines()[1]
    assert "first 2.0 s of a stage" in text


def test_a_rate_stage_spreads_its_users_first_requests(stub_url: str, tmp_path: Path) -> None:
    """Locust runs a task before it asks `wait_time`, so every user's first request went at once (75 users: 75
    requests in 100 ms, an overload opening a run of 30 requests/s). Each now waits its user's random phase of the
    interval (8 users at 8/s: 1 s): 8 phases spread less than 0.2 s about once in 10,000 runs."""
    report = tmp_path / "report"
    rate = ("--shape", "rate", "--rates", "8", "--stage-seconds", "2", "--rate-users", "8", "--max-seconds", "2")
    result = run_loadtest("--url", stub_url, *rate, "--settle-seconds", "0", "--batch", "1", "--report", str(report))
    assert result.returncode in (0, 1), result.stdout + result.stderr  # the stub sheds and answers badly
    starts = sorted(float(row["start_epoch"]) for row in locust_rows(report, "requests.csv"))
    assert len(starts) >= 8 and starts[7] - starts[0] > 0.2, starts[:8]


@pytest.mark.parametrize(
    "body",
    [
        {"object": "list", "data": [{"id": "gpt-4o", "object": "model"}]},  # OpenAI's /v1/models
        [{"name": "sst2"}],
        {"models": ["sst2"]},
    ],
)
def test_a_server_that_is_not_bertserve(
    body: object, serve: Callable[[type[BaseHTTPRequestHandler]], str], tmp_path: Path
) -> None:
    url = serve(models_answer(body))
    result = run_loadtest("--url", url, "--report", str(tmp_path / "r"), timeout=30)
    assert_one_line_error(result, f"the server at {url} does not look like bertserve")
    assert not (tmp_path / "r").exists()


def test_report_folder_mistakes(stub_url: str, tmp_path: Path) -> None:
    posts = StubHandler.count
    taken = tmp_path / "a-file"
    taken.write_text("not a folder")
    result = run_loadtest("--url", stub_url, "--report", str(taken), timeout=30)
    assert_one_line_error(result, f"--report {taken}: exists and is not a folder")
    assert taken.read_text() == "not a folder"
    for path in ("/proc/nope", str(taken / "below")):
        result = run_loadtest("--url", stub_url, "--report", path, timeout=30)
        assert_one_line_error(result, f"--report {path}: cannot create the folder")
    assert StubHandler.count == posts  # only the preflight's GET: no load started
    assert not list(tmp_path.glob("**/requests.csv"))


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--shape", "rate", "--rates", "inf"], "finite positive rates"),  # an OverflowError traceback
        (["--shape", "rate", "--rates", "5,nan"], "finite positive rates"),  # ran unpaced, "offered nan", exit 0
        (["--step-seconds", "nan"], "a finite step_seconds > 0"),  # no stage, no request, exit 0
        (["--shape", "rate", "--rates", "abc"], "--rates: 'abc' is not a number"),  # float()'s words alone
    ],
)
def test_rates_and_durations_that_are_not_finite_numbers_are_refused(
    options: list[str], message: str, tmp_path: Path
) -> None:
    result = run_loadtest("--url", "http://127.0.0.1:9", *options, "--report", str(tmp_path / "r"), timeout=30)
    assert_one_line_error(result, message)
    assert not (tmp_path / "r").exists()


class SilentHandler(StubHandler):
    """A classify endpoint that reads each request and never answers it."""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        threading.Event().wait(60)


def test_requests_unanswered_when_the_load_stops_are_failures(
    serve: Callable[[type[BaseHTTPRequestHandler]], str], tmp_path: Path
) -> None:
    """A server that answers nothing: the request in flight was dropped at Locust's stop, and the report read "0
    requests, 0 failed", exit status 0."""
    report = tmp_path / "report"
    args = ("--step-users", "1", "--max-users", "1", "--step-seconds", "2", "--max-seconds", "2", "--batch", "1")
    result = run_loadtest("--url", serve(SilentHandler), *args, "--report", str(report), timeout=90)
    assert result.returncode == 1, result.stdout + result.stderr
    summary = json.loads((report / "summary.json").read_text())
    assert summary["totals"]["requests"] == summary["totals"]["failed"] == 1, summary["totals"]
    with (report / "requests.csv").open(newline="") as stream:
        (row,) = list(csv.DictReader(stream))
    assert row["outcome"] == "fail" and row["error"] == "no answer 10 s after the load stopped"
    assert any("1 request(s) got no answer at all" in warning for warning in summary["warnings"]), summary
    assert float(row["response_ms"]) > 10_000
    # the stage ends when the load stops, not when Locust exits after that wait (its rates read low by it)
    (stage,) = locust_rows(report, "stages.csv")
    assert 1.5 < float(stage["end_epoch"]) - float(stage["start_epoch"]) < 4, stage


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupted_run_stops_locust_and_reports_what_ran(
    stop: signal.Signals, stub_url: str, tmp_path: Path
) -> None:
    """Ctrl-C gave a KeyboardInterrupt traceback and no report; SIGTERM killed the runner alone, and Locust, orphaned,
    went on loading the server to the end of its schedule. The runner starts with SIGINT ignored, as a script's
    background job (`... &`, CI's) does: Locust inherited that, never stopped on the runner's SIGINT, and was killed
    30 s later having written nothing."""
    report = tmp_path / "report"
    args = ("--step-users", "1", "--max-users", "1", "--step-seconds", "60", "--max-seconds", "60", "--batch", "1")
    started = time.monotonic()
    with subprocess.Popen(
        [sys.executable, "-m", "loadtests", "--url", stub_url, *args, "--report", str(report)],
        cwd=ROOT,
        env=offline_env(None),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    ) as runner:
        posts = StubHandler.count
        # the load is on: one user's closed loop sends its 21st request once its 20th is recorded (at the 20th itself,
        # the signal could come between the stub's count and Locust's record: 19 in the report, once in CI)
        while StubHandler.count < posts + 21 and time.monotonic() - started < 40:
            time.sleep(0.1)
        runner.send_signal(stop)
        out, err = runner.communicate(timeout=60)
    assert runner.returncode == 128 + stop.value, out + err
    assert time.monotonic() - started < 45 and "Traceback" not in err, err
    assert f"interrupted ({stop.name}): the report holds what ran until then" in err
    summary = json.loads((report / "summary.json").read_text())
    assert summary["run"]["stop_reason"] == f"interrupted ({stop.name})" and summary["totals"]["requests"] >= 20
    locust_run = json.loads((report / "locust_run.json").read_text())  # it said "schedule completed"
    assert locust_run["stop_reason"] == f"interrupted ({stop.name})"
    assert (report / "summary.md").is_file()
    left = StubHandler.count
    time.sleep(1.5)
    assert StubHandler.count == left  # no Locust left sending


@pytest.mark.parametrize(
    ("option", "value"), [("--payload-limit", "-1"), ("--settle-seconds", "-1"), ("--settle-seconds", "nan")]
)
def test_negative_options_are_refused(option: str, value: str, tmp_path: Path) -> None:
    result = run_loadtest("--url", "http://127.0.0.1:9", option, value, "--report", str(tmp_path / "r"), timeout=30)
    assert_one_line_error(result, f"{option} must be 0")
    assert not (tmp_path / "r").exists()


def test_api_key_and_a_regression_head(keyed_regression_server: Server, tmp_path: Path) -> None:
    """A server started with API keys, serving only a cross-encoder whose classify scores are raw logits."""
    url = keyed_regression_server.url
    result = run_loadtest("--url", url, "--report", str(tmp_path / "r"), timeout=30)
    assert_one_line_error(result, "the server refused the key (HTTP 401): pass --api-key", "no key was sent")
    result = run_loadtest(
        "--url", url, "--report", str(tmp_path / "r"), env={API_KEY_ENV: "wrong-key-0123456789abcdef"}, timeout=30
    )
    assert_one_line_error(result, "the server refused the key (HTTP 401): pass --api-key", "not one it accepts")
    assert not (tmp_path / "r").exists()

    report = tmp_path / "report"
    result = run_loadtest(
        "--url",
        url,
        "--api-key",
        LOADTEST_API_KEY,
        "--shape",
        "step",
        "--step-users",
        "2",
        "--max-users",
        "2",
        "--step-seconds",
        "3",
        "--max-seconds",
        "3",
        "--settle-seconds",
        "0.5",
        "--batch",
        "1-3",
        "--report",
        str(report),
    )
    assert result.returncode == 0, result.stdout + result.stderr + (report / "locust.out").read_text()
    summary = json.loads((report / "summary.json").read_text())
    assert summary["run"]["models"] == {"classify": REGRESSION_MODEL}
    assert summary["totals"]["failed"] == 0 and summary["totals"]["ok"] > 5  # raw scores passed the checks
    assert "bertserve_requests_total" in (report / "metrics_after.prom").read_text()  # scraped with the key
    assert "--api-key REDACTED" in summary["run"]["command"]
    for path in report.iterdir():
        if path.suffix in (".json", ".md", ".txt", ".out", ".log", ".html"):
            assert LOADTEST_API_KEY not in path.read_text(errors="replace"), path.name
    with (report / "requests.csv").open(newline="") as stream:
        scores_checked = [row for row in csv.DictReader(stream) if row["outcome"] == "ok"]
    assert len(scores_checked) == summary["totals"]["ok"]


def test_locustfile_run_directly_with_a_user_class_without_model(
    keyed_regression_server: Server, tmp_path: Path
) -> None:
    """NerUser named, but the server has no NER model: one line, not a traceback per user, and exit status 1;
    ClassifyUser still runs (the key from the environment)."""
    report = tmp_path / "direct"
    args = [
        "-f",
        str(ROOT / "loadtests" / "locustfile.py"),
        "--headless",
        "--only-summary",
        "--host",
        keyed_regression_server.url,
        "--step-users",
        "2",
        "--max-users",
        "2",
        "--step-seconds",
        "2",
        "--max-seconds",
        "2",
        "--report-dir",
        str(report),
    ]
    result = run_loadtest(*args, "ClassifyUser", "NerUser", module="locust", env={API_KEY_ENV: LOADTEST_API_KEY})
    output = result.stdout + result.stderr
    assert result.returncode == 1, output
    assert "Traceback" not in output and "StopUser" not in output, output
    line = "no ready ner model on the server: NerUser users are not started"
    assert output.count(line) == 1, output
    with (report / "requests.csv").open(newline="") as stream:
        rows = list(csv.DictReader(stream))
    assert rows and {row["endpoint"] for row in rows} == {"classify"} and {row["outcome"] for row in rows} == {"ok"}

    result = run_loadtest(*args, "NerUser", module="locust", env={API_KEY_ENV: LOADTEST_API_KEY}, timeout=30)
    output = result.stdout + result.stderr
    assert result.returncode == 1 and "Traceback" not in output and output.count(line) == 1, output
