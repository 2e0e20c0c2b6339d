"""Classification scores: the function transformers' text-classification pipeline applies, or the one asked for."""

from __future__ import annotations

import numpy as np
import pytest

from bertcore.tasks import classification
from bertcore.tasks.errors import TaskInputError
from bertcore.tokenization import TextTokenizer
from tests.conftest import SHARED

SST2_TOKENIZER = SHARED / "models" / "minilm-bert-sst2" / "tokenizer.json"

LOGITS = np.array([2.0, 0.0, -1.0], dtype=np.float32)


@pytest.mark.parametrize(
    ("problem_type", "labels", "function"),
    [
        ("single_label_classification", 3, "softmax"),
        ("multi_label_classification", 3, "sigmoid"),
        (None, 1, "sigmoid"),  # a one-label head without a problem type
        ("regression", 1, "none"),  # a cross-encoder trained as regression: its logit
        (None, 3, "softmax"),
    ],
)
def test_the_default_function_is_the_pipelines(problem_type: str | None, labels: int, function: str) -> None:
    assert classification.default_function(problem_type, labels) == function


def test_function_to_apply_overrides_the_default() -> None:
    labels = ["a", "b", "c"]
    raw = classification.postprocess(LOGITS, labels, "single_label_classification", None, "none")
    assert [x["score"] for x in raw] == [2.0, 0.0, -1.0]
    sigmoid = classification.postprocess(LOGITS, labels, "single_label_classification", 1, "sigmoid")
    assert sigmoid == [{"label": "a", "score": pytest.approx(1 / (1 + np.exp(-2.0)))}]
    one = classification.postprocess(np.array([0.5], dtype=np.float32), ["LABEL_0"], "regression", None)
    assert one == [{"label": "LABEL_0", "score": 0.5}]
    with pytest.raises(TaskInputError) as raised:
        classification.postprocess(LOGITS, labels, None, None, "tanh")
    assert raised.value.field == "function_to_apply"


def _one_input(
    logits: np.ndarray, labels: list[str], problem_type: str | None, top_k: int | None, function: str | None
):
    """The reference: one input's scores by numpy on its own row, as post-processing ran before it took a
    request's rows at once."""
    values = logits.astype(np.float64)
    function = function or classification.default_function(problem_type, values.shape[-1])
    if function == "sigmoid":
        values = 1.0 / (1.0 + np.exp(-values))
    elif function == "softmax":
        shifted = np.exp(values - values.max(-1, keepdims=True))
        values = shifted / shifted.sum(-1, keepdims=True)
    order = np.argsort(-values, kind="stable")
    if top_k is not None:
        order = order[:top_k]
    return [{"label": labels[i], "score": float(values[i])} for i in order]


@pytest.mark.parametrize("label_count", [1, 2, 3, 7, 28, 301])
def test_a_requests_inputs_scored_at_once_score_as_each_alone(label_count: int) -> None:
    """Bit for bit, every function, top_k and label count: ties (equal logits) keep the label order, and the rows
    come from one block of logits, as the engine's answer holds them."""
    rng = np.random.default_rng(label_count)
    labels = [f"label_{i}" for i in range(label_count)]
    block = rng.normal(0.0, 4.0, size=(16, label_count)).astype(np.float32)
    block[3] = 1.5  # a row of ties
    block[5, : label_count // 2] = block[5, -1]  # some ties
    rows = [block[i] for i in range(len(block))]
    cases = 0
    for function in (None, "softmax", "sigmoid", "none"):
        for problem_type in (None, "single_label_classification", "multi_label_classification", "regression"):
            for top_k in (None, 1, 2, label_count + 5):
                expected = [_one_input(row, labels, problem_type, top_k, function) for row in rows]
                assert classification.postprocess_all(rows, labels, problem_type, top_k, function) == expected
                assert classification.postprocess_all(rows[:1], labels, problem_type, top_k, function) == expected[:1]
                cases += 1
    assert cases == 64
    assert classification.postprocess_all([], labels, None, None) == []


def test_rerank_relevance_of_pairs_at_once_is_each_pairs_sigmoid() -> None:
    logits = np.random.default_rng(7).normal(0.0, 6.0, size=(33, 1)).astype(np.float32)
    rows = [logits[i] for i in range(len(logits))]
    assert classification.relevance_all(rows) == [float(1.0 / (1.0 + np.exp(-float(row[0])))) for row in rows]
    assert classification.relevance_all([]) == []


def test_rerank_order_is_the_logits_even_where_their_sigmoids_are_all_one() -> None:
    """A logit past ~37 has a sigmoid of exactly 1.0: ranked by the relevance, such documents came back in the
    request's order (a cross-encoder probe: logits 83.01, 91.96, 83.21, 91.03 answered as 0, 1, 2, 3)."""
    saturated = [np.array([logit], dtype=np.float32) for logit in (83.01, 91.96, 83.21, 91.03)]
    assert classification.relevance_all(saturated) == [1.0] * 4
    assert classification.relevance_order(saturated) == [1, 3, 2, 0]
    tied = [np.array([logit], dtype=np.float32) for logit in (2.0, -1.0, 2.0, 5.0, -1.0)]
    assert classification.relevance_order(tied) == [3, 0, 2, 1, 4]  # equal logits in the documents' order
    assert classification.relevance_order([]) == []


@pytest.mark.skipif(not SST2_TOKENIZER.is_file(), reason="../shared/models/minilm-bert-sst2 is absent")
def test_a_pair_over_the_window_is_refused_with_what_each_part_brings() -> None:
    """A rerank pair over the window said "documents.1 is 603 tokens long", the query's tokens counted as the
    document's: the refusal now says what each part brings, named as the request names it."""
    tokenizer = TextTokenizer.load(SST2_TOKENIZER, 0)
    pairs: list[classification.TextInput] = [("a short query", "d"), ("a short query", "word " * 20)]
    with pytest.raises(TaskInputError) as raised:
        classification.prepare(tokenizer, pairs, 16, False, ["documents.0", "documents.1"], ("query", "document"))
    assert raised.value.field == "documents.1"
    assert str(raised.value) == (
        "documents.1 is 26 tokens long (query 3 tokens, document 20, 3 special); this model takes at most 16"
    )
    with pytest.raises(TaskInputError) as unnamed:  # classify's pairs: text and text_pair, inputs.N
        classification.prepare(tokenizer, [("word " * 20, "b")], 16, False)
    assert unnamed.value.field == "inputs.0"
    assert "input 0 is 24 tokens long (text 20 tokens, text_pair 1, 3 special)" in str(unnamed.value)
    alone = classification.prepare(tokenizer, ["word " * 20], 32, False)  # a lone text: no parts to name
    assert len(alone[0]) == 22
    with pytest.raises(TaskInputError, match=r"^input 0 is 22 tokens long; this model"):
        classification.prepare(tokenizer, ["word " * 20], 16, False)
