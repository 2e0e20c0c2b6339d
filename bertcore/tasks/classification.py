"""Sequence classification: a text or a text pair per input; softmax or sigmoid by the model's problem_type.

Post-processing follows transformers' text-classification pipeline: sigmoid for multi-label models (and for a
single-label head), softmax otherwise; `top_k` best labels, sorted by score (None: all labels).
"""

from __future__ import annotations

import numpy as np

from bertcore.rows import Row
from bertcore.tasks.errors import TaskInputError
from bertcore.tokenization import TextTokenizer

TextInput = str | tuple[str, str]


def prepare(tokenizer: TextTokenizer, inputs: list[TextInput], max_length: int, truncate: bool) -> list[Row]:
    rows = []
    for index, (item, encoding) in enumerate(zip(inputs, tokenizer.encode_batch(inputs), strict=True)):
        text, pair = (item, None) if isinstance(item, str) else item
        if len(encoding.ids) > max_length:
            if not truncate:
                raise TaskInputError(
                    f"input {index} is {len(encoding.ids)} tokens long; this model takes at most {max_length}",
                    field=f"inputs.{index}",
                )
            encoding = tokenizer.encode(text, pair, max_length=max_length)[0]
        rows.append(Row.from_encoding(encoding))
    return rows


def scores(logits: np.ndarray, problem_type: str | None) -> np.ndarray:
    logits = logits.astype(np.float64)
    if problem_type == "multi_label_classification" or logits.shape[-1] == 1:
        return 1.0 / (1.0 + np.exp(-logits))
    shifted = np.exp(logits - logits.max(-1, keepdims=True))
    return shifted / shifted.sum(-1, keepdims=True)


def postprocess(logits: np.ndarray, labels: list[str], problem_type: str | None, top_k: int | None) -> list[dict]:
    probabilities = scores(logits, problem_type)
    order = np.argsort(-probabilities, kind="stable")
    if top_k is not None:
        order = order[:top_k]
    return [{"label": labels[i], "score": float(probabilities[i])} for i in order]
