"""Sentence embeddings: one vector per text. The pooling, any Dense layers and the model's own normalization all run
inside the graph (its one output, OUTPUT, is a vector per row); what is left here is what a request asks of the
vector: unit length, and fewer dimensions.

- `prepare`: texts to rows as classification makes them (one row per text, cut to the window or refused), each text
  behind the model's default prompt where sentence-transformers' `encode` puts one;
- `postprocess`: `dimensions` keeps the first N values (Matryoshka-trained models are made to be cut so; OpenAI's
  `dimensions` does the same), and `normalize` scales the vector to unit length (L2), the cut one too: without it
  the first N values as they are, as sentence-transformers' `encode(truncate_dim=N, normalize_embeddings=False)`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from bertcore.messages import shown
from bertcore.model_config import EmbeddingSpec
from bertcore.rows import Row
from bertcore.tasks import classification
from bertcore.tasks.errors import TaskInputError
from bertcore.tokenization import TextTokenizer

OUTPUT = "sentence_embedding"  # the graph's one output: [batch, dimension]
# torch.nn.functional.normalize's floor under the norm (sentence-transformers' Normalize): a zero vector stays zero
NORM_EPSILON = 1e-12


def prompted(texts: list[str], spec: EmbeddingSpec, prompt_name: str | None = None) -> list[str]:
    """The texts as sentence-transformers' `encode` embeds them: behind the prompt named (`prompt_name`, one of the
    model's prompts), else the default prompt where the model names one (an instruction-tuned model's vectors are
    only what it was trained to give with it)."""
    if prompt_name is not None and prompt_name not in spec.prompts:
        names = ", ".join(sorted(spec.prompts)) or "none"
        raise TaskInputError(
            f"prompt_name {shown(prompt_name, 102)} is not one of the model's prompts ({names})", field="prompt_name"
        )
    name = prompt_name if prompt_name is not None else spec.default_prompt_name
    prompt = spec.prompts.get(name, "") if name else ""
    return [prompt + text for text in texts] if prompt else texts


def prepare(
    tokenizer: TextTokenizer,
    texts: list[str],
    max_length: int,
    truncate: bool,
    field: str | Sequence[str] = "inputs",
) -> list[Row]:
    """One row per text; a text longer than the window is cut to it (`truncate`) or refused, as classification does:
    a TaskInputError naming `field`.N (the request's name for its texts: inputs, or OpenAI's input), or where
    `field` is a sequence, the name it gives text N (each text's own name in the request)."""
    inputs: list[classification.TextInput] = [*texts]
    if field == "inputs":
        return classification.prepare(tokenizer, inputs, max_length, truncate)
    names = [f"{field}.{i}" for i in range(len(texts))] if isinstance(field, str) else field
    return classification.prepare(tokenizer, inputs, max_length, truncate, names)


def check_dimensions(dimensions: int | None, size: int) -> None:
    """`dimensions` must keep at least one value and at most the model's vector size (no value can be made up)."""
    if dimensions is None:
        return
    if dimensions < 1 or dimensions > size:
        raise TaskInputError(
            f"dimensions {dimensions} is not between 1 and this model's vector size, {size}", field="dimensions"
        )


def postprocess(vector: np.ndarray, normalize: bool, dimensions: int | None = None) -> np.ndarray:
    """The answer's vector, float32 and one-dimensional: its first `dimensions` values, scaled to unit length where
    `normalize` asks it (a cut unit vector is no longer one); the graph's values as they are otherwise (a client
    that asks `normalize: false` with `dimensions` gets the first N values, not a unit vector). An array, not a
    list: the answers write it out as it is (JSON, base64, tensors) without a Python float per value."""
    check_dimensions(dimensions, vector.shape[-1])
    values = vector.astype(np.float32, copy=False)
    if dimensions is not None and dimensions < values.shape[-1]:
        values = values[:dimensions]
    if normalize:
        norm = float(np.linalg.norm(values.astype(np.float64)))
        values = values / np.float32(max(norm, NORM_EPSILON))
    return np.ascontiguousarray(values)
