"""Answer checks: good answers pass, every kind of malformed answer fails with its reason; 429 is shed."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from loadtests.payloads import QaPair
from loadtests.validation import Malformed, ModelTarget, judge, pick_target, validate

SENTIMENT = ModelTarget("classify", "sst2", ("NEGATIVE", "POSITIVE"), "single_label_classification")
TAGGER = ModelTarget("ner", "conll", ("O", "B-PER", "I-PER", "B-LOC", "I-LOC"))
READER = ModelTarget("qa", "squad")
TEXTS = ["a gorgeous movie", "EU rejects German call"]
NER_TEXTS = ["Ann lives in Paris.", "nothing here"]
PAIRS = [QaPair("Who rejects the call?", "EU rejects German call."), QaPair("Where?", "In Paris, mostly.")]

GOOD_CLASSIFY: dict[str, Any] = {
    "model": "sst2",
    "results": [
        [{"label": "POSITIVE", "score": 0.9}, {"label": "NEGATIVE", "score": 0.1}],
        [{"label": "NEGATIVE", "score": 0.6}, {"label": "POSITIVE", "score": 0.4}],
    ],
}
GOOD_NER: dict[str, Any] = {
    "model": "conll",
    "results": [
        [
            {"entity_group": "PER", "score": 0.99, "word": "ann", "start": 0, "end": 3},
            {"entity_group": "LOC", "score": 0.98, "word": "paris", "start": 13, "end": 18},
        ],
        [],
    ],
}
GOOD_QA: dict[str, Any] = {
    "model": "squad",
    "results": [
        [{"score": 0.7, "start": 0, "end": 2, "answer": "EU"}],
        [{"score": 0.5, "start": 3, "end": 8, "answer": "Paris"}],
    ],
}


def test_good_answers_pass() -> None:
    validate("classify", GOOD_CLASSIFY, SENTIMENT, TEXTS)
    validate("ner", GOOD_NER, TAGGER, NER_TEXTS)
    validate("qa", GOOD_QA, READER, PAIRS)
    # Unknown label sets (no labels in the model list): the structure is still checked.
    validate("classify", GOOD_CLASSIFY, ModelTarget("classify", "sst2"), TEXTS)
    # Multi-label (sigmoid) scores need not sum to 1.
    multi = copy.deepcopy(GOOD_CLASSIFY)
    multi["results"][0][1]["score"] = 0.8
    validate(
        "classify",
        multi,
        ModelTarget("classify", "sst2", ("NEGATIVE", "POSITIVE"), "multi_label_classification"),
        TEXTS,
    )
    top2 = copy.deepcopy(GOOD_QA)
    top2["results"][0].append({"score": 0.2, "start": 3, "end": 10, "answer": "rejects"})
    validate("qa", top2, READER, PAIRS, top_k=2)


def _broken(good: dict[str, Any], change: Any) -> dict[str, Any]:
    answer = copy.deepcopy(good)
    change(answer)
    return answer


CLASSIFY_CASES = [
    (lambda a: a["results"].pop(), "1 results for 2 inputs"),
    (lambda a: a.update(model="other"), "model is 'other'"),
    (lambda a: a["results"][0].reverse(), "not sorted"),
    (lambda a: a["results"][0][0].update(label="HAPPY"), "are not the model's"),
    (lambda a: a["results"][0][0].update(score=0.95), "sum to"),
    (lambda a: a["results"][0][0].update(score=float("nan")), "not a number in"),
    (lambda a: a["results"][1][0].update(score=1.5), "not a number in"),
    (lambda a: a["results"][1].clear(), "no labels"),
    (lambda a: a.update(results="none"), "results is not a list"),
    (lambda a: a["results"].__setitem__(0, {"label": "POSITIVE"}), r"results\[0\] is not a list"),
]
NER_CASES = [
    (lambda a: a["results"][0][0].update(end=40), "outside the text"),
    (lambda a: a["results"][0][0].update(start=3, end=3), "outside the text"),
    (lambda a: a["results"][0][0].update(start=3, end=4), "blank"),
    (lambda a: a["results"][0][0].update(entity_group="ORG"), "not among"),
    (lambda a: a["results"][0][0].update(start="0"), "not an integer"),
    (lambda a: a["results"][0][1].pop("score"), "not a number in"),
    (lambda a: a["results"][0][1].update(word=None), "word is not a string"),
]
QA_CASES = [
    (lambda a: a["results"][0][0].update(answer="EU "), "!= context"),
    (lambda a: a["results"][1][0].update(start=30, end=35), "outside the context"),
    (lambda a: a["results"][1][0].update(start=5, end=3), "outside the context"),
    (lambda a: a["results"][0].append(dict(a["results"][0][0])), "2 answers, expected 1 to 1"),
    (lambda a: a["results"][0].clear(), "0 answers"),
    (lambda a: a["results"][0][0].update(score=-0.1), "not a number in"),
]


@pytest.mark.parametrize(
    ("endpoint", "good", "target", "inputs", "change", "reason"),
    [("classify", GOOD_CLASSIFY, SENTIMENT, TEXTS, *case) for case in CLASSIFY_CASES]
    + [("ner", GOOD_NER, TAGGER, NER_TEXTS, *case) for case in NER_CASES]
    + [("qa", GOOD_QA, READER, PAIRS, *case) for case in QA_CASES],
)
def test_malformed_answers_fail(
    endpoint: str, good: dict[str, Any], target: ModelTarget, inputs: list[Any], change: Any, reason: str
) -> None:
    with pytest.raises(Malformed, match=reason):
        validate(endpoint, _broken(good, change), target, inputs)


def test_regression_heads_answer_raw_scores() -> None:
    """A regression head (a cross-encoder: problem_type regression, one label) answers its raw logit, any finite
    number; a one-label head without problem_type answers a sigmoid (in [0, 1], no sum to check); softmax and
    multi-label heads keep their [0, 1] bounds."""
    regression = ModelTarget("classify", "rerank", ("LABEL_0",), "regression")
    one_label = ModelTarget("classify", "rerank", ("LABEL_0",), None)
    assert (regression.score_function, one_label.score_function, SENTIMENT.score_function) == (
        "none",
        "sigmoid",
        "softmax",
    )
    raw = {"model": "rerank", "results": [[{"label": "LABEL_0", "score": 3.25}], [{"label": "LABEL_0", "score": -7}]]}
    validate("classify", raw, regression, TEXTS)
    assert judge("classify", 200, json.dumps(raw).encode(), regression, TEXTS) == ("ok", None)
    validate("classify", raw, ModelTarget("classify", "rerank", None, "regression"), TEXTS)  # labels unknown
    for bad in (float("nan"), float("inf"), "1.0", None, True):
        broken = _broken(raw, lambda a, bad=bad: a["results"][0][0].update(score=bad))
        with pytest.raises(Malformed, match="not a finite number"):
            validate("classify", broken, regression, TEXTS)
    with pytest.raises(Malformed, match="not a number in"):
        validate("classify", raw, one_label, TEXTS)
    sigmoid = _broken(raw, lambda a: [result[0].update(score=0.3) for result in a["results"]])
    validate("classify", sigmoid, one_label, TEXTS)  # 0.3 alone: a sigmoid, not a softmax summing to 1
    with pytest.raises(Malformed, match="not a number in"):
        validate("classify", _broken(GOOD_CLASSIFY, lambda a: a["results"][0][0].update(score=3.0)), SENTIMENT, TEXTS)
    labelled = {"name": "rerank", "status": "ready", "task": "classification", "labels": ["LABEL_0"]}
    labelled["problem_type"] = "regression"
    assert pick_target([labelled], "classify") == regression  # as /v1/models reports it


def test_judge_outcomes() -> None:
    body = json.dumps(GOOD_CLASSIFY).encode()
    assert judge("classify", 200, body, SENTIMENT, TEXTS) == ("ok", None)
    assert judge("classify", 429, b'{"error": "queue full"}', SENTIMENT, TEXTS) == ("shed", None)
    outcome, reason = judge("classify", 503, b'{"error": "draining"}', SENTIMENT, TEXTS)
    assert outcome == "fail" and reason.startswith("HTTP 503")
    outcome, reason = judge("classify", 504, "", SENTIMENT, TEXTS)
    assert outcome == "fail" and "504" in reason
    outcome, reason = judge("classify", 200, b"<html>", SENTIMENT, TEXTS)
    assert outcome == "fail" and "not JSON" in reason
    outcome, reason = judge("classify", 200, json.dumps({"model": "sst2", "results": []}), SENTIMENT, TEXTS)
    assert outcome == "fail" and "0 results for 2 inputs" in reason
    outcome, reason = judge("classify", 0, None, SENTIMENT, TEXTS)
    assert outcome == "fail" and "no response" in reason


MODELS: list[dict[str, Any]] = [
    {"name": "demo-ner", "status": "ready", "task": "ner", "labels": ["O", "B-PER", "I-PER"]},
    {"name": "broken", "status": "failed", "task": "classification"},
    {"name": "sst2", "status": "ready", "task": "classification", "labels": ["NEGATIVE", "POSITIVE"]},
]


def test_targets_are_picked_by_task_or_name() -> None:
    target = pick_target(MODELS, "classify")
    assert target == ModelTarget("classify", "sst2", ("NEGATIVE", "POSITIVE"), None)  # the failed one skipped
    assert target.qa_doc_stride is None
    assert ModelTarget("qa", "tiny", max_length=64).qa_doc_stride == 8
    assert ModelTarget("qa", "real", max_length=512).qa_doc_stride is None
    assert pick_target(MODELS, "ner").entity_groups == frozenset({"PER"})
    assert pick_target(MODELS, "qa") is None
    assert pick_target(MODELS, "ner", "demo-ner").name == "demo-ner"
    with pytest.raises(ValueError, match="its task is ner"):
        pick_target(MODELS, "classify", "demo-ner")
    with pytest.raises(ValueError, match="no such model"):
        pick_target(MODELS, "qa", "squad")
    with pytest.raises(ValueError, match="not ready"):
        pick_target(MODELS, "classify", "broken")
