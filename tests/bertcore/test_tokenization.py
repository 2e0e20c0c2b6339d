"""The thread-local tokenizer keeps its truncation between calls: a call must never see another call's settings; plain
ASCII text is normalized lightly (lowercasing only), and encodes as the tokenizer itself encodes it."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from tokenizers import Encoding, Tokenizer, normalizers

from bertcore import tokenization
from bertcore.plain_wordpiece import TokenIds
from bertcore.tokenization import TextTokenizer, plain_ascii
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


# Plain ASCII of both cases, then every ASCII character that is not a letter or a digit inside words (controls
# among them: a text holding one is not plain and goes to the tokenizer itself), tabs and line breaks between words
PLAIN = ["A Gorgeous MOVIE, isn't it?", "Tabs\tand\nnew lines\r\nand   spaces [SEP] [MASK] <s>", "x" * 40]
EVERY_ASCII = [f"Word{chr(code)}WORD and{chr(code)} {chr(code)}next" for code in range(128) if not chr(code).isalnum()]


def library_encodings(library: Tokenizer, items: list, max_length: int | None = None, stride: int = 0) -> list:
    """What tokenizer.json's own tokenizer makes of each item: ids, types, offsets, words, sequences (the windows
    too, with max_length)."""
    found = []
    for item in items:
        text, pair = (item, None) if isinstance(item, str) else item
        if max_length is None:
            library.no_truncation()
        else:
            library.enable_truncation(max_length, stride=stride, strategy="longest_first", direction="right")
        encoding = library.encode(text, pair)
        found.append([described(window) for window in [encoding, *encoding.overflowing]])
    return found


def described(encoding: Encoding) -> tuple:
    return (encoding.ids, encoding.type_ids, encoding.offsets, encoding.word_ids, encoding.sequence_ids)


@pytest.mark.parametrize("arch", ALL_FAMILIES)
def test_plain_ascii_text_encodes_as_the_tokenizer_itself_encodes_it(arch: str) -> None:
    """WordPiece families (BertNormalizer) encode plain ASCII text with a normalizer that only lowercases: for
    every family, plain or not (control characters, accents, CJK), one text, pairs, windows and batches that
    mix both kinds (back in order), the very encodings tokenizer.json's own tokenizer makes."""
    library = make_tokenizer(arch)
    tokenizer = TextTokenizer(library.backend_tokenizer.to_str(), pad_token_id=library.pad_token_id or 0)
    own = Tokenizer.from_str(library.backend_tokenizer.to_str())
    own.no_padding()
    assert tokenizer.normalizes_plain_ascii_lightly == (
        arch in ("bert", "distilbert", "electra", "ernie", "mobilebert")
    )
    mixed = ["naïve Café in 東京", *PLAIN, *EVERY_ASCII]
    items: list = [*mixed, *zip(PLAIN, reversed(mixed), strict=False), (PLAIN[0], EVERY_ASCII[0])]
    assert any(plain_ascii(text) for text in mixed) and not all(plain_ascii(text) for text in mixed)
    assert [[described(e) for e in tokenizer.encode(*_pair(item))] for item in items] == library_encodings(own, items)
    assert [[described(e) for e in tokenizer.encode(*_pair(item), max_length=12, stride=3)] for item in items] == (
        library_encodings(own, items, max_length=12, stride=3)
    )
    own.no_truncation()
    assert [[described(e)] for e in tokenizer.encode_batch(items)] == library_encodings(own, items)
    without_offsets = [(e.ids, e.type_ids) for e in tokenizer.encode_batch(items, offsets=False)]
    assert without_offsets == [(e.ids, e.type_ids) for e in own.encode_batch_fast(items)]


def _pair(item: str | tuple[str, str]) -> tuple[str, str | None]:
    return (item, None) if isinstance(item, str) else item


def test_plain_ascii_is_ascii_without_control_characters() -> None:
    assert plain_ascii("Plain, ASCII: 100% [ok]\ttabs\nand\r\nbreaks")
    assert plain_ascii("")
    for code in [*range(0, 9), 11, 12, *range(14, 32), 127]:
        assert not plain_ascii(f"a{chr(code)}b"), code
    assert not plain_ascii("café")
    assert not plain_ascii("non\u00a0breaking")


def test_a_light_normalizer_that_would_encode_otherwise_is_not_used(monkeypatch: pytest.MonkeyPatch) -> None:
    """The light normalizer is checked against the tokenizer's own on probes before it serves: a cased WordPiece
    tokenizer given lowercasing (what a wrong derivation would give it) keeps its own normalizer for every text."""
    library = make_tokenizer("bert")
    config = json.loads(library.backend_tokenizer.to_str())
    config["normalizer"]["lowercase"] = False
    cased = json.dumps(config)
    assert TextTokenizer(cased, pad_token_id=0).normalizes_plain_ascii_lightly  # none at all: it agrees
    monkeypatch.setattr(tokenization, "_plain_ascii_normalizer", lambda tokenizer_json: normalizers.Lowercase)
    tokenizer = TextTokenizer(cased, pad_token_id=0)
    assert not tokenizer.normalizes_plain_ascii_lightly
    own = Tokenizer.from_str(cased)
    assert tokenizer.encode("Hello World")[0].ids == own.encode("Hello World").ids
    assert (
        tokenizer.encode("Hello World")[0].ids
        != Tokenizer.from_str(json.dumps({**config, "normalizer": {"type": "Lowercase"}})).encode("Hello World").ids
    )


@pytest.mark.parametrize("added", [["Café", "Zoë"], ["[NEW]", "plainword"]])
def test_added_tokens_are_found_as_the_library_finds_them(added: list[str]) -> None:
    """The library finds a normalized added token's content in the normalized text: an added "Café" in plain "cafe"
    (BertNormalizer strips the accent, plain lowercasing would not). Where an added token's content normalizes
    otherwise by lowercasing alone, plain text keeps the tokenizer's own normalizer (not the light one); the plain
    path, which looks for both forms of an added token's content, sends text holding either to the library and
    makes the rest itself; ASCII added tokens leave both on. Every text the library's, lone, batched, by ids, in
    windows and pairs."""
    library = make_tokenizer("bert")
    library.add_tokens(added)
    tokenizer_json = library.backend_tokenizer.to_str()
    tokenizer = TextTokenizer(tokenizer_json, pad_token_id=0)
    assert tokenizer.normalizes_plain_ascii_lightly == all(map(str.isascii, added))
    assert tokenizer.makes_plain_ids and tokenizer.makes_plain_windows and tokenizer.makes_plain_pair_windows
    own = Tokenizer.from_str(tokenizer_json)
    own.no_padding()
    texts = ["cafe", "CAFE au lait", "Café", "naïve café", "zoe", "Zoë's", "plain words", "a plainword b [new]"]
    expected = [(encoding.ids, encoding.type_ids) for encoding in own.encode_batch(texts)]
    assert [(e.ids, e.type_ids) for e in (tokenizer.encode(text)[0] for text in texts)] == expected
    assert [(e.ids, e.type_ids) for e in tokenizer.encode_batch(texts)] == expected
    by_ids = tokenizer.encode_ids_batch(texts)
    assert [(e.ids, e.type_ids) for e in by_ids] == expected
    # text holding an added token's content in either form from the library ("cafe" holds "Café" to BERT, which
    # strips accents), the rest made without it
    made_plain = [True] * 7 + [False] if all(map(str.isascii, added)) else [False] * 6 + [True, True]
    assert [isinstance(encoding, TokenIds) for encoding in by_ids] == made_plain
    own.enable_truncation(6, stride=2, strategy="longest_first", direction="right")
    for text in texts:
        encoding = own.encode(text)
        windows = [window.ids for window in [encoding, *encoding.overflowing]]
        assert [window.ids for window in tokenizer.encode_windows(text, 6, 2)] == windows, text
    own.enable_truncation(16, stride=2, strategy="only_second", direction="right")
    for text in texts:
        encoding = own.encode("Zoe?", text)
        windows = [window.ids for window in [encoding, *encoding.overflowing]]
        assert [window.ids for window in tokenizer.encode_pair_windows("Zoe?", text, 16, 2)] == windows, text
