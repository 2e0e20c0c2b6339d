"""Request shapes for the overload benchmark: a task, the real checkpoint that serves it, and request bodies from the
real data of ../shared. Long texts are made of consecutive real paragraphs or sentences, so that they take several
windows as a user's long document would.

- classify-1: one SST-2 sentence a request (minilm-bert-sst2);
- classify-16: sixteen SST-2 sentences a request;
- qa-long: a SQuAD question with its article's paragraphs joined to about 600 words (3 windows of 384 tokens,
  minilm-bert-squad);
- ner-long: 40 consecutive CoNLL-2003 test sentences as one text (several windows, minilm-bert-conll03);
- classify-1-large: one SST-2 sentence a request to a larger model, ~4x MiniLM's cost per token (LARGE: a BERT of 6
  layers, hidden 768, random weights with MiniLM SST-2's tokenizer, built by benchmarks.reliability: ../shared has
  no larger fine-tuned checkpoint), for a repository of models of different costs;
- embed-1, embed-64: one and sixty-four SST-2 sentences a request to the native embedding route (minilm-embed, the
  all-MiniLM-L6-v2 sentence-transformers checkpoint);
- embeddings-1: one SST-2 sentence a request to OpenAI's `/v1/embeddings`, which names its model in the body (the
  model's gate is met once the request is tokenized, not at the door);
- rerank-20: a SQuAD question against 20 paragraphs of its article through Cohere's `/v1/rerank` (the top 20 of a
  retrieve-then-rerank flow; the cross-encoder of benchmarks.rerank_benchmark: MiniLM SST-2's encoder, 12 layers,
  with a one-label head), also named in the body.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from benchmarks import realdata

LARGE = "bert-6x768-random-sst2"
QA_CONTEXT_WORDS = 600
NER_SENTENCES = 40
EMBEDDER = "minilm-embed"
CROSS_ENCODER = "minilm-cross-encoder"
RERANK_DOCUMENTS = 20


@dataclass(frozen=True)
class RequestShape:
    name: str
    checkpoint: str  # a directory of ../shared/models
    endpoint: str  # classify, ner, qa or embed; or a path of its own (OpenAI's, Cohere's: the body names the model)

    def path(self) -> str:
        return self.endpoint if self.endpoint.startswith("/") else f"/v1/models/{self.checkpoint}/{self.endpoint}"

    def bodies(self, count: int = 256) -> list[dict]:
        return BODIES[self.name](count)

    def rows_per_request(self) -> int:
        """Sequences a request holds, as the load client counts them (inputs, not windows)."""
        return {"classify-16": 16, "embed-64": 64, "rerank-20": RERANK_DOCUMENTS}.get(self.name, 1)


def _sentences() -> list[str]:
    return [text for text, _ in realdata.sst2()]


def _classify(per_request: int, count: int) -> list[dict]:
    sentences = _sentences()
    return [
        {"inputs": [sentences[(i * per_request + j) % len(sentences)] for j in range(per_request)]}
        for i in range(count)
    ]


def _qa_long(count: int) -> list[dict]:
    data = json.loads((realdata.SHARED / "data" / "squad" / "dev-v1.1-eval-half.json").read_text(encoding="utf-8"))
    bodies: list[dict] = []
    for article in data["data"]:
        paragraphs = [p["context"] for p in article["paragraphs"]]
        context, used = "", 0
        while used < len(paragraphs) and len(context.split()) < QA_CONTEXT_WORDS:
            context = f"{context} {paragraphs[used]}".strip()
            used += 1
        if len(context.split()) < QA_CONTEXT_WORDS:
            continue
        words = context.split()[:QA_CONTEXT_WORDS]
        for qa in article["paragraphs"][0]["qas"]:
            bodies.append({"inputs": [{"question": qa["question"], "context": " ".join(words)}]})
        if len(bodies) >= count:
            break
    return bodies[:count]


def _ner_long(count: int) -> list[dict]:
    sentences = [" ".join(words) for words, _ in realdata.conll03()]
    return [
        {"inputs": [" ".join(sentences[(i * NER_SENTENCES + j) % len(sentences)] for j in range(NER_SENTENCES))]}
        for i in range(count)
    ]


def _embeddings(count: int) -> list[dict]:
    sentences = _sentences()
    return [{"model": EMBEDDER, "input": sentences[i % len(sentences)]} for i in range(count)]


def _rerank(count: int) -> list[dict]:
    """Each question of an article against RERANK_DOCUMENTS of its paragraphs (its own first among them)."""
    data = json.loads((realdata.SHARED / "data" / "squad" / "dev-v1.1-eval-half.json").read_text(encoding="utf-8"))
    bodies: list[dict] = []
    for article in data["data"]:
        paragraphs = [p["context"] for p in article["paragraphs"]]
        documents = [paragraphs[i % len(paragraphs)] for i in range(RERANK_DOCUMENTS)]
        for qa in article["paragraphs"][0]["qas"]:
            bodies.append({"model": CROSS_ENCODER, "query": qa["question"], "documents": documents})
    return [bodies[i % len(bodies)] for i in range(count)]


BODIES = {
    "classify-1": lambda count: _classify(1, count),
    "classify-16": lambda count: _classify(16, count),
    "qa-long": _qa_long,
    "ner-long": _ner_long,
    "classify-1-large": lambda count: _classify(1, count),
    "embed-1": lambda count: _classify(1, count),
    "embed-64": lambda count: _classify(64, count),
    "embeddings-1": _embeddings,
    "rerank-20": _rerank,
}
SHAPES = {
    "classify-1": RequestShape("classify-1", "minilm-bert-sst2", "classify"),
    "classify-16": RequestShape("classify-16", "minilm-bert-sst2", "classify"),
    "qa-long": RequestShape("qa-long", "minilm-bert-squad", "qa"),
    "ner-long": RequestShape("ner-long", "minilm-bert-conll03", "ner"),
    "classify-1-large": RequestShape("classify-1-large", LARGE, "classify"),
    "embed-1": RequestShape("embed-1", EMBEDDER, "embed"),
    "embed-64": RequestShape("embed-64", EMBEDDER, "embed"),
    "embeddings-1": RequestShape("embeddings-1", EMBEDDER, "/v1/embeddings"),
    "rerank-20": RequestShape("rerank-20", CROSS_ENCODER, "/v1/rerank"),
}
