"""Accuracy of the served answers on the shared evaluation data, against ../shared/models/SCORES.md.

Starts `python -m service` on the real checkpoints and sends the data over HTTP:
SST-2 dev accuracy (872 sentences), CoNLL-2003 test entity F1 (3,453 sentences; entities from the `first`
strategy mapped back to words), SQuAD v1.1 EM/F1 (5,609 questions; official normalisation, best over gold).

    python -m benchmarks.evaluate_served [--tasks sst2,conll03,squad] [--squad-limit N]
                                         [--variant fp32|int8|int8-dynamic]
"""

from __future__ import annotations

import argparse
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from benchmarks.realdata import SHARED, conll03, shared_available, squad, sst2
from benchmarks.reports import write_report
from benchmarks.serving import start_service
from export.cli import quiet_libraries
from export.evaluation import answer_f1, entity_spans, normalize_answer
from export.pipeline import export_checkpoint

MODELS = {"sst2": "minilm-bert-sst2", "conll03": "minilm-bert-conll03", "squad": "minilm-bert-squad"}


def post_all(url: str, path: str, bodies: list[dict]) -> list[dict]:
    def one(body: dict) -> dict:
        with httpx.Client(base_url=url, timeout=300) as client:
            response = client.post(path, json=body)
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
    data = conll03()
    texts = [" ".join(words) for words, _ in data]
    answers = post_all(
        url,
        f"/v1/models/{MODELS['conll03']}/ner",
        [{"inputs": c, "aggregation_strategy": "first"} for c in chunks(texts, 32)],
    )
    entities = [r for a in answers for r in a["results"]]
    true_positive = predicted_count = gold_count = 0
    for (words, gold), found in zip(data, entities, strict=True):
        starts, position = [], 0
        for word in words:
            starts.append(position)
            position += len(word) + 1
        tags = ["O"] * len(words)
        for entity in found:
            covered = [i for i, s in enumerate(starts) if s < entity["end"] and s + len(words[i]) > entity["start"]]
            for j, i in enumerate(covered):
                tags[i] = ("B-" if j == 0 else "I-") + entity["entity_group"]
        predicted, expected = entity_spans(tags), entity_spans(gold)
        true_positive += len(predicted & expected)
        predicted_count += len(predicted)
        gold_count += len(expected)
    precision, recall = true_positive / predicted_count, true_positive / gold_count
    return {
        "sentences": len(data),
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
