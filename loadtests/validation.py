"""Which models to load, and the checks every answer must pass (shape, labels, offsets, answer text).

Pure functions, no Locust: the locustfile calls `judge(...)`, which tells a good answer (`ok`), a shed one
(429, `shed`) and a failure (`fail`, with the reason) apart.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, Literal

from loadtests.payloads import TASK_OF_ENDPOINT, QaPair

Outcome = Literal["ok", "shed", "fail"]


class Malformed(ValueError):
    """An answer that does not have the shape or content the API promises."""


@dataclass(frozen=True)
class ModelTarget:
    endpoint: str
    name: str
    labels: tuple[str, ...] | None = None
    problem_type: str | None = None
    max_length: int | None = None

    @property
    def qa_doc_stride(self) -> int | None:
        """None (the server's default, min(max_seq_len / 2, 128)) for real windows; for a window under 256
        tokens (tiny test models) an eighth of it, so a question of ordinary length still leaves room for it."""
        if self.max_length is None or self.max_length >= 256:
            return None
        return max(1, self.max_length // 8)

    @property
    def entity_groups(self) -> frozenset[str] | None:
        """NER entity types from the tag set (B-PER, I-PER -> PER; O left out)."""
        if self.labels is None:
            return None
        return frozenset(label[2:] if label[:2] in ("B-", "I-") else label for label in self.labels) - {"O"}

    @property
    def score_function(self) -> str:
        """What the server applies to a classifier's logits by default (as transformers' pipeline, see
        bertcore/tasks/classification.py): none for a regression head (`problem_type` regression, e.g. a
        cross-encoder: raw scores, any finite number), sigmoid for a multi-label or one-label head (each score in
        [0, 1]), else softmax (in [0, 1], summing to 1)."""
        if self.problem_type == "regression":
            return "none"
        if self.problem_type == "multi_label_classification" or (self.labels is not None and len(self.labels) == 1):
            return "sigmoid"
        return "softmax"


def pick_target(models: list[dict[str, Any]], endpoint: str, name: str | None = None) -> ModelTarget | None:
    """The model named `name` (it must serve the endpoint's task), else the first ready one of that task."""
    task = TASK_OF_ENDPOINT[endpoint]
    if name is not None:
        found = [m for m in models if m.get("name") == name]
        if not found:
            raise ValueError(f"--{endpoint}-model {name}: no such model (served: {[m.get('name') for m in models]})")
        if found[0].get("task") != task:
            raise ValueError(f"--{endpoint}-model {name}: its task is {found[0].get('task')}, not {task}")
        if found[0].get("status") != "ready":
            raise ValueError(f"--{endpoint}-model {name}: status {found[0].get('status')}, not ready")
        candidates = found
    else:
        candidates = [m for m in models if m.get("task") == task and m.get("status") == "ready"]
    if not candidates:
        return None
    model = candidates[0]
    labels = model.get("labels")
    return ModelTarget(
        endpoint, model["name"], tuple(labels) if labels else None, model.get("problem_type"), model.get("max_length")
    )


def _require(condition: bool, reason: str) -> None:
    if not condition:
        raise Malformed(reason)


def _score(value: Any, where: str, bounded: bool = True) -> None:
    """A finite number, in [0, 1] unless `bounded` is False (a regression head's raw score)."""
    finite = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if bounded:
        _require(finite and 0 <= value <= 1, f"{where}: score {value!r} is not a number in [0, 1]")
    else:
        _require(finite, f"{where}: score {value!r} is not a finite number")


def _offset(value: Any, where: str) -> int:
    _require(isinstance(value, int) and not isinstance(value, bool), f"{where}: offset {value!r} is not an integer")
    return value


def _results(body: Any, target: ModelTarget, count: int) -> list[Any]:
    _require(isinstance(body, dict), "answer is not a JSON object")
    _require(body.get("model") == target.name, f"model is {body.get('model')!r}, expected {target.name!r}")
    results = body.get("results")
    _require(isinstance(results, list), "results is not a list")
    _require(len(results) == count, f"{len(results)} results for {count} inputs")
    for index, result in enumerate(results):
        _require(isinstance(result, list), f"results[{index}] is not a list")
        _require(all(isinstance(item, dict) for item in result), f"results[{index}] holds a non-object")
    return results


def validate_classify(body: Any, target: ModelTarget, texts: list[str]) -> None:
    """top_k null: every label once, by decreasing score; softmax scores sum to 1; a regression head's raw scores
    may be any finite number."""
    function = target.score_function
    for index, labels in enumerate(_results(body, target, len(texts))):
        where = f"results[{index}]"
        _require(len(labels) > 0, f"{where}: no labels")
        names = [item.get("label") for item in labels]
        _require(all(isinstance(name, str) for name in names), f"{where}: a label is not a string")
        for item in labels:
            _score(item.get("score"), where, bounded=function != "none")
        scores = [item["score"] for item in labels]
        _require(scores == sorted(scores, reverse=True), f"{where}: labels not sorted by decreasing score")
        if target.labels is not None:
            _require(
                sorted(names) == sorted(target.labels), f"{where}: labels {names} are not the model's {target.labels}"
            )
            if function == "softmax":
                _require(abs(sum(scores) - 1) < 1e-3, f"{where}: softmax scores sum to {sum(scores):.4f}, not 1")


def validate_ner(body: Any, target: ModelTarget, texts: list[str]) -> None:
    """Aggregated entities: a known entity type, a score, and a non-blank [start, end) span inside the text."""
    groups = target.entity_groups
    for index, (entities, text) in enumerate(zip(_results(body, target, len(texts)), texts, strict=True)):
        for number, entity in enumerate(entities):
            where = f"results[{index}][{number}]"
            group = entity.get("entity_group")
            _require(isinstance(group, str), f"{where}: entity_group {group!r} is not a string")
            _require(groups is None or group in groups, f"{where}: entity_group {group!r} not among {groups}")
            _score(entity.get("score"), where)
            _require(isinstance(entity.get("word"), str), f"{where}: word is not a string")
            start, end = _offset(entity.get("start"), where), _offset(entity.get("end"), where)
            _require(0 <= start < end <= len(text), f"{where}: span [{start}, {end}) outside the text ({len(text)})")
            _require(bool(text[start:end].strip()), f"{where}: span [{start}, {end}) is blank")


def validate_qa(body: Any, target: ModelTarget, pairs: list[QaPair], top_k: int = 1) -> None:
    """1..top_k answers per input, each with answer == context[start:end]."""
    for index, (answers, pair) in enumerate(zip(_results(body, target, len(pairs)), pairs, strict=True)):
        _require(1 <= len(answers) <= top_k, f"results[{index}]: {len(answers)} answers, expected 1 to {top_k}")
        for number, answer in enumerate(answers):
            where = f"results[{index}][{number}]"
            _score(answer.get("score"), where)
            start, end = _offset(answer.get("start"), where), _offset(answer.get("end"), where)
            context = pair.context
            _require(0 <= start <= end <= len(context), f"{where}: span [{start}, {end}) outside the context")
            text = answer.get("answer")
            _require(
                text == context[start:end], f"{where}: answer {text!r} != context[{start}:{end}] {context[start:end]!r}"
            )


def validate(endpoint: str, body: Any, target: ModelTarget, inputs: list[Any], top_k: int = 1) -> None:
    if endpoint == "classify":
        validate_classify(body, target, inputs)
    elif endpoint == "ner":
        validate_ner(body, target, inputs)
    elif endpoint == "qa":
        validate_qa(body, target, inputs, top_k)
    else:
        raise ValueError(f"unknown endpoint {endpoint!r}")


def judge(
    endpoint: str, status: int, content: bytes | str | None, target: ModelTarget, inputs: list[Any], top_k: int = 1
) -> tuple[Outcome, str | None]:
    """(outcome, reason): 2xx with a valid answer is ok, 429 is shed, anything else fails with the reason."""
    if status == 429:
        return "shed", None
    text = content.decode("utf-8", "replace") if isinstance(content, bytes) else (content or "")
    if status == 0:
        return "fail", "no response (connection error or client timeout)"
    if not 200 <= status < 300:
        return "fail", f"HTTP {status}: {text[:200]}"
    try:
        body = json.loads(text)
    except json.JSONDecodeError:
        return "fail", f"malformed answer: not JSON: {text[:100]!r}"
    try:
        validate(endpoint, body, target, inputs, top_k)
    except Malformed as error:
        return "fail", f"malformed answer: {error}"
    return "ok", None
