"""Admission's time bound under open-loop overload, with heavy requests: the real MiniLM SQuAD checkpoint and long
contexts of real SQuAD paragraphs (3 windows of 384 tokens each), against a real server process.

The fault this holds down (issue 30): the front door always admitted 32 requests, whatever each cost, so at 3x
overload admitted QA requests queued 2-3x the bound. Counted in tokens, the door admits what the measured rate
answers within the bound.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import pytest

from benchmarks.loadclient import run_load
from benchmarks.openloop import open_loop, post_request
from benchmarks.realdata import shared_available
from benchmarks.request_shapes import SHAPES

BOUND_S = 2.0  # the default --max-queue-s
FACTOR = 3.0

needs_shared = pytest.mark.skipif(not shared_available(), reason="../shared (real checkpoints and data) is absent")


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
    rate = run_load(server.url, path, bodies, [1] * len(bodies), clients=4, seconds=5).sequences_per_s  # the 200s
    host, port = "127.0.0.1", int(server.url.rsplit(":", 1)[1])
    requests = [post_request(host, path, json.dumps(body).encode()) for body in bodies]
    result = asyncio.run(open_loop(host, port, requests, rate * FACTOR, seconds=8, timeout=30))

    statuses = result.statuses()
    assert set(statuses) <= {200, 429}, statuses
    assert statuses[429] > 0 and statuses[200] > 0, statuses  # overloaded, and still serving
    queue_p99_s = result.queue_ms(0.99) / 1000
    assert queue_p99_s <= BOUND_S, (queue_p99_s, statuses, rate)
    # The whole promise (answered within the bound plus one request's time alone, as the client counts it from when
    # the request was due) is the benchmark's (benchmarks.reliability overload --shape qa-long): on a loaded 2-core
    # machine the open-loop client's own lag lands in that figure, while the server's queue time is the server's.
