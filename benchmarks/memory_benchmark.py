"""Memory held after maximum-size requests, the cost of giving it back, and QA work amplification.

A real server (`python -m service`, each engine mode asked for) over the real MiniLM checkpoints in ../shared
(SST-2, CoNLL-2003 and SQuAD, fp32 on the CPU), in this order:

1. memory: `--rounds` rounds of one legal maximum-size request per task (every text 20,000 characters of SQuAD
   prose, the per-input maximum; classification 64 inputs, the per-request maximum; NER and QA fewer, which fill
   batches of the largest shapes just the same), then `--idle-s` seconds without requests. RSS of the server and
   its child processes (process mode: engine and front-ends) at ready, after each round, the peak (sampled every
   50 ms) and after the idle time.
2. throughput of normal-size requests: SST-2 sentences (1 and 16 inputs a request) and SQuAD questions with their
   paragraph (4 a request), closed-loop clients for `--seconds` each.
3. QA amplification: the issue's request (question "q", a 7,000-character context, max_seq_len 9) and 64 such
   questions with contexts of 20,000 characters: status, windows, wall time, the server's CPU seconds, RSS after.

    python -m benchmarks.memory_benchmark [--engine-modes in-process,process] [--rounds 3] [--idle-s 5]
        [--seconds 15] [--server-args '--release-memory-idle-s 0'] [--source DIR] [--parts memory,throughput,qa]

`--source DIR` runs the server from another checkout of this project (e.g. an older commit unpacked with
`git archive`), with this environment: how the figures before a change are taken.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil

from benchmarks.loadclient import run_load
from benchmarks.realdata import ROOT, SHARED, shared_available, squad, sst2
from benchmarks.reports import write_report
from export.pipeline import export_checkpoint
from export.quiet import quiet_libraries
from tests.harness.serving import ServiceProcess, free_port

MODELS = {"classification": "minilm-bert-sst2", "ner": "minilm-bert-conll03", "qa": "minilm-bert-squad"}
MAX_CHARS = 20_000  # the default --max-chars-per-input
MB = 2**20


def tree(pid: int) -> list[psutil.Process]:
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def rss_mb(pid: int) -> float:
    """RSS of the server process and all its descendants, in MiB."""
    total = 0
    for process in tree(pid):
        with contextlib.suppress(psutil.NoSuchProcess):
            total += process.memory_info().rss
    return total / MB


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of the server process and its live descendants."""
    total = 0.0
    for process in tree(pid):
        with contextlib.suppress(psutil.NoSuchProcess):
            times = process.cpu_times()
            total += times.user + times.system
    return total


@dataclass
class PeakSampler:
    """Samples the tree's RSS every `interval` seconds on a thread; `peak` since the last reset."""

    pid: int
    interval: float = 0.05
    peak: float = 0.0
    _stop: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.peak = max(self.peak, rss_mb(self.pid))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def max_size_texts(count: int, offset: int = 0) -> list[str]:
    """`count` texts of exactly MAX_CHARS characters: consecutive SQuAD paragraphs, as one long document."""
    prose = " ".join(dict.fromkeys(context for _, context, _ in squad()))
    needed = (offset + count) * MAX_CHARS
    prose = (prose + " ") * (needed // len(prose) + 1)
    return [prose[(offset + i) * MAX_CHARS : (offset + i + 1) * MAX_CHARS] for i in range(count)]


def max_size_requests(args: argparse.Namespace) -> dict[str, tuple[str, dict]]:
    texts = max_size_texts(64)
    return {
        "classification": (f"/v1/models/{MODELS['classification']}/classify", {"inputs": texts}),
        "ner": (f"/v1/models/{MODELS['ner']}/ner", {"inputs": texts[: args.ner_inputs]}),
        "qa": (
            f"/v1/models/{MODELS['qa']}/qa",
            {"inputs": [{"question": "What was decided?", "context": text} for text in texts[: args.qa_inputs]]},
        ),
    }


def repository(workdir: Path) -> Path:
    repo = workdir / "models"
    for name in MODELS.values():
        if not (repo / name / "model.json").is_file():
            export_checkpoint(str(SHARED / "models" / name), name, repo, variants="fp32")
    return repo


def start_server(source: Path, repo: Path, mode: str, extra: list[str], log: Path) -> ServiceProcess:
    port = free_port()
    command = [sys.executable, "-m", "service", "--repository", str(repo), "--port", str(port)]
    command += ["--engine-mode", mode, "--request-timeout-s", "900", "--log-level", "warning", *extra]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    with log.open("w") as stream:
        process = subprocess.Popen(command, cwd=source, env=env, stdout=stream, stderr=subprocess.STDOUT)
    server = ServiceProcess(f"http://127.0.0.1:{port}", process, log)
    server.wait_ready(timeout=300)
    return server


def memory_part(server: ServiceProcess, args: argparse.Namespace) -> dict:
    pid = server.process.pid
    time.sleep(1.0)
    report: dict = {"ready_mb": round(rss_mb(pid)), "rounds": []}
    print(f"  ready: {report['ready_mb']} MiB", flush=True)
    sampler = PeakSampler(pid)
    requests = max_size_requests(args)
    with httpx.Client(base_url=server.url, timeout=900) as client:
        for round_index in range(args.rounds):
            row: dict = {}
            for task, (path, body) in requests.items():
                started = time.perf_counter()
                response = client.post(path, json=body)
                row[task] = {
                    "status": response.status_code,
                    "rows": int(response.headers.get("x-rows", 0)),
                    "seconds": round(time.perf_counter() - started, 1),
                }
            row["after_mb"] = round(rss_mb(pid))
            report["rounds"].append(row)
            print(f"  round {round_index + 1}: {row}", flush=True)
    report["peak_mb"] = round(max(sampler.peak, *(r["after_mb"] for r in report["rounds"])))
    time.sleep(args.idle_s)
    sampler.stop()
    report["after_idle_mb"] = round(rss_mb(pid))
    print(f"  peak {report['peak_mb']} MiB; after {args.idle_s:g} s idle: {report['after_idle_mb']} MiB", flush=True)
    return report


def throughput_part(server: ServiceProcess, args: argparse.Namespace) -> dict:
    sentences = [sentence for sentence, _ in sst2()]
    examples = [(question, context) for question, context, _ in squad(800)]
    qa_bodies = [{"inputs": [{"question": q, "context": c} for q, c in examples[i : i + 4]]} for i in range(0, 800, 4)]
    cases = {
        "classify, 1 input (16 clients)": (f"/v1/models/{MODELS['classification']}/classify", 16, 1),
        "classify, 16 inputs (8 clients)": (f"/v1/models/{MODELS['classification']}/classify", 8, 16),
        "qa, 4 inputs (4 clients)": (f"/v1/models/{MODELS['qa']}/qa", 4, 4),
    }
    report = {}
    for label, (path, clients, size) in cases.items():
        if size == 4:
            bodies = qa_bodies
        else:
            bodies = [{"inputs": sentences[i : i + size]} for i in range(0, len(sentences) - size + 1, size)]
        run_load(server.url, path, bodies[:50], [size] * 50, clients=clients, seconds=2)  # warm
        result = run_load(server.url, path, bodies, [size] * len(bodies), clients=clients, seconds=args.seconds)
        report[label] = result.summary()
        print(f"  {label}: {report[label]}", flush=True)
    report["rss_after_mb"] = round(rss_mb(server.process.pid))
    return report


def amplification_part(server: ServiceProcess) -> dict:
    pid = server.process.pid
    context = max_size_texts(1)[0]
    cases = {
        "issue: q + 7,000 chars, max_seq_len 9": {
            "inputs": {"question": "q", "context": context[:7000]},
            "max_seq_len": 9,
        },
        "64 x (q + 20,000 chars), max_seq_len 9": {
            "inputs": [{"question": "q", "context": text} for text in max_size_texts(64)],
            "max_seq_len": 9,
        },
    }
    report = {}
    with httpx.Client(base_url=server.url, timeout=900) as client:
        for label, body in cases.items():
            time.sleep(1.0)
            cpu, rss, started = cpu_seconds(pid), rss_mb(pid), time.perf_counter()
            response = client.post(f"/v1/models/{MODELS['qa']}/qa", json=body)
            report[label] = {
                "status": response.status_code,
                "windows": int(response.headers.get("x-rows", 0)) or None,
                "field": response.json().get("field") if response.status_code != 200 else None,
                "seconds": round(time.perf_counter() - started, 2),
                "server_cpu_s": round(cpu_seconds(pid) - cpu, 2),
                "rss_delta_mb": round(rss_mb(pid) - rss),
            }
            print(f"  {label}: {report[label]}", flush=True)
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine-modes", default="in-process,process")
    parser.add_argument("--parts", default="memory,throughput,qa")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--ner-inputs", type=int, default=8, help="20,000-character texts per NER request")
    parser.add_argument("--qa-inputs", type=int, default=4, help="20,000-character contexts per QA request")
    parser.add_argument("--idle-s", type=float, default=5.0)
    parser.add_argument("--seconds", type=float, default=15.0, help="per throughput case")
    parser.add_argument("--server-args", default="", help="extra settings for python -m service")
    parser.add_argument("--source", type=Path, default=ROOT, help="the checkout whose server runs")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/bertserve-memory-bench"))
    parser.add_argument("--report", type=Path, default=None)
    args = parser.parse_args()
    if not shared_available():
        raise SystemExit("../shared is absent: the real checkpoints and data are needed")
    quiet_libraries()
    args.workdir.mkdir(parents=True, exist_ok=True)
    repo = repository(args.workdir)
    parts = set(args.parts.split(","))
    report: dict = {"cores": os.cpu_count(), "source": str(args.source), "server_args": args.server_args}
    for mode in args.engine_modes.split(","):
        print(f"{mode}: python -m service --engine-mode {mode} {args.server_args} (from {args.source})", flush=True)
        server = start_server(args.source.resolve(), repo, mode, args.server_args.split(), args.workdir / "server.log")
        try:
            result: dict = {}
            if "memory" in parts:
                result["memory"] = memory_part(server, args)
            if "throughput" in parts:
                result["throughput"] = throughput_part(server, args)
            if "qa" in parts:
                result["qa_amplification"] = amplification_part(server)
            report[mode] = result
        finally:
            server.stop()
    print("\n| engine mode | ready | after each round | peak | after idle |")
    print("|---|---|---|---|---|")
    for mode in args.engine_modes.split(","):
        memory = report[mode].get("memory")
        if memory:
            rounds = " / ".join(str(r["after_mb"]) for r in memory["rounds"])
            print(f"| {mode} | {memory['ready_mb']} | {rounds} | {memory['peak_mb']} | {memory['after_idle_mb']} |")
    write_report("memory_benchmark", report, args.report)


if __name__ == "__main__":
    main()
