"""The service's /metrics as numbers: totals per sample name, and per-stage means between two scrapes."""

from __future__ import annotations

from collections import Counter

import httpx
from prometheus_client.parser import text_string_to_metric_families

# (label, histogram, what one observation is); the mean of a stage over a run is delta(_sum) / delta(_count).
STAGES = (
    ("request", "bertserve_request_duration_seconds", "request"),
    ("queue", "bertserve_queue_duration_seconds", "request"),
    ("tokenization", "bertserve_tokenization_duration_seconds", "request"),
    ("inference", "bertserve_inference_duration_seconds", "batch"),
    ("batch size", "bertserve_batch_size", "batch"),
)


def parse(text: str, prefix: str = "") -> Counter[str]:
    """Every sample whose name starts with `prefix`, summed over its labels (models, endpoints, processes);
    a name the server does not export reads 0."""
    totals: Counter[str] = Counter()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.startswith(prefix):
                totals[sample.name] += sample.value
    return totals


def scrape(url: str) -> Counter[str]:
    """The server's /metrics as {sample name: value summed over all its label sets}."""
    return parse(httpx.get(url + "/metrics", timeout=30).text)


def delta(before: dict[str, float], after: dict[str, float], name: str) -> float | None:
    """How much a total grew between two scrapes; None where the server does not export it."""
    if name not in after:
        return None
    return after[name] - before.get(name, 0.0)


def stage_means(before: dict[str, float], after: dict[str, float]) -> dict[str, dict]:
    """Per stage: observations in the window and their mean (seconds, or rows for the batch size)."""
    stages = {}
    for label, histogram, unit in STAGES:
        count = delta(before, after, histogram + "_count")
        total = delta(before, after, histogram + "_sum")
        mean = total / count if count and total is not None else None
        stages[label] = {"per": unit, "count": count, "mean": mean}
    padded = delta(before, after, "bertserve_batch_padded_tokens_total")
    real = delta(before, after, "bertserve_batch_real_tokens_total")
    stages["padding"] = {"per": "token", "count": real, "mean": padded / real if padded is not None and real else None}
    return stages
