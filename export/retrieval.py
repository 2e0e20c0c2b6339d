"""Retrieval data for an embedding entry's `--eval`: queries, passages, and which passages answer which query.

The file is JSON: {"queries": [str, ...], "passages": [str, ...], "answers": [[passage index, ...], ...]}, one
list of (0-based) passage indices per query, at least one each. Every query is searched against every passage
by the similarity the model names (sentence-transformers' similarity_fn_name: cosine, or dot), and a query
counts as found at k where one of its answers is among the k best passages. Metrics, in points: recall@1,
recall@10 (the budget applies to it) and MRR@10. `python -m export.retrieval_data` makes such a file from SQuAD.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from bertcore.messages import one_line
from export.checkpoint import Checkpoint
from export.errors import ExportError

FORMAT = "retrieval JSON"
METRIC = "recall@10"
TOP_K = 10


@dataclass(frozen=True)
class RetrievalData:
    queries: list[str]
    passages: list[str]
    answers: list[list[int]]


def read_retrieval(path: Path, limit: int | None = None) -> RetrievalData:
    """The file, checked; `limit` keeps the first N queries (and every passage)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8-sig"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ExportError(f"--eval {path}: cannot read it as {FORMAT}: {one_line(exc)}") from exc
    shape = '{"queries": [str], "passages": [str], "answers": [[passage index, ...] per query]}'
    if not isinstance(data, dict) or not all(isinstance(data.get(key), list) for key in ("queries", "passages")):
        raise ExportError(f"--eval {path}: not {FORMAT}; expected {shape}")
    queries, passages, answers = data["queries"], data["passages"], data.get("answers")
    if not all(isinstance(text, str) and text.strip() for text in [*queries, *passages]):
        raise ExportError(f"--eval {path}: every query and passage must be a non-empty string")
    if not isinstance(answers, list) or len(answers) != len(queries):
        raise ExportError(f"--eval {path}: 'answers' must hold one list of passage indices per query ({shape})")
    for number, indices in enumerate(answers):
        if not isinstance(indices, list) or not indices:
            raise ExportError(f"--eval {path}: answers[{number}] is not a non-empty list of passage indices")
        if not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < len(passages) for i in indices):
            raise ExportError(f"--eval {path}: answers[{number}] names a passage outside 0..{len(passages) - 1}")
    if not queries or not passages:
        raise ExportError(f"--eval {path} has no queries or no passages ({FORMAT} expected)")
    keep = limit or len(queries)
    return RetrievalData(queries[:keep], passages, answers[:keep])


def prompts(checkpoint: Checkpoint) -> tuple[str, str]:
    """The prefixes sentence-transformers puts before queries and passages: its "query" and "document" (or
    "passage") prompts where the model names them, else its default prompt, else none."""
    head = checkpoint.embedding
    if head is None:
        return "", ""
    default = head.prompts.get(head.default_prompt_name, "") if head.default_prompt_name else ""
    query = head.prompts.get("query", default)
    passage = head.prompts.get("document", head.prompts.get("passage", default))
    return query, passage


def encode_rows(checkpoint: Checkpoint, data: RetrievalData) -> list[dict[str, Any]]:
    """Tokenized rows: the queries first, then the passages (truncated to the model's window, as served)."""
    query_prompt, passage_prompt = prompts(checkpoint)
    texts = [query_prompt + q for q in data.queries] + [passage_prompt + p for p in data.passages]
    tokenizer = checkpoint.tokenizer
    return [dict(tokenizer(text, truncation=True, max_length=checkpoint.max_length).items()) for text in texts]


def search(
    session: ort.InferenceSession,
    feeds: list[dict[str, np.ndarray]],
    order: list[list[int]],
    queries: int,
    similarity: str,
) -> list[list[int]]:
    """Each query's TOP_K best passages (indices), best first."""
    vectors: dict[int, np.ndarray] = {}
    for feed, chunk in zip(feeds, order, strict=True):
        (out,) = session.run(["sentence_embedding"], feed)
        for row, index in enumerate(chunk):
            vectors[index] = out[row].astype(np.float32)
    matrix = np.stack([vectors[i] for i in range(len(vectors))])
    if similarity != "dot":
        matrix = matrix / np.maximum(np.linalg.norm(matrix, axis=-1, keepdims=True), 1e-12)
    scores = matrix[:queries] @ matrix[queries:].T
    k = min(TOP_K, scores.shape[1])
    top = np.argpartition(-scores, k - 1, axis=1)[:, :k]
    ranked = np.take_along_axis(top, np.argsort(-np.take_along_axis(scores, top, 1), axis=1, kind="stable"), 1)
    return [[int(i) for i in row] for row in ranked]


def score(answers: list[list[int]], golds: list[list[int]]) -> dict[str, float]:
    """recall@1, recall@10 and MRR@10 in points."""
    found_1 = found_k = reciprocal = 0.0
    for ranked, gold in zip(answers, golds, strict=True):
        relevant = set(gold)
        hits = [rank for rank, passage in enumerate(ranked) if passage in relevant]
        found_1 += bool(hits and hits[0] == 0)
        found_k += bool(hits)
        reciprocal += 1 / (hits[0] + 1) if hits else 0.0
    count = max(len(golds), 1)
    return {
        "recall@1": round(100 * found_1 / count, 2),
        "recall@10": round(100 * found_k / count, 2),
        "mrr@10": round(100 * reciprocal / count, 2),
    }


def agreement(answers: list[list[int]], reference: list[list[int]]) -> float:
    """Share of queries whose best passage is the reference's."""
    same = sum(a[:1] == r[:1] for a, r in zip(answers, reference, strict=True))
    return round(same / max(len(reference), 1), 4)
