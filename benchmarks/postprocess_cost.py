"""Post-processing's CPU per input, in-process: classification's scores and NER's entities of 16-input requests.

NER: CoNLL-2003 test sentences through the shared CoNLL-2003 checkpoint's tokenizer (`ner.prepare`, the server's
windows and stride), their entities found from random logits that favour "O" (a real text is mostly "O" runs) with
each aggregation strategy; classification: random 2-label logits (SST-2's), top_k 1 as the native route's default.
Only the post-processing is timed, best of --repeats passes over the requests, in microseconds per input. It runs
the bertcore it imports, so compare two checkouts by running it on each in turn, on one quiet machine (it reads
either API: the per-input functions, or the per-request ones added beside them):

    python -m benchmarks.postprocess_cost
    PYTHONPATH=/tmp/base python benchmarks/postprocess_cost.py   # another checkout's bertcore (git worktree add)
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

import bertcore
from benchmarks.realdata import SHARED, conll03, shared_available
from bertcore.tasks import classification, ner
from bertcore.tokenization import TextTokenizer

NER_CHECKPOINT = SHARED / "models" / "minilm-bert-conll03"
PER_REQUEST = 16
SST2_LABELS = ["NEGATIVE", "POSITIVE"]


def best_us_per_input(work: Callable[[], object], inputs: int, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        work()
        times.append(time.perf_counter() - started)
    return min(times) / inputs * 1e6


def classification_work(requests: int, seed: int) -> Callable[[], object]:
    rng = np.random.default_rng(seed)
    logits = [[rng.normal(0, 1, len(SST2_LABELS)).astype(np.float32) for _ in range(PER_REQUEST)]] * requests
    if hasattr(classification, "postprocess_all"):
        return lambda: [classification.postprocess_all(rows, SST2_LABELS, None, 1) for rows in logits]
    return lambda: [[classification.postprocess(row, SST2_LABELS, None, 1) for row in rows] for rows in logits]


def ner_work(sentences: int, strategy: str, seed: int) -> Callable[[], object]:
    config = json.loads((NER_CHECKPOINT / "config.json").read_text(encoding="utf-8"))
    labels = [config["id2label"][str(i)] for i in range(len(config["id2label"]))]
    tokenizer = TextTokenizer.load(NER_CHECKPOINT / "tokenizer.json", int(config.get("pad_token_id", 0)))
    max_length = 128
    stride = ner.default_stride(tokenizer, max_length)
    texts = [" ".join(words) for words, _ in conll03(sentences)]
    requests = [texts[i : i + PER_REQUEST] for i in range(0, len(texts), PER_REQUEST)]
    features = [[ner.prepare(tokenizer, text, max_length, stride) for text in request] for request in requests]
    rng = np.random.default_rng(seed)
    favour_o = np.eye(len(labels), dtype=np.float32)[0] * 4

    def logits_of(text_features: ner.NerFeatures) -> list[np.ndarray]:
        return [(rng.normal(0, 1, (len(row), len(labels))) + favour_o).astype(np.float32) for row in text_features.rows]

    logits = [[logits_of(text_features) for text_features in request] for request in features]
    work = list(zip(requests, features, logits, strict=True))
    if hasattr(ner, "postprocess_all"):
        return lambda: [ner.postprocess_all(t, f, g, labels, strategy) for t, f, g in work]
    return lambda: [
        [ner.postprocess(text, f, g, labels, strategy) for text, f, g in zip(*request, strict=True)] for request in work
    ]


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sentences", type=int, default=512, help="CoNLL-2003 sentences (and classification inputs)")
    parser.add_argument("--repeats", type=int, default=7, help="passes over the requests; the best is reported")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if not shared_available():
        raise SystemExit(f"needs ../shared's checkpoints and data ({SHARED})")
    print(f"bertcore from {Path(bertcore.__file__).resolve().parent.parent}")
    figures = {
        "classification": best_us_per_input(
            classification_work(args.sentences // PER_REQUEST, args.seed), args.sentences, args.repeats
        )
    }
    for strategy in ("simple", "first", "none"):
        figures[f"ner {strategy}"] = best_us_per_input(
            ner_work(args.sentences, strategy, args.seed), args.sentences, args.repeats
        )
    for name, figure in figures.items():
        print(f"{name:>16}: {figure:6.2f} us an input")
    return figures


if __name__ == "__main__":
    main()
