"""Ids and windows of plain text (ASCII, and beyond it the characters a BERT normalizer keeps character for
character) made without the tokenizers library (a BERT pipeline's only) are the library's, for every family, text,
pair and template; what might differ goes to the library."""

from __future__ import annotations

import functools
import json
import threading
from collections.abc import Callable

import pytest
from tokenizers import Encoding, Tokenizer

from benchmarks.realdata import conll03, shared_available, squad, sst2
from bertcore import plain_wordpiece
from bertcore.plain_wordpiece import PlainEncoding, PlainPairEncoding, PlainWordPiece, TokenIds
from bertcore.rows import Encoded, Row
from bertcore.tokenization import TextTokenizer, plain_ascii
from tests.tiny_models import FAMILIES, make_tokenizer

ALL_FAMILIES = ("bert", "distilbert", "roberta", "albert", *FAMILIES)
WORDPIECE = ("bert", "distilbert", "electra", "ernie", "mobilebert")
PLAIN = [
    "A Gorgeous MOVIE, isn't it?",
    "Tabs\tand\nnew lines\r\nand   spaces",
    "",
    "   ",
    "!!!",
    "x" * 40,
    "unaffable" * 12,  # over WordPiece's 100 characters a word: one unknown token
    "e-mail a.b@c.org, https://x.y/z?q=1&r=2#s 1,000,000 $5.99 50% ~`^|\\/<>=+*_{}",
    *[f"Word{chr(code)}WORD and{chr(code)} {chr(code)}next" for code in range(32, 127) if not chr(code).isalnum()],
]
# Beyond ASCII, characters the normalizer turns into one character each: accents, curly quotes, dashes, no-break
# spaces, Greek (a final capital sigma), Cyrillic, symbols, a dotted capital I, German's sharp s
BEYOND = [
    "naïve café",
    "Zoë\u2019s «résumé» \u2014 “\u039f\u0394\u039f\u03a3” Кириллица ½ €5 °C",
    "İstanbul\u00a0straße Ærøskøbing: Ünïcödéwördsthätgöönandönandön, 3\u00d74 \u2264 12\u2026",
]
LONG_BEYOND = " ".join(BEYOND) * 4
# An added token's content (any case), a part of one, text the library must normalize: CJK, a control character,
# a combining accent, format characters (soft hyphen, zero-width space), a ligature beyond the characters looked at
OTHER = [
    "a [SEP] b",
    "[sep] in lower case",
    "[CLS",
    "<s> and </s>",
    "東京 to Paris",
    "bell\x07",
    "cafe\u0301",
    "soft\u00adhyphen and zero\u200bwidth",
    "a \ufb01ne ligature",
    "naïve [SEP] café",
]


def rows_of(encoding: Encoded) -> tuple[str, list[int], str, list[int]]:
    """An encoding's model input row: each array's dtype and values."""
    row = Row.from_encoding(encoding)
    ids, types = row.input_ids, row.token_type_ids
    return (str(ids.dtype), ids.tolist(), str(types.dtype), types.tolist())


def library_ids(tokenizer_json: str, items: list) -> list[tuple[list[int], list[int]]]:
    library = library_of(tokenizer_json)
    library.no_truncation()
    # encode_batch, as transformers' fast tokenizers call it (encode_batch_fast gives a pair's second part segment 0
    # where a tokenizer has no post-processor: TextTokenizer keeps offsets there)
    return [(encoding.ids, encoding.type_ids) for encoding in library.encode_batch(items)]


def plain_text(tokenizer_json: str, text: str) -> bool:
    """Plain ASCII, or of `BEYOND`, without an added token's content in any case: what skips the library."""
    added = [token["content"].lower() for token in json.loads(tokenizer_json)["added_tokens"]]
    return (plain_ascii(text) or text in (*BEYOND, LONG_BEYOND)) and not any(
        content in text.lower() for content in added
    )


def pairs_of(texts: list[str]) -> list[tuple[str, str]]:
    return list(zip(texts, reversed(texts), strict=True))


def in_threads(work: Callable[[int], None], count: int = 4) -> list[BaseException]:
    """`work(0)`, ..., `work(count - 1)` at once, each on a thread of its own; what they raised (a thread's exception
    alone would not fail a test)."""
    raised: list[BaseException] = []

    def run(offset: int) -> None:
        try:
            work(offset)
        except BaseException as exc:
            raised.append(exc)

    threads = [threading.Thread(target=run, args=(offset,)) for offset in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return raised


@pytest.mark.parametrize("arch", ALL_FAMILIES)
def test_ids_are_the_librarys_for_every_family_and_only_plain_text_skips_it(arch: str) -> None:
    tokenizer_json = make_tokenizer(arch).backend_tokenizer.to_str()
    tokenizer = TextTokenizer(tokenizer_json, pad_token_id=0)
    texts = [*PLAIN, *BEYOND, *OTHER]
    items: list = [*texts, *pairs_of(texts), (PLAIN[0], OTHER[0]), (OTHER[4], PLAIN[0])]
    got = tokenizer.encode_ids_batch(items)
    assert [(encoding.ids, encoding.type_ids) for encoding in got] == library_ids(tokenizer_json, items)
    assert tokenizer.makes_plain_ids == (arch in WORDPIECE)
    for item, encoding in zip(items, got, strict=True):
        parts = [item] if isinstance(item, str) else list(item)
        if tokenizer.makes_plain_ids and all(plain_text(tokenizer_json, part) for part in parts):
            assert isinstance(encoding, TokenIds), item
        else:
            assert isinstance(encoding, Encoding), item


WINDOWINGS = [(512, 128), (12, 3), (9, 6), (8, 0)]


def described(encoding: Encoding | PlainEncoding) -> tuple:
    return (encoding.ids, encoding.type_ids, encoding.tokens, encoding.offsets, encoding.special_tokens_mask)


@functools.lru_cache(maxsize=4)
def library_of(tokenizer_json: str) -> Tokenizer:
    library = Tokenizer.from_str(tokenizer_json)
    library.no_padding()
    return library


def library_windows(tokenizer_json: str, text: str, max_length: int, stride: int) -> list[tuple]:
    library = library_of(tokenizer_json)
    library.enable_truncation(max_length, stride=stride, strategy="longest_first", direction="right")
    encoding = library.encode(text)
    return [described(window) for window in [encoding, *encoding.overflowing]]


@pytest.mark.parametrize("arch", ALL_FAMILIES)
def test_windows_are_the_librarys_offsets_and_all_for_every_family(arch: str) -> None:
    """NER's windows of a text: the very ids, segments, token strings, offsets and special-token marks the library
    makes, one window or many, overlapping or not, plain text made without it."""
    tokenizer_json = make_tokenizer(arch).backend_tokenizer.to_str()
    tokenizer = TextTokenizer(tokenizer_json, pad_token_id=0)
    assert tokenizer.makes_plain_windows == (arch in WORDPIECE)
    long_text = " ".join(PLAIN[:9]) * 3
    for text in [*PLAIN, *BEYOND, *OTHER, long_text, LONG_BEYOND]:
        for max_length, stride in WINDOWINGS:
            got = tokenizer.encode_windows(text, max_length, stride)
            assert [described(window) for window in got] == library_windows(tokenizer_json, text, max_length, stride)
            plain = tokenizer.makes_plain_windows and plain_text(tokenizer_json, text)
            assert all(isinstance(window, PlainEncoding if plain else Encoding) for window in got), text
    assert len(tokenizer.encode_windows(long_text, 12, 3)) > 10


PAIR_WINDOWINGS = [None, (384, 128), (24, 4), (16, 6)]


# Everything QA reads of a window: each token's word and that word's characters in its text included
pair_described = plain_wordpiece._pair_described


def library_pair_windows(tokenizer_json: str, first: str, second: str, windowing: tuple[int, int] | None) -> list:
    library = library_of(tokenizer_json)
    if windowing is None:
        library.no_truncation()
    else:
        library.enable_truncation(windowing[0], stride=windowing[1], strategy="only_second", direction="right")
    encoding = library.encode(first, second)
    return [pair_described(window) for window in [encoding, *encoding.overflowing]]


@pytest.mark.parametrize("arch", ALL_FAMILIES)
def test_pair_windows_are_the_librarys_words_and_all_for_every_family(arch: str) -> None:
    """QA's windows of a question and its context: ids, segments, offsets, marks, sequence ids, each token's word
    and that word's characters (a word cut by a window's edge: its pieces inside), as the library makes them."""
    tokenizer_json = make_tokenizer(arch).backend_tokenizer.to_str()
    tokenizer = TextTokenizer(tokenizer_json, pad_token_id=0)
    assert tokenizer.makes_plain_pair_windows == (arch in WORDPIECE)
    long_context = " ".join(PLAIN[:9]) * 3
    questions = ["Who won?", "What is it, Mr. X?", BEYOND[1], OTHER[0], OTHER[4]]
    checked = 0
    for question in questions:
        for context in [*PLAIN[:9], *BEYOND, *OTHER, long_context, LONG_BEYOND]:
            if not context.strip() or not question.strip():
                continue
            for windowing in PAIR_WINDOWINGS:
                try:
                    expected = library_pair_windows(tokenizer_json, question, context, windowing)
                except BaseException:  # the library's own refusal (no room for the context): QA checks it first
                    continue
                got = tokenizer.encode_pair_windows(question, context, *(windowing or (None, 0)))
                assert [pair_described(window) for window in got] == expected, (question, context, windowing)
                # each window's model input row: ids and type ids (made as an array from the parts' lengths)
                assert [rows_of(window) for window in got] == [
                    ("int64", described[0], "int64", described[1]) for described in expected
                ]
                plain = tokenizer.makes_plain_pair_windows and all(
                    plain_text(tokenizer_json, text) for text in (question, context)
                )
                assert all(isinstance(window, PlainPairEncoding if plain else Encoding) for window in got)
                checked += len(got)
    assert checked > 100


@pytest.mark.parametrize(("lowercase", "strip_accents"), [(True, None), (False, None), (True, False), (False, True)])
@pytest.mark.parametrize(
    "post_processor",
    [
        "bert",
        None,  # no special tokens at all
        {  # a template of its own: two tokens before, segment 1 for a lone text, the pair's second part in segment 0
            "type": "TemplateProcessing",
            "single": [
                {"SpecialToken": {"id": "[CLS]", "type_id": 1}},
                {"SpecialToken": {"id": "[MASK]", "type_id": 1}},
                {"Sequence": {"id": "A", "type_id": 1}},
                {"SpecialToken": {"id": "[SEP]", "type_id": 0}},
            ],
            "pair": [
                {"Sequence": {"id": "A", "type_id": 1}},
                {"SpecialToken": {"id": "[SEP]", "type_id": 1}},
                {"Sequence": {"id": "B", "type_id": 0}},
            ],
            "special_tokens": {
                name: {"id": name, "ids": [index], "tokens": [name]}
                for name, index in (("[CLS]", 2), ("[SEP]", 3), ("[MASK]", 4))
            },
        },
    ],
)
def test_case_accents_and_any_template_come_out_as_the_library_makes_them(
    lowercase: bool, strip_accents: bool | None, post_processor: object
) -> None:
    """Cased and uncased, accents stripped or kept (with the case, as BertNormalizer's default, or against it)."""
    config = json.loads(make_tokenizer("bert").backend_tokenizer.to_str())
    config["normalizer"]["lowercase"] = lowercase
    config["normalizer"]["strip_accents"] = strip_accents
    if post_processor != "bert":
        config["post_processor"] = post_processor
    tokenizer_json = json.dumps(config)
    tokenizer = TextTokenizer(tokenizer_json, pad_token_id=0)
    assert tokenizer.makes_plain_ids
    texts = [*PLAIN, *BEYOND]
    items: list = [*texts, *pairs_of(texts)]
    got = tokenizer.encode_ids_batch(items)
    # every one made without the library, but for a dotted capital I lowercased with its accent kept (two characters)
    assert all(
        isinstance(encoding, TokenIds) for item, encoding in zip(items, got, strict=True) if "İ" not in str(item)
    )
    assert [(encoding.ids, encoding.type_ids) for encoding in got] == library_ids(tokenizer_json, items)
    # the model input rows (their type ids made as arrays from the template's runs) are the library encodings' rows
    assert [rows_of(encoding) for encoding in got] == [
        rows_of(encoding) for encoding in library_of(tokenizer_json).encode_batch(items)
    ]
    # The library's overflowing windows keep the text's own segment, not the template's (1 here): this tokenizer's
    # windows fail their probes and are left to it
    assert tokenizer.makes_plain_windows == (post_processor in ("bert", None))
    for text in texts:
        windows = tokenizer.encode_windows(text, 12, 3)
        assert [described(window) for window in windows] == library_windows(tokenizer_json, text, 12, 3)
        assert [rows_of(window) for window in windows] == [
            rows_of(window) for window in tokenizer.encode(text, max_length=12, stride=3)
        ]


def test_a_tokenizer_that_is_not_a_bert_pipeline_is_left_to_the_library() -> None:
    described = json.loads(make_tokenizer("bert").backend_tokenizer.to_str())
    library = Tokenizer.from_str(json.dumps(described))
    assert PlainWordPiece.of(json.dumps(described), library, lowercase=True) is not None
    described["pre_tokenizer"] = {"type": "Whitespace"}  # splits alike on most text, but is another pipeline
    assert PlainWordPiece.of(json.dumps(described), Tokenizer.from_str(json.dumps(described)), lowercase=True) is None
    # a wrong case derived for it fails its probes
    assert PlainWordPiece.of(library.to_str(), library, lowercase=False) is None


def test_words_remembered_are_bounded_and_change_no_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(plain_wordpiece, "MAX_WORDS", 5)
    tokenizer_json = make_tokenizer("bert").backend_tokenizer.to_str()
    tokenizer = TextTokenizer(tokenizer_json, pad_token_id=0)
    items = PLAIN * 2
    assert [(e.ids, e.type_ids) for e in tokenizer.encode_ids_batch(items)] == library_ids(tokenizer_json, items)
    assert tokenizer.plain_words_remembered == 5


def test_contexts_remembered_are_bounded_shared_and_change_no_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    """QA's contexts are split once and the split kept for the next question about them (the latest few, short
    ones only): each question's windows over a remembered context, at any window size, are still the library's."""
    monkeypatch.setattr(plain_wordpiece, "CONTEXTS_REMEMBERED", 3)
    monkeypatch.setattr(plain_wordpiece, "MAX_REMEMBERED_CONTEXT_CHARS", 200)
    tokenizer_json = make_tokenizer("bert").backend_tokenizer.to_str()
    tokenizer = TextTokenizer(tokenizer_json, pad_token_id=0)
    long_context = " ".join(PLAIN[:9]) * 3
    contexts = [PLAIN[0], PLAIN[7], BEYOND[0], long_context, BEYOND[1], OTHER[4]]  # the last: the library's alone
    checked = 0
    for _ in range(2):
        for context in contexts:
            for question in ("Who won?", "What is it, Mr. X?"):
                for windowing in ((384, 128), (16, 6)):
                    try:
                        expected = library_pair_windows(tokenizer_json, question, context, windowing)
                    except BaseException:  # the library's own refusal (no room for the context)
                        continue
                    got = tokenizer.encode_pair_windows(question, context, *windowing)
                    assert [pair_described(window) for window in got] == expected, (question, context, windowing)
                    checked += 1
    assert checked >= 30
    assert len(long_context) > 200
    assert tokenizer.plain_contexts_remembered == [PLAIN[7], BEYOND[0], BEYOND[1]]


def test_threads_asking_about_the_same_contexts_get_the_librarys_windows(monkeypatch: pytest.MonkeyPatch) -> None:
    """A front-end's loop and its tokenizer thread share the remembered contexts: threads asking about the same
    few contexts, more of them than are remembered (each insert drops one), get the library's windows every time."""
    monkeypatch.setattr(plain_wordpiece, "CONTEXTS_REMEMBERED", 4)
    tokenizer_json = make_tokenizer("bert").backend_tokenizer.to_str()
    tokenizer = TextTokenizer(tokenizer_json, pad_token_id=0)
    contexts = [f"Paragraph {n}: {PLAIN[n % 9]} and then more words about item {n}, twice." for n in range(10)]
    pairs = [(question, context) for context in contexts for question in ("Who won?", "What is it, Mr. X?")]
    expected = [library_pair_windows(tokenizer_json, question, context, (32, 8)) for question, context in pairs]
    failures: list[int] = []

    def ask(offset: int) -> None:
        for step in range(300):
            index = (offset + step * 3) % len(pairs)
            got = tokenizer.encode_pair_windows(*pairs[index], 32, 8)
            if [pair_described(window) for window in got] != expected[index]:
                failures.append(index)

    assert in_threads(ask) == []
    assert failures == []
    assert len(tokenizer.plain_contexts_remembered) == 4


def test_a_query_shared_by_many_pairs_is_each_pairs_own() -> None:
    """Rerank's pairs share their query (one object): its ids are made once and kept for the next pair; another
    object, equal or not, another query, a pair the library must encode, lone texts between: every one the
    library's."""
    tokenizer_json = make_tokenizer("bert").backend_tokenizer.to_str()
    tokenizer = TextTokenizer(tokenizer_json, pad_token_id=0)
    query, other = "Which film is worth seeing?", "Is it naïve?"
    same_text = "".join(["Which film is worth ", "seeing?"])  # equal, another object
    items: list = [
        *[(query, document) for document in [*PLAIN[:6], OTHER[0], *BEYOND]],
        PLAIN[0],
        (other, PLAIN[1]),
        (query, PLAIN[2]),
        (same_text, PLAIN[3]),
        (OTHER[0], PLAIN[4]),
        (query, PLAIN[5]),
    ]
    got = tokenizer.encode_ids_batch(items)
    assert [(encoding.ids, encoding.type_ids) for encoding in got] == library_ids(tokenizer_json, items)
    assert sum(isinstance(encoding, TokenIds) for encoding in got) >= len(items) - 3


def test_threads_encoding_at_once_get_their_own_ids() -> None:
    tokenizer_json = make_tokenizer("bert").backend_tokenizer.to_str()
    tokenizer = TextTokenizer(tokenizer_json, pad_token_id=0)
    words = ["alpha", "beta", "gamma"] * 40
    texts: list = [f"{word} number {n}, said {word.upper()}" for n, word in enumerate(words)]
    texts += [(words[n % 3], text) for n, text in enumerate(texts)]  # pairs of three queries: each thread's own
    expected = library_ids(tokenizer_json, texts)
    failures: list[int] = []

    def encode(offset: int) -> None:
        for start in range(offset, len(texts), 7):
            encoding = tokenizer.encode_ids_batch(texts[start : start + 5])
            if [(e.ids, e.type_ids) for e in encoding] != expected[start : start + 5]:
                failures.append(start)

    assert in_threads(encode) == []
    assert failures == []


@pytest.mark.skipif(not shared_available(), reason="../shared (real checkpoints and data) is absent")
def test_the_shared_checkpoints_ids_on_real_text_are_the_librarys() -> None:
    from benchmarks.realdata import SHARED

    sentences = [sentence for sentence, _ in sst2()]
    questions = [(question, context) for question, context, _ in squad(600)]
    items: list = [*sentences, *questions, *[question for question, _ in questions]]
    for name in ("minilm-bert-sst2", "minilm-distilbert-sst2", "minilm-embed"):
        tokenizer_json = (SHARED / "models" / name / "tokenizer.json").read_text(encoding="utf-8")
        tokenizer = TextTokenizer(tokenizer_json, pad_token_id=0)
        got = tokenizer.encode_ids_batch(items)
        assert sum(isinstance(encoding, TokenIds) for encoding in got) > 0.9 * len(items), name
        assert [(e.ids, e.type_ids) for e in got] == library_ids(tokenizer_json, items), name


@pytest.mark.skipif(not shared_available(), reason="../shared (real checkpoints and data) is absent")
def test_the_ner_checkpoints_windows_of_real_text_are_the_librarys() -> None:
    from benchmarks.realdata import SHARED

    texts = [" ".join(words) for words, _ in conll03()]
    tokenizer_json = (SHARED / "models" / "minilm-bert-conll03" / "tokenizer.json").read_text(encoding="utf-8")
    tokenizer = TextTokenizer(tokenizer_json, pad_token_id=0)
    made = 0
    for max_length, stride in ((512, 128), (24, 8)):
        for text in texts:
            windows = tokenizer.encode_windows(text, max_length, stride)
            made += isinstance(windows[0], PlainEncoding)
            assert [described(window) for window in windows] == library_windows(
                tokenizer_json, text, max_length, stride
            ), text
    assert made > 0.9 * 2 * len(texts)


@pytest.mark.skipif(not shared_available(), reason="../shared (real checkpoints and data) is absent")
def test_the_qa_checkpoints_pair_windows_of_real_text_are_the_librarys() -> None:
    from benchmarks.realdata import SHARED

    pairs = [(question, context) for question, context, _ in squad(300)]
    tokenizer_json = (SHARED / "models" / "minilm-bert-squad" / "tokenizer.json").read_text(encoding="utf-8")
    tokenizer = TextTokenizer(tokenizer_json, pad_token_id=0)
    made = 0
    for windowing in ((384, 128), (64, 16)):
        for question, context in pairs:
            windows = tokenizer.encode_pair_windows(question, context, *windowing)
            made += isinstance(windows[0], PlainPairEncoding)
            expected = library_pair_windows(tokenizer_json, question, context, windowing)
            assert [pair_described(window) for window in windows] == expected, question
    assert made > 0.9 * 2 * len(pairs)  # the rest hold CJK, combining marks, a byte-order mark
