"""Two CPU streams on one session, raw: one intra-op thread per run against a pool of all the cores' threads shared
by the runs (issue 37, item 4).

The server runs a model's batches `--cpu-streams` at a time (two on 2 cores), each calling one session from its own
thread with threads / streams intra-op threads: under load two batches run side by side, but a lone batch gets one
thread. Would one pool of all the threads, shared by the streams' calls, give a lone batch them all and cost nothing
under load? Per setting, on the real MiniLM SST-2 graph (fp32, exported as serve_benchmark exports it) and the SST-2
dev sentences: a lone call's median time at batch 1, and the sequences/s of two callers at once (the streams at
saturation) and of one caller, at batch 16 sorted by length. The server's session options otherwise (inter-op 1,
sequential; spinning on and off).

    python -m benchmarks.stream_threads [--seconds 6] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import threading
import time
from pathlib import Path
from typing import Any

import onnxruntime as ort
from transformers import AutoTokenizer

from benchmarks.realdata import sst2
from benchmarks.reports import write_report
from benchmarks.serve_benchmark import call_seconds, encode_feeds, exported_entry
from export.quiet import quiet_libraries
from service.engine.runtime import run_options


def open_session(model: Path, threads: int, spinning: bool) -> ort.InferenceSession:
    """A CPU session with the server's options (`service.engine.runtime.run_options`) and `threads` intra-op
    threads."""
    return ort.InferenceSession(str(model), run_options(threads, spinning), providers=["CPUExecutionProvider"])


def lone_ms(session: ort.InferenceSession, feeds: list[dict[str, Any]]) -> float:
    """The median time of one call per feed, one after another (a lone request's batch)."""
    return 1000 * statistics.median(call_seconds(session, feeds))


def callers_rate(session: ort.InferenceSession, feeds: list[dict[str, Any]], callers: int, seconds: float) -> float:
    """Rows a second of `callers` threads calling the session at once, each through the feeds in turn, until
    `seconds` have passed (a call under way then is finished and counted)."""
    rows = [0] * callers
    stop = time.perf_counter() + seconds

    def call(caller: int) -> None:
        i = caller
        while time.perf_counter() < stop:
            feed = feeds[i % len(feeds)]
            session.run(None, feed)
            rows[caller] += len(next(iter(feed.values())))
            i += callers

    threads = [threading.Thread(target=call, args=(caller,)) for caller in range(callers)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return sum(rows) / (time.perf_counter() - started)


def measure(
    model: Path,
    singles: list[dict[str, Any]],
    batches: list[dict[str, Any]],
    threads: int,
    spinning: bool,
    seconds: float,
) -> dict[str, float]:
    session = open_session(model, threads, spinning)
    for feed in singles[:10]:
        session.run(None, feed)  # warm-up
    return {
        "lone_batch1_ms": round(lone_ms(session, singles), 2),
        "two_callers_batch16_seq_s": round(callers_rate(session, batches, 2, seconds), 1),
        "one_caller_batch16_seq_s": round(callers_rate(session, batches, 1, seconds), 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=6.0, help="each load with callers lasts this long")
    parser.add_argument("--rounds", type=int, default=2, help="every setting this many times, in turn")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/bertserve-serve-bench"))
    args = parser.parse_args()
    quiet_libraries()
    entry = exported_entry(args.workdir)
    model = entry / "model.fp32.onnx"
    tokenizer = AutoTokenizer.from_pretrained(str(entry))
    sentences = [s for s, _ in sst2()]
    by_length = sorted(sentences, key=lambda s: len(tokenizer(s)["input_ids"]))
    probe = open_session(model, 1, True)
    singles = encode_feeds(probe, tokenizer, [[s] for s in sentences[:300]])
    batches = encode_feeds(probe, tokenizer, [by_length[i : i + 16] for i in range(0, len(by_length), 16)])
    cores = os.cpu_count() or 1
    settings = [(threads, spinning) for threads in sorted({1, cores}) for spinning in (True, False)]
    rounds: dict[str, list[dict[str, float]]] = {}
    for round_ in range(args.rounds):
        for threads, spinning in settings:
            label = f"{threads} intra-op thread(s), spinning {'on' if spinning else 'off'}"
            figures = measure(model, singles, batches, threads, spinning, args.seconds)
            rounds.setdefault(label, []).append(figures)
            print(f"round {round_ + 1}: {label}: {json.dumps(figures)}", flush=True)
    print("\n| session (one, called by the streams) | lone call, batch 1, ms | 2 callers, batch 16, seq/s | 1 caller |")
    print("|---|---|---|---|")
    for label, figures in rounds.items():
        cells = [" / ".join(str(f[key]) for f in figures) for key in figures[0]]
        print(f"| {label} | {' | '.join(cells)} |")
    write_report("stream_threads", {"cores": cores, "rounds": rounds})


if __name__ == "__main__":
    main()
