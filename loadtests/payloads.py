"""Request payloads for the load tests: which texts, how many inputs per request, and the request bodies.

Sources (`--payloads`):
- `builtin`: the small set in `loadtests/builtin.py` (always there);
- `shared`: SST-2 dev sentences, CoNLL-2003 test sentences and SQuAD dev (question, context) pairs from
  `../shared/data` (via `benchmarks.realdata`); an error saying so when `../shared` is absent;
- a path to a JSON file `{"classify": [str...], "ner": [str...], "qa": [{"question", "context"}...]}`
  (any key may be left out; the matching endpoint then uses the built-in texts).

Batch sizes (`--batch`): `mix` (the default: 60% single inputs, 30% 2-4, 10% 5-16, as real clients send),
`N` (always N inputs), or `A-B` (uniformly A to B).
"""

from __future__ import annotations

import json
import random
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loadtests import builtin

ROOT = Path(__file__).resolve().parents[1]
ENDPOINTS: tuple[str, ...] = ("classify", "ner", "qa")
TASK_OF_ENDPOINT: dict[str, str] = {"classify": "classification", "ner": "ner", "qa": "qa"}


class PayloadError(ValueError):
    """A payload source that cannot be used, with the reason."""


@dataclass(frozen=True)
class QaPair:
    question: str
    context: str

    def as_input(self) -> dict[str, str]:
        return {"question": self.question, "context": self.context}


@dataclass(frozen=True)
class PayloadSet:
    source: str
    classify: tuple[str, ...]
    ner: tuple[str, ...]
    qa: tuple[QaPair, ...]

    def sizes(self) -> dict[str, int]:
        return {"classify": len(self.classify), "ner": len(self.ner), "qa": len(self.qa)}

    def length_stats(self) -> dict[str, dict[str, float]]:
        """Characters per input (per context for QA): min, mean, max, for the report."""

        def stats(lengths: list[int]) -> dict[str, float]:
            return {"min": min(lengths), "mean": round(sum(lengths) / len(lengths), 1), "max": max(lengths)}

        return {
            "classify": stats([len(text) for text in self.classify]),
            "ner": stats([len(text) for text in self.ner]),
            "qa": stats([len(pair.context) for pair in self.qa]),
        }


def builtin_payloads() -> PayloadSet:
    qa = tuple(QaPair(question, context) for context, questions in builtin.PARAGRAPHS for question in questions)
    return PayloadSet("builtin", builtin.REVIEWS, builtin.NEWS, qa)


def _realdata() -> Any:
    """`benchmarks.realdata`, the readers of ../shared (benchmarks/ sits next to loadtests/ in the project)."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    import benchmarks.realdata as realdata

    return realdata


def shared_payloads(limit: int | None = None) -> PayloadSet:
    realdata = _realdata()
    data = realdata.SHARED / "data"
    missing = [
        str(path)
        for path in (data / "sst2" / "dev.tsv", data / "conll2003" / "test.txt", data / "squad")
        if not path.exists()
    ]
    if missing:
        raise PayloadError(
            f"--payloads shared needs the real data sets in {data} (SST-2, CoNLL-2003, SQuAD); missing: "
            + ", ".join(missing)
            + ". Use --payloads builtin, or set BERTSERVE_SHARED to the folder holding data/."
        )
    classify = tuple(sentence for sentence, _ in realdata.sst2(limit) if sentence)
    ner = tuple(" ".join(words) for words, _ in realdata.conll03(limit) if words)
    qa = tuple(QaPair(question, context) for question, context, _ in realdata.squad(limit))
    return PayloadSet("shared", classify, ner, qa)


def file_payloads(path: Path) -> PayloadSet:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as error:
        raise PayloadError(f"cannot read payload file {path}: {error}") from error
    if not isinstance(data, dict) or not set(data) <= set(ENDPOINTS):
        raise PayloadError(f"payload file {path}: expected an object with keys among {', '.join(ENDPOINTS)}")
    base = builtin_payloads()

    def texts(key: str, default: tuple[str, ...]) -> tuple[str, ...]:
        if key not in data:
            return default
        values = data[key]
        if not isinstance(values, list) or not values or not all(isinstance(v, str) and v.strip() for v in values):
            raise PayloadError(f"payload file {path}: {key!r} must be a non-empty list of non-blank strings")
        return tuple(values)

    qa = base.qa
    if "qa" in data:
        items = data["qa"]
        if (
            not isinstance(items, list)
            or not items
            or not all(
                isinstance(item, dict)
                and isinstance(item.get("question"), str)
                and isinstance(item.get("context"), str)
                and item["question"].strip()
                and item["context"].strip()
                for item in items
            )
        ):
            raise PayloadError(f"payload file {path}: 'qa' must be a non-empty list of {{question, context}}")
        qa = tuple(QaPair(item["question"], item["context"]) for item in items)
    return PayloadSet(str(path), texts("classify", base.classify), texts("ner", base.ner), qa)


def load_payloads(source: str, limit: int | None = None) -> PayloadSet:
    """`builtin`, `shared` or a JSON file path, each endpoint's set cut to its first `limit` texts (QA: pairs)
    whatever the source (None or 0: all); PayloadError with the reason when it cannot be used."""
    if limit is not None and limit < 0:
        raise PayloadError(f"--payload-limit must be 0 (all) or more, not {limit}")
    if source == "builtin":
        loaded = builtin_payloads()
    elif source == "shared":
        loaded = shared_payloads(limit or None)
    elif Path(source).suffix == ".json" or Path(source).exists():
        loaded = file_payloads(Path(source))
    else:
        raise PayloadError(f"--payloads: expected builtin, shared or a JSON file, not {source!r}")
    if not limit:
        return loaded
    return PayloadSet(loaded.source, loaded.classify[:limit], loaded.ner[:limit], loaded.qa[:limit])


@dataclass(frozen=True)
class BatchSizes:
    """How many inputs a request carries: weighted ranges of sizes, each drawn uniformly."""

    spec: str
    ranges: tuple[tuple[float, int, int], ...]  # (weight, low, high)

    def draw(self, rng: random.Random) -> int:
        _weight, low, high = rng.choices(self.ranges, weights=[r[0] for r in self.ranges])[0]
        return rng.randint(low, high)

    @property
    def largest(self) -> int:
        return max(high for _, _, high in self.ranges)

    def mean(self) -> float:
        total = sum(weight for weight, _, _ in self.ranges)
        return sum(weight * (low + high) / 2 for weight, low, high in self.ranges) / total


MIX = "mix"
MIX_RANGES: tuple[tuple[float, int, int], ...] = ((0.6, 1, 1), (0.3, 2, 4), (0.1, 5, 16))


def parse_batch_sizes(spec: str) -> BatchSizes:
    """`mix`, `N` or `A-B` (1 <= A <= B <= 64); ValueError otherwise."""
    spec = spec.strip()
    if spec == MIX:
        return BatchSizes(spec, MIX_RANGES)
    low_text, _, high_text = spec.partition("-")
    try:
        low = int(low_text)
        high = int(high_text) if high_text else low
    except ValueError:
        raise ValueError(f"batch sizes: expected mix, N or A-B, not {spec!r}") from None
    if not 1 <= low <= high <= 64:
        raise ValueError(f"batch sizes: need 1 <= A <= B <= 64 (the server's default input limit), not {spec!r}")
    return BatchSizes(spec, ((1.0, low, high),))


def classify_body(texts: list[str]) -> dict[str, Any]:
    """All labels by score (top_k null), so the answer can be checked against the model's label set."""
    return {"inputs": texts, "top_k": None}


def ner_body(texts: list[str]) -> dict[str, Any]:
    return {"inputs": texts, "aggregation_strategy": "simple"}


def qa_body(pairs: list[QaPair], top_k: int = 1, doc_stride: int | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"inputs": [pair.as_input() for pair in pairs], "top_k": top_k}
    if doc_stride is not None:
        body["doc_stride"] = doc_stride
    return body


def sample(items: tuple[Any, ...], count: int, rng: random.Random) -> list[Any]:
    """`count` items drawn at random (with replacement: batches can exceed the set)."""
    return [items[rng.randrange(len(items))] for _ in range(count)]
