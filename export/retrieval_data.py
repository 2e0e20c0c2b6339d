"""`python -m export.retrieval_data SQUAD.json OUT.json`: a retrieval file for an embedding entry's `--eval`, made
from SQuAD (v1.1 JSON): every question is a query, every paragraph of the file's articles a passage, and a
question's answer is the paragraph it was asked about. On the shared SQuAD half (24 articles): 5,609 queries
against 1,154 passages. The format is export/retrieval.py's."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from bertcore.messages import one_line


def from_squad(squad: dict[str, Any], articles: int | None = None) -> dict[str, Any]:
    """{"queries", "passages", "answers"} from SQuAD's data / paragraphs / context / qas / question."""
    passages: list[str] = []
    index: dict[str, int] = {}
    queries: list[str] = []
    answers: list[list[int]] = []
    for article in squad["data"][:articles]:
        for paragraph in article["paragraphs"]:
            context = paragraph["context"]
            if context not in index:
                index[context] = len(passages)
                passages.append(context)
            for qa in paragraph["qas"]:
                queries.append(qa["question"].strip())
                answers.append([index[context]])
    return {"queries": queries, "passages": passages, "answers": answers}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m export.retrieval_data", description=__doc__)
    parser.add_argument("squad", type=Path, help="SQuAD v1.1 JSON (e.g. ../shared/data/squad/dev-v1.1-eval-half.json)")
    parser.add_argument("out", type=Path, help="the retrieval JSON to write")
    parser.add_argument("--articles", type=int, default=None, help="only the first N articles (default: all)")
    args = parser.parse_args(argv)
    try:
        data = from_squad(json.loads(args.squad.read_text(encoding="utf-8-sig")), args.articles)
        args.out.write_text(json.dumps(data, ensure_ascii=False) + "\n", encoding="utf-8")
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError) as exc:
        print(f"error: {args.squad}: not SQuAD v1.1 JSON, or {args.out} not writable: {one_line(exc)}", file=sys.stderr)
        return 1
    print(f"{args.out}: {len(data['queries'])} queries, {len(data['passages'])} passages")
    return 0


if __name__ == "__main__":
    sys.exit(main())
