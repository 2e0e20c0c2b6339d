"""The thread-local tokenizer keeps its truncation between calls: a call must never see another call's settings."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from bertcore.tokenization import TextTokenizer
from tests.tiny_models import FAMILIES, make_tokenizer

TEXT = "Angela Merkel met Emmanuel Macron in Paris on 14 June 2019, then flew to New York. " * 6


def fresh_windows(path: Path, max_length: int | None, stride: int) -> list[list[int]]:
    tokenizer = Tokenizer.from_file(str(path))
    if max_length is not None:
        tokenizer.enable_truncation(max_length, stride=stride, direction="right")
    encoding = tokenizer.encode(TEXT)
    return [window.ids for window in [encoding, *encoding.overflowing]] if max_length is not None else [encoding.ids]


def test_truncation_follows_each_call(tiny_checkpoint: Callable[..., Path]) -> None:
    path = tiny_checkpoint("bert", "ner") / "tokenizer.json"
    tokenizer = TextTokenizer.load(path, pad_token_id=0)
    calls = [(None, 0), (32, 8), (32, 8), (24, 8), (24, 0), (None, 0), (32, 8), (None, 0)]
    for max_length, stride in calls:
        got = [encoding.ids for encoding in tokenizer.encode(TEXT, max_length=max_length, stride=stride)]
        assert got == fresh_windows(path, max_length, stride), (max_length, stride)
        assert [encoding.ids for encoding in tokenizer.encode_batch([TEXT])] == fresh_windows(path, None, 0)
    assert tokenizer.num_special_tokens(pair=False) == Tokenizer.from_file(str(path)).num_special_tokens_to_add(False)
    assert tokenizer.num_special_tokens(pair=True) == Tokenizer.from_file(str(path)).num_special_tokens_to_add(True)


def test_one_text_encodes_as_in_a_batch(tiny_checkpoint: Callable[..., Path]) -> None:
    # A lone short text (or pair) takes `encode`, a longer one and several `encode_batch`: the same encodings.
    path = tiny_checkpoint("bert", "classification") / "tokenizer.json"
    tokenizer = TextTokenizer.load(path, pad_token_id=0)
    library = Tokenizer.from_file(str(path))
    cases: list[list] = [["a gorgeous movie"], [("what is it?", "a gorgeous movie")], [TEXT * 3], ["a", "b c"], [""]]
    for items in cases:
        got = tokenizer.encode_batch(items)
        expected = library.encode_batch(items)
        assert [(e.ids, e.type_ids, e.offsets, e.special_tokens_mask) for e in got] == [
            (e.ids, e.type_ids, e.offsets, e.special_tokens_mask) for e in expected
        ], items


ALL_FAMILIES = ("bert", "distilbert", "roberta", "albert", *FAMILIES)


@pytest.mark.parametrize("arch", ALL_FAMILIES)
def test_encodings_without_offsets_have_the_same_ids(arch: str) -> None:
    """Classification's, rerank's and embeddings' rows are encoded without offsets (`offsets=False`): for every
    family's tokenizer (WordPiece, byte BPE, Unigram, SentencePiece) the very same ids and type ids, one text or many,
    pairs, accents, CJK, emoji, empty text (a lone short text keeps `encode`, offsets and all; a long one does not)."""
    library = make_tokenizer(arch)
    tokenizer = TextTokenizer(library.backend_tokenizer.to_str(), pad_token_id=library.pad_token_id or 0)
    texts = ["a gorgeous movie", "Zoë Ünal flew to 東京 🙂 on 14 June", "", TEXT, "  spaced\tout\n", "naïve café"]
    cases: list[list] = [[text] for text in texts] + [
        [TEXT * 3],
        [(TEXT * 2, TEXT)],
        texts,
        [(texts[0], texts[1])],
        list(zip(texts, texts[::-1], strict=True)),
    ]
    for items in cases:
        fast = tokenizer.encode_batch(items, offsets=False)
        full = tokenizer.encode_batch(items)
        assert [(e.ids, e.type_ids, e.attention_mask) for e in fast] == [
            (e.ids, e.type_ids, e.attention_mask) for e in full
        ], (arch, items)
