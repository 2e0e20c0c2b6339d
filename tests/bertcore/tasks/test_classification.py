"""Classification scores: the function transformers' text-classification pipeline applies, or the one asked for."""

from __future__ import annotations

import numpy as np
import pytest

from bertcore.tasks import classification
from bertcore.tasks.errors import TaskInputError

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
