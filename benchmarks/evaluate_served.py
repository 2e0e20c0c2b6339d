"""Accuracy of the served answers on the shared evaluation data, against ../shared/models/SCORES.md.

Starts `python -m service` on the real checkpoints and sends the data over HTTP:
SST-2 dev accuracy (872 sentences), CoNLL-2003 test entity F1 (3,453 sentences, strategy `first`: sent as words
with `is_split_into_words`, and as text), SQuAD v1.1 EM/F1 (5,609 questions; official normalisation, best over gold).

    python -m benchmarks.evaluate_served [--tasks sst2,conll03,squad] [--squad-limit N]
                                         [--variant fp32|int8|int8-dynamic]
"""

from __future__ import annotations

import argparse
import itertools
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from benchmarks.realdata import SHARED, conll03, shared_available, squad, sst2
from benchmarks.reports import write_report
from export.evaluation import answer_f1, entity_spans, iob_tags, normalize_answer
from export.pipeline import export_checkpoint
from export.quiet import quiet_libraries
from tests.harness.serving import start_service

MODELS = {"sst2": "minilm-bert-sst2", "conll03": "minilm-bert-conll03", "squad": "minilm-bert-squad"}


MAX_TRIES = 20  # a 429 is the server's admission at work (long SQuAD contexts on a slow CPU): waited out, as asked


def post_all(url: str, path: str, bodies: list[dict]) -> list[dict]:
    def one(body: dict) -> dict:
        with httpx.Client(base_url=url, timeout=300) as client:
            for _ in range(MAX_TRIES):
                response = client.post(path, json=body)
                if response.status_code != 429:
                    break
                time.sleep(float(response.headers.get("retry-after", "1")))
            response.raise_for_status()
            return response.json()

    with ThreadPoolExecutor(4) as pool:
        return list(pool.map(one, bodies))


def chunks(items: list, size: int) -> list[list]:
    return [items[i : i + size] for i in range(0, len(items), size)]


def evaluate_sst2(url: str) -> dict:
    data = sst2()
    answers = post_all(
        url, f"/v1/models/{MODELS['sst2']}/classify", [{"inputs": [s for s, _ in c]} for c in chunks(data, 32)]
    )
    predicted = [r[0]["label"] for a in answers for r in a["results"]]
    correct = sum((label == "POSITIVE") == bool(gold) for label, (_, gold) in zip(predicted, data, strict=True))
    return {"sentences": len(data), "accuracy": round(correct / len(data), 4)}


def evaluate_conll(url: str) -> dict:
    """Entity F1 two ways: the words sent as the words they are (`is_split_into_words`: tags from each entity's
    first and last word), and as text, the words joined by spaces (entities mapped back to the words they cover)."""
    data = conll03()
    path = f"/v1/models/{MODELS['conll03']}/ner"
    as_words = post_all(
        url,
        path,
        [
            {"inputs": [w for w, _ in c], "is_split_into_words": True, "aggregation_strategy": "first"}
            for c in chunks(data, 32)
        ],
    )
    as_text = post_all(
        url, path, [{"inputs": [" ".join(w) for w, _ in c], "aggregation_strategy": "first"} for c in chunks(data, 32)]
    )
    word_tags, text_tags = [], []
    for (words, _), by_word, by_text in zip(
        data, [r for a in as_words for r in a["results"]], [r for a in as_text for r in a["results"]], strict=True
    ):
        word_tags.append(iob_tags(len(words), [(e["first_word"], e["last_word"], e["entity_group"]) for e in by_word]))
        starts = list(itertools.accumulate((len(word) + 1 for word in words[:-1]), initial=0))  # in " ".join(words)
        covered = [
            [i for i, s in enumerate(starts) if s < e["end"] and s + len(words[i]) > e["start"]] for e in by_text
        ]
        text_tags.append(
            iob_tags(len(words), [(c[0], c[-1], e["entity_group"]) for c, e in zip(covered, by_text, strict=True) if c])
        )
    gold = [tags for _, tags in data]
    return {"sentences": len(data), "words": entity_f1(word_tags, gold), "text": entity_f1(text_tags, gold)}


def entity_f1(predicted_tags: list[list[str]], gold_tags: list[list[str]]) -> dict:
    true_positive = predicted_count = gold_count = 0
    for predicted_sentence, gold_sentence in zip(predicted_tags, gold_tags, strict=True):
        predicted, expected = entity_spans(predicted_sentence), entity_spans(gold_sentence)
        true_positive += len(predicted & expected)
        predicted_count += len(predicted)
        gold_count += len(expected)
    precision, recall = true_positive / predicted_count, true_positive / gold_count
    return {
        "f1": round(2 * precision * recall / (precision + recall), 4),
        "precision": round(precision, 4),
        "recall": round(recall, 4),
    }


def evaluate_squad(url: str, limit: int | None) -> dict:
    data = squad(limit)
    bodies = [{"inputs": [{"question": q, "context": c} for q, c, _ in chunk]} for chunk in chunks(data, 8)]
    answers = [r[0]["answer"] for a in post_all(url, f"/v1/models/{MODELS['squad']}/qa", bodies) for r in a["results"]]
    exact = sum(
        max(normalize_answer(p) == normalize_answer(g) for g in golds)
        for p, (_, _, golds) in zip(answers, data, strict=True)
    )
    f1 = sum(max(answer_f1(p, g) for g in golds) for p, (_, _, golds) in zip(answers, data, strict=True))
    return {
        "questions": len(data),
        "exact_match": round(100 * exact / len(data), 2),
        "f1": round(100 * f1 / len(data), 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", default="sst2,conll03,squad")
    parser.add_argument("--squad-limit", type=int, default=None)
    parser.add_argument("--variant", choices=["fp32", "int8", "int8-dynamic"], default="fp32")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/bertserve-evaluate"))
    args = parser.parse_args()
    if not shared_available():
        raise SystemExit("../shared is absent: the real checkpoints and data are needed")
    quiet_libraries()
    tasks = args.tasks.split(",")
    repository = args.workdir / "models"
    for task in tasks:
        if not (repository / MODELS[task] / "model.int8-dynamic.onnx").is_file():
            export_checkpoint(
                str(SHARED / "models" / MODELS[task]), MODELS[task], repository, variants="fp32,int8,int8-dynamic"
            )
    server = start_service(
        repository,
        "--log-level",
        "warning",
        "--cpu-variant",
        args.variant,
        "--device",
        "cpu",
        "--access-log",
        "off",
        "--request-timeout-s",
        "600",
        "--models",
        ",".join(MODELS[t] for t in tasks),
    )
    url = server.url
    report = {"variant": args.variant}
    try:
        if "sst2" in tasks:
            report["sst2"] = evaluate_sst2(url)
            print("SST-2:", report["sst2"], flush=True)
        if "conll03" in tasks:
            report["conll03"] = evaluate_conll(url)
            print("CoNLL-2003:", report["conll03"], flush=True)
        if "squad" in tasks:
            report["squad"] = evaluate_squad(url, args.squad_limit)
            print("SQuAD:", report["squad"], flush=True)
    finally:
        server.stop()
    write_report(f"evaluate_served_{args.variant}", report)


if __name__ == "__main__":
    main()
