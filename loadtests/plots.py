"""PNG plots of a load test (matplotlib, Agg backend): throughput and latency against offered load, timeline."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from matplotlib.ticker import NullFormatter, ScalarFormatter

from loadtests.report import RequestRecord, StageStats, StageWindow


def _save(figure: Figure, path: Path) -> Path:
    """Writes the figure as a PNG and frees it (pyplot keeps every open figure alive)."""
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)
    return path


def throughput_plot(stats: Sequence[StageStats], summary: dict[str, Any], offered_unit: str, path: Path) -> Path:
    figure, axis = plt.subplots(figsize=(7, 4.5), dpi=110)
    offered = [s.offered for s in stats]
    axis.plot(offered, [s.sent_rps for s in stats], "x--", color="grey", label="requests sent/s")
    axis.plot(offered, [s.ok_rps for s in stats], "o-", color="tab:blue", label="requests answered/s")
    axis.plot(offered, [s.ok_sps for s in stats], "s-", color="tab:green", label="sequences answered/s")
    shed = [s.shed_rate * s.sent_rps for s in stats]
    if any(shed):
        axis.plot(offered, shed, "v:", color="tab:red", label="requests shed (429)/s")
    saturation = summary.get("saturation")
    if saturation:
        axis.axvline(saturation["offered"], color="tab:orange", alpha=0.6, linestyle="--", label="saturation")
    axis.set_xlabel(f"offered load ({offered_unit})")
    axis.set_ylabel("per second")
    axis.set_ylim(bottom=0)
    axis.grid(alpha=0.3)
    axis.legend(loc="upper left", fontsize=8)
    axis.set_title("Throughput against offered load")
    return _save(figure, path)


def latency_plot(stats: Sequence[StageStats], offered_unit: str, path: Path) -> Path:
    figure, axis = plt.subplots(figsize=(7, 4.5), dpi=110)
    offered = [s.offered for s in stats]
    for name, values, style in (
        ("p50", [s.p50_ms for s in stats], "o-"),
        ("p95", [s.p95_ms for s in stats], "s-"),
        ("p99", [s.p99_ms for s in stats], "^-"),
    ):
        points = [(x, y) for x, y in zip(offered, values, strict=True) if y is not None]
        if points:
            axis.plot([x for x, _ in points], [y for _, y in points], style, label=name)
    axis.set_xlabel(f"offered load ({offered_unit})")
    axis.set_ylabel("latency of answered requests (ms)")
    if any(s.p99_ms for s in stats):
        axis.set_yscale("log")
        axis.yaxis.set_major_formatter(ScalarFormatter())
        axis.yaxis.set_minor_formatter(NullFormatter())
    axis.grid(alpha=0.3, which="both")
    axis.legend(fontsize=8)
    axis.set_title("Latency percentiles against offered load")
    return _save(figure, path)


def timeline_plot(records: Sequence[RequestRecord], stages: Sequence[StageWindow], path: Path) -> Path:
    """Answered, shed and failed requests per second over the run, with the offered load per stage."""
    figure, axis = plt.subplots(figsize=(8, 4), dpi=110)
    origin = min([s.start for s in stages] + [r.start for r in records], default=0.0)
    counts: dict[str, Counter[int]] = {"ok": Counter(), "shed": Counter(), "fail": Counter()}
    for record in records:
        counts.setdefault(record.outcome, Counter())[int(record.start - origin)] += 1
    last = max((int(r.start - origin) for r in records), default=0)
    seconds = list(range(last + 1))
    for outcome, color in (("ok", "tab:blue"), ("shed", "tab:red"), ("fail", "black")):
        if counts[outcome]:
            axis.plot(seconds, [counts[outcome][t] for t in seconds], color=color, label=f"{outcome}/s")
    axis.set_xlabel("seconds since start")
    axis.set_ylabel("requests/s")
    axis.set_ylim(bottom=0)
    axis.grid(alpha=0.3)
    if stages:
        second = axis.twinx()
        xs, ys = [], []
        for stage in stages:
            xs += [stage.start - origin, stage.end - origin]
            ys += [stage.offered, stage.offered]
        second.plot(xs, ys, color="tab:orange", alpha=0.6, label="offered load")
        second.set_ylabel("offered load", color="tab:orange")
        second.set_ylim(bottom=0)
    axis.legend(loc="upper left", fontsize=8)
    axis.set_title("Timeline")
    return _save(figure, path)
