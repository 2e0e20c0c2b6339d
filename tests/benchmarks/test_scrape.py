"""The /metrics parser of the benchmarks against the service's own registry: names and per-stage means."""

from __future__ import annotations

import pytest
from prometheus_client import generate_latest

from benchmarks.scrape import STAGES, delta, parse, stage_means
from service.metrics import Metrics


def exposition(metrics: Metrics) -> str:
    return generate_latest(metrics.registry).decode()


def test_stage_means_are_deltas_of_sum_over_count_summed_across_models() -> None:
    metrics = Metrics()
    metrics.inference_duration.labels(model="a").observe(1.0)  # before the window: must not count
    before = parse(exposition(metrics))
    for model, seconds in (("a", 0.002), ("a", 0.004), ("b", 0.006)):
        metrics.inference_duration.labels(model=model).observe(seconds)
        metrics.batch_size.labels(model=model).observe(8)
    metrics.queue_duration.labels(model="b").observe(0.010)
    metrics.observer("a").on_batch(rows=4, padded_tokens=60, real_tokens=40, seconds=0.001)
    metrics.observer("b").on_batch(rows=4, padded_tokens=30, real_tokens=20, seconds=0.001)
    after = parse(exposition(metrics))

    stages = stage_means(before, after)
    assert stages["inference"]["count"] == 5
    assert stages["inference"]["mean"] == pytest.approx((0.002 + 0.004 + 0.006 + 0.002) / 5)
    assert stages["batch size"]["mean"] == pytest.approx((3 * 8 + 2 * 4) / 5)
    assert stages["padding"]["mean"] == pytest.approx(90 / 60)  # padded / real tokens over both models' batches
    assert stages["queue"]["mean"] == pytest.approx(0.010)
    assert stages["tokenization"] == {"per": "request", "count": None, "mean": None}  # no model observed: absent


def test_every_stage_histogram_is_one_the_service_exports() -> None:
    metrics = Metrics()
    for _, histogram, _ in STAGES:
        attribute = {
            "bertserve_request_duration_seconds": metrics.request_duration.labels(model="m", endpoint="classify"),
            "bertserve_queue_duration_seconds": metrics.queue_duration.labels(model="m"),
            "bertserve_tokenization_duration_seconds": metrics.tokenization_duration.labels(model="m"),
            "bertserve_inference_duration_seconds": metrics.inference_duration.labels(model="m"),
            "bertserve_batch_size": metrics.batch_size.labels(model="m"),
        }[histogram]
        attribute.observe(1)
    totals = parse(exposition(metrics))
    for _, histogram, _ in STAGES:
        assert totals[histogram + "_count"] == 1, histogram


def test_a_metric_the_server_does_not_export_is_none_not_zero() -> None:
    assert delta({}, {"x_total": 3.0}, "x_total") == 3.0
    assert delta({"x_total": 1.0}, {}, "x_total") is None
    assert stage_means({}, {})["inference"]["mean"] is None
    assert stage_means({}, {})["padding"]["mean"] is None
