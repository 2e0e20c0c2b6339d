"""Sequence classification: a text or a text pair per input; softmax, sigmoid or raw scores.

Post-processing follows transformers' text-classification pipeline: by default no function for a regression head,
sigmoid for multi-label models and for a one-label head, softmax otherwise; `function_to_apply` ("softmax",
"sigmoid", "none") overrides it; `top_k` best labels, sorted by score (None: all labels).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from bertcore.messages import shown
from bertcore.rows import Row
from bertcore.tasks.errors import TaskInputError
from bertcore.tokenization import TextTokenizer

TextInput = str | tuple[str, str]
FUNCTIONS = ("softmax", "sigmoid", "none")


def text_input(text: str, pair: str | None) -> TextInput:
    """A text, or a pair where there is a second text: the pipeline's tokenizer call, `tokenizer(text,
    text_pair="")`, encodes an empty second segment as none ([CLS] a [SEP]); served as [CLS] a [SEP] [SEP], the
    scores were up to 0.056 apart on MiniLM SST-2. (A rerank pair is not read so: sentence-transformers' batched
    call keeps an empty document as a segment.)"""
    return (text, pair) if pair else text


def prepare(
    tokenizer: TextTokenizer,
    inputs: list[TextInput],
    max_length: int,
    truncate: bool,
    fields: Sequence[str] | None = None,
    pair_names: tuple[str, str] = ("text", "text_pair"),
) -> list[Row]:
    """One row per text or pair; one longer than the window is cut to it (`truncate`) or refused: a TaskInputError
    naming it as the request does (`fields`: each input's name, e.g. rerank's documents.N; else inputs.N), and for a
    pair, how many of its tokens each part brings (`pair_names`: the parts' names, e.g. rerank's query and
    document), so that the client knows which text to shorten."""
    rows = []
    encodings = tokenizer.encode_ids_batch(inputs)  # a row is its ids: no token maps back to the text
    for index, (item, encoding) in enumerate(zip(inputs, encodings, strict=True)):
        text, pair = (item, None) if isinstance(item, str) else item
        if len(encoding.ids) > max_length:
            if not truncate:
                field = f"inputs.{index}" if fields is None else fields[index]
                what = f"input {index}" if fields is None else field
                parts = "" if pair is None else _pair_parts(tokenizer, text, pair, len(encoding.ids), pair_names)
                raise TaskInputError(
                    f"{what} is {len(encoding.ids)} tokens long{parts}; this model takes at most {max_length}",
                    field=field,
                )
            encoding = tokenizer.encode(text, pair, max_length=max_length)[0]
        rows.append(Row.from_encoding(encoding))
    return rows


def _pair_parts(tokenizer: TextTokenizer, text: str, pair: str, length: int, names: tuple[str, str]) -> str:
    """A pair's length by its parts, for its refusal: " (text 12 tokens, text_pair 588, 3 special)"."""
    first, second = (len(tokenizer.encode(part, add_special_tokens=False)[0].ids) for part in (text, pair))
    return f" ({names[0]} {first} tokens, {names[1]} {second}, {length - first - second} special)"


def check_query(tokenizer: TextTokenizer, query: str, max_length: int) -> None:
    """A rerank query whose own tokens leave no room for a document's first (its pair's [CLS] q [SEP] d [SEP] over
    the window whatever the document): the query's fault, not each document's."""
    (encoding,) = tokenizer.encode_ids_batch([query])  # [CLS] query [SEP]
    if len(encoding.ids) + 2 > max_length:
        raise TaskInputError(
            f"the query is {len(encoding.ids)} tokens long; with a document, this model takes at most {max_length}",
            field="query",
        )


def first_tokens(tokenizer: TextTokenizer, text: str, count: int) -> str:
    """`text` up to the end of its `count`-th token (the whole text where it has no more)."""
    encoding = tokenizer.encode(text, add_special_tokens=False)[0]
    if len(encoding.ids) <= count:
        return text
    return text[: encoding.offsets[count - 1][1]]


def default_function(problem_type: str | None, num_labels: int) -> str:
    """The function the pipeline applies when none is asked for."""
    if problem_type == "regression":
        return "none"
    if problem_type == "multi_label_classification" or num_labels == 1:
        return "sigmoid"
    return "softmax"


def check_function(function: str | None) -> None:
    if function is not None and function not in FUNCTIONS:
        raise TaskInputError(
            f"unknown function_to_apply {shown(function)}; expected one of: {', '.join(FUNCTIONS)}",
            field="function_to_apply",
        )


def scores(logits: np.ndarray, problem_type: str | None, function: str | None = None) -> np.ndarray:
    check_function(function)
    logits = logits.astype(np.float64)
    function = function or default_function(problem_type, logits.shape[-1])
    if function == "none":
        return logits
    if function == "sigmoid":
        return 1.0 / (1.0 + np.exp(-logits))
    # The reductions as ufuncs, not array methods (whose Python wrappers cost more than a row's math): the same floats
    shifted = np.exp(logits - np.maximum.reduce(logits, axis=-1, keepdims=True))
    return shifted / np.add.reduce(shifted, axis=-1, keepdims=True)


def postprocess(
    logits: np.ndarray,
    labels: list[str],
    problem_type: str | None,
    top_k: int | None,
    function: str | None = None,
) -> list[dict]:
    """One input's labels and scores, best first (`top_k` of them; None: all)."""
    return postprocess_all([logits], labels, problem_type, top_k, function)[0]


def postprocess_all(
    logits: Sequence[np.ndarray],
    labels: list[str],
    problem_type: str | None,
    top_k: int | None,
    function: str | None = None,
) -> list[list[dict]]:
    """Each input's `postprocess`, the inputs' logits (each of shape (len(labels),)) taken as one matrix: a row's
    scores are the same numbers (the functions run row by row), and numpy is called a few times a request rather
    than a few times an input, which cost more than the rest of a 16-input request's post-processing."""
    if not logits:
        return []
    probabilities = scores(np.array(logits), problem_type, function)  # np.stack's checks cost 6x np.array's
    order = (-probabilities).argsort(axis=-1, kind="stable")
    if top_k is not None:
        order = order[:, :top_k]
    return [
        [{"label": labels[i], "score": row[i]} for i in picks]
        for row, picks in zip(probabilities.tolist(), order.tolist(), strict=True)
    ]


def relevance_order(logits: Sequence[np.ndarray]) -> list[int]:
    """The pairs' indices, most relevant first, by their logits (equal logits in the pairs' order). Not by the
    relevance: a logit past ~37 has a sigmoid of exactly 1.0, and such pairs would tie in their order."""
    if not logits:
        return []
    return (-np.array(logits, dtype=np.float64)[:, 0]).argsort(kind="stable").tolist()


def relevance_all(logits: Sequence[np.ndarray]) -> list[float]:
    """A cross-encoder's relevance of each pair: the sigmoid of its one logit (each of shape (1,)), for all pairs
    in one numpy pass, as `postprocess_all`."""
    if not logits:
        return []
    return scores(np.array(logits)[:, 0], None, "sigmoid").tolist()
