"""A SIMULATION of the autoscaling overlay's HorizontalPodAutoscaler, driven by one real server. No cluster runs.

One real `python -m service` plays one pod of the Deployment. An open-loop client (Poisson arrivals, so the
offered load does not bend to the latency) sends it single-sentence classify requests, and /metrics is scraped
every second. Two parts:

  ramp  one pod, the offered rate stepped up and back down: per stage, the answered rate, p50/p99 and each
        candidate autoscaling metric (queued rows, requests in flight by Little's law, engine busy share), to
        see which one rises with the load before the latency does, and falls back.
  hpa   the HPA of deploy/kubernetes/overlays/autoscaling (metric, target, min/max, behaviour read from its
        YAML) applied to the scraped metric: desired = ceil(ready x metric / target), skipped within the 10%
        tolerance, scale-down held by the stabilisation window, steps capped by the scaling policies. The real
        server receives the cluster's offered rate divided by the simulated ready replicas (an even balance);
        a new replica takes load only after the measured start-up time. Every time constant (sync period,
        metric window, stabilisation windows, policy periods, start-up) is multiplied by --time-scale, so that
        a ramp of a minute or two shows what a cluster would do over ten times longer.

What it cannot show: scheduling, image pulls, uneven balancing (a Service balances connections, not
requests), several pods' noise in the average, or the metrics pipeline's own delay (scrape + adapter, ~30-60 s).
It also prints the pod's start-up time and resident memory, idle and under load (the sizing in the base).

    python -m export ../shared/models/minilm-bert-sst2 --name minilm-bert-sst2 --repository /tmp/as --variants fp32
    python -m benchmarks.autoscale_simulation --repository /tmp/as [--part ramp|hpa|both] [--rates 10,30,...]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import math
import os
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil
import yaml

from benchmarks.loadclient import _request, run_load
from benchmarks.realdata import ROOT, shared_available, sst2
from benchmarks.reports import write_report
from benchmarks.scrape import scrape
from tests.harness.serving import ServiceProcess, start_service

HPA_MANIFEST = ROOT / "deploy" / "kubernetes" / "overlays" / "autoscaling" / "hpa.yaml"
FALLBACK_TEXTS = [
    "a gorgeous, witty, seductive movie.",
    "the story is a mess and the acting is worse.",
    "it is not a bad film, but it is not a good one either, and it goes on for far too long.",
    "an utterly charming and hilarious film that reminded me why i love the movies.",
]


# --- the candidate metrics, each as its PromQL computes it from two scrapes `window` seconds apart -------------
def queued_rows(samples: list[tuple[float, dict]], window: float) -> float:
    """avg_over_time(sum(bertserve_queue_depth)[window]): the gauge, averaged over the scrapes in the window."""
    recent = [s for t, s in samples if t >= samples[-1][0] - window]
    return sum(s["bertserve_queue_depth"] for s in recent) / len(recent)


def _rate(name: str) -> Callable[[list[tuple[float, dict]], float], float]:
    def rate(samples: list[tuple[float, dict]], window: float) -> float:
        end_t, end = samples[-1]
        start_t, start = next((t, s) for t, s in samples if t >= end_t - window)
        return (end[name] - start[name]) / (end_t - start_t) if end_t > start_t else 0.0

    return rate


CANDIDATES: dict[str, Callable[[list[tuple[float, dict]], float], float]] = {
    # prometheus-adapter / HPA name -> computation; the overlay's metric must be one of these.
    "bertserve_queued_rows": queued_rows,
    # Little's law: request-seconds answered per second = requests in flight on average.
    "bertserve_requests_in_flight": _rate("bertserve_request_duration_seconds_sum"),
    # The share of the engine's capacity in use: batch seconds a second, divided by the concurrent streams (summed
    # over models). 1.0 is saturation whatever the stream count.
    "bertserve_engine_busy": _rate("bertserve_engine_busy_seconds_total"),
}


# --- the open-loop client -----------------------------------------------------------------------------------
@dataclass
class OpenLoop:
    url: str
    path: str
    payloads: Iterator[bytes]
    rate: float = 1.0
    max_in_flight: int = 512
    done: list[tuple[float, float, int]] = field(default_factory=list)  # (finished at, latency s, status)
    overflow: int = 0  # arrivals dropped by the client at max_in_flight
    _idle: list = field(default_factory=list)
    _in_flight: int = 0

    async def _one(self, body: bytes) -> None:
        host, port = self.url.removeprefix("http://").split(":")
        self._in_flight += 1
        started = time.perf_counter()
        status = 0
        # A pooled connection may have been closed by the server's keep-alive timeout: then once more on a new one.
        for pooled in (bool(self._idle), False):
            try:
                reader, writer = self._idle.pop() if pooled else await asyncio.open_connection(host, int(port))
                status, _, closes = await _request(reader, writer, host, self.path, body)
                if closes:  # the server closes it after this answer (an error answered before the body was read)
                    writer.close()
                else:
                    self._idle.append((reader, writer))
                break
            except (OSError, asyncio.IncompleteReadError, ValueError, IndexError):
                continue
        self._in_flight -= 1
        self.done.append((time.perf_counter(), time.perf_counter() - started, status))

    async def run(self, until: float, seed: int = 0) -> None:
        """Poisson arrivals at self.rate (read at every arrival) until perf_counter() reaches `until`."""
        arrivals = random.Random(seed)
        tasks: set[asyncio.Task] = set()
        next_at = time.perf_counter()
        while next_at < until:
            await asyncio.sleep(max(0.0, next_at - time.perf_counter()))
            if self._in_flight >= self.max_in_flight:
                self.overflow += 1
            else:
                task = asyncio.create_task(self._one(next(self.payloads)))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            next_at += arrivals.expovariate(max(self.rate, 0.01))
        if tasks:
            await asyncio.wait(tasks, timeout=60)
        for _, writer in self._idle:
            writer.close()

    def window(self, start: float, end: float) -> dict:
        rows = [(lat, status) for t, lat, status in self.done if start <= t < end]
        ok = sorted(lat for lat, status in rows if status == 200)
        seconds = max(end - start, 1e-9)

        def pct(q: float) -> float:
            return round(1000 * ok[min(len(ok) - 1, int(q * len(ok)))], 1) if ok else float("nan")

        return {
            "answered_per_s": round(len(ok) / seconds, 1),
            "shed_per_s": round(sum(1 for _, s in rows if s == 429) / seconds, 1),
            "failed": sum(1 for _, s in rows if s not in (200, 429)),
            "p50_ms": pct(0.5),
            "p99_ms": pct(0.99),
        }


def process_usage(pid: int) -> tuple[float, float]:
    """Resident memory (MB) and CPU seconds so far of the server process and every process under it."""
    process = psutil.Process(pid)
    members = [process, *process.children(recursive=True)]
    rss = sum(p.memory_info().rss for p in members) / 2**20
    cpu = sum(p.cpu_times().user + p.cpu_times().system for p in members)
    return rss, cpu


# --- the HPA --------------------------------------------------------------------------------------------------
@dataclass
class HpaSpec:
    metric: str
    target: float
    min_replicas: int
    max_replicas: int
    up_window_s: float
    down_window_s: float
    up_policies: list[dict]
    down_policies: list[dict]
    tolerance: float = 0.1  # kube-controller-manager --horizontal-pod-autoscaler-tolerance (default)
    sync_s: float = 15.0  # --horizontal-pod-autoscaler-sync-period (default)

    @classmethod
    def from_manifest(cls, path: Path = HPA_MANIFEST) -> HpaSpec:
        hpa = next(
            doc for doc in yaml.safe_load_all(path.read_text()) if doc and doc["kind"] == "HorizontalPodAutoscaler"
        )
        spec = hpa["spec"]
        (metric,) = [m["pods"] for m in spec["metrics"] if m["type"] == "Pods"]
        target = metric["target"]["averageValue"]
        behavior = spec.get("behavior", {})
        up, down = behavior.get("scaleUp", {}), behavior.get("scaleDown", {})
        return cls(
            metric=metric["metric"]["name"],
            target=float(target[:-1]) / 1000 if str(target).endswith("m") else float(target),
            min_replicas=spec.get("minReplicas", 1),
            max_replicas=spec["maxReplicas"],
            up_window_s=up.get("stabilizationWindowSeconds", 0),
            down_window_s=down.get("stabilizationWindowSeconds", 300),
            up_policies=up.get("policies", [{"type": "Percent", "value": 100, "periodSeconds": 15}]),
            down_policies=down.get("policies", [{"type": "Percent", "value": 100, "periodSeconds": 15}]),
        )

    def scaled(self, factor: float) -> HpaSpec:
        def policies(items: list[dict]) -> list[dict]:
            return [{**p, "periodSeconds": p["periodSeconds"] * factor} for p in items]

        return HpaSpec(
            self.metric,
            self.target,
            self.min_replicas,
            self.max_replicas,
            self.up_window_s * factor,
            self.down_window_s * factor,
            policies(self.up_policies),
            policies(self.down_policies),
            self.tolerance,
            self.sync_s * factor,
        )


@dataclass
class Hpa:
    """The replica calculation of the HPA controller (pods metric, averageValue target), as documented."""

    spec: HpaSpec
    recommendations: list[tuple[float, int]] = field(default_factory=list)  # (at, raw desired)
    changes: list[tuple[float, int]] = field(default_factory=list)  # (at, replicas before the change)

    def desired(self, now: float, ready: int, current: int, metric: float) -> int:
        ratio = metric / self.spec.target
        raw = current if abs(ratio - 1) <= self.spec.tolerance else math.ceil(ready * ratio)
        raw = min(max(raw, self.spec.min_replicas), self.spec.max_replicas)
        self.recommendations.append((now, raw))
        # Stabilisation: up to the lowest recommendation of the up window, down to the highest of the down window.
        up = min(r for t, r in self.recommendations if t >= now - self.spec.up_window_s)
        down = max(r for t, r in self.recommendations if t >= now - self.spec.down_window_s)
        wanted = up if up > current else down if down < current else current
        if wanted > current:
            wanted = min(wanted, self._limit(now, current, self.spec.up_policies, up=True))
        elif wanted < current:
            wanted = max(wanted, self._limit(now, current, self.spec.down_policies, up=False))
        if wanted != current:
            self.changes.append((now, current))
        return wanted

    def _limit(self, now: float, current: int, policies: list[dict], up: bool) -> int:
        limits = []
        for policy in policies:
            # The replica count at the start of the policy's period (before the changes made within it).
            start = next((before for t, before in self.changes if t >= now - policy["periodSeconds"]), current)
            if policy["type"] == "Pods":
                limits.append(start + policy["value"] if up else start - policy["value"])
            elif up:
                limits.append(math.ceil(start * (1 + policy["value"] / 100)))
            else:
                limits.append(int(start * (1 - policy["value"] / 100)))
        return max(limits) if up else min(limits)  # selectPolicy: Max (the default)


# --- the runs -------------------------------------------------------------------------------------------------
def texts() -> list[str]:
    return [s for s, _ in sst2()] if shared_available() else FALLBACK_TEXTS


def payloads() -> Iterator[bytes]:
    return itertools.cycle([json.dumps({"inputs": [t]}).encode() for t in texts()])


def capacity(url: str, path: str, seconds: float = 5.0, clients: int = 8) -> float:
    """Answered requests/s of one pod at saturation (closed loop), the unit of the offered rates."""
    bodies = [{"inputs": [t]} for t in texts()]
    run_load(url, path, bodies[:50], [1] * 50, clients, 1.0)  # warm-up
    return run_load(url, path, bodies, [1] * len(bodies), clients, seconds).summary()["sequences_per_s"]


def health_summary(health: list[tuple[float, float, float, float]]) -> dict:
    return {"probe_max_ms": round(max(h[1] for h in health), 1), "rss_peak_mb": round(max(h[2] for h in health), 1)}


def probe_ms(url: str) -> float:
    """How long /livez and /readyz take to answer (the slower), as the kubelet's probes would see it."""
    slowest = 0.0
    for path in ("/livez", "/readyz"):
        started = time.perf_counter()
        httpx.get(url + path, timeout=30)
        slowest = max(slowest, time.perf_counter() - started)
    return 1000 * slowest


async def _sample(server: ServiceProcess, samples: list, health: list, until: float, on_tick: Callable) -> None:
    """Every second: scrape /metrics, time the probes, read the RSS, let the caller adjust the load."""
    while time.perf_counter() < until:
        tick_end = time.perf_counter() + 1.0
        samples.append((time.perf_counter(), await asyncio.to_thread(scrape, server.url)))
        probe = await asyncio.to_thread(probe_ms, server.url)
        health.append((time.perf_counter(), probe, *process_usage(server.process.pid)))
        on_tick(time.perf_counter())
        await asyncio.sleep(max(0.0, tick_end - time.perf_counter()))


def run_ramp(
    server: ServiceProcess, path: str, rates: list[float], stage_s: float, settle_s: float, unit: float
) -> dict:
    load = OpenLoop(server.url, path, payloads())
    samples: list[tuple[float, dict]] = []
    health: list[tuple[float, float, float, float]] = []  # (at, probe ms, RSS MB, CPU s)
    started = time.perf_counter()

    def on_tick(now: float) -> None:
        load.rate = rates[min(int((now - started) / stage_s), len(rates) - 1)]

    async def main() -> None:
        until = started + stage_s * len(rates)
        load.rate = rates[0]
        await asyncio.gather(load.run(until), _sample(server, samples, health, until, on_tick))

    asyncio.run(main())
    stages = []
    print(
        "\n| offered x capacity | offered req/s | answered req/s | shed/s | p50 ms | p99 ms | cpu cores | probe ms | "
        + " | ".join(CANDIDATES)
        + " |"
    )
    print("|---" * (8 + len(CANDIDATES)) + "|")
    for i, rate in enumerate(rates):
        begin, end = started + i * stage_s + settle_s, started + (i + 1) * stage_s
        inside = [(t, s) for t, s in samples if begin <= t <= end]
        row = {"offered_per_s": rate, **load.window(begin, end)}
        inside_health = [h for h in health if begin <= h[0] <= end]
        row["probe_max_ms"] = round(max((h[1] for h in inside_health), default=float("nan")), 1)
        # CPU cores the server used (what a CPU-utilisation HPA would see, x the CPU request).
        first, last = inside_health[0], inside_health[-1]
        row["cpu_cores"] = round((last[3] - first[3]) / (last[0] - first[0]), 2) if last[0] > first[0] else 0.0
        for name, compute in CANDIDATES.items():
            row[name] = round(compute(inside, end - begin), 3) if len(inside) >= 2 else float("nan")
        stages.append(row)
        print(
            f"| {rate / unit:.2f} | {rate:g} | {row['answered_per_s']} | {row['shed_per_s']} | {row['p50_ms']} | "
            f"{row['p99_ms']} | {row['cpu_cores']} | "
            f"{row['probe_max_ms']} | " + " | ".join(f"{row[name]:.3g}" for name in CANDIDATES) + " |"
        )
    return {"stages": stages, **health_summary(health), "client_overflow": load.overflow}


def run_hpa(
    server: ServiceProcess, path: str, spec: HpaSpec, rates: list[float], stage_s: float, startup_s: float, scale: float
) -> dict:
    if spec.metric not in CANDIDATES:
        raise SystemExit(f"the HPA's metric {spec.metric} is none of {sorted(CANDIDATES)}")
    compute = CANDIDATES[spec.metric]
    window = 60 * scale  # the [1m] range of the adapter rule's query, scaled
    hpa = Hpa(spec)
    load = OpenLoop(server.url, path, payloads())
    samples: list[tuple[float, dict]] = []
    health: list[tuple[float, float, float, float]] = []  # (at, probe ms, RSS MB, CPU s)
    pods: list[float] = [0.0] * spec.min_replicas  # ready-at time of each replica (the first ones: ready)
    rows: list[dict] = []
    started = time.perf_counter()
    last_sync = [started]

    def ready(now: float) -> int:
        return sum(1 for at in pods if at <= now)

    def cluster_rate(now: float) -> float:
        return rates[min(int((now - started) / stage_s), len(rates) - 1)]

    def on_tick(now: float) -> None:
        nonlocal pods
        if now - last_sync[0] >= spec.sync_s and len(samples) >= 2:
            last_sync[0] = now
            metric = compute(samples, window)
            n_ready = ready(now)
            wanted = hpa.desired(now - started, n_ready, len(pods), metric)
            if wanted > len(pods):
                pods += [now + startup_s] * (wanted - len(pods))
            elif wanted < len(pods):
                pods = sorted(pods)[:wanted]
            rows.append({"t": now - started, "metric": metric, "ready": n_ready, "desired": wanted})
        load.rate = cluster_rate(now) / max(ready(now), 1)

    async def main() -> None:
        until = started + stage_s * len(rates)
        load.rate = rates[0] / len(pods)
        await asyncio.gather(load.run(until, seed=1), _sample(server, samples, health, until, on_tick))

    asyncio.run(main())
    print(
        f"\nSIMULATED HPA: metric {spec.metric}, target {spec.target:g} per pod, replicas {spec.min_replicas}.."
        f"{spec.max_replicas}, sync {spec.sync_s:g} s, metric window {window:g} s, scale-down window "
        f"{spec.down_window_s:g} s, start-up {startup_s:.1f} s (all x{scale:g})"
    )
    print(
        "| t s | cluster offered req/s | ready | desired | per-pod offered | metric | pod answered/s | "
        "cluster answered/s | pod p99 ms |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    report = []
    for i, row in enumerate(rows):
        begin = started + (rows[i - 1]["t"] if i else 0.0)
        end = started + row["t"]
        figures = load.window(begin, end)
        offered = cluster_rate(end)
        entry = {
            **{k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()},
            "cluster_offered_per_s": offered,
            "pod_offered_per_s": round(offered / max(row["ready"], 1), 1),
            "cluster_answered_per_s": round(figures["answered_per_s"] * row["ready"], 1),
            **figures,
        }
        report.append(entry)
        print(
            f"| {entry['t']:.1f} | {offered:g} | {row['ready']} | {row['desired']} | {entry['pod_offered_per_s']} | "
            f"{row['metric']:.3g} | {figures['answered_per_s']} | {entry['cluster_answered_per_s']} | "
            f"{figures['p99_ms']} |"
        )
    stages = stage_summary(load, started, rates, stage_s, report)
    return {"syncs": report, "stages": stages, **health_summary(health), "client_overflow": load.overflow}


def stage_summary(load: OpenLoop, started: float, rates: list[float], stage_s: float, syncs: list[dict]) -> list:
    """Per stage of the cluster's load: the replicas at its end, the mean metric and cluster answered rate over
    its syncs, and the pod's p99 over the stage."""
    print(
        "\nper stage:\n| cluster offered req/s | replicas at the end | mean metric | cluster answered/s | pod p99 ms |"
    )
    print("|---|---|---|---|---|")
    stages = []
    for i, rate in enumerate(rates):
        inside = [r for r in syncs if i * stage_s <= r["t"] < (i + 1) * stage_s]
        if not inside:
            continue
        stage = {
            "cluster_offered_per_s": rate,
            "replicas": inside[-1]["desired"],
            "metric": round(sum(r["metric"] for r in inside) / len(inside), 3),
            "cluster_answered_per_s": round(sum(r["cluster_answered_per_s"] for r in inside) / len(inside), 1),
            "pod_p99_ms": load.window(started + i * stage_s, started + (i + 1) * stage_s)["p99_ms"],
        }
        stages.append(stage)
        print("| " + " | ".join(f"{v:g}" for v in stage.values()) + " |")
    return stages


def first_classifier(url: str) -> str:
    models = httpx.get(url + "/v1/models", timeout=10).json()
    entries = models["models"] if isinstance(models, dict) else models
    for entry in entries:
        if entry.get("task") == "classification":
            return entry["name"]
    raise SystemExit("no classification model in the repository")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repository", type=Path, required=True)
    parser.add_argument("--model", help="classification entry to load (default: the first one)")
    parser.add_argument("--part", choices=["ramp", "hpa", "both"], default="both")
    parser.add_argument(
        "--rates", default="0.1,0.3,0.5,0.7,0.9,1.1,0.9,0.7,0.5,0.3,0.1", help="ramp: offered load, x capacity"
    )
    parser.add_argument("--stage-seconds", type=float, default=8.0)
    parser.add_argument("--settle-seconds", type=float, default=2.0, help="ramp: left out at each stage's start")
    parser.add_argument(
        "--cluster-rates",
        default="0.5,1,2,3,4,4,3,2,1,0.5,0.5,0.5,0.5,0.5,0.5",
        help="hpa: the cluster's offered load per stage, x one pod's capacity",
    )
    parser.add_argument("--hpa-stage-seconds", type=float, default=8.0)
    parser.add_argument("--time-scale", type=float, default=0.1, help="hpa: factor on every time constant")
    parser.add_argument("--server-args", default="", help="extra settings for python -m service")
    args = parser.parse_args()

    started = time.perf_counter()
    server = start_service(args.repository, "--log-level", "warning", *args.server_args.split())
    startup_s = time.perf_counter() - started
    # Other work on the machine moves every figure: the load average is reported before and after.
    report: dict = {"startup_s": round(startup_s, 2), "cpus": psutil.cpu_count(), "loadavg_before": os.getloadavg()}
    try:
        model = args.model or first_classifier(server.url)
        path = f"/v1/models/{model}/classify"
        time.sleep(1)
        report["rss_idle_mb"] = round(process_usage(server.process.pid)[0], 1)
        print(f"model {model}: ready {startup_s:.1f} s after start, idle RSS {report['rss_idle_mb']} MB", flush=True)
        report["capacity_per_s"] = unit = capacity(server.url, path)
        print(f"capacity of one pod (closed loop, 8 clients, 1-sentence requests): {unit} req/s", flush=True)
        if args.part in ("ramp", "both"):
            rates = [round(float(r) * unit, 1) for r in args.rates.split(",")]
            report["ramp"] = run_ramp(server, path, rates, args.stage_seconds, args.settle_seconds, unit)
            ramp = report["ramp"]
            print(f"ramp: peak RSS {ramp['rss_peak_mb']} MB, slowest probe {ramp['probe_max_ms']} ms", flush=True)
        if args.part in ("hpa", "both"):
            spec = HpaSpec.from_manifest().scaled(args.time_scale)
            rates = [round(float(r) * unit, 1) for r in args.cluster_rates.split(",")]
            scale = args.time_scale
            report["hpa"] = run_hpa(server, path, spec, rates, args.hpa_stage_seconds, startup_s * scale, scale)
            sim = report["hpa"]
            print(f"simulation: peak RSS {sim['rss_peak_mb']} MB, slowest probe {sim['probe_max_ms']} ms", flush=True)
    finally:
        server.stop()
    report["loadavg_after"] = os.getloadavg()
    print(f"load average (1, 5, 15 min) before: {report['loadavg_before']}, after: {report['loadavg_after']}")
    write_report("autoscale_simulation", report)


if __name__ == "__main__":
    main()
