"""Token ids of plain text for a WordPiece model, without the tokenizers library's per-text machinery.

For text `plain_ascii` accepts, a BERT tokenizer (BertNormalizer, BertPreTokenizer, WordPiece, a template of special
tokens) comes to: lowercase (where the model is uncased), split into runs of letters and digits and single
punctuation characters (every other printable ASCII character is punctuation to BERT), each run through WordPiece,
the template around. Beyond ASCII, the characters the normalizer turns into one character each (accented letters,
curly quotes, dashes, Greek, Cyrillic, ...: a tokenizer's `_Alphabet`, read off its normalizer when it loads) are
folded into what the normalizer makes of them first; every character keeps its position, so offsets are the
text's own. The library does that in ~30 µs for a 25-token sentence, most of it building the normalized
string's alignments, offsets and the encoding's Python object; a task that only needs the ids (classification,
rerank, embeddings) gets them here in a few µs: each word's pieces come from the tokenizer's own WordPiece model and
are remembered, and the template's tokens and segments are read off the tokenizer's encodings of probe texts.

NER's windows are made the same way, with each token's string and offsets (a word's span and its pieces' spans within
it) and the windows cut as the library's truncation cuts them; QA's windows of a question and its context too (only
the context cut), with sequence ids and each token's word.

What is not certain to come out alike falls back to the library: text holding an added token's content (`[SEP]`
typed into a review), control characters, a character beyond the tokenizer's alphabet (CJK, combining marks,
format characters), and every tokenizer that is not this pipeline. Before it serves, a tokenizer's probes must come
out equal both ways (ids and type ids; for windows also tokens, offsets and special-token marks, at several window
sizes and strides, or windows are left to the library).
"""

from __future__ import annotations

import json
import re
import threading
import unicodedata
from bisect import bisect_left, bisect_right
from collections.abc import Sequence
from typing import cast

import numpy as np
from tokenizers import Encoding, Tokenizer

from bertcore.rows import ArrayTypes

# BertPreTokenizer on ASCII without control characters: whitespace splits, punctuation (every printable ASCII
# character but letters and digits) stands alone
_WORDS = re.compile(r"[A-Za-z0-9]+|[^A-Za-z0-9\s]")
# Control characters besides tab, newline and carriage return: BertNormalizer (clean_text) drops them.
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
_BEYOND_ASCII = re.compile(r"[^\x00-\x7f]+")
# The characters beyond ASCII looked at when a tokenizer loads (`_Alphabet`): Latin with its accents, Greek,
# Cyrillic, the other alphabets, general punctuation (curly quotes, dashes, no-break spaces), currency and other
# symbols; below CJK's, whose characters BertNormalizer sets apart with spaces
_BEYOND_ASCII_LOOKED_AT = range(0x80, 0x3000)
# Words remembered per tokenizer and process (~400 bytes each with their tokens and offsets: at most ~7 MiB; SST-2,
# CoNLL-2003 and 3,000 SQuAD paragraphs hold ~16,000): past this, a word not seen yet is split each time it comes
MAX_WORDS = 16_384
# QA's contexts split into tokens, remembered per tokenizer and process, the latest first out: a request's questions
# about one paragraph (16 SQuAD questions hold ~4 paragraphs), and a client's next question about the same document,
# split it once. Only contexts up to this many characters (a paragraph's few hundred; at most ~6 MiB in all)
CONTEXTS_REMEMBERED = 32
MAX_REMEMBERED_CONTEXT_CHARS = 8_192
_PROBES = (
    ("Hello, World! It's 3.14 o'clock -- e-mail: a.b@c.org, https://x.y/z?q=1&r=2#s", None),
    ("Tabs\tand\nnew lines\r\nand   spaces; unaffable CamelCase_with_underscores", "A PAIR: (with) {braces}"),
    ("MiXeD CaSe 1,000,000 $5.99 50% #hash ~`^|\\/<>=+*", "supercalifragilisticexpialidocious" * 4),
    ("", None),
    ("", "only the second"),
    # beyond ASCII: accents stripped (or kept), curly quotes, dashes, a no-break space, Greek (a final capital
    # sigma), Cyrillic, a dotted capital I, symbols, and a word of several pieces with accents
    ("Café «Zoë» — naïve résumé, \u2018quoted\u2019 “double” ½ €5 °C\u00a0\u039fΔ\u039fΣ Кириллица", None),
    ("straße İstanbul fine… Ünïcödéwördsthätgöönandön", "x"),
    ("Ärger über Öl: Ünïcödé\u2010dash \u2013 Ωmega ™ ©", "Ça va? «Ñandú» Ελληνικά"),
)


def plain_ascii(text: str) -> bool:
    """ASCII without control characters (tab, newline and carriage return allowed): all that BertNormalizer does to
    such text is lowercase it (and map whitespace to spaces, which the pre-tokenizer splits on alike)."""
    return text.isascii() and (text.isprintable() or _CONTROL.search(text) is None)


class _Segmented(ArrayTypes):
    """An encoding whose segments are its template's around its parts: its type ids made from the parts' lengths
    when asked for, as an array for a model input row (`type_array`) or as the library's list (`type_ids`)."""

    __slots__ = ("_lengths", "_template")

    def __init__(self, template: _Template, lengths: tuple[int, ...]) -> None:
        self._template, self._lengths = template, lengths

    def type_array(self) -> np.ndarray:
        return self._template.type_array(self._lengths)

    @property
    def type_ids(self) -> list[int]:
        return cast("list[int]", self.type_array().tolist())


class TokenIds(_Segmented):
    """What a task that never maps a token back to the text needs of an encoding."""

    __slots__ = ("ids",)

    def __init__(self, ids: list[int], template: _Template, lengths: tuple[int, ...]) -> None:
        super().__init__(template, lengths)
        self.ids = ids


class PlainEncoding(_Segmented):
    """One window of a text as a task that maps tokens back to the text reads an encoding (NER)."""

    __slots__ = ("ids", "offsets", "special_tokens_mask", "tokens")

    def __init__(
        self,
        ids: list[int],
        template: _Template,
        tokens: list[str],
        offsets: list[tuple[int, int]],
        special_tokens_mask: list[int],
    ) -> None:
        super().__init__(template, (len(ids) - template.fixed,))
        self.ids, self.tokens = ids, tokens
        self.offsets, self.special_tokens_mask = offsets, special_tokens_mask


class PlainPairEncoding(_Segmented):
    """One window of a question and its context as QA reads an encoding: ids, segments, offsets (each into its own
    text), special-token marks, sequence ids, and each token's word (its index among its text's words)."""

    __slots__ = ("_runs", "ids", "offsets", "sequence_ids", "special_tokens_mask", "word_ids")

    def __init__(
        self,
        ids: list[int],
        template: _Template,
        offsets: list[tuple[int, int]],
        special_tokens_mask: list[int],
        sequence_ids: list[int | None],
        word_ids: list[int | None],
        runs: tuple[tuple[int, int], tuple[int, int]],
    ) -> None:
        super().__init__(template, (runs[0][1] - runs[0][0], runs[1][1] - runs[1][0]))
        self.ids, self.offsets = ids, offsets
        self.special_tokens_mask, self.sequence_ids, self.word_ids = special_tokens_mask, sequence_ids, word_ids
        self._runs = runs  # each text's tokens: [start, stop) in the window

    def __len__(self) -> int:
        return len(self.ids)

    def token_to_word(self, token: int) -> int | None:
        return self.word_ids[token]

    def word_to_chars(self, word: int, sequence_index: int = 0) -> tuple[int, int] | None:
        """The characters of the window's tokens of `word` in that text (a word cut by the window's edge: its
        pieces inside), as the library's encoding gives them."""
        low, high = self._runs[sequence_index]
        words = cast("list[int]", self.word_ids)  # ints throughout the run
        first = bisect_left(words, word, low, high)  # a text's tokens' words never decrease
        if first == high or words[first] != word:
            return None
        last = bisect_right(words, word, first, high) - 1
        return self.offsets[first][0], self.offsets[last][1]


# A word's pieces: ids, token strings, and each piece's offsets within the word (None: one piece, the whole word)
_Pieces = tuple[tuple[int, ...], tuple[str, ...], tuple[tuple[int, int], ...] | None]
# A text's tokens without the special ones: ids, offsets, and each token's word (its index among the text's words)
_Split = tuple[list[int], list[tuple[int, int]], list[int | None]]
# What `windows` is checked on when a tokenizer loads: (max_length, stride), None for no truncation
_WINDOWINGS = (None, (8, 0), (8, 2), (9, 5), (512, 128))
# QA's pairs: a question, a context in many windows (words of several pieces cut by windows' edges among them)
_PAIR_PROBES = (
    ("Who won?", "Japan got a lucky win; China, in a surprising defeat, lost 2-1 at https://x.y/z?q=1 unaffably."),
    ("What is CamelCase_with_underscores?", "Hello, World! It's 3.14 o'clock -- e-mail: a.b@c.org. " * 3),
    ("a", "supercalifragilisticexpialidocious " * 5),
)


class _Template:
    """The special tokens around one text (or a pair) and every token's segment, as the post-processor adds them."""

    def __init__(self, tokenizer: Tokenizer, first: str, second: str | None) -> None:
        encoding = tokenizer.encode(first, second)
        ids, types = encoding.ids, encoding.type_ids
        self.ids: list[list[int]] = []  # the special tokens before, between and after the parts
        # every token's segment in order, each special token's as (segment, None), each part's as (segment, index)
        marks: list[tuple[int, int | None]] = []
        cuts = []
        start = 0
        for index, text in enumerate((first,) if second is None else (first, second)):
            part = tokenizer.encode(text, add_special_tokens=False).ids
            at = _find(ids, part, start)
            if not part or len(set(types[at : at + len(part)])) != 1:
                raise ValueError("a probe's part is not of one segment")
            self.ids.append(ids[start:at])
            marks += [(value, None) for value in types[start:at]]
            marks.append((types[at], index))
            cuts.append((start, at))
            start = at + len(part)
        self.ids.append(ids[start:])
        marks += [(value, None) for value in types[start:]]
        cuts.append((start, len(ids)))
        # and their token strings, offsets and special-token marks, where a task maps tokens back to the text
        self.tokens = [encoding.tokens[a:b] for a, b in cuts]
        self.offsets = [encoding.offsets[a:b] for a, b in cuts]
        self.special = [encoding.special_tokens_mask[a:b] for a, b in cuts]
        self.fixed = sum(len(ids) for ids in self.ids)  # the special tokens' count
        # the segments as runs of one value, in order: each run's value, its special tokens' count, its parts
        values: list[int] = []
        runs: list[tuple[int, list[int]]] = []
        for value, held in marks:
            if not values or values[-1] != value:
                values.append(value)
                runs.append((0, []))
            specials, parts = runs[-1]
            if held is None:
                runs[-1] = (specials + 1, parts)
            else:
                parts.append(held)
        self._segment_runs = runs
        self._run_values = np.array(values, dtype=np.int64)
        self._one_segment = values[0] if len(values) == 1 else None

    def type_array(self, lengths: tuple[int, ...]) -> np.ndarray:
        """The type ids (int64) of an encoding whose parts are `lengths` tokens long: one segment's (a lone text,
        the common case) zeros or a fill, otherwise each run repeated."""
        if self._one_segment is not None:
            total = self.fixed + sum(lengths)
            if self._one_segment == 0:
                return np.zeros(total, dtype=np.int64)
            return np.full(total, self._one_segment, dtype=np.int64)
        counts = [specials + sum([lengths[part] for part in parts]) for specials, parts in self._segment_runs]
        return np.repeat(self._run_values, counts)


class _Alphabet:
    """The characters beyond ASCII that a tokenizer's normalizer turns into exactly one character each, what each
    becomes (an accented letter its base letter where accents are stripped, a no-break space a space, a curly quote
    itself; lowercased where the model is uncased), and how the pre-tokenizer splits text of them.

    Text of plain ASCII and these characters keeps every character's position through normalization, so the
    library's offsets are the positions in the normalized text, as for ASCII. Each is read off the tokenizer's own
    normalizer and pre-tokenizer, one character at a time: BertNormalizer's work on a character that is not a mark
    depends on that character alone (its cleaning, accents stripped through NFD, lowercasing character by
    character: no final sigma), and BertPreTokenizer's on its class (whitespace, punctuation, a word's). Marks and
    control or format characters (dropped, or reordered by NFD), CJK (padded with spaces) and every character whose
    normalized form is not one character (İ lowercased where accents stay) are left to the library, with the
    text that holds them."""

    def __init__(self, tokenizer: Tokenizer, lowercase: bool) -> None:
        normalizer, pre_tokenizer = tokenizer.normalizer, tokenizer.pre_tokenizer
        self.fold: dict[str, str] = {}  # a character -> what the normalizer makes it
        word_chars: set[str] = set()  # what the normalizer makes of them that is part of a word (not ASCII)
        for code in _BEYOND_ASCII_LOOKED_AT:
            char = chr(code)
            if unicodedata.category(char)[0] in "CM" or unicodedata.combining(char):
                continue
            normal = normalizer.normalize_str(char)
            if len(normal) != 1 or (lowercase and normal.lower() != normal):  # lowercased ASCII beside it: stays
                continue
            pieces = [piece for piece, _ in pre_tokenizer.pre_tokenize_str(f"a{normal}b")]
            if pieces == ["a", "b"]:
                self.fold[char] = " "
            elif pieces == ["a", normal, "b"]:
                self.fold[char] = normal
            elif pieces == [f"a{normal}b"]:
                self.fold[char] = normal
                if not normal.isascii():
                    word_chars.add(normal)
        letters = "".join(re.escape(char) for char in sorted(word_chars))
        # BertPreTokenizer on the normalized text: runs of word characters, each other character but space alone
        self.words = re.compile(f"[A-Za-z0-9{letters}]+|[^A-Za-z0-9 \t\n\r{letters}]")

    def normalized(self, text: str) -> str | None:
        """`text` (not ASCII) with each of its characters beyond ASCII as the normalizer makes it; None where one
        is not in the alphabet."""
        try:
            return _BEYOND_ASCII.sub(self._fold_run, text)
        except KeyError:
            return None

    def _fold_run(self, match: re.Match[str]) -> str:
        fold = self.fold
        return "".join([fold[char] for char in match[0]])


# A normalizer's settings (as tokenizer.json has them) and the case derived for it -> its alphabet
_ALPHABETS: dict[tuple[str, bool], _Alphabet] = {}


def _find(ids: list[int], part: list[int], start: int) -> int:
    for at in range(start, len(ids) - len(part) + 1):
        if ids[at : at + len(part)] == part:
            return at
    raise ValueError("a probe's tokens are not in its encoding")


class PlainWordPiece:
    """Ids and type ids of plain text (or pairs), and a text's or a pair's windows, equal to the tokenizer's, for one
    tokenizer."""

    def __init__(self, tokenizer: Tokenizer, lowercase: bool, added: Sequence[str], alphabet: _Alphabet) -> None:
        self._model = tokenizer.model
        self._lowercase = lowercase
        # an added token's content anywhere in lowercased text (one search, not one per token), as it is and as the
        # normalizer makes it (the library matches a normalized token's in normalized text: "Café" in "cafe")
        normalizer = tokenizer.normalizer
        forms = {form.lower() for content in added for form in (content, normalizer.normalize_str(content))}
        contents = sorted(forms - {""}, key=len, reverse=True)
        self._added = re.compile("|".join(map(re.escape, contents))) if contents else None
        self._words: dict[str, _Pieces] = {}
        self._contexts: dict[str, _Split] = {}  # `_split_context`'s; never changed once in, only dropped
        self._contexts_lock = threading.Lock()  # a front-end's loop and its tokenizer thread both split contexts
        self._alphabet = alphabet
        self._last_first: tuple[str, list[int]] | None = None  # the last first text's ids, kept by identity
        self._single = _Template(tokenizer, "probe words", None)
        self._pair = _Template(tokenizer, "first probe", "second probe")
        self._windows_agree = False  # until `of` has checked them
        self._pair_windows_agree = False

    @classmethod
    def of(cls, tokenizer_json: str, tokenizer: Tokenizer, lowercase: bool) -> PlainWordPiece | None:
        """The fast path for this tokenizer (an untruncated, unpadded one), None where it is not a BERT pipeline
        or its probes do not come out alike."""
        described = json.loads(tokenizer_json)
        model, pre_tokenizer = described.get("model") or {}, described.get("pre_tokenizer") or {}
        if model.get("type") != "WordPiece" or pre_tokenizer.get("type") != "BertPreTokenizer":
            return None
        added = [token["content"] for token in described.get("added_tokens") or []]
        # one alphabet for every tokenizer of a normalizer (~50 ms to read off): a server's models share theirs
        key = (json.dumps(described.get("normalizer"), sort_keys=True), lowercase)
        alphabet = _ALPHABETS.get(key)
        if alphabet is None:
            alphabet = _ALPHABETS[key] = _Alphabet(tokenizer, lowercase)
        try:
            plain = cls(tokenizer, lowercase, added, alphabet)
        except ValueError:
            return None
        for text, pair in _PROBES:
            encoding, ids = tokenizer.encode(text, pair), plain.ids(text, pair)
            if ids is None and _beyond_ascii(text, pair):  # a character outside this tokenizer's alphabet
                continue
            if ids is None or (ids.ids, ids.type_ids) != (encoding.ids, encoding.type_ids):
                return None
        plain._windows_agree = all(plain._windows_as_library(tokenizer, windowing) for windowing in _WINDOWINGS)
        plain._pair_windows_agree = all(
            plain._pair_windows_as_library(tokenizer, windowing) for windowing in _WINDOWINGS
        )
        tokenizer.no_truncation()
        plain._words.clear()  # the probes' words are no corpus's
        return plain

    def _windows_as_library(self, tokenizer: Tokenizer, windowing: tuple[int, int] | None) -> bool:
        max_length, stride = windowing or (10**6, 0)
        if windowing is None:
            tokenizer.no_truncation()
        else:
            tokenizer.enable_truncation(max_length, stride=stride, strategy="longest_first", direction="right")
        for text, pair in _PROBES:
            if pair is not None:
                continue
            encoding = tokenizer.encode(text)
            library = [_described(window) for window in [encoding, *encoding.overflowing]]
            windows = self._windows(text, max_length, stride)
            if windows is None and _beyond_ascii(text, None):
                continue
            if windows is None or [_described(window) for window in windows] != library:
                return False
        return True

    def _pair_windows_as_library(self, tokenizer: Tokenizer, windowing: tuple[int, int] | None) -> bool:
        if windowing is None:
            tokenizer.no_truncation()
        else:
            max_length, stride = windowing
            tokenizer.enable_truncation(max_length, stride=stride, strategy="only_second", direction="right")
        for first, second in _PAIR_PROBES:
            windows = self._pair_windows(first, second, *(windowing or (None, 0)))
            if windows is None:  # no room for the second text's windows: left to the library (and QA's checks)
                continue
            encoding = tokenizer.encode(first, second)
            library = [_pair_described(window) for window in [encoding, *encoding.overflowing]]
            if [_pair_described(window) for window in windows] != library:
                return False
        return True

    @property
    def words_remembered(self) -> int:
        return len(self._words)

    @property
    def contexts_remembered(self) -> list[str]:
        """The pairs' second texts whose split is remembered, the oldest first."""
        return list(self._contexts)

    @property
    def makes_windows(self) -> bool:
        """Whether `windows` serves (its probes came out as the library makes them)."""
        return self._windows_agree

    @property
    def makes_pair_windows(self) -> bool:
        """Whether `pair_windows` serves (its probes came out as the library makes them)."""
        return self._pair_windows_agree

    def _holds_added(self, lowered: str) -> bool:
        """Whether lowercased text holds an added token's content (matched without regard to case: "[sep]" goes
        to the library too, to be sure)."""
        return self._added is not None and self._added.search(lowered) is not None

    def _normal(self, text: str) -> tuple[str, re.Pattern[str]] | None:
        """The text as the normalizer makes it, character for character (each keeps its position), and how to split
        it into words; None where the library must encode it: a control character, a character beyond ASCII outside
        the tokenizer's `_Alphabet`, an added token's content."""
        if text.isascii():
            if not plain_ascii(text):
                return None
            lowered = text.lower()
            if self._holds_added(lowered):
                return None
            return (lowered if self._lowercase else text), _WORDS
        if _CONTROL.search(text) is not None:
            return None
        normal = self._alphabet.normalized(text)
        if normal is None:
            return None
        lowered = normal.lower()  # the characters beyond ASCII are already: only ASCII's letters change
        if self._holds_added(lowered) or self._holds_added(text.lower()):
            return None
        return (lowered if self._lowercase else normal), self._alphabet.words

    def ids(self, text: str, pair: str | None = None) -> TokenIds | None:
        """The encoding's ids and type ids of a text (or pair) the tokenizer's normalizer keeps character for
        character (`_normal`), None where the library must encode it."""
        last = self._last_first  # one read: another thread may replace it
        if pair is not None and last is not None and last[0] is text:  # rerank's query, first in each of its pairs
            first = last[1]
        else:
            made = self._part_ids(text)
            if made is None:
                return None
            first = made
            if pair is not None:
                self._last_first = (text, first)
        if pair is None:
            template = self._single
            return TokenIds(template.ids[0] + first + template.ids[1], template, (len(first),))
        second = self._part_ids(pair)
        if second is None:
            return None
        template = self._pair
        ids = template.ids[0] + first + template.ids[1]
        ids += second
        ids += template.ids[2]
        return TokenIds(ids, template, (len(first), len(second)))

    def _part_ids(self, text: str) -> list[int] | None:
        """A text's ids without special tokens; None where the library must encode it."""
        normal = self._normal(text)
        if normal is None:
            return None
        ids: list[int] = []
        self._extend(ids, *normal)
        return ids

    def windows(self, text: str, max_length: int, stride: int) -> list[PlainEncoding] | None:
        """A lone text's windows as the library makes them truncating at `max_length` with `stride`
        tokens of overlap (the first, then its overflows), offsets and all; None where the library must encode it."""
        return self._windows(text, max_length, stride) if self._windows_agree else None

    def _windows(self, text: str, max_length: int, stride: int) -> list[PlainEncoding] | None:
        template = self._single
        capacity = max_length - len(template.ids[0]) - len(template.ids[1])
        normal = self._normal(text)
        if normal is None or not 0 <= stride < capacity:
            return None
        ids: list[int] = []
        tokens: list[str] = []
        offsets: list[tuple[int, int]] = []
        words = self._words
        append_offsets = offsets.append
        for match in normal[1].finditer(normal[0]):
            word = match[0]
            pieces = words.get(word) or self._pieces(word)
            ids += pieces[0]
            tokens += pieces[1]
            spans = pieces[2]
            if spans is None:  # one piece: the word's own span
                append_offsets(match.span())
            else:
                start = match.start()
                offsets += [(start + begin, start + end) for begin, end in spans]
        return [
            PlainEncoding(
                template.ids[0] + ids[start:stop] + template.ids[1],
                template,
                template.tokens[0] + tokens[start:stop] + template.tokens[1],
                template.offsets[0] + offsets[start:stop] + template.offsets[1],
                template.special[0] + [0] * (stop - start) + template.special[1],
            )
            for start, stop in _window_ranges(len(ids), capacity, stride)
        ]

    def pair_windows(
        self, first: str, second: str, max_length: int | None, stride: int
    ) -> list[PlainPairEncoding] | None:
        """A pair's windows (QA's question and context) as the library makes them truncating only the
        second text at `max_length` (None: one window, untruncated) with `stride` tokens of overlap; None where the
        library must encode it."""
        return self._pair_windows(first, second, max_length, stride) if self._pair_windows_agree else None

    def _pair_windows(
        self, first: str, second: str, max_length: int | None, stride: int
    ) -> list[PlainPairEncoding] | None:
        normal_first = self._normal(first)
        if normal_first is None:  # the library encodes the pair: no context split (nor remembered) for nothing
            return None
        second_split = self._split_context(second)
        if second_split is None:
            return None
        first_ids, first_offsets, first_words = self._split(*normal_first)
        ids, offsets, words = second_split  # shared with other calls: sliced below, never changed
        template = self._pair
        before, between, after = (len(template.ids[0]), len(template.ids[1]), len(template.ids[2]))
        fixed = before + len(first_ids) + between + after
        ranges = [(0, len(ids))]
        if max_length is not None and fixed + len(ids) > max_length:
            capacity = max_length - fixed
            if not 0 <= stride < capacity:
                return None
            ranges = _window_ranges(len(ids), capacity, stride)
        head_ids = template.ids[0] + first_ids + template.ids[1]
        head_offsets = template.offsets[0] + first_offsets + template.offsets[1]
        head_special = template.special[0] + [0] * len(first_ids) + template.special[1]
        head_sequences: list[int | None] = [None] * before + [0] * len(first_ids) + [None] * between
        head_words: list[int | None] = [None] * before + first_words + [None] * between
        first_run = (before, before + len(first_ids))
        windows = []
        for start, stop in ranges:
            size = stop - start
            windows.append(
                PlainPairEncoding(
                    head_ids + ids[start:stop] + template.ids[2],
                    template,
                    head_offsets + offsets[start:stop] + template.offsets[2],
                    head_special + [0] * size + template.special[2],
                    head_sequences + [1] * size + [None] * after,
                    head_words + words[start:stop] + [None] * after,
                    (first_run, (len(head_ids), len(head_ids) + size)),
                )
            )
        return windows

    def _split_context(self, text: str) -> _Split | None:
        """`_split` of a pair's second text (QA's context) where it is plain, None where it is not; remembered
        (`CONTEXTS_REMEMBERED`): the lists are shared by every call that asks for the same text."""
        split = self._contexts.get(text)
        if split is not None:
            return split
        normal = self._normal(text)
        if normal is None:
            return None
        split = self._split(*normal)
        if len(text) <= MAX_REMEMBERED_CONTEXT_CHARS:
            with self._contexts_lock:
                if len(self._contexts) >= CONTEXTS_REMEMBERED:
                    del self._contexts[next(iter(self._contexts))]
                self._contexts[text] = split
        return split

    def _split(self, text: str, word_pattern: re.Pattern[str]) -> _Split:
        """A normalized text's ids, offsets and words (each token's word's index) without special tokens."""
        ids: list[int] = []
        offsets: list[tuple[int, int]] = []
        words: list[int | None] = []
        known = self._words
        for index, match in enumerate(word_pattern.finditer(text)):
            word = match[0]
            pieces = known.get(word) or self._pieces(word)
            ids += pieces[0]
            spans = pieces[2]
            if spans is None:
                offsets.append(match.span())
                words.append(index)
            else:
                start = match.start()
                offsets += [(start + begin, start + end) for begin, end in spans]
                words += [index] * len(spans)
        return ids, offsets, words

    def _extend(self, ids: list[int], text: str, word_pattern: re.Pattern[str]) -> None:
        words = self._words
        for word in word_pattern.findall(text):
            ids += (words.get(word) or self._pieces(word))[0]

    def _pieces(self, word: str) -> _Pieces:
        """The word's pieces by the tokenizer's own WordPiece model, remembered while there is room."""
        tokens = self._model.tokenize(word)
        spans = [token.offsets for token in tokens]  # in bytes of the word's UTF-8
        if not word.isascii():
            spans = _in_characters(word, spans)
        if len(tokens) == 1 and tokens[0].value == word and spans[0] == (0, len(word)):
            return self._remembered(word, ((tokens[0].id,), (word,), None))  # the word's own string, not a copy
        return self._remembered(
            word, (tuple([token.id for token in tokens]), tuple([token.value for token in tokens]), tuple(spans))
        )

    def _remembered(self, word: str, pieces: _Pieces) -> _Pieces:
        if len(self._words) < MAX_WORDS:
            self._words[word] = pieces
        return pieces


def _beyond_ascii(text: str, pair: str | None) -> bool:
    return not text.isascii() or (pair is not None and not pair.isascii())


def _in_characters(word: str, spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Spans in bytes of a word's UTF-8 as spans in its characters (pieces start and end at characters)."""
    character_at = {0: 0}
    end = 0
    for index, char in enumerate(word, 1):
        end += len(char.encode("utf-8"))
        character_at[end] = index
    return [(character_at[start], character_at[stop]) for start, stop in spans]


def _window_ranges(count: int, capacity: int, stride: int) -> list[tuple[int, int]]:
    """The library's windows over `count` tokens (`Encoding::truncate`): `capacity` tokens each, each `capacity -
    stride` on from the last, until one reaches the end; one window where all fit."""
    starts = range(0, count, capacity - stride) if count > capacity else [0]
    return [(start, min(start + capacity, count)) for start in starts if start == 0 or start + stride < count]


def _described(encoding: Encoding | PlainEncoding) -> tuple:
    return (encoding.ids, encoding.type_ids, encoding.tokens, encoding.offsets, encoding.special_tokens_mask)


def _pair_described(encoding: Encoding | PlainPairEncoding) -> tuple:
    """All QA reads of a window, each word's characters in each text included."""
    words = [
        None if word is None or sequence is None else encoding.word_to_chars(word, sequence)
        for word, sequence in zip(encoding.word_ids, encoding.sequence_ids, strict=True)
    ]
    return (
        encoding.ids,
        encoding.type_ids,
        encoding.offsets,
        encoding.special_tokens_mask,
        encoding.sequence_ids,
        encoding.word_ids,
        [encoding.token_to_word(token) for token in range(len(encoding))],
        words,
    )
