"""The summary maths: stage figures, saturation, p99 near 50% / 90% of it, shed rate beyond; metrics deltas."""

from __future__ import annotations

from dataclasses import replace

import pytest

from loadtests.report import (
    RequestRecord,
    StageStats,
    StageWindow,
    markdown,
    metrics_delta,
    parse_prometheus,
    percentile,
    scrape_warning,
    stage_stats,
    summarize,
)


def test_percentile_is_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]  # 1..100
    assert percentile(values, 50) == 50 and percentile(values, 99) == 99 and percentile(values, 100) == 100
    assert percentile([7.0], 99) == 7.0 and percentile([], 50) is None
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0


def test_stage_stats_attribute_requests_and_leave_out_the_settling() -> None:
    stages = [StageWindow(0, 2, 2, None, 100.0, 110.0), StageWindow(1, 4, 4, None, 110.0, 120.0)]
    records = [
        RequestRecord(100.5, "classify", "ok", 200, 999.0, 1),  # settling: left out
        *(RequestRecord(102.0 + i * 0.1, "classify", "ok", 200, float(i + 1), 2) for i in range(80)),
        RequestRecord(111.0, "classify", "ok", 200, 5.0, 1),  # settling of stage 1
        *(RequestRecord(112.0 + i * 0.05, "ner", "ok", 200, 10.0, 3) for i in range(100)),
        *(RequestRecord(113.0 + i * 0.05, "ner", "shed", 429, 1.0, 3) for i in range(20)),
        *(RequestRecord(114.0, "qa", "fail", 500, 2.0, 1) for _ in range(4)),
        RequestRecord(130.0, "qa", "ok", 200, 1.0, 1),  # after the last stage
    ]
    first, second = stage_stats(records, stages, settle_s=2.0)
    assert (first.seconds, first.requests, first.ok, first.rows_ok) == (8.0, 80, 80, 160)
    assert first.ok_rps == pytest.approx(10.0) and first.ok_sps == pytest.approx(20.0)
    assert (first.p50_ms, first.p95_ms, first.p99_ms) == (40.0, 76.0, 80.0)
    assert (second.requests, second.ok, second.shed, second.failed) == (124, 100, 20, 4)
    assert second.shed_rate == pytest.approx(20 / 124) and second.fail_rate == pytest.approx(4 / 124)
    assert second.ok_sps == pytest.approx(300 / 8) and second.sent_rps == pytest.approx(124 / 8)
    assert second.p99_ms == 10.0  # shed and failed requests are not in the latencies
    # A settle longer than half the stage is cut to half of it.
    (short,) = stage_stats(records, stages[:1], settle_s=30.0)
    assert short.seconds == 5.0


def test_failures_while_settling_count_in_the_totals() -> None:
    """A stage's settling seconds are left out of its figures, not out of the failure count."""
    stages = [StageWindow(0, 2, 2, None, 100.0, 110.0)]
    records = [
        *(RequestRecord(100.1 + i * 0.1, "classify", "fail", 500, 1.0, 1) for i in range(7)),  # settling
        RequestRecord(101.0, "classify", "shed", 429, 1.0, 1),  # settling
        *(RequestRecord(103.0 + i * 0.1, "classify", "ok", 200, 5.0, 1) for i in range(20)),
    ]
    stats = stage_stats(records, stages, settle_s=2.0)
    assert stats[0].failed == 0 and stats[0].requests == 20
    summary = summarize(stats, "requests", records)
    totals = summary["totals"]
    assert (totals["requests"], totals["ok"], totals["shed"], totals["failed"]) == (28, 20, 1, 7)
    assert totals["fail_rate"] == pytest.approx(7 / 28, abs=1e-4)
    assert totals["outside_stages"] == {"requests": 8, "ok": 0, "shed": 1, "failed": 7}
    text = markdown(summary, stats, {"seconds": 10.0, "settle_seconds": 2.0})
    assert "- totals: 28 requests, 20 ok, 1 shed, 7 failed" in text
    assert "8 of them, 7 failed, 1 shed, fell in the first 2.0 s of a stage" in text
    # Without the request log: the stage figures' totals, as before.
    assert summarize(stats)["totals"]["failed"] == 0 and "outside_stages" not in summarize(stats)["totals"]


def _stage(index: int, offered: float, ok_rps: float, p99: float, shed_rate: float = 0.0) -> StageStats:
    seconds, sent = 10.0, ok_rps / (1 - shed_rate)
    requests = round(sent * seconds)
    shed = requests - round(ok_rps * seconds)
    return StageStats(
        index=index,
        offered=offered,
        users=int(offered),
        rate=None,
        seconds=seconds,
        requests=requests,
        ok=requests - shed,
        shed=shed,
        failed=0,
        rows_ok=2 * (requests - shed),
        ok_rps=ok_rps,
        ok_sps=2 * ok_rps,
        sent_rps=sent,
        shed_rate=shed / requests,
        fail_rate=0.0,
        p50_ms=p99 / 3,
        p95_ms=p99 / 1.5,
        p99_ms=p99,
    )


STEPS = [
    _stage(0, 2, 40.0, 30.0),
    _stage(1, 4, 75.0, 40.0),
    _stage(2, 6, 95.0, 60.0),
    _stage(3, 8, 100.0, 120.0),  # saturation
    _stage(4, 10, 98.0, 300.0, shed_rate=0.25),
    _stage(5, 12, 99.0, 500.0, shed_rate=0.5),
]


def test_summary_finds_saturation_and_the_points_around_it() -> None:
    summary = summarize(STEPS)
    assert summary["saturation"]["ok_rps"] == 100.0 and summary["saturation"]["stage"] == 3
    assert summary["knee"]["stage"] == 2  # first stage within 5% of the best (95 >= 0.95 * 100)
    assert summary["saturated"] is True
    assert summary["at_50"]["stage"] == 0 and summary["at_50"]["p99_ms"] == 30.0  # 40 is nearest to 50
    assert summary["at_90"]["stage"] == 2 and summary["at_90"]["p99_ms"] == 60.0  # 95 is nearest to 90
    beyond = summary["beyond"]
    assert beyond["stages"] == [3, 4, 5]
    shed = STEPS[4].shed + STEPS[5].shed
    assert beyond["shed_rate"] == pytest.approx(shed / sum(s.requests for s in STEPS[3:]), abs=1e-4)
    assert beyond["p99_ms"] == 500.0
    assert summary["totals"]["shed"] == shed and summary["totals"]["failed"] == 0
    # By sequences/s the same stages (each request carries 2 inputs here).
    by_sequences = summarize(STEPS, "sequences")
    assert by_sequences["saturation"]["throughput"] == 200.0 and by_sequences["at_90"]["stage"] == 2


def test_summary_says_when_the_load_did_not_saturate() -> None:
    rising = [_stage(0, 2, 40.0, 30.0), _stage(1, 4, 80.0, 35.0)]
    summary = summarize(rising)
    assert summary["saturated"] is False and summary["beyond"] is None
    assert summary["at_90"]["stage"] == 1 and summary["at_50"]["stage"] == 0
    text = markdown(summary, rising, {"command": "python -m loadtests ...", "offered_unit": "users", "seconds": 20})
    assert "not saturated" in text and "no shed rate" in text
    # One stage is its own saturation: no stage ran near half of it (it was labelled "~50% of saturation")
    alone = summarize(rising[1:])
    assert alone["at_90"]["stage"] == 1 and alone["at_50"] is None
    assert "- p99 at ~50% of saturation: no stage ran near it" in markdown(alone, rising[1:], {"seconds": 10})
    empty = summarize([replace(rising[0], ok=0, ok_rps=0.0, ok_sps=0.0)])
    assert empty["saturation"] is None and empty["at_50"] is None
    assert "No request was answered" in markdown(empty, [], {"seconds": 1})


def test_a_server_shedding_or_a_pace_never_reached_is_said_whatever_the_throughput() -> None:
    """99% shed and a rate stage that sent 16 of the 20 requests/s offered both read "not saturated" and nothing
    else: the verdict is by answered throughput only."""
    shedding = [_stage(0, 3, 10.0, 900.0, shed_rate=0.99)]
    paced = replace(_stage(1, 20, 15.9, 1000.0), rate=20.0, sent_rps=15.9)
    fine = replace(_stage(2, 10, 9.95, 50.0), rate=10.0, sent_rps=9.95)
    summary = summarize([*shedding, paced, fine])
    assert summary["warnings"] == [
        "stage 0 (offered 3): 99.0% shed (429) and 0.0% failed: past what the server takes, whatever its throughput "
        "says",
        "stage 1 sent 15.9 requests/s of the 20 offered: its users could not keep the pace (answers slower than "
        "users / rate; raise --rate-users)",
    ]
    # Failures alone are not load: a server that died mid-run read "72.0% failed: past what the server takes"
    died = replace(_stage(3, 10, 2.8, 50.0), requests=100, ok=28, failed=72, fail_rate=0.72)
    assert summarize([died])["warnings"] == [
        "stage 3 (offered 10): 0.0% shed (429) and 72.0% failed: errors, not load shed: requests.csv and "
        "locust_failures.csv say which"
    ]
    scraped = {**summary, "warnings": [*summary["warnings"], scrape_warning("connection refused")]}  # the runner's
    text = markdown(scraped, [*shedding, paced, fine], {"seconds": 30, "server_scrape_failed": "connection refused"})
    assert text.count("- **warning**: ") == 3
    assert "the server's /metrics could not be read after the run (connection refused)" in text
    assert summarize(STEPS[:4])["warnings"] == []  # no shed past 5%, closed loop: nothing to say


def test_requests_that_got_no_answer_are_said_however_few_and_wherever_they_started() -> None:
    """A server hung mid-run: a closed loop's two users left two requests unanswered (under the 5% warning, their
    waits out of the latencies), and requests sent in a stage's settling seconds left no trace in its figures: the
    stage read "0 requests", the summary "failed 0.00% of 0 requests", and no warning said the server had stopped."""
    answered = [RequestRecord(100.0 + i / 10, "classify", "ok", 200, 12.0, 1) for i in range(100)]  # stage 0
    hung = [
        RequestRecord(111.0, "classify", "fail", 0, 18254.0, 1, "no answer 10 s after the load stopped"),
        RequestRecord(111.2, "classify", "fail", 0, 18050.5, 1, "no answer 10 s after the load stopped"),
        RequestRecord(111.5, "classify", "fail", 0, 900.0, 1, "no response (connection error or client timeout)"),
    ]
    stages = [StageWindow(0, 2, 2, None, 100.0, 110.0), StageWindow(1, 4, 4, None, 110.0, 120.0)]
    stats = stage_stats([*answered, *hung], stages, settle_s=2.0)
    assert stats[1].requests == 0  # all three in stage 1's settling seconds
    summary = summarize(stats, records=[*answered, *hung])
    assert summary["warnings"] == [
        "3 request(s) got no answer at all (the longest waited 18.3 s, 2 of them still waiting when the load "
        "stopped): the server stopped answering, or connections failed; requests.csv and locust_failures.csv say "
        "which"
    ]
    assert summarize(stats, records=answered)["warnings"] == []
    assert "- **warning**: 3 request(s) got no answer at all" in markdown(summary, stats, {"seconds": 20})


def test_markdown_has_the_numbers() -> None:
    summary = summarize(STEPS)
    text = markdown(summary, STEPS, {"command": "python -m loadtests --url X", "seconds": 60.0, "offered_unit": "u"})
    assert "**saturation throughput**: 100.0 requests/s, 200.0 sequences/s" in text
    assert "p99 at ~50% of saturation: 30.0 ms" in text and "p99 at ~90% of saturation: 60.0 ms" in text
    assert "beyond saturation (stages [3, 4, 5]): shed (429)" in text
    assert text.count("\n| ") == len(STEPS) + 1  # header + one row per stage


BEFORE = """# HELP bertserve_requests_total Requests answered.
# TYPE bertserve_requests_total counter
bertserve_requests_total{endpoint="classify",model="sst2",status="200"} 10.0
bertserve_batch_size_count{model="sst2"} 5.0
bertserve_batch_size_sum{model="sst2"} 10.0
bertserve_queue_depth{model="sst2"} 0.0
"""
AFTER = """bertserve_requests_total{endpoint="classify",model="sst2",status="200"} 110.0
bertserve_requests_total{endpoint="classify",model="sst2",status="429"} 7.0
bertserve_batch_size_count{model="sst2"} 25.0
bertserve_batch_size_sum{model="sst2"} 90.0
bertserve_batch_padding_ratio_count{model="sst2"} 20.0
bertserve_batch_padding_ratio_sum{model="sst2"} 22.0
bertserve_inference_duration_seconds_sum{model="sst2"} 0.5
bertserve_inference_duration_seconds_count{model="sst2"} 20.0
bertserve_queue_depth{model="sst2"} 3.0
bertserve_model_info{model="a \\"quoted\\" name",provider="CPUExecutionProvider"} 1.0
"""


def test_metrics_before_and_after() -> None:
    after = parse_prometheus(AFTER)
    assert after[("bertserve_queue_depth", (("model", "sst2"),))] == 3.0
    assert ("bertserve_model_info", (("model", 'a \\"quoted\\" name'), ("provider", "CPUExecutionProvider"))) in after
    delta = metrics_delta(parse_prometheus(BEFORE), after)
    assert delta["requests_by_status"] == {"sst2/classify": {"200": 100, "429": 7}}
    model = delta["models"]["sst2"]
    assert model["batches"] == 20 and model["mean_batch_rows"] == 4.0 and model["mean_padding_ratio"] == 1.1
    assert model["mean_inference_ms"] == 25.0 and model["queue_depth_after"] == 3.0
