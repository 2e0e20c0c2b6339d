"""CPU latency of fp32, int8 (static) and int8-dynamic at batch 1 and 8, on the real MiniLM checkpoints and text.

Exports the four shared MiniLM checkpoints (unless --repository already holds them), then times each variant's
onnxruntime session on real inputs of its task (SST-2 sentences, CoNLL-2003 sentences, SQuAD question + context
truncated to 384 tokens), batches in data order, padded to their longest row.

    python -m benchmarks.cpu_latency [--repository /tmp/bertserve-latency] [--threads N] [--seconds 8]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import onnxruntime as ort
from transformers import AutoTokenizer

from benchmarks.realdata import SHARED, encoded_batches, shared_available, texts_for
from benchmarks.reports import write_report
from export.pipeline import export_checkpoint
from export.quiet import quiet_libraries

MODELS = ("minilm-bert-sst2", "minilm-distilbert-sst2", "minilm-bert-conll03", "minilm-bert-squad")


def time_session(session: ort.InferenceSession, batches: list[dict], seconds: float) -> tuple[list[float], int]:
    for feed in batches[:3]:
        session.run(None, feed)  # warm-up
    latencies, sequences, deadline, i = [], 0, time.perf_counter() + seconds, 0
    while time.perf_counter() < deadline or len(latencies) < 10:
        feed = batches[i % len(batches)]
        started = time.perf_counter()
        session.run(None, feed)
        latencies.append(time.perf_counter() - started)
        sequences += len(feed["input_ids"])
        i += 1
    return latencies, sequences


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repository", type=Path, default=Path("/tmp/bertserve-latency"))
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--seconds", type=float, default=8.0, help="timed seconds per variant and batch size")
    args = parser.parse_args()
    if not shared_available():
        raise SystemExit("../shared is absent: the real checkpoints and data are needed")
    quiet_libraries()
    print(f"onnxruntime {ort.__version__}, {args.threads} intra-op threads, {os.cpu_count()} cores")
    print("| model | variant | batch | mean tokens/row | p50 ms/batch | p90 ms/batch | sequences/s |")
    print("|---|---|---|---|---|---|---|")
    results = []
    for name in MODELS:
        entry = args.repository / name
        if not (entry / "model.int8-dynamic.onnx").is_file():
            export_checkpoint(str(SHARED / "models" / name), name, args.repository, variants="fp32,int8,int8-dynamic")
        config = json.loads((entry / "model.json").read_text())
        tokenizer = AutoTokenizer.from_pretrained(str(entry))
        texts = texts_for(config["task"], 256)
        options = ort.SessionOptions()
        options.intra_op_num_threads = args.threads
        for variant in ("fp32", "int8", "int8-dynamic"):
            session = ort.InferenceSession(
                str(entry / f"model.{variant}.onnx"), options, providers=["CPUExecutionProvider"]
            )
            for batch in (1, 8):
                batches = encoded_batches(tokenizer, config["task"], texts, config["inputs"], batch)
                tokens = statistics.mean(float(b["attention_mask"].sum()) / len(b["input_ids"]) for b in batches)
                latencies, sequences = time_session(session, batches, args.seconds)
                ms = sorted(1000 * t for t in latencies)
                row = {
                    "model": name,
                    "variant": variant,
                    "batch": batch,
                    "tokens_per_row": round(tokens, 1),
                    "p50_ms": statistics.median(ms),
                    "p90_ms": ms[int(0.9 * (len(ms) - 1))],
                    "sequences_per_s": sequences / sum(latencies),
                }
                results.append(row)
                print(
                    f"| {name} | {variant} | {batch} | {tokens:.1f} | {row['p50_ms']:.2f} | {row['p90_ms']:.2f} | "
                    f"{row['sequences_per_s']:.1f} |",
                    flush=True,
                )
    write_report("cpu_latency", results)


if __name__ == "__main__":
    main()
