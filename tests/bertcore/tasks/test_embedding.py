"""Sentence embeddings after the graph: unit length where asked, Matryoshka cuts normalized again, the default prompt
in front of each text, and texts longer than the window cut or refused as classification's are."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from bertcore.model_config import EmbeddingSpec
from bertcore.tasks import embedding
from bertcore.tasks.errors import TaskInputError
from bertcore.tokenization import TextTokenizer

MINILM_TOKENIZER = Path(__file__).resolve().parents[3].parent / "shared" / "models" / "minilm-embed" / "tokenizer.json"
VECTOR = np.array([3.0, 4.0, 12.0, 0.0], dtype=np.float32)  # norm 13; its first two values' norm 5


def test_the_vector_is_scaled_to_unit_length_where_asked() -> None:
    normalized = embedding.postprocess(VECTOR, normalize=True)
    assert normalized.tolist() == pytest.approx([3 / 13, 4 / 13, 12 / 13, 0.0])
    assert embedding.postprocess(VECTOR, normalize=False).tolist() == [3.0, 4.0, 12.0, 0.0]  # the graph's own vector


@pytest.mark.parametrize(
    ("source", "normalize", "dimensions"),
    [(np.float32, True, None), (np.float32, False, None), (np.float16, False, None), (np.float32, False, 2)],
)
def test_the_vector_is_a_float32_array_of_its_own(source: type, normalize: bool, dimensions: int | None) -> None:
    """One flat, contiguous float32 array, whatever the graph's output type: the answers write it out as it is."""
    batch = np.stack([VECTOR, VECTOR * 2]).astype(source)  # the engine's rows are views into one batch
    vector = embedding.postprocess(batch[1], normalize=normalize, dimensions=dimensions)
    assert vector.dtype == np.float32 and vector.ndim == 1 and vector.flags.c_contiguous
    assert vector.shape == (dimensions or 4,)


def test_dimensions_keeps_the_first_values_normalized_again_unless_normalize_is_false() -> None:
    """A cut unit vector is no longer one: OpenAI's `dimensions` and Matryoshka models normalize it again; a client
    that asks `normalize: false` gets the first values as they are (sentence-transformers' truncate_dim without
    normalize_embeddings), where it got a unit vector."""
    assert embedding.postprocess(VECTOR, normalize=True, dimensions=2).tolist() == pytest.approx([0.6, 0.8])
    assert embedding.postprocess(VECTOR, normalize=False, dimensions=2).tolist() == [3.0, 4.0]
    assert embedding.postprocess(VECTOR / 13, normalize=True, dimensions=2).tolist() == pytest.approx([0.6, 0.8])
    assert embedding.postprocess(VECTOR, normalize=False, dimensions=4).tolist() == [3.0, 4.0, 12.0, 0.0]  # not cut


@pytest.mark.parametrize("dimensions", [0, -1, 5])
def test_dimensions_beyond_the_vector_are_refused(dimensions: int) -> None:
    with pytest.raises(TaskInputError, match="between 1 and this model's vector size, 4") as raised:
        embedding.postprocess(VECTOR, normalize=True, dimensions=dimensions)
    assert raised.value.field == "dimensions"
    embedding.check_dimensions(None, 4)
    embedding.check_dimensions(4, 4)


def test_a_zero_vector_stays_zero() -> None:
    assert embedding.postprocess(np.zeros(3, dtype=np.float32), normalize=True).tolist() == [0.0, 0.0, 0.0]


def test_the_default_prompt_goes_before_every_text() -> None:
    plain = EmbeddingSpec(pooling="mean", normalize=True, dimension=4)
    assert embedding.prompted(["a", "b"], plain) == ["a", "b"]
    named = EmbeddingSpec(
        pooling="mean", normalize=True, dimension=4, prompts={"query": "query: "}, default_prompt_name="query"
    )
    assert embedding.prompted(["a", "b"], named) == ["query: a", "query: b"]


@pytest.mark.skipif(not MINILM_TOKENIZER.is_file(), reason="../shared/models/minilm-embed is absent")
def test_texts_become_one_row_each_cut_or_refused_past_the_window() -> None:
    tokenizer = TextTokenizer.load(MINILM_TOKENIZER, 0)
    texts = ["A man is playing a guitar.", "word " * 40]
    rows = embedding.prepare(tokenizer, texts, max_length=16, truncate=True)
    assert [len(row) for row in rows] == [9, 16]  # [CLS] 7 tokens [SEP]; the long text cut to the window
    with pytest.raises(TaskInputError, match="input 1 is 42 tokens long; this model takes at most 16") as raised:
        embedding.prepare(tokenizer, texts, max_length=16, truncate=False)
    assert raised.value.field == "inputs.1"
    with pytest.raises(TaskInputError) as renamed:  # OpenAI's request names its texts `input`
        embedding.prepare(tokenizer, texts, max_length=16, truncate=False, field="input")
    assert renamed.value.field == "input.1"
