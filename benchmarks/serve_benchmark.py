"""Serving throughput on the real MiniLM SST-2 checkpoint and the 872 SST-2 dev sentences, in one run:

1. the raw onnxruntime session on the same inputs and the graph the server serves (the ceiling): batch 1, batch
   16 in data order, batch 16 sorted by length;
2. the service end to end over HTTP (`python -m service`), concurrent keep-alive clients at saturation;
3. a FastAPI server wrapping transformers.pipeline (PyTorch fp32), what a user would write by hand;
each with requests of 1 input and of 16 inputs. Client and servers share this machine's cores.

    python -m benchmarks.serve_benchmark [--seconds 20] [--clients-1 16] [--clients-16 6] [--lone-seconds 8]
                                         [--cpu-variant auto|fp32|int8|int8-dynamic]

and a lone client (one connection, 1-input requests) beside the raw session's time for one sentence at batch 1,
on all the cores' threads and on one (issue 37: within 2 ms).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
from transformers import AutoTokenizer

from benchmarks.loadclient import classify_cases, run_load
from benchmarks.realdata import SHARED, shared_available, sst2
from benchmarks.reports import write_report
from benchmarks.scrape import delta, scrape
from export.pipeline import export_checkpoint
from export.quiet import quiet_libraries
from tests.harness.serving import start, start_service

MODEL = "minilm-bert-sst2"


def _session(entry: Path, threads: int, variant: str) -> ort.InferenceSession:
    """The entry's graph of `variant` (the one the server serves: an int8 server against an fp32 ceiling read
    2.6x its "ceiling")."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    graph = entry / json.loads((entry / "model.json").read_text())["variants"][variant]["file"]
    return ort.InferenceSession(str(graph), options, providers=["CPUExecutionProvider"])


def encode_feeds(session: ort.InferenceSession, tokenizer: Any, batches: list[list[str]]) -> list[dict[str, Any]]:
    """The session's inputs for each batch of sentences, padded to the batch's longest."""
    names = [i.name for i in session.get_inputs()]
    encoded = [tokenizer(b, padding=True, truncation=True, return_tensors="np") for b in batches]
    return [{n: e[n].astype(np.int64) for n in names} for e in encoded]


def exported_entry(workdir: Path) -> Path:
    """The real MiniLM SST-2 checkpoint as an entry (fp32, int8, int8-dynamic) in workdir/models, exported once."""
    if not shared_available():
        raise SystemExit("../shared is absent: the real checkpoints and data are needed")
    repository = workdir / "models"
    if not (repository / MODEL / "model.int8-dynamic.onnx").is_file():
        export_checkpoint(str(SHARED / "models" / MODEL), MODEL, repository, variants="fp32,int8,int8-dynamic")
    return repository / MODEL


def call_seconds(session: ort.InferenceSession, feeds: list[dict[str, Any]]) -> list[float]:
    """Seconds of each `session.run`, one feed after another."""
    times = []
    for feed in feeds:
        started = time.perf_counter()
        session.run(None, feed)
        times.append(time.perf_counter() - started)
    return times


def _timed_calls(session: ort.InferenceSession, tokenizer: Any, batches: list[list[str]]) -> list[float]:
    """Seconds of each `session.run` over `batches` (tokenized first, padded to each batch's longest), after one
    warm-up call."""
    feeds = encode_feeds(session, tokenizer, batches)
    session.run(None, feeds[0])
    return call_seconds(session, feeds)


def raw_lone_ms(entry: Path, sentences: list[str], threads: int, variant: str) -> float:
    """The raw session's time for one sentence at batch 1 on `threads` intra-op threads (the median of each call),
    what a lone request to the server is compared with."""
    tokenizer = AutoTokenizer.from_pretrained(str(entry))
    times = sorted(_timed_calls(_session(entry, threads, variant), tokenizer, [[s] for s in sentences]))
    return 1000 * times[len(times) // 2]


def raw_session(entry: Path, sentences: list[str], threads: int, variant: str) -> dict:
    tokenizer = AutoTokenizer.from_pretrained(str(entry))
    session = _session(entry, threads, variant)

    def run(batches: list[list[str]]) -> float:
        return sum(len(b) for b in batches) / sum(_timed_calls(session, tokenizer, batches))

    by_length = sorted(sentences, key=lambda s: len(tokenizer(s)["input_ids"]))
    return {
        "batch 1": run([[s] for s in sentences[:300]]),
        "batch 16, data order": run([sentences[i : i + 16] for i in range(0, len(sentences), 16)]),
        "batch 16, sorted by length": run([by_length[i : i + 16] for i in range(0, len(by_length), 16)]),
    }


def load_cases(sentences: list[str], path: str, args: argparse.Namespace) -> dict[str, tuple]:
    return classify_cases(sentences, path, args.clients_1, args.clients_16)


def measure(url: str, cases: dict[str, tuple], seconds: float, with_metrics: bool) -> dict:
    results = {}
    for label, (path, bodies, sizes, clients) in cases.items():
        run_load(url, path, bodies, sizes, clients, 2.0)  # warm-up
        before = scrape(url) if with_metrics else None
        load = run_load(url, path, bodies, sizes, clients, seconds)
        row = {"clients": clients, **load.summary()}
        if with_metrics:
            after = scrape(url)
            batches = delta(before, after, "bertserve_batch_size_count") or 0
            real = delta(before, after, "bertserve_batch_real_tokens_total") or 0
            padded = delta(before, after, "bertserve_batch_padded_tokens_total") or 0
            row["inference_calls_per_request"] = round(batches / max(load.requests, 1), 3)
            row["rows_per_batch"] = round(load.sequences / max(batches, 1), 1)
            row["padding_ratio"] = round(padded / max(real, 1), 3)
            busy = delta(before, after, "bertserve_inference_duration_seconds_sum") or 0
            # share of wall time a batch was running; with N CPU streams (--cpu-streams) up to N
            row["inference_busy"] = round(busy / load.seconds, 3)
            row["real_tokens_per_s"] = round(real / load.seconds, 1)
        results[label] = row
        print(f"  {label}: {json.dumps(row)}", flush=True)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--clients-1", type=int, default=16, help="connections for 1-input requests")
    parser.add_argument("--clients-16", type=int, default=6, help="connections for 16-input requests")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/bertserve-serve-bench"))
    parser.add_argument(
        "--cpu-variant", default="auto", choices=["auto", "fp32", "int8", "int8-dynamic"], help="served CPU variant"
    )
    parser.add_argument("--server-args", default="", help="extra settings for python -m service")
    parser.add_argument("--skip-pipeline", action="store_true")
    parser.add_argument(
        "--lone-seconds",
        type=float,
        default=8.0,
        help="a lone client's 1-input requests for this long, beside the raw session at batch 1 (0: skip)",
    )
    args = parser.parse_args()
    quiet_libraries()
    checkpoint = SHARED / "models" / MODEL
    repository = exported_entry(args.workdir).parent
    sentences = [s for s, _ in sst2()]
    report: dict = {"cores": os.cpu_count(), "sentences": len(sentences)}

    print(f"service: python -m service --repository {repository} --cpu-variant {args.cpu_variant} {args.server_args}")
    server = start_service(
        repository, "--log-level", "warning", "--cpu-variant", args.cpu_variant, *args.server_args.split()
    )
    try:
        # the ceiling is the graph the server chose (auto: by the export's accuracy and the load's timing trial),
        # measured while the server idles
        with server.client() as client:
            variant = report["variant"] = client.get(f"/v1/models/{MODEL}").json()["variant"]
        print(f"raw onnxruntime session, {variant} (sequences/s):", flush=True)
        raw = raw_session(repository / MODEL, sentences, os.cpu_count() or 1, variant)
        report["raw"] = {k: round(v, 1) for k, v in raw.items()}
        print(f"  {report['raw']}", flush=True)
        cases = load_cases(sentences, f"/v1/models/{MODEL}/classify", args)
        report["service"] = measure(server.url, cases, args.seconds, True)
        if args.lone_seconds > 0:
            path, singles, sizes, _ = cases["1 input"]
            lone = run_load(server.url, path, singles, sizes, 1, args.lone_seconds)
            report["lone"] = {"service": lone.summary()}
    finally:
        server.stop()
    if "lone" in report:
        # the raw session on the same sentences, on the server's threads (all the cores) and on one (what a batch
        # gets where --cpu-streams runs two side by side on 2 cores)
        lone_sentences = sentences[:300]
        report["lone"]["raw_ms"] = {
            f"{threads} threads": round(raw_lone_ms(repository / MODEL, lone_sentences, threads, variant), 2)
            for threads in sorted({os.cpu_count() or 1, 1}, reverse=True)
        }
        print(f"  lone: {json.dumps(report['lone'])}", flush=True)

    if not args.skip_pipeline:
        print("pipeline server: FastAPI + transformers.pipeline (PyTorch fp32)", flush=True)
        server = start(["-m", "benchmarks.pipeline_server", str(checkpoint)])
        try:
            server.wait_ready(path="/classify", body={"inputs": ["warm"]})
            report["pipeline"] = measure(server.url, load_cases(sentences, "/classify", args), args.seconds, False)
        finally:
            server.stop()

    ceiling = report["raw"]["batch 16, sorted by length"]
    print("\n| server | request | clients | sequences/s | p50 ms | p99 ms | calls/request | padding ratio |")
    print("|---|---|---|---|---|---|---|---|")
    for server_name in ("service", "pipeline"):
        for label, row in report.get(server_name, {}).items():
            print(
                f"| {server_name} | {label} | {row['clients']} | {row['sequences_per_s']} | {row['p50_ms']} | "
                f"{row['p99_ms']} | {row.get('inference_calls_per_request', '-')} | {row.get('padding_ratio', '-')} |"
            )
    print(f"\nraw session ({report['variant']}): {report['raw']}")
    service16 = report["service"]["16 inputs"]["sequences_per_s"]
    print(f"service 16-input / raw sorted batch-16 ceiling: {service16 / ceiling:.1%}")
    print(f"service 16-input / raw data-order batch-16: {service16 / report['raw']['batch 16, data order']:.1%}")
    if "lone" in report:
        service_ms = report["lone"]["service"]["p50_ms"]
        raw = ", ".join(f"{ms} ms on {label}" for label, ms in report["lone"]["raw_ms"].items())
        print(f"lone request (1 connection, 1 input): service p50 {service_ms} ms; raw session at batch 1: {raw}")
    if "pipeline" in report:
        for label in ("1 input", "16 inputs"):
            ratio = report["service"][label]["sequences_per_s"] / report["pipeline"][label]["sequences_per_s"]
            print(f"service / pipeline server, {label}: {ratio:.2f}x")
    write_report("serve_benchmark", report)


if __name__ == "__main__":
    main()
