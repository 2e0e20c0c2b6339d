"""The other protocols' adapters against the native API, back to back on one server (issue 32):

1. the Hugging Face task API (POST /v1/models/{name}) against native REST (POST /v1/models/{name}/classify) on
   MiniLM SST-2 and the SST-2 dev sentences, 1-input and 16-input requests: sequences/s, p50, p99;
2. rerank, 1 query x 32 documents per request (POST /v1/rerank), against the same 32 (query, document) pairs sent
   to classify as text pairs: requests/s, p50, p99. The cross-encoder is MiniLM SST-2's encoder with a one-label
   head (made here, untrained: the speed is the encoder's, what a MiniLM cross-encoder would give); the queries
   are SQuAD questions, the documents SQuAD paragraphs cut to --doc-chars characters.

Each pair of loads runs alternately, --rounds times, on one server (fp32), and the medians are reported: on a
shared machine, compare only the pairs of one run.

    python -m benchmarks.rerank_benchmark [--seconds 8] [--rerank-seconds 20] [--rounds 2] [--clients-1 16]
                                          [--clients-16 6] [--clients-rerank 2] [--doc-chars 300]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from pathlib import Path

from benchmarks.loadclient import classify_cases, run_load
from benchmarks.realdata import SHARED, shared_available, squad, sst2
from benchmarks.reports import write_report
from export.pipeline import export_checkpoint
from export.quiet import quiet_libraries
from tests.harness.serving import start_service

CLASSIFIER = "minilm-bert-sst2"
CROSS_ENCODER = "minilm-cross-encoder"
DOCUMENTS = 32


def make_cross_encoder(directory: Path) -> Path:
    """MiniLM SST-2's encoder with a fresh one-label regression head, saved as a checkpoint."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    if (directory / "config.json").is_file():
        return directory
    torch.manual_seed(0)
    source = SHARED / "models" / CLASSIFIER
    model = AutoModelForSequenceClassification.from_pretrained(
        str(source),
        num_labels=1,
        problem_type="regression",
        id2label={0: "LABEL_0"},
        label2id={"LABEL_0": 0},
        ignore_mismatched_sizes=True,
    )
    model.save_pretrained(str(directory))
    AutoTokenizer.from_pretrained(str(source)).save_pretrained(str(directory))
    return directory


def rerank_cases(doc_chars: int, clients: int) -> dict[str, tuple]:
    """label -> (path, bodies, sequences per body, connections): the same pairs as rerank and as classify."""
    examples = squad()
    contexts = list(dict.fromkeys(context[:doc_chars] for _, context, _ in examples))
    questions = [question for question, _, _ in examples]
    reranks, classifies = [], []
    for i in range(64):
        query = questions[i * 7 % len(questions)]
        documents = [contexts[(i * DOCUMENTS + j) % len(contexts)] for j in range(DOCUMENTS)]
        reranks.append({"model": CROSS_ENCODER, "query": query, "documents": documents})
        classifies.append({"inputs": [{"text": query, "text_pair": document} for document in documents]})
    sizes = [DOCUMENTS] * len(reranks)
    return {
        "rerank, 1 x 32": ("/v1/rerank", reranks, sizes, clients),
        "classify, 32 pairs": (f"/v1/models/{CROSS_ENCODER}/classify", classifies, sizes, clients),
    }


def hf_cases(sentences: list[str], clients_1: int, clients_16: int) -> dict[str, tuple]:
    native = classify_cases(sentences, f"/v1/models/{CLASSIFIER}/classify", clients_1, clients_16)
    hf = classify_cases(sentences, f"/v1/models/{CLASSIFIER}", clients_1, clients_16)
    return {
        "native, 1 input": native["1 input"],
        "hf task API, 1 input": hf["1 input"],
        "native, 16 inputs": native["16 inputs"],
        "hf task API, 16 inputs": hf["16 inputs"],
    }


def measure_pairs(url: str, cases: dict[str, tuple], seconds: float, rounds: int) -> dict[str, dict]:
    """Each pair of cases (in order) alternately, `rounds` times; per case the medians over the rounds."""
    labels = list(cases)
    runs: dict[str, list[dict]] = {label: [] for label in labels}
    for first, second in zip(labels[::2], labels[1::2], strict=True):
        for label in (first, second):
            path, bodies, sizes, clients = cases[label]
            run_load(url, path, bodies, sizes, clients, 2.0)  # warm-up
        for _ in range(rounds):
            for label in (first, second):
                path, bodies, sizes, clients = cases[label]
                load = run_load(url, path, bodies, sizes, clients, seconds)
                answered = load.statuses.get(200, 0) / load.seconds  # requests answered 200 a second
                row = {"clients": clients, "requests_per_s": round(answered, 2), **load.summary()}
                runs[label].append(row)
                print(f"  {label}: {json.dumps(row)}", flush=True)
    return {
        label: {
            key: round(statistics.median(row[key] for row in rows), 2)
            for key in ("requests_per_s", "sequences_per_s", "p50_ms", "p99_ms")
        }
        | {"clients": rows[0]["clients"], "statuses": rows[-1]["statuses"]}
        for label, rows in runs.items()
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=8.0, help="each load, after a 2 s warm-up")
    parser.add_argument("--rounds", type=int, default=2, help="alternating rounds of each pair of loads")
    parser.add_argument("--clients-1", type=int, default=16, help="connections for 1-input requests")
    parser.add_argument("--clients-16", type=int, default=6, help="connections for 16-input requests")
    parser.add_argument("--clients-rerank", type=int, default=2, help="connections for rerank and its pairs")
    parser.add_argument("--rerank-seconds", type=float, default=20.0, help="each rerank load (32 pairs a request)")
    parser.add_argument("--doc-chars", type=int, default=300, help="characters of each SQuAD paragraph")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/bertserve-rerank-bench"))
    args = parser.parse_args()
    if not shared_available():
        raise SystemExit("../shared is absent: the real checkpoints and data are needed")
    quiet_libraries()
    repository = args.workdir / "models"
    if not (repository / CLASSIFIER / "model.fp32.onnx").is_file():
        export_checkpoint(str(SHARED / "models" / CLASSIFIER), CLASSIFIER, repository, variants="fp32")
    if not (repository / CROSS_ENCODER / "model.fp32.onnx").is_file():
        checkpoint = make_cross_encoder(args.workdir / "cross-encoder-checkpoint")
        export_checkpoint(str(checkpoint), CROSS_ENCODER, repository, variants="fp32")
    report: dict = {"cores": os.cpu_count(), "seconds": args.seconds, "rounds": args.rounds}
    print(f"service: python -m service --repository {repository} --cpu-variant fp32 --max-queue-s 20", flush=True)
    # Capacity, not shedding, is measured: a queue bound loose enough that the closed loops are never refused.
    server = start_service(
        repository,
        "--log-level",
        "warning",
        "--cpu-variant",
        "fp32",
        "--max-queue-s",
        "20",
        log_path=args.workdir / "server.log",
    )
    try:
        sentences = [sentence for sentence, _ in sst2()]
        report["hf"] = measure_pairs(
            server.url, hf_cases(sentences, args.clients_1, args.clients_16), args.seconds, args.rounds
        )
        report["rerank"] = measure_pairs(
            server.url, rerank_cases(args.doc_chars, args.clients_rerank), args.rerank_seconds, args.rounds
        )
    finally:
        server.stop()

    print("\n| load | clients | requests/s | sequences/s | p50 ms | p99 ms |")
    print("|---|---|---|---|---|---|")
    for part in ("hf", "rerank"):
        for label, row in report[part].items():
            print(
                f"| {label} | {row['clients']} | {row['requests_per_s']} | {row['sequences_per_s']} | "
                f"{row['p50_ms']} | {row['p99_ms']} |"
            )
    hf, rerank = report["hf"], report["rerank"]
    for size in ("1 input", "16 inputs"):
        ratio = hf[f"hf task API, {size}"]["sequences_per_s"] / hf[f"native, {size}"]["sequences_per_s"]
        print(f"hf task API / native, {size}: {ratio:.3f}")
    ratio = rerank["rerank, 1 x 32"]["requests_per_s"] / rerank["classify, 32 pairs"]["requests_per_s"]
    print(f"rerank / classify of the same pairs (requests/s): {ratio:.3f}")
    write_report("rerank_benchmark", report)


if __name__ == "__main__":
    main()
