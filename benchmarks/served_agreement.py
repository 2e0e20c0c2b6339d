"""Do two servers give the same answers? Records a running server's answers on the shared data, and compares them
with another's: e.g. fp16 on CUDA against fp32 on the CPU (labels, entity spans, answer spans).

    python -m benchmarks.served_agreement --url http://127.0.0.1:8000 --out cpu.json            # on the CPU
    python -m benchmarks.served_agreement --url http://127.0.0.1:8000 --out gpu.json --reference cpu.json

Models are the repository entries named as in benchmarks.evaluate_served (minilm-bert-sst2, -conll03, -squad);
`--tasks` picks which. Data from ../shared/data (or BERTSERVE_SHARED). Agreement: SST-2, the share of sentences
with the same label; CoNLL-2003, entities (type, start, end) found by both over the mean count found by each
(an F1 of one against the other); SQuAD, the share of questions with the same best answer span.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from benchmarks.evaluate_served import MODELS, chunks, post_all
from benchmarks.realdata import conll03, squad, sst2


def record(url: str, tasks: list[str], squad_limit: int | None) -> dict[str, list]:
    answers: dict[str, list] = {}
    if "sst2" in tasks:
        bodies = [{"inputs": [s for s, _ in c], "top_k": 1} for c in chunks(sst2(), 16)]
        replies = post_all(url, f"/v1/models/{MODELS['sst2']}/classify", bodies)
        answers["sst2"] = [r[0]["label"] for a in replies for r in a["results"]]
    if "conll03" in tasks:
        texts = [" ".join(words) for words, _ in conll03()]
        replies = post_all(url, f"/v1/models/{MODELS['conll03']}/ner", [{"inputs": c} for c in chunks(texts, 16)])
        answers["conll03"] = [
            [[e["entity_group"], e["start"], e["end"]] for e in found] for a in replies for found in a["results"]
        ]
    if "squad" in tasks:
        data = squad(squad_limit)
        bodies = [{"inputs": [{"question": q, "context": c} for q, c, _ in chunk]} for chunk in chunks(data, 8)]
        replies = post_all(url, f"/v1/models/{MODELS['squad']}/qa", bodies)
        answers["squad"] = [[r[0]["start"], r[0]["end"]] for a in replies for r in a["results"]]
    return answers


def agreement(got: dict[str, list], reference: dict[str, list]) -> dict[str, dict]:
    report = {}
    for task in sorted(set(got) & set(reference)):
        mine, theirs = got[task], reference[task]
        if len(mine) != len(theirs):
            report[task] = {"error": f"{len(mine)} answers against {len(theirs)}"}
            continue
        if task == "conll03":
            both = found = expected = 0
            for a, b in zip(mine, theirs, strict=True):
                sa, sb = {tuple(e) for e in a}, {tuple(e) for e in b}
                both, found, expected = both + len(sa & sb), found + len(sa), expected + len(sb)
            report[task] = {
                "sentences": len(mine),
                "entities": expected,
                "agreement": round(2 * both / max(found + expected, 1), 5),
            }
        else:
            same = sum(a == b for a, b in zip(mine, theirs, strict=True))
            report[task] = {"inputs": len(mine), "same": same, "agreement": round(same / max(len(mine), 1), 5)}
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--out", type=Path, required=True, help="where to write this server's answers (JSON)")
    parser.add_argument("--reference", type=Path, help="answers of the reference server, to compare with")
    parser.add_argument("--tasks", default="sst2,conll03,squad")
    parser.add_argument("--squad-limit", type=int, default=None)
    args = parser.parse_args()
    answers = record(args.url, args.tasks.split(","), args.squad_limit)
    args.out.write_text(json.dumps(answers))
    print(f"wrote {', '.join(f'{task}: {len(v)}' for task, v in answers.items())} answers to {args.out}")
    if args.reference:
        for task, figures in agreement(answers, json.loads(args.reference.read_text())).items():
            print(f"agreement {task}: {figures}")


if __name__ == "__main__":
    main()
