"""A model's tokenizer (tokenizer.json), safe to use from several threads at once.

`tokenizers.Tokenizer` keeps truncation settings on the object, and the tasks need different settings per
request (QA's max_seq_len and doc_stride, NER's window stride). Each thread gets its own copy, so setting
truncation for one call never races with another thread's encode.

Plain ASCII text (`plain_ascii`) of a WordPiece model is encoded with the tokenizer's normalizer swapped for the
lowercasing it comes to on such text: BertNormalizer's unicode work changes nothing there, and was ~28% of encoding
it. The swap is checked on probes when the tokenizer loads; the encodings are the same (ids, offsets, words).
Where a task needs only ids (`encode_ids_batch`), a lone text's windows (`encode_windows`) or a question and context's
(`encode_pair_windows`), such text of a BERT tokenizer skips the library altogether (`bertcore.plain_wordpiece`), and
so does text beyond ASCII whose every character the normalizer turns into one (accents, curly quotes, Greek, ...).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Sequence
from functools import cached_property
from pathlib import Path
from typing import Any, Literal

from tokenizers import Encoding, Tokenizer, normalizers

from bertcore.plain_wordpiece import PlainEncoding, PlainPairEncoding, PlainWordPiece, TokenIds, plain_ascii

TruncationStrategy = Literal["longest_first", "only_first", "only_second"]
# A text (or pair) this short is encoded holding the GIL (`Tokenizer.encode`: tens of microseconds), not through
# `encode_batch`, which lets go of the GIL for longer work but costs more for one short text.
SHORT_CHARS = 1000
# What the tokenizer must encode alike with either normalizer, checked once per tokenizer before the plain one
# serves: upper and lower case, digits, punctuation, contractions, whitespace of every kind BertNormalizer maps to a
# space, special tokens' text, a URL
_PLAIN_PROBES = (
    ("Hello, World! It's 3.14 o'clock -- [CLS] [SEP] [MASK] <s> </s> [UNK]", None),
    ("Tabs\tand\nnew lines\r\nand   spaces; e-mail: a.b@c.org, https://x.y/z?q=1&r=2#s", "A PAIR: (with) {braces}"),
    ("MiXeD CaSe WoRdS and CamelCaseIdentifiers_with_underscores 1,000,000 $5.99 50% #hash", "~`^|\\/<>=+*"),
)
# Makes the normalizer that plain ASCII text is encoded with (None: no normalizer at all)
PlainNormalizer = Callable[[], Any]


def _plain(text: str, pair: str | None) -> bool:
    return plain_ascii(text) and (pair is None or plain_ascii(pair))


def _described(encoding: Encoding) -> tuple:
    return encoding.ids, encoding.type_ids, encoding.offsets, encoding.word_ids, encoding.sequence_ids


def _no_normalizer() -> None:
    return None


def _plain_ascii_normalizer(tokenizer_json: str) -> PlainNormalizer | None:
    """What plain-ASCII text (`plain_ascii`) may be normalized with instead, where the tokenizer's normalizer is
    BertNormalizer: the lowercasing it comes to on such text (nothing where it keeps case). Its unicode work
    (cleaning, accents stripped through NFD, spaces around CJK characters, each with the character alignments that
    offsets need) changes nothing there. None for every other normalizer."""
    normalizer = json.loads(tokenizer_json).get("normalizer")
    if not isinstance(normalizer, dict) or normalizer.get("type") != "BertNormalizer":
        return None
    return normalizers.Lowercase if normalizer.get("lowercase", True) else _no_normalizer


class TextTokenizer:
    def __init__(self, tokenizer_json: str, pad_token_id: int, padding_side: str = "right") -> None:
        """From the text of a tokenizer.json (the file, or a fast tokenizer's `backend_tokenizer.to_str()`).
        `padding_side`: the model's (model.json); "left" (XLNet) also puts a QA context before its question."""
        self._json = tokenizer_json
        loaded = Tokenizer.from_str(self._json)  # fail at load time, not on the first request
        # `encode_batch_fast` (no offsets) gives a pair's second text segment 0 where there is no post-processor
        # (`encode_batch`, as transformers calls it, gives 1): such a tokenizer's batches keep their offsets
        self._fast_batches = loaded.post_processor is not None
        self.padding_side = padding_side
        self.max_token_id = max(loaded.get_vocab(with_added_tokens=True).values(), default=-1)
        self.pad_token_id = pad_token_id
        self._local = threading.local()
        # Plain-ASCII text is encoded with a normalizer that only lowercases, where that gives the same encodings
        # (checked here on probes that cover what the full normalizer would change)
        plain_normalizer = _plain_ascii_normalizer(tokenizer_json)
        self._plain_normalizer: PlainNormalizer | None = None
        self._plain_ids = None
        if plain_normalizer is not None and self._plain_agrees(loaded, plain_normalizer):
            # not where an added token's content normalizes otherwise by lowercasing alone (`_added_alike`)
            if self._added_alike(loaded, plain_normalizer):
                self._plain_normalizer = plain_normalizer
            # ... and where a task reads less than a whole encoding, a BERT pipeline's are made without the
            # library (checked against the loaded tokenizer, its own normalizer back in place after the check
            # above; it looks for both forms of every added token's content itself)
            self._plain_ids = PlainWordPiece.of(self._json, loaded, plain_normalizer is normalizers.Lowercase)

    @classmethod
    def load(cls, path: Path, pad_token_id: int, padding_side: str = "right") -> TextTokenizer:
        return cls(path.read_text(encoding="utf-8"), pad_token_id, padding_side)

    @property
    def normalizes_plain_ascii_lightly(self) -> bool:
        """Whether plain-ASCII text skips the tokenizer's own normalizer for plain lowercasing (or none)."""
        return self._plain_normalizer is not None

    @property
    def makes_plain_ids(self) -> bool:
        """Whether `encode_ids_batch` makes plain text's ids itself (`PlainWordPiece`)."""
        return self._plain_ids is not None

    @property
    def makes_plain_windows(self) -> bool:
        """Whether `encode_windows` makes plain text's windows itself (`PlainWordPiece.windows`)."""
        return self._plain_ids is not None and self._plain_ids.makes_windows

    @property
    def makes_plain_pair_windows(self) -> bool:
        """Whether `encode_pair_windows` makes plain pairs' windows itself."""
        return self._plain_ids is not None and self._plain_ids.makes_pair_windows

    @property
    def plain_words_remembered(self) -> int:
        return 0 if self._plain_ids is None else self._plain_ids.words_remembered

    @property
    def plain_contexts_remembered(self) -> list[str]:
        return [] if self._plain_ids is None else self._plain_ids.contexts_remembered

    @staticmethod
    def _plain_agrees(tokenizer: Tokenizer, plain_normalizer: PlainNormalizer) -> bool:
        tokenizer.no_padding()
        tokenizer.no_truncation()
        full = [_described(tokenizer.encode(text, pair)) for text, pair in _PLAIN_PROBES]
        own = tokenizer.normalizer
        light_normalizer = plain_normalizer()
        tokenizer.normalizer = light_normalizer
        light = [_described(tokenizer.encode(text, pair)) for text, pair in _PLAIN_PROBES]
        tokenizer.normalizer = own
        return full == light

    @staticmethod
    def _added_alike(tokenizer: Tokenizer, plain_normalizer: PlainNormalizer) -> bool:
        """Whether every added token's content normalizes alike by the tokenizer's normalizer and by the light one.
        The library finds a normalized added token's content in the normalized text, the content normalized by the
        tokenizer's normalizer: an added "Café" is found in plain "cafe" by BertNormalizer (accents stripped), not
        by lowercasing alone."""
        light_normalizer = plain_normalizer()
        own = tokenizer.normalizer
        contents = [token.content for token in tokenizer.get_added_tokens_decoder().values()]
        light_forms = [
            content if light_normalizer is None else light_normalizer.normalize_str(content) for content in contents
        ]
        return [own.normalize_str(content) for content in contents] == light_forms

    def _tokenizer(self) -> Tokenizer:
        """This thread's copy of the tokenizer (its normalizer and truncation as its last call asked)."""
        local = self._local
        tokenizer = getattr(local, "tokenizer", None)
        if tokenizer is None:
            tokenizer = Tokenizer.from_str(self._json)
            tokenizer.no_padding()
            tokenizer.no_truncation()
            local.tokenizer = tokenizer
            local.truncation = None
            local.own_normalizer = tokenizer.normalizer
            local.plain_normalizer = None if self._plain_normalizer is None else self._plain_normalizer()
            local.plain = False
        return tokenizer

    def _light(self, text: str, pair: str | None = None) -> bool:
        """Whether this text (or pair) is normalized lightly: plain ASCII, and a tokenizer that may (the check is
        not made for one that may not)."""
        return self._plain_normalizer is not None and _plain(text, pair)

    def _truncating(self, truncation: tuple[int, int, TruncationStrategy] | None, plain: bool = False) -> Tokenizer:
        """This thread's tokenizer, normalizing as `plain` says (lightly: `_light` text) and
        truncating as asked (max_length, stride, strategy) or not at all (None); each set only where the thread's
        last call asked otherwise (most calls of a model ask the same; a swap of normalizer costs a few µs)."""
        tokenizer = self._tokenizer()
        local = self._local
        if local.plain != plain:
            tokenizer.normalizer = local.plain_normalizer if plain else local.own_normalizer
            local.plain = plain
        if local.truncation != truncation:
            if truncation is None:
                tokenizer.no_truncation()
            else:
                max_length, stride, strategy = truncation
                tokenizer.enable_truncation(max_length, stride=stride, strategy=strategy, direction="right")
            local.truncation = truncation
        return tokenizer

    def encode(
        self,
        text: str,
        pair: str | None = None,
        *,
        max_length: int | None = None,
        stride: int = 0,
        strategy: TruncationStrategy = "longest_first",
        add_special_tokens: bool = True,
    ) -> list[Encoding]:
        """Encode one text (or pair). With max_length, every window: the first, then its overflows in order.

        Windows are made the way transformers' fast tokenizers make them with `return_overflowing_tokens=True`
        (the tokenizers library's truncation with `stride` tokens of overlap).
        """
        tokenizer = self._truncating(
            None if max_length is None else (max_length, stride, strategy), self._light(text, pair)
        )
        encoding = tokenizer.encode(text, pair, add_special_tokens=add_special_tokens)
        return [encoding, *encoding.overflowing] if max_length is not None else [encoding]

    def encode_batch(self, items: Sequence[str | tuple[str, str]], offsets: bool = True) -> list[Encoding]:
        """Encode many texts (or pairs) at once, untruncated: one call into the tokenizers library, which lets
        go of the GIL while it works (`encode` holds it). `offsets=False`: the encodings' offsets may be left out
        (all (0, 0)), for tasks that never map a token back to the text (classification, rerank, embeddings): the
        same ids and type ids in ~17% less time (41.7 -> 34.5 µs an SST-2 sentence, one thread). A lone short text
        is still encoded holding the GIL, with its offsets: letting go of the GIL for tens of microseconds on the
        event loop would let another thread take it for up to a switch interval."""
        if len(items) == 1:  # one short text: `encode`, without the batch's machinery, costs ~15% less
            text, pair = (items[0], None) if isinstance(items[0], str) else items[0]
            if len(text) + len(pair or "") <= SHORT_CHARS:
                return [self._truncating(None, self._light(text, pair)).encode(text, pair)]
        if self._plain_normalizer is None:
            return self._batch(list(items), False, offsets)
        kinds = [_plain(item, None) if isinstance(item, str) else _plain(*item) for item in items]
        if all(kinds) or not any(kinds):
            return self._batch(list(items), all(kinds), offsets)
        # Some plain, some not: each kind normalized its own way, back in the items' order
        encodings: list[Encoding | None] = [None] * len(items)
        for kind in (True, False):
            chosen = [i for i, plain in enumerate(kinds) if plain is kind]
            for i, encoding in zip(chosen, self._batch([items[i] for i in chosen], kind, offsets), strict=True):
                encodings[i] = encoding
        return encodings  # type: ignore[return-value]

    def encode_windows(self, text: str, max_length: int, stride: int) -> Sequence[Encoding | PlainEncoding]:
        """A lone text's windows of at most `max_length` tokens overlapping by `stride`, as `encode` makes them, with
        what a task reads to map tokens back to the text (ids, type ids, tokens, offsets, special-token marks):
        plain text of a BERT tokenizer through `PlainWordPiece` (~15-20 against ~37 µs a CoNLL-2003 sentence,
        the library's reads included), the rest through `encode`."""
        if self._plain_ids is not None:
            windows = self._plain_ids.windows(text, max_length, stride)
            if windows is not None:
                return windows
        return self.encode(text, max_length=max_length, stride=stride)

    def encode_pair_windows(
        self, first: str, second: str, max_length: int | None, stride: int = 0
    ) -> Sequence[Encoding | PlainPairEncoding]:
        """A pair's windows truncating only the second text at `max_length` (None: untruncated) with `stride`
        tokens of overlap, as `encode(..., strategy="only_second")` makes them, with what QA reads of them (ids,
        segments, offsets, special-token marks, sequence ids, words): a plain pair of a BERT tokenizer through
        `PlainWordPiece`, the rest through `encode`."""
        if self._plain_ids is not None:
            windows = self._plain_ids.pair_windows(first, second, max_length, stride)
            if windows is not None:
                return windows
        return self.encode(first, second, max_length=max_length, stride=stride, strategy="only_second")

    def encode_ids_batch(self, items: Sequence[str | tuple[str, str]]) -> list[Encoding | TokenIds]:
        """The ids and type ids of many texts (or pairs), untruncated, for tasks that never map a token back to the
        text: plain items of a BERT tokenizer through `PlainWordPiece` (~7 against ~35-45 µs an SST-2
        sentence), the rest as `encode_batch(offsets=False)` encodes them."""
        plain_ids = self._plain_ids
        if plain_ids is None:
            return list(self.encode_batch(items, offsets=False))
        encodings: list[Encoding | TokenIds | None] = []
        rest: list[int] = []
        for index, item in enumerate(items):
            text, pair = (item, None) if isinstance(item, str) else item
            encoding = plain_ids.ids(text, pair)
            if encoding is None:
                rest.append(index)
            encodings.append(encoding)
        if rest:
            encoded = self.encode_batch([items[i] for i in rest], offsets=False)
            for index, library_encoding in zip(rest, encoded, strict=True):
                encodings[index] = library_encoding
        return encodings  # type: ignore[return-value]

    def _batch(self, items: list[str | tuple[str, str]], plain: bool, offsets: bool) -> list[Encoding]:
        tokenizer = self._truncating(None, plain)
        fast = not offsets and self._fast_batches
        return tokenizer.encode_batch_fast(items) if fast else tokenizer.encode_batch(items)

    def count_tokens(self, text: str, pair: str | None = None) -> int:
        """Length with special tokens and without truncation."""
        return len(self.encode(text, pair)[0].ids)

    def num_special_tokens(self, pair: bool) -> int:
        return self._special_tokens[pair]

    @cached_property
    def _special_tokens(self) -> dict[bool, int]:
        """Special tokens added to a text (False) and to a pair (True): asked for every text a task prepares."""
        tokenizer = self._tokenizer()
        return {pair: tokenizer.num_special_tokens_to_add(pair) for pair in (False, True)}

    def tokens_to_string(self, tokens: Sequence[str]) -> str:
        """Join token strings into text with the tokenizer's decoder (spaces without one).

        What transformers' `convert_tokens_to_string` does for fast tokenizers: it works on token strings, not
        ids, so a token may be replaced by any text first, and it neither skips special tokens nor cleans up spaces.
        """
        decoder = self._tokenizer().decoder
        return decoder.decode(list(tokens)) if decoder is not None else " ".join(tokens)

    @cached_property
    def continuing_subword_prefix(self) -> str | None:
        """The model's mark of a word-continuing piece ("##" for WordPiece), None where it has none."""
        return json.loads(self._json)["model"].get("continuing_subword_prefix") or None

    @cached_property
    def unk_token_id(self) -> int | None:
        """The id the model gives to unknown text, None where it never does (byte-level BPE without unk)."""
        model = json.loads(self._json)["model"]
        if model.get("type") == "Unigram":
            return model.get("unk_id")
        unk_token = model.get("unk_token")
        return self._tokenizer().token_to_id(unk_token) if unk_token else None
