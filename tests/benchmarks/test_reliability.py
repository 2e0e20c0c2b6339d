"""The reliability benchmark's command line, and the hang phase's reading of an open loop: answers by when they were
due, and when the launcher spoke."""

from __future__ import annotations

import time

import pytest

from benchmarks.openloop import Answer, OpenLoopResult
from benchmarks.process_cpu import BUSY_MACHINE_CORES
from benchmarks.reliability import _hang_outcome, busy_rows, mixed_table, parse_args


def test_flags_after_a_double_dash_go_to_the_server() -> None:
    args = parse_args(["overload", "--seconds", "20", "--", "--engine-mode", "process", "--frontends", "2"])
    assert (args.phase, args.seconds, args.server_args) == (
        "overload",
        20.0,
        ["--engine-mode", "process", "--frontends", "2"],
    )
    plain = parse_args(["hang", "--fraction", "0.3"])
    assert (plain.phase, plain.fraction, plain.server_args) == ("hang", 0.3, [])


def test_each_phase_has_its_shapes_and_mixed_takes_two_or_more() -> None:
    assert parse_args(["overload"]).shape == "classify-1"
    assert parse_args(["mixed"]).shape == "classify-1,qa-long"
    assert parse_args(["mixed", "--shape", "classify-1,classify-16"]).shape == "classify-1,classify-16"
    for wrong in (["mixed", "--shape", "qa-long"], ["overload", "--shape", "classify-2"]):
        with pytest.raises(SystemExit):
            parse_args(wrong)


def test_the_mixed_table_gives_each_shape_its_share_answered_and_the_promise() -> None:
    row = {
        "offered_per_s": 7.5,
        "capacity_per_s": 5.0,
        "statuses": {"200": 3, "429": 147},
        "answered_share": 0.02,
        "p50_ms_200": 740.0,
        "p99_ms_200": 2400.0,
        "alone_ms": 360.0,
    }
    line = mixed_table([{"shape": "qa-long", **row}], max_queue_s=2.0).splitlines()[-1]
    assert line == "| qa-long | 7.5 (5.0) | 3 | 147 | 0 | 2.0% | 0.74 / 2.40 | 2.36 | NO |"


def test_answers_are_counted_before_the_stop_while_stuck_and_after_the_first_200() -> None:
    result = OpenLoopResult(rate=10, seconds=3)
    due_status = [(0.1, 200), (0.9, 503), (1.1, 429), (1.5, 503), (2.0, 200), (2.1, 429), (2.5, 200)]
    result.answers = [Answer(due=due, seconds=0.5, status=status) for due, status in due_status]
    result.answers[3].seconds = 1.2
    wall = time.mktime(time.strptime("2026-11-25 07:21:34", "%Y-%m-%d %H:%M:%S")) + 0.5
    log = (
        "2026-11-25 07:21:34,100 INFO service.supervisor.launcher [-]: engine started (pid 7)\n"
        "2026-11-25 07:21:35,317 ERROR service.supervisor.launcher [-]: engine (pid 7) is stuck: the event loop has "
        "not run for 1.0 s (--liveness-stall-s 1); killing it\n"
    )
    outcome = _hang_outcome(result, {"perf": 1.0, "wall": wall}, log)
    assert outcome["before_stop"] == {"200": 1, "503": 1}
    assert outcome["while_stuck"] == {"429": 1, "503": 1}
    assert outcome["after_recovery"] == {"200": 2, "429": 1}
    assert outcome["first_200_after_stop_s"] == 1.0
    assert outcome["launcher_said_stuck_after_s"] == 0.82
    assert outcome["launcher_line"].startswith("engine (pid 7) is stuck: the event loop has not run for 1.0 s")
    assert outcome["longest_wait_s"] == 1.2


def test_a_row_taken_on_a_busy_machine_is_flagged_under_the_table() -> None:
    rows = [
        {"shape": "classify-1", "factor": 3.0, "other_cores": 0.03},
        {"shape": "ner-long", "factor": 3.0, "other_cores": BUSY_MACHINE_CORES + 0.3},
        {"shape": "qa-long", "factor": 1.5, "other_cores": None},  # /proc could not tell
        {"shape": "classify-16", "factor": 3.0},  # a report written before the reading existed
    ]
    warnings = busy_rows(rows)
    assert len(warnings) == 1 and warnings[0].startswith("ner-long (3x): WARNING: other programs used 0.55 cores")


def test_the_embedding_and_rerank_shapes_are_requests_their_routes_take() -> None:
    """Each shape's bodies pass its route's own schema, with the rows the load client counts for it."""
    from benchmarks.realdata import shared_available
    from benchmarks.request_shapes import SHAPES
    from service.frontend.http import schemas

    if not shared_available():  # the shapes are made of ../shared's real data
        pytest.fail("../shared is missing: the shapes need its real data")
    cases = {
        "embed-1": (schemas.EmbedRequest, "/v1/models/minilm-embed/embed"),
        "embed-64": (schemas.EmbedRequest, "/v1/models/minilm-embed/embed"),
        "embeddings-1": (schemas.OpenAIEmbeddingRequest, "/v1/embeddings"),
        "rerank-20": (schemas.RerankRequest, "/v1/rerank"),
    }
    for name, (schema, path) in cases.items():
        shape = SHAPES[name]
        assert shape.path() == path
        for body in shape.bodies(3):
            request = schema.model_validate(body)
            rows = getattr(request, "inputs", None) or getattr(request, "documents", None) or [request.input]
            assert (len(rows) if isinstance(rows, list) else 1) == shape.rows_per_request(), name
    assert {body["model"] for body in SHAPES["rerank-20"].bodies(3)} == {"minilm-cross-encoder"}
