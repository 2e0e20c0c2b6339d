"""Prometheus metrics, in a registry of the app's own (several apps can live in one test process)."""

from __future__ import annotations

import contextlib
import fcntl
import math
import os
import time
from collections.abc import Iterable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.metrics_core import Metric
from prometheus_client.mmap_dict import MmapedDict
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead
from prometheus_client.registry import Collector

MULTIPROCESS_DIR = "PROMETHEUS_MULTIPROC_DIR"  # set by the launcher in process mode: one view over all processes
FOLDED = "exited"  # the files of a multiprocess directory that hold the totals of every process that exited
FOLD_LOCK = (
    ".fold.lock"  # flock()ed to fold (exclusive) and to merge (shared): a scrape sees a fold whole or not at all
)

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
TOKEN_BUCKETS = (16, 64, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536)
RATIO_BUCKETS = (1.0, 1.05, 1.1, 1.25, 1.5, 2.0, 3.0, 5.0, 10.0)
LOAD_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)


class Metrics:
    """Each process writes its own; in process mode (PROMETHEUS_MULTIPROC_DIR set) every front-end's /metrics
    merges the files of all processes, the engine's batch and queue figures included."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self._series: dict[tuple[MetricWrapperBase, tuple[str, ...]], Any] = {}
        r = self.registry
        self.requests = Counter(
            "bertserve_requests",
            "Requests answered, by model, endpoint and HTTP status.",
            ["model", "endpoint", "status"],
            registry=r,
        )
        self.request_duration = Histogram(
            "bertserve_request_duration_seconds",
            "Whole request time, body read to response.",
            ["model", "endpoint"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.queue_duration = Histogram(
            "bertserve_queue_duration_seconds",
            "Longest wait of a request's rows in the batch queue.",
            ["model"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.tokenization_duration = Histogram(
            "bertserve_tokenization_duration_seconds",
            "Tokenization time of a request.",
            ["model"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.inference_duration = Histogram(
            "bertserve_inference_duration_seconds",
            "Run time of one batch in the ONNX Runtime session.",
            ["model"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.batch_size = Histogram(
            "bertserve_batch_size",
            "Rows (sequences or windows) per batch.",
            ["model"],
            buckets=SIZE_BUCKETS,
            registry=r,
        )
        self.batch_tokens = Histogram(
            "bertserve_batch_tokens",
            "Padded tokens (longest row x rows) per batch.",
            ["model"],
            buckets=TOKEN_BUCKETS,
            registry=r,
        )
        self.padding_ratio = Histogram(
            "bertserve_batch_padding_ratio",
            "Padded tokens / real tokens per batch (1.0: no padding).",
            ["model"],
            buckets=RATIO_BUCKETS,
            registry=r,
        )
        self.padded_tokens = Counter(
            "bertserve_batch_padded_tokens", "Padded tokens run, summed over batches.", ["model"], registry=r
        )
        self.real_tokens = Counter(
            "bertserve_batch_real_tokens", "Real (unpadded) tokens run, summed over batches.", ["model"], registry=r
        )
        self.busy = Counter(
            "bertserve_engine_busy_seconds",
            "Batch run time divided by the model's concurrent streams: its rate is the share of the engine's capacity "
            "in use (1.0 = every stream busy all the time, whatever the stream count); the autoscaling metric.",
            ["model"],
            registry=r,
        )
        self.trace_spans_dropped = Counter(
            "bertserve_trace_spans_dropped",
            "Trace spans lost on the way to the collector (--otlp-endpoint), by reason: queue_full (more spans than "
            "--otlp-max-queue-spans waited for export), export_failed (the collector refused them or could not be "
            "reached). Requests are never held up for traces.",
            ["reason"],
            registry=r,
        )
        self.admission_share = Gauge(
            "bertserve_admission_share",
            "Share of its usual work a front-end admits now: the lowest of its models' "
            "(bertserve_model_admission_share; 1: all; less after a model's admitted answers took longer than 70% of "
            "--max-queue-s, growing back as they get quick); the lowest of the live front-ends.",
            registry=r,
            multiprocess_mode="livemin",
        )
        self.admission_share.set(1.0)
        self.model_admission_share = Gauge(
            "bertserve_model_admission_share",
            "Share of its usual work a model's own gate admits now (as bertserve_admission_share, from that model's "
            "answers alone: a model whose answers are late admits less of its own work, not of the others'); the "
            "lowest of the live front-ends. A model appears once it is served.",
            ["model"],
            registry=r,
            multiprocess_mode="livemin",
        )
        self.queue_depth = Gauge(
            "bertserve_queue_depth",
            "Rows waiting in the batch queue.",
            ["model"],
            registry=r,
            multiprocess_mode="livesum",
        )
        self.model_info = Gauge(
            "bertserve_model_info",
            "1 per served model, with where it runs.",
            ["model", "task", "architecture", "variant", "provider"],
            registry=r,
            multiprocess_mode="livemax",
        )
        self.model_placement = Gauge(
            "bertserve_model_placement",
            "1 per loaded model: the --device asked for (requested), the provider it runs on, and why (reason: "
            "requested; no_cuda_provider, --device auto with a CPU build of onnxruntime; cuda_unusable, --device "
            "auto where the CUDA provider could not start, e.g. a GPU image without a GPU).",
            ["model", "requested", "provider", "reason"],
            registry=r,
            multiprocess_mode="livemax",
        )
        self.model_ready = Gauge(
            "bertserve_model_ready",
            "1 when the model is loaded and warmed up; 0 while loading or failed.",
            ["model"],
            registry=r,
            multiprocess_mode="livemax",
        )

        # Model lifecycle (--model-control): written by the engine, which loads and unloads.
        self.model_loads = Counter(
            "bertserve_model_loads",
            "Loads of a model version (at start, by a load call or by polling): ok once it serves, failed where it "
            "could not load, warm up or pass its self-test.",
            ["model", "result"],
            registry=r,
        )
        self.model_unloads = Counter(
            "bertserve_model_unloads", "Unloads of a model, by model and result.", ["model", "result"], registry=r
        )
        self.model_load_duration = Histogram(
            "bertserve_model_load_duration_seconds",
            "From a load's start to the new version serving (session, warm-up and the front-end's self-test).",
            ["model"],
            buckets=LOAD_BUCKETS,
            registry=r,
        )
        self.model_version = Gauge(
            "bertserve_model_version_info",
            "1 for the version of each model in use now (0 for the versions it served before).",
            ["model", "version"],
            registry=r,
            multiprocess_mode="livemax",
        )
        self.model_load_failed = Gauge(
            "bertserve_model_load_failed",
            "1 while the latest load of the model failed (a version served before keeps serving, if any).",
            ["model"],
            registry=r,
            multiprocess_mode="livemax",
        )

    def series(self, metric: MetricWrapperBase, *labels: str) -> Any:
        """`metric.labels(*labels)`, kept: prometheus_client checks and locks on every call, and a request records
        four series. For counters and histograms, whose series are never removed (a gauge's may be: `forget`); their
        label values are bounded (models served, "unknown", endpoints, statuses)."""
        key = (metric, labels)
        child = self._series.get(key)
        if child is None:
            child = self._series[key] = metric.labels(*labels)
        return child

    def forget_series(self, gauge: Gauge, *labels: str) -> None:
        """`forget` a gauge's series kept by `series`: the kept child goes too, so that a later `series` (the model
        served again) makes one the gauge reports."""
        self._series.pop((gauge, labels), None)
        forget(gauge, *labels)

    def exposition(self) -> bytes:
        directory = os.environ.get(MULTIPROCESS_DIR)
        return merged_exposition(directory) if directory else generate_latest(self.registry)

    def count_dropped_spans(self, reason: str, spans: int) -> None:
        """Trace spans lost on the way to the collector (`service.tracing`, from its export thread)."""
        self.trace_spans_dropped.labels(reason).inc(spans)

    def observer(self, model: str, streams: int = 1) -> ModelObserver:
        return ModelObserver(self, model, streams)


def forget(gauge: Gauge, *labels: str) -> None:
    """The series of a model no longer served: removed. In process mode a series written to the shared directory
    cannot be removed, so it is set to a mark the merge drops (`merged_exposition`): +inf for a gauge merged by its
    lowest value, -inf for one merged by its highest, so that a process still reporting the series wins over the
    mark whatever the order of the files. (A summed gauge's series forgotten must have one writer: the engine.)"""
    if os.environ.get(MULTIPROCESS_DIR):
        lowest = getattr(gauge, "_multiprocess_mode", "") in ("min", "livemin")
        gauge.labels(*labels).set(math.inf if lowest else -math.inf)
    else:
        with contextlib.suppress(KeyError):
            gauge.remove(*labels)


def fold_exited_process(pid: int, directory: str, wait_s: float = 0.5) -> bool:
    """A process of a multiprocess directory has exited: its live gauges go (prometheus_client's
    `mark_process_dead`), and its counters' and histograms' values are added to the directory's `FOLDED` files and
    its own files removed. The merged totals stay as they were, and a server whose processes restart many times
    keeps a file per kind of metric for all of them, not one per process that ever ran (each read at every scrape).
    A scrape holds the directory's lock shared while it reads (`_Merged`), so it sees a fold whole or not at all.
    False, nothing folded, where a scrape held the lock for `wait_s` (a front-end stopped in the middle of one):
    the caller, which must not hang on it, tries again later."""
    mark_process_dead(pid, directory)
    with open(os.path.join(directory, FOLD_LOCK), "a") as lock:  # closing it lets go
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    return False
                time.sleep(0.005)
        for kind in ("counter", "histogram", "summary"):
            exited = os.path.join(directory, f"{kind}_{pid}.db")
            if not os.path.exists(exited):
                continue
            totals = MmapedDict(os.path.join(directory, f"{kind}_{FOLDED}.db"))
            try:
                for key, value, timestamp, _ in MmapedDict.read_all_values_from_file(exited):
                    total, _ = totals.read_value(key)
                    totals.write_value(key, total + value, timestamp)
            finally:
                totals.close()
            os.remove(exited)
    return True


class _Merged(Collector):
    """Every process's metrics merged (prometheus_client's MultiProcessCollector), less the gauges' forgotten series
    (`forget`'s marks): no gauge here has an infinite value of its own."""

    def __init__(self, directory: str) -> None:
        self._directory = directory
        self._processes = MultiProcessCollector(None, path=directory)

    def collect(self) -> Iterable[Metric]:
        with open(os.path.join(self._directory, FOLD_LOCK), "a") as lock:  # closing it lets go
            fcntl.flock(lock, fcntl.LOCK_SH)
            metrics = list(self._processes.collect())
        for metric in metrics:
            if metric.type == "gauge":
                metric.samples = [sample for sample in metric.samples if not math.isinf(sample.value)]
            yield metric


def merged_exposition(directory: str) -> bytes:
    """Every process's metrics written to a multiprocess directory, merged, in the exposition format."""
    return generate_latest(_Merged(directory))


class ModelObserver:
    """The batcher's view of the metrics for one model."""

    def __init__(self, metrics: Metrics, model: str, streams: int = 1) -> None:
        self._streams = max(1, streams)
        self._busy = metrics.busy.labels(model)
        self._inference = metrics.inference_duration.labels(model)
        self._size = metrics.batch_size.labels(model)
        self._tokens = metrics.batch_tokens.labels(model)
        self._ratio = metrics.padding_ratio.labels(model)
        self._padded = metrics.padded_tokens.labels(model)
        self._real = metrics.real_tokens.labels(model)
        self._depth = metrics.queue_depth.labels(model)

    def on_batch(self, rows: int, padded_tokens: int, real_tokens: int, seconds: float) -> None:
        self._inference.observe(seconds)
        self._busy.inc(seconds / self._streams)
        self._size.observe(rows)
        self._tokens.observe(padded_tokens)
        self._ratio.observe(padded_tokens / max(real_tokens, 1))
        self._padded.inc(padded_tokens)
        self._real.inc(real_tokens)

    def on_queue_depth(self, rows: int) -> None:
        self._depth.set(rows)
