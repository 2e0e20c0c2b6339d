"""From the request log and the stage timings to per-stage figures and the summary of a load test.

Per stage (its first `settle_s` seconds left out, so users ramping up and queues filling do not count):
requests sent, answered (ok), shed (429) and failed; ok requests/s and sequences/s (inputs answered); p50,
p95 and p99 of the ok latencies. A request belongs to the stage in which it started.

Summary:
- totals: every request logged, the settling seconds too (a failure there is still a failure: it counts in the
  failures and in the exit status); how many of them fell in the settling seconds;
- saturation throughput: the best ok throughput of any stage (requests/s, or sequences/s with
  `metric="sequences"`); the knee is the first stage within 5% of it, and the load is saturated when
  stages with more offered load follow the knee;
- p99 at the stages (up to the knee) whose throughput is nearest 50% and 90% of saturation, where one came within
  25% of that (a one-stage run has no 50% point: its one stage was labelled so);
- beyond saturation: over the stages after the knee, the share of requests shed (429) and failed;
- warnings: rate stages that did not send their offered rate, stages shedding or failing over 5% of their
  requests, saturated by throughput or not, and requests that got no answer at all, however few.
"""

from __future__ import annotations

import csv
import math
import re
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from loadtests.shapes import UNANSWERED

Metric = Literal["requests", "sequences"]
KNEE_FRACTION = 0.95
NEAR_FRACTION = 0.25  # a stage stands for a share of saturation when its throughput is this near the target


@dataclass(frozen=True)
class RequestRecord:
    start: float  # epoch seconds
    endpoint: str
    outcome: str  # ok, shed, fail
    status: int  # 0: no answer (connection error, client timeout, or none before the load stopped)
    ms: float
    rows: int
    error: str = ""


@dataclass(frozen=True)
class StageWindow:
    index: int
    offered: float
    users: int
    rate: float | None
    start: float  # epoch seconds
    end: float


@dataclass(frozen=True)
class StageStats:
    index: int
    offered: float
    users: int
    rate: float | None
    seconds: float
    requests: int
    ok: int
    shed: int
    failed: int
    rows_ok: int
    ok_rps: float
    ok_sps: float
    sent_rps: float
    shed_rate: float
    fail_rate: float
    p50_ms: float | None
    p95_ms: float | None
    p99_ms: float | None

    def throughput(self, metric: Metric) -> float:
        return self.ok_sps if metric == "sequences" else self.ok_rps


def percentile(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile (q in [0, 100]) of the values; None when there are none."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


def read_requests(path: Path) -> list[RequestRecord]:
    with path.open(newline="") as stream:
        return [
            RequestRecord(
                float(row["start_epoch"]),
                row["endpoint"],
                row["outcome"],
                int(row["status"]),
                float(row["response_ms"]),
                int(row["rows"]),
                row.get("error") or "",
            )
            for row in csv.DictReader(stream)
        ]


def read_stages(path: Path) -> list[StageWindow]:
    with path.open(newline="") as stream:
        return [
            StageWindow(
                int(row["index"]),
                float(row["offered"]),
                int(row["users"]),
                float(row["rate"]) if row["rate"] not in ("", "None") else None,
                float(row["start_epoch"]),
                float(row["end_epoch"]),
            )
            for row in csv.DictReader(stream)
        ]


def _rate(part: int, whole: int) -> float:
    return part / whole if whole else 0.0


def stage_stats(records: Iterable[RequestRecord], stages: Sequence[StageWindow], settle_s: float) -> list[StageStats]:
    """Figures per stage over [start + settle, end), settle at most half the stage."""
    windows = []
    for stage in stages:
        settle = min(settle_s, (stage.end - stage.start) / 2)
        windows.append((stage, stage.start + settle, stage.end))
    members: dict[int, list[RequestRecord]] = defaultdict(list)
    for record in records:
        for stage, start, end in windows:
            if start <= record.start < end:
                members[stage.index].append(record)
                break
    result = []
    for stage, start, end in windows:
        seconds = end - start
        group = members[stage.index]
        ok = [r for r in group if r.outcome == "ok"]
        shed = sum(1 for r in group if r.outcome == "shed")
        failed = sum(1 for r in group if r.outcome == "fail")
        rows_ok = sum(r.rows for r in ok)
        latencies = [r.ms for r in ok]
        result.append(
            StageStats(
                index=stage.index,
                offered=stage.offered,
                users=stage.users,
                rate=stage.rate,
                seconds=round(seconds, 3),
                requests=len(group),
                ok=len(ok),
                shed=shed,
                failed=failed,
                rows_ok=rows_ok,
                ok_rps=len(ok) / seconds if seconds > 0 else 0.0,
                ok_sps=rows_ok / seconds if seconds > 0 else 0.0,
                sent_rps=len(group) / seconds if seconds > 0 else 0.0,
                shed_rate=_rate(shed, len(group)),
                fail_rate=_rate(failed, len(group)),
                p50_ms=percentile(latencies, 50),
                p95_ms=percentile(latencies, 95),
                p99_ms=percentile(latencies, 99),
            )
        )
    return result


def _point(stage: StageStats, metric: Metric, target: float | None = None) -> dict[str, Any]:
    point: dict[str, Any] = {
        "stage": stage.index,
        "offered": stage.offered,
        "throughput": round(stage.throughput(metric), 2),
        "ok_rps": round(stage.ok_rps, 2),
        "ok_sps": round(stage.ok_sps, 2),
        "p50_ms": stage.p50_ms,
        "p95_ms": stage.p95_ms,
        "p99_ms": stage.p99_ms,
    }
    if target is not None:
        point["target"] = round(target, 2)
    return point


def _totals(requests: int, ok: int, shed: int, failed: int) -> dict[str, Any]:
    return {
        "requests": requests,
        "ok": ok,
        "shed": shed,
        "failed": failed,
        "shed_rate": round(_rate(shed, requests), 4),
        "fail_rate": round(_rate(failed, requests), 4),
    }


PACE_FRACTION = 0.9  # a rate stage that sent less than this share of its offered rate did not offer it
REFUSED_FRACTION = 0.05  # a stage shedding or failing more than this share was past what the server takes


def warnings(stats: Sequence[StageStats]) -> list[str]:
    """What the throughput verdict alone would hide: rate stages that never sent their offered rate (the users
    could not keep the pace), and stages that shed or failed much of their load, saturated by throughput or not
    (a server shedding 99% read "not saturated": its answered throughput was still at its best)."""
    said = []
    for s in stats:
        if s.rate is not None and s.seconds > 0 and s.sent_rps < PACE_FRACTION * s.rate:
            said.append(
                f"stage {s.index} sent {s.sent_rps:.1f} requests/s of the {s.rate:g} offered: its users could not "
                "keep the pace (answers slower than users / rate; raise --rate-users)"
            )
        if s.requests and (s.shed_rate > REFUSED_FRACTION or s.fail_rate > REFUSED_FRACTION):
            # a server past what it takes sheds (429); failures alone are errors (a server gone, bad answers)
            cause = (
                "past what the server takes, whatever its throughput says"
                if s.shed_rate > REFUSED_FRACTION
                else "errors, not load shed: requests.csv and locust_failures.csv say which"
            )
            said.append(
                f"stage {s.index} (offered {s.offered:g}): {100 * s.shed_rate:.1f}% shed (429) and "
                f"{100 * s.fail_rate:.1f}% failed: {cause}"
            )
    return said


def scrape_warning(error: str) -> str:
    """The warning of a run whose server's /metrics could not be read after it (died or hung meanwhile)."""
    return f"the server's /metrics could not be read after the run ({error}): no figures"


def unanswered_warnings(records: Sequence[RequestRecord]) -> list[str]:
    """Requests that got no answer at all, whatever their share: a server that hangs fails one request per user of
    a closed loop (under the 5% of `warnings`), and one whose requests were sent in a stage's settling seconds left
    no trace in the stage figures: its stage read "0 requests" and the summary said nothing."""
    silent = [r for r in records if r.status == 0]
    if not silent:
        return []
    waiting = [r for r in silent if r.error == UNANSWERED]
    longest = max(r.ms for r in silent) / 1000
    still = f", {len(waiting)} of them still waiting when the load stopped" if waiting else ""
    return [
        f"{len(silent)} request(s) got no answer at all (the longest waited {longest:.1f} s{still}): the server "
        "stopped answering, or connections failed; requests.csv and locust_failures.csv say which"
    ]


def summarize(
    stats: Sequence[StageStats], metric: Metric = "requests", records: Sequence[RequestRecord] | None = None
) -> dict[str, Any]:
    """Saturation throughput, p99 near 50% and 90% of it, shed and fail rates beyond it (see module doc).

    `totals` counts every request of `records` (the whole log, settling seconds included); without `records`,
    the requests of the stage figures. `outside_stages` (with `records`) says how many requests, and failures,
    the stage figures leave out (a stage's settling seconds, or after the last stage)."""
    in_stages = {
        "requests": sum(s.requests for s in stats),
        "ok": sum(s.ok for s in stats),
        "shed": sum(s.shed for s in stats),
        "failed": sum(s.failed for s in stats),
    }
    if records is None:
        totals = _totals(**in_stages)
    else:
        outcomes = [record.outcome for record in records]
        totals = _totals(len(outcomes), outcomes.count("ok"), outcomes.count("shed"), outcomes.count("fail"))
        totals["outside_stages"] = {key: totals[key] - in_stages[key] for key in in_stages}
    summary: dict[str, Any] = {
        "metric": metric,
        "stages": len(stats),
        "totals": totals,
        "saturation": None,
        "knee": None,
        "saturated": False,
        "at_50": None,
        "at_90": None,
        "beyond": None,
    }
    summary["warnings"] = warnings(stats) + ([] if records is None else unanswered_warnings(records))
    answered = [s for s in stats if s.ok > 0]
    if not answered:
        return summary
    best = max(answered, key=lambda s: s.throughput(metric))
    saturation = best.throughput(metric)
    knee = next(s for s in answered if s.throughput(metric) >= KNEE_FRACTION * saturation)
    summary["saturation"] = _point(best, metric)
    summary["knee"] = _point(knee, metric)
    rising = [s for s in answered if s.index <= knee.index]
    for key, fraction in (("at_50", 0.5), ("at_90", 0.9)):
        target = fraction * saturation
        nearest = min(rising, key=lambda s: (abs(s.throughput(metric) - target), s.index))
        if abs(nearest.throughput(metric) - target) <= NEAR_FRACTION * target:
            summary[key] = _point(nearest, metric, target)
    beyond = [s for s in stats if s.index > knee.index and s.offered > knee.offered]
    if beyond:
        sent = sum(s.requests for s in beyond)
        summary["saturated"] = True
        summary["beyond"] = {
            "stages": [s.index for s in beyond],
            "offered": [s.offered for s in beyond],
            "requests": sent,
            "shed_rate": round(_rate(sum(s.shed for s in beyond), sent), 4),
            "fail_rate": round(_rate(sum(s.failed for s in beyond), sent), 4),
            "p99_ms": max((s.p99_ms for s in beyond if s.p99_ms is not None), default=None),
            "ok_throughput": round(
                sum(s.throughput(metric) * s.seconds for s in beyond) / sum(s.seconds for s in beyond), 2
            ),
        }
    return summary


def endpoint_totals(records: Iterable[RequestRecord]) -> dict[str, dict[str, Any]]:
    groups: dict[str, list[RequestRecord]] = defaultdict(list)
    for record in records:
        groups[record.endpoint].append(record)
    totals = {}
    for endpoint, group in sorted(groups.items()):
        ok = [r.ms for r in group if r.outcome == "ok"]
        totals[endpoint] = {
            "requests": len(group),
            "ok": len(ok),
            "shed": sum(1 for r in group if r.outcome == "shed"),
            "failed": sum(1 for r in group if r.outcome == "fail"),
            "inputs_answered": sum(r.rows for r in group if r.outcome == "ok"),
            "p50_ms": percentile(ok, 50),
            "p99_ms": percentile(ok, 99),
        }
    return totals


# Prometheus text -------------------------------------------------------------------------------------------

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')
Sample = tuple[str, tuple[tuple[str, str], ...]]


def parse_prometheus(text: str) -> dict[Sample, float]:
    """{(name, sorted labels): value} for every sample line (comments skipped)."""
    samples: dict[Sample, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE.match(line)
        if not match:
            continue
        name, labels, value = match.groups()
        try:
            number = float(value)
        except ValueError:
            continue
        samples[(name, tuple(sorted(_LABEL.findall(labels or ""))))] = number
    return samples


def metrics_delta(before: dict[Sample, float], after: dict[Sample, float]) -> dict[str, Any]:
    """What the server counted during the test: answers by status, batches, batch size, padding, queue depth."""

    def delta(name: str) -> dict[tuple[tuple[str, str], ...], float]:
        return {
            labels: value - before.get((metric, labels), 0.0)
            for (metric, labels), value in after.items()
            if metric == name
        }

    requests: dict[str, dict[str, int]] = defaultdict(dict)
    for labels, value in delta("bertserve_requests_total").items():
        found = dict(labels)
        key = f"{found.get('model', '?')}/{found.get('endpoint', '?')}"
        if value:
            requests[key][found.get("status", "?")] = int(value)
    models: dict[str, dict[str, Any]] = {}
    batch_sum, batch_count = delta("bertserve_batch_size_sum"), delta("bertserve_batch_size_count")
    padding_sum, padding_count = (
        delta("bertserve_batch_padding_ratio_sum"),
        delta("bertserve_batch_padding_ratio_count"),
    )
    inference_sum = delta("bertserve_inference_duration_seconds_sum")
    inference_count = delta("bertserve_inference_duration_seconds_count")
    for labels, count in batch_count.items():
        model = dict(labels).get("model", "?")
        entry = models.setdefault(model, {})
        entry["batches"] = int(count)
        entry["mean_batch_rows"] = round(batch_sum.get(labels, 0.0) / count, 2) if count else None
        if padding_count.get(labels):
            entry["mean_padding_ratio"] = round(padding_sum.get(labels, 0.0) / padding_count[labels], 3)
        if inference_count.get(labels):
            entry["mean_inference_ms"] = round(1000 * inference_sum.get(labels, 0.0) / inference_count[labels], 2)
    for (metric, labels), value in after.items():
        if metric == "bertserve_queue_depth":
            models.setdefault(dict(labels).get("model", "?"), {})["queue_depth_after"] = value
    return {"requests_by_status": dict(requests), "models": models}


# Markdown --------------------------------------------------------------------------------------------------


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def markdown(summary: dict[str, Any], stats: Sequence[StageStats], run: dict[str, Any]) -> str:
    unit = "sequences/s" if summary["metric"] == "sequences" else "requests/s"
    offered_unit = run.get("offered_unit", "offered load")
    lines = [
        "# Load test summary",
        "",
        f"- command: `{run.get('command', '')}`",
        f"- target: {run.get('url')} — models {run.get('models')}",
        f"- shape: {run.get('shape')} (offered load in {offered_unit}); payloads {run.get('payloads')}; "
        f"batch sizes {run.get('batch')}",
        f"- duration: {run.get('seconds', 0):.1f} s; stop: {run.get('stop_reason')}",
        "",
    ]
    saturation = summary.get("saturation")
    if saturation is None:
        lines.append("No request was answered: no throughput to report.")
    else:
        lines += [
            f"- **saturation throughput**: {saturation['ok_rps']:.1f} requests/s, {saturation['ok_sps']:.1f} "
            f"sequences/s (stage {saturation['stage']}, offered {saturation['offered']:g}; by {unit})"
            + (
                ""
                if summary["saturated"]
                else " — not saturated: throughput still within 5% of its best at the last stage"
            ),
        ]
        for key, label in (("at_50", "50%"), ("at_90", "90%")):
            point = summary[key]
            if point is None:
                lines.append(f"- p99 at ~{label} of saturation: no stage ran near it (add stages of lighter load)")
                continue
            lines.append(
                f"- p99 at ~{label} of saturation: {_ms(point['p99_ms'])} ms (stage {point['stage']}, offered "
                f"{point['offered']:g}: {point['throughput']:.1f} {unit} for a target of {point['target']:.1f})"
            )
        beyond = summary.get("beyond")
        if beyond:
            lines.append(
                f"- beyond saturation (stages {beyond['stages']}): shed (429) {100 * beyond['shed_rate']:.2f}% of "
                f"{beyond['requests']} requests, failed {100 * beyond['fail_rate']:.2f}%, worst p99 "
                f"{_ms(beyond['p99_ms'])} ms"
            )
        else:
            lines.append("- beyond saturation: no stage past the knee, no shed rate to report")
    for warning in summary.get("warnings", ()):
        lines.append(f"- **warning**: {warning}")
    totals = summary["totals"]
    lines.append(
        f"- totals: {totals['requests']} requests, {totals['ok']} ok, {totals['shed']} shed, {totals['failed']} failed"
    )
    outside = totals.get("outside_stages")
    if outside and outside["requests"]:
        settle = run.get("settle_seconds")
        lines.append(
            f"  (all logged requests; {outside['requests']} of them, {outside['failed']} failed, "
            f"{outside['shed']} shed, fell in the first {settle if settle is not None else '?'} s of a stage or after "
            "the last one: counted here and in the exit status, left out of the stage rates and latencies)"
        )
    lines += [
        "",
        "| stage | offered | users | s | sent/s | ok req/s | ok seq/s | shed % | fail % | p50 ms | p95 ms | p99 ms |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in stats:
        lines.append(
            f"| {s.index} | {s.offered:g} | {s.users} | {s.seconds:.1f} | {s.sent_rps:.1f} | {s.ok_rps:.1f} | "
            f"{s.ok_sps:.1f} | {100 * s.shed_rate:.1f} | {100 * s.fail_rate:.1f} | {_ms(s.p50_ms)} | {_ms(s.p95_ms)} | "
            f"{_ms(s.p99_ms)} |"
        )
    return "\n".join(lines) + "\n"


def stats_rows(stats: Sequence[StageStats]) -> list[dict[str, Any]]:
    return [asdict(s) for s in stats]
