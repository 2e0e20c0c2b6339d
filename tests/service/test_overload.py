"""Admission's time bound under open-loop overload, with heavy requests, against real server processes: the real
MiniLM SQuAD checkpoint with long contexts of real SQuAD paragraphs (3 windows of 384 tokens each), and the real
MiniLM CoNLL-2003 checkpoint with 40 test sentences a text, in process mode.

The faults these hold down (issue 30): the front door always admitted 32 requests, whatever each cost, so at 3x
overload admitted QA requests queued 2-3x the bound; counted in tokens, the door admits what the measured rate
answers within the bound. In process mode on 2 cores long NER texts, whose front-end work competes with the engine,
took 2.4x their median at the tail, and the floor (one batch of tokens) was 2.7 s of that work: admitted answers
took 3.7 s against 2 s, until the gate learnt from what answers really took.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import pytest

from benchmarks.loadclient import run_load
from benchmarks.openloop import OpenLoopResult, open_loop, post_request, quantile
from benchmarks.realdata import shared_available
from benchmarks.request_shapes import SHAPES

BOUND_S = 2.0  # the default --max-queue-s
FACTOR = 3.0

needs_shared = pytest.mark.skipif(not shared_available(), reason="../shared (real checkpoints and data) is absent")


def open_loop_at(
    server, shape_name: str, factor: float, seconds: float = 8, answers_after_s: tuple[int, float] = (0, 0.0)
) -> tuple[float, OpenLoopResult]:
    """The shape's capacity (a closed loop of 4 clients, its 200s a second), then an open loop at `factor` x it;
    returns the capacity and the open loop's result. `answers_after_s` (N, S): the loop runs long enough for about
    N answers after its first S seconds at that capacity (a slow or loaded machine answers fewer a second, and a
    statistic of the steady state needs a count, not a time)."""
    shape = SHAPES[shape_name]
    bodies, path = shape.bodies(64), shape.path()
    rate = run_load(server.url, path, bodies, [1] * len(bodies), clients=4, seconds=5).sequences_per_s
    wanted, after_s = answers_after_s
    if wanted and rate > 0:
        seconds = max(seconds, after_s + wanted / rate)
    host, port = "127.0.0.1", int(server.url.rsplit(":", 1)[1])
    requests = [post_request(host, path, json.dumps(body).encode()) for body in bodies]
    return rate, asyncio.run(open_loop(host, port, requests, rate * factor, seconds=seconds, timeout=30))


@needs_shared
def test_admitted_long_qa_requests_queue_within_the_bound_at_3x_overload(real_repository: Path, server_factory) -> None:
    shape = SHAPES["qa-long"]
    server = server_factory(real_repository, "--models", shape.checkpoint, "--max-queue-s", str(BOUND_S))
    bodies = shape.bodies(64)
    path = shape.path()
    with httpx.Client(base_url=server.url, timeout=60) as client:
        windows = client.post(path, json=bodies[0]).headers["x-rows"]
        assert int(windows) == 3  # the shape is what it says: three windows a request
        for body in bodies[:5]:  # warm, one at a time
            client.post(path, json=body).raise_for_status()
    rate, result = open_loop_at(server, shape.name, FACTOR)

    statuses = result.statuses()
    assert set(statuses) <= {200, 429}, statuses
    assert statuses[429] > 0 and statuses[200] > 0, statuses  # overloaded, and still serving
    queue_p99_s = result.queue_ms(0.99) / 1000
    assert queue_p99_s <= BOUND_S, (queue_p99_s, statuses, rate)
    # The whole promise (answered within the bound plus one request's time alone, as the client counts it from when
    # the request was due) is the benchmark's (benchmarks.reliability overload --shape qa-long): on a loaded 2-core
    # machine the open-loop client's own lag lands in that figure, while the server's queue time is the server's.


@needs_shared
def test_long_ner_in_process_mode_is_answered_within_the_bound_plus_its_own_time(
    real_repository: Path, server_factory
) -> None:
    """The promise as the server counts it (x-total-time-ms, from the request's arrival to its answer): admitted
    requests' p99 within --max-queue-s plus one such request's own time alone, once the gate has met the overload.

    Requests due in the first 2 s are left out: those admitted at the start of an overload, before any answer could
    be late (the floor, one batch of tokens: 9 texts), took up to 3 s on a loaded machine (a CPU-bound process
    beside the test) against 2.2 s. With ~40 answers a p99 is the slowest one, so the test holds the steady state,
    where the gate before the feedback failed by far (p99 3.58 s, 16 of 51 answers over 2.15 s) and the feedback
    keeps 1.2-2.0 s; benchmarks.reliability's table counts the whole run."""
    shape = SHAPES["ner-long"]
    server = server_factory(
        real_repository, "--models", shape.checkpoint, "--engine-mode", "process", "--max-queue-s", str(BOUND_S)
    )
    alone = []
    with httpx.Client(base_url=server.url, timeout=60) as client:
        for body in shape.bodies(6):  # the first warms
            response = client.post(shape.path(), json=body)
            response.raise_for_status()
            alone.append(float(response.headers["x-total-time-ms"]) / 1000)
    alone_s = sorted(alone[1:])[len(alone[1:]) // 2]
    # ~2 answers in 3 of capacity are admitted at 3x: enough time for ~16 steady answers whatever the machine's speed
    # (a loaded 2-core machine answered 16 in all, 9 of them steady, in a fixed 8 s)
    rate, result = open_loop_at(server, shape.name, FACTOR, answers_after_s=(24, 2))

    statuses = result.statuses()
    assert set(statuses) <= {200, 429}, statuses
    assert statuses[429] > 0 and statuses[200] > 0, statuses
    first_due = min(answer.due for answer in result.answers)
    steady = [
        answer.server_ms / 1000
        for answer in result.answers
        if answer.status == 200 and answer.server_ms is not None and answer.due - first_due >= 2
    ]
    assert len(steady) >= 10, (len(steady), statuses, rate)
    server_p99_s = quantile(steady, 0.99)
    assert server_p99_s <= BOUND_S + alone_s, (server_p99_s, alone_s, statuses, rate)
