"""Locust users for the bertserve endpoints, and the load shape; `python -m loadtests` runs it headless.

One user class per endpoint: ClassifyUser, NerUser, QaUser; and MixedUser, whose users take the endpoints of
`--mix` in turn (what `python -m loadtests` runs for several endpoints: every stage sends the same mix). Every
answer goes through `catch_response`: 2xx with a valid answer (shape, labels, offsets inside the text, answer ==
context[start:end]) succeeds; 429 succeeds too but is counted as shed, under the request name `ENDPOINT [429
shed]`; anything else (another status, a malformed answer, no answer, none by the end of the run) fails the request
with the reason.

Also usable directly, e.g.:

    locust -f loadtests/locustfile.py --headless --host http://127.0.0.1:8000 ClassifyUser \\
        --load-shape step --step-users 2 --step-seconds 10 --max-users 16 --max-seconds 80 --report-dir /tmp/lt

Each request is logged (start time, endpoint, outcome, status, milliseconds, inputs) and written, with the
stage timings, to `--report-dir` (requests.csv, stages.csv) when Locust quits.

With `--api-key KEY` (default: the environment variable BERTSERVE_LOADTEST_API_KEY) every request, the first
`/v1/models` included, carries `Authorization: Bearer KEY`. A user class named on the command line whose endpoint
has no ready model on the server is not started: one error line says so, and Locust exits with 1 (left out of
the command line, all three classes are tried and one without a model is only skipped, with a warning).
"""

from __future__ import annotations

import csv
import itertools
import json
import logging
import os
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

if str(Path(__file__).resolve().parents[1]) not in sys.path:  # run as `locust -f loadtests/locustfile.py`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import gevent
from gevent import GreenletExit
from locust import FastHttpUser, LoadTestShape, events, task
from locust.env import Environment
from locust.exception import StopUser
from locust.stats import CSV_STATS_INTERVAL_SEC

from loadtests.payloads import (
    ENDPOINTS,
    BatchSizes,
    PayloadSet,
    classify_body,
    load_payloads,
    ner_body,
    parse_batch_sizes,
    qa_body,
    sample,
)
from loadtests.shapes import (
    STOP_TIMEOUT_S,
    UNANSWERED,
    Schedule,
    Stage,
    pacing_wait,
    parse_rates,
    rate_schedule,
    step_schedule,
)
from loadtests.urls import API_KEY_ENV, auth_headers, check_target, fetch_models
from loadtests.validation import ModelTarget, judge, pick_target

logger = logging.getLogger("loadtests")
SHED_SUFFIX = " [429 shed]"
REQUEST_FIELDS = ("start_epoch", "endpoint", "outcome", "status", "response_ms", "rows", "error")
STAGE_FIELDS = ("index", "offered", "users", "rate", "start_epoch", "end_epoch")
SPAWN_RATE = 100.0  # users per second: a step's users arrive at once
MIXED = "mixed"  # MixedUser's endpoint: those of --mix in turn


@dataclass
class RunState:
    """What the users and the shape share in this (local, single-process) Locust run."""

    payloads: PayloadSet | None = None
    batch: BatchSizes | None = None
    targets: dict[str, ModelTarget] = field(default_factory=dict)
    schedule: Schedule | None = None
    max_requests: int = 0
    report_dir: Path | None = None
    seed: int = 0
    qa_top_k: int = 1
    headers: dict[str, str] = field(default_factory=dict)  # the API key's Authorization header, if any
    mix: list[str] = field(default_factory=list)  # MixedUser's endpoints, in turn
    current: Stage | None = None
    stages: list[list[Any]] = field(default_factory=list)  # STAGE_FIELDS rows
    records: list[tuple[Any, ...]] = field(default_factory=list)  # REQUEST_FIELDS rows
    stop_reason: str | None = None
    written: bool = False

    def enter(self, stage: Stage) -> None:
        now = time.time()
        if self.stages:
            self.stages[-1][5] = now
        self.stages.append([stage.index, stage.offered, stage.users, stage.rate, now, None])
        self.current = stage

    def end(self) -> None:
        """The load stops: the last stage ends now, not when Locust exits after the requests still in flight
        (up to STOP_TIMEOUT_S later; its rates read 11% low, divided by that wait too)."""
        if self.stages and self.stages[-1][5] is None:
            self.stages[-1][5] = time.time()

    def write(self) -> None:
        if self.written or self.report_dir is None:
            return
        self.written = True
        self.end()
        self.report_dir.mkdir(parents=True, exist_ok=True)
        with (self.report_dir / "requests.csv").open("w", newline="") as stream:
            writer = csv.writer(stream)
            writer.writerow(REQUEST_FIELDS)
            writer.writerows(self.records)
        with (self.report_dir / "stages.csv").open("w", newline="") as stream:
            writer = csv.writer(stream)
            writer.writerow(STAGE_FIELDS)
            writer.writerows(self.stages)
        (self.report_dir / "locust_run.json").write_text(
            json.dumps(
                {
                    "stop_reason": self.stop_reason or "schedule completed",
                    "requests_logged": len(self.records),
                    "targets": {endpoint: target.name for endpoint, target in self.targets.items()},
                    "payloads": self.payloads.source if self.payloads else None,
                    "batch": self.batch.spec if self.batch else None,
                },
                indent=2,
            )
        )


STATE = RunState()


@events.init_command_line_parser.add_listener
def _add_options(parser: Any) -> None:
    group = parser.add_argument_group("bertserve load test")
    group.add_argument("--payloads", default="builtin", help="builtin, shared (../shared/data) or a JSON file")
    group.add_argument(
        "--payload-limit", type=int, default=0, help="only the first N texts (QA: pairs) of each set (0: all)"
    )
    group.add_argument("--batch", default="mix", help="inputs per request: mix, N or A-B")
    for endpoint in ("classify", "ner", "qa"):
        group.add_argument(f"--{endpoint}-model", default="", help=f"model for /{endpoint} (default: first by task)")
    group.add_argument("--load-shape", choices=["step", "rate"], default="step")
    group.add_argument("--step-users", type=int, default=2)
    group.add_argument("--step-seconds", type=float, default=10.0)
    group.add_argument("--max-users", type=int, default=16)
    group.add_argument("--rates", default="10", help="requests/s per stage, comma-separated")
    group.add_argument("--stage-seconds", type=float, default=10.0)
    group.add_argument("--rate-users", type=int, default=0, help="users sharing the rate (0: from the rate)")
    group.add_argument("--max-seconds", type=float, default=120.0, help="hard stop of the load")
    group.add_argument("--max-requests", type=int, default=200_000, help="stop once this many were sent")
    group.add_argument("--report-dir", default="", help="where requests.csv and stages.csv go")
    group.add_argument("--seed", type=int, default=0)
    group.add_argument(
        "--mix", default="", help="MixedUser: the endpoints each user takes in turn (default: every one with a model)"
    )
    group.add_argument("--allow-remote", action="store_true", help="allow a non-loopback --host")
    group.add_argument(
        "--api-key",
        default="",
        help=f"sent as `Authorization: Bearer KEY` on every request (default: ${API_KEY_ENV}, better than the "
        "command line, which ps shows)",
    )


def configure(options: Any, host: str) -> None:
    """Fill STATE from the parsed options: payloads, batch sizes, schedule, target models."""
    host = check_target(host, options.allow_remote)
    STATE.payloads = load_payloads(options.payloads, options.payload_limit or None)
    STATE.batch = parse_batch_sizes(options.batch)
    if options.load_shape == "step":
        STATE.schedule = step_schedule(options.step_users, options.step_seconds, options.max_users, options.max_seconds)
    else:
        STATE.schedule = rate_schedule(
            parse_rates(str(options.rates)), options.stage_seconds, options.rate_users or None, options.max_seconds
        )
    STATE.max_requests = options.max_requests
    STATE.report_dir = Path(options.report_dir) if options.report_dir else None
    STATE.seed = options.seed
    api_key = options.api_key or os.environ.get(API_KEY_ENV) or None
    STATE.headers = auth_headers(api_key)
    models = fetch_models(host, api_key)
    for endpoint in ("classify", "ner", "qa"):
        target = pick_target(models, endpoint, getattr(options, f"{endpoint}_model") or None)
        if target is not None:
            STATE.targets[endpoint] = target
    wanted = [name.strip() for name in str(getattr(options, "mix", "") or "").split(",") if name.strip()]
    missing = [name for name in wanted if name not in STATE.targets]
    if missing:
        raise ValueError(f"--mix: no ready model for {', '.join(missing)} on the server")
    STATE.mix = wanted or [endpoint for endpoint in ENDPOINTS if endpoint in STATE.targets]


@events.init.add_listener
def _on_init(environment: Environment, **_: Any) -> None:
    options = environment.parsed_options
    if options is None:  # used as a library without Locust's options: the caller fills STATE
        return
    try:
        configure(options, environment.host or "")
    except Exception as error:  # a wrong option or an unreachable server: stop before any load
        sys.stderr.write(f"error: {error}\n")
        raise SystemExit(2) from error
    drop_users_without_model(environment, named=bool(getattr(options, "user_classes", None)))


def drop_users_without_model(environment: Environment, named: bool) -> None:
    """Leave out the user classes whose endpoint has no ready model, one line each (no user starts only to stop
    with a traceback). Classes named on the command line: an error, and exit status 1; nothing left: exit now."""
    keep = []
    for user_class in environment.user_classes:
        endpoint = getattr(user_class, "endpoint", None)
        if endpoint is None or endpoint == MIXED or endpoint in STATE.targets:
            keep.append(user_class)
            continue
        line = f"no ready {endpoint} model on the server: {user_class.__name__} users are not started"
        if named:
            logger.error(line)
            environment.process_exit_code = 1
        else:
            logger.warning(line)
    if len(keep) < len(environment.user_classes):
        environment.user_classes[:] = keep
    if not keep:
        logger.error("no user class left to run: stopping before any load")
        raise SystemExit(1)


@events.request.add_listener
def _on_request(
    name: str,
    response_time: float,
    exception: Exception | None,
    context: dict[str, Any],
    start_time: float | None = None,
    response: Any = None,
    **_: Any,
) -> None:
    endpoint = context.get("endpoint")
    if endpoint is None:
        return
    outcome = "fail" if exception is not None else ("shed" if name.endswith(SHED_SUFFIX) else "ok")
    status = getattr(response, "status_code", 0) or 0
    error = str(exception)[:200] if exception is not None else ""
    STATE.records.append(
        (
            round(start_time or time.time(), 6),
            endpoint,
            outcome,
            status,
            round(response_time, 3),
            context["rows"],
            error,
        )
    )


@events.quitting.add_listener
def _on_quitting(**_: Any) -> None:
    STATE.write()
    # Locust rewrites its CSVs once a second from a greenlet: let it run once more after the last request, so
    # locust_stats.csv and locust_failures.csv hold the final figures (the files are flushed at exit).
    gevent.sleep(CSV_STATS_INTERVAL_SEC + 0.2)


def retry_after(value: str | None) -> float:
    """Seconds to wait before the next request: a Retry-After in seconds, 1 where there is none, at most 5."""
    try:
        seconds = float(value) if value is not None else 1.0
    except ValueError:
        seconds = 1.0
    return min(max(seconds, 0.0), 5.0) if seconds == seconds else 1.0  # NaN: 1


class EndpointUser(FastHttpUser):
    """Sends requests to one endpoint; closed loop under the step shape, paced under the rate shape."""

    abstract = True
    endpoint: ClassVar[str] = ""
    connection_timeout = 10.0
    network_timeout = 40.0  # past the server's 30 s deadline (504)
    _ids: ClassVar[itertools.count] = itertools.count()

    def __init__(self, environment: Environment) -> None:
        super().__init__(environment)
        self.rng = random.Random(STATE.seed * 1_000_003 + next(self._ids))
        self._last_start: float | None = None
        self._pause = 0.0  # before the next request of a closed loop: a 429's Retry-After

    def wait_time(self) -> float:
        stage = STATE.current
        if stage is None or stage.rate is None:
            # closed loop: back to back, but after a 429 (or no answer at all) the server's Retry-After (1 s where it
            # gives none, 5 s at most), as the clients people use wait: sent again at once, 3 users made 566
            # requests/s of 429s, and the shed rate measured the load test's own retries
            pause, self._pause = self._pause, 0.0
            return pause
        interval = stage.users / stage.rate
        now = time.monotonic()
        wait = pacing_wait(interval, now, self._last_start, self.rng.uniform(0, interval))
        self._last_start = now + wait
        return wait

    def on_start(self) -> None:
        if self.endpoint not in STATE.targets or STATE.payloads is None or STATE.batch is None:
            raise StopUser()  # left out at init (drop_users_without_model) when run by Locust's command line
        self.pace_first()

    def pace_first(self) -> None:
        """Under a rate stage, the first request too waits its user's phase: Locust runs a task before it asks
        `wait_time`, so every user's first request went at once (75 users: 75 requests in 100 ms, an overload
        opening a run of 30 requests/s)."""
        stage = STATE.current
        if stage is not None and stage.rate is not None:
            gevent.sleep(self.wait_time())

    def request(self, endpoint: str) -> None:
        """One request to `endpoint`'s model: its texts drawn from the payloads, its answer judged."""
        assert STATE.payloads is not None and STATE.batch is not None
        target = STATE.targets[endpoint]
        size = STATE.batch.draw(self.rng)
        top_k = 1
        inputs: list[Any]
        if endpoint == "classify":
            inputs = sample(STATE.payloads.classify, size, self.rng)
            body = classify_body(inputs)
        elif endpoint == "ner":
            inputs = sample(STATE.payloads.ner, size, self.rng)
            body = ner_body(inputs)
        else:
            inputs = sample(STATE.payloads.qa, size, self.rng)
            top_k = STATE.qa_top_k
            body = qa_body(inputs, top_k, target.qa_doc_stride)
        self.send(endpoint, target, body, inputs, top_k)

    def send(self, endpoint: str, target: ModelTarget, body: dict[str, Any], inputs: list[Any], top_k: int) -> None:
        path = f"/v1/models/{target.name}/{endpoint}"
        context = {"endpoint": endpoint, "rows": len(inputs)}
        started = time.time()
        try:
            with self.client.post(
                path, json=body, headers=STATE.headers, name=endpoint, catch_response=True, context=context
            ) as response:
                try:
                    content = response.content
                except Exception:  # the body could not be read: judged as no answer
                    content = None
                status = (response.status_code or 0) if content is not None else 0
                outcome, reason = judge(endpoint, status, content, target, inputs, top_k)
                if outcome == "shed" or status == 0:
                    self._pause = retry_after(response.headers.get("retry-after") if status else None)
                if outcome == "shed":
                    response.request_meta["name"] = endpoint + SHED_SUFFIX
                    response.success()
                elif outcome == "ok":
                    response.success()
                else:
                    response.failure(reason)
        except GreenletExit:
            # stopped by Locust with no answer after the stop's whole grace (--stop-timeout): a failure, not a
            # request that never was (a server that answered nothing had read "0 requests, 0 failed", exit 0)
            elapsed_s = time.time() - started
            if elapsed_s >= STOP_TIMEOUT_S:
                row = (round(started, 6), endpoint, "fail", 0, round(elapsed_s * 1000.0, 3), len(inputs), UNANSWERED)
                STATE.records.append(row)
            raise


class ClassifyUser(EndpointUser):
    endpoint = "classify"

    @task
    def classify(self) -> None:
        self.request("classify")


class NerUser(EndpointUser):
    endpoint = "ner"

    @task
    def ner(self) -> None:
        self.request("ner")


class QaUser(EndpointUser):
    endpoint = "qa"

    @task
    def qa(self) -> None:
        self.request("qa")


class MixedUser(EndpointUser):
    """Takes the endpoints of --mix in turn, each user from its own place in the turn: every stage sends the same
    mix, whatever its user count (one class per endpoint, Locust gives a stage of 1 user classify alone, of 2
    classify and NER: the step shape's stages compared different mixes, and its knee was the mix's)."""

    endpoint = MIXED

    def on_start(self) -> None:
        if not STATE.mix or STATE.payloads is None or STATE.batch is None:
            raise StopUser()
        self.turn = next(self._turns)
        self.pace_first()

    @task
    def next_endpoint(self) -> None:
        endpoint = STATE.mix[self.turn % len(STATE.mix)]
        self.turn += 1
        self.request(endpoint)

    _turns: ClassVar[itertools.count] = itertools.count()


class ConfiguredShape(LoadTestShape):
    """The step or rate schedule from the options; stops at its end, at --max-seconds or at --max-requests."""

    def tick(self) -> tuple[int, float] | None:
        schedule = STATE.schedule
        if schedule is None:
            return None
        if STATE.max_requests and len(STATE.records) >= STATE.max_requests:
            STATE.stop_reason = f"--max-requests {STATE.max_requests} reached"
            STATE.end()
            return None
        stage = schedule.stage_at(self.get_run_time())
        if stage is None:
            STATE.end()
            return None
        if stage != STATE.current:
            STATE.enter(stage)
        return stage.users, SPAWN_RATE
