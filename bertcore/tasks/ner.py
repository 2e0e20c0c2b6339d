"""Token classification (NER): text to model rows, and token logits to entities.

The entities are those of transformers 5's `token-classification` pipeline on the same checkpoint (labels, words,
character offsets; scores up to float rounding) for every aggregation strategy. What it does, and what we do:

* Scores are the softmax over labels of each token's logits; special tokens (the post-processor's [CLS], [SEP],
  padding) are dropped. Added tokens typed in the text, such as "[MASK]", are not special there and are kept.
* A token's `word` is its vocabulary string ("##ing", "Ġworld"), except for the unknown token, whose word is the
  text it covers. Grouped words join those strings with the tokenizer's decoder (`convert_tokens_to_string`), not
  by decoding ids; entity groups join the already joined words with the decoder a second time.
* Whether a token continues a word: for tokenizers whose model marks continuation pieces (WordPiece's "##"), when
  the token string and the text it covers differ in length; for the others (byte-level BPE, Unigram), when it does
  not start the text and neither the character before it nor its first character is a space (" " only, not tabs or
  new lines). Unknown tokens start a word.
* "simple" groups adjacent tokens with the same tag, starting a new group at every B- tag; a label without a B-/I-
  prefix counts as I-. "first", "average" and "max" first give every word one label (its first token's, its
  tokens' mean scores', or its most confident token's), then group the words the same way. Labels in
  `ignore_labels` are dropped after grouping.
* Long texts: windows of `max_length` tokens overlapping by `stride` tokens, the way the pipeline's `stride`
  argument makes them (`return_overflowing_tokens`). Each window is tagged and grouped alone; entities of all
  windows are then sorted by start and, where one starts inside the previous kept one, the longer wins (the
  higher score on equal lengths). Windows come from the tokenizers library, so their quirks are the pipeline's
  too: with RoBERTa's trim_offsets, a window's first text token keeps its leading space in its offsets.
  The pipeline refuses `stride` with strategy "none"; here a token in several windows is reported once (from the
  window where, among those not ignoring it, it scored highest), with `index` counted over the whole text's tokens.
* Words given split (`is_split_into_words`, `Words`): the text is the words joined by one space, tokenized as any
  text, and each entity also names its first and last word (`first_word`, `last_word`). The word strategies
  ("first", "average", "max") take the caller's words as the words, where the pipeline (with or without
  `is_split_into_words`) still guesses them from the token strings: for WordPiece every punctuation mark is a word
  of its own, so the "." of an initial "S." or of "F.A." gets a label of its own, which the model was never
  trained to give (fine-tuning labels a word's first piece only). On CoNLL-2003's own words this is the score the
  checkpoint was measured with (entity F1 0.8365 for the shared MiniLM checkpoint, against 0.8265 for the
  pipeline's words).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import lru_cache
from itertools import pairwise
from typing import Any, NamedTuple, overload

import numpy as np
from tokenizers import Encoding

from bertcore.messages import shown
from bertcore.plain_wordpiece import PlainEncoding
from bertcore.rows import Row
from bertcore.tasks.errors import TaskInputError
from bertcore.tokenization import TextTokenizer

AGGREGATION_STRATEGIES = ("none", "simple", "first", "average", "max")
WORD_STRATEGIES = ("first", "average", "max")

# Tokens of overlap between consecutive windows: the common choice for 512-token models (as the question-answering
# doc_stride). An entity cut by a window's end is whole in the next window when it is shorter than the overlap, and
# tokens near a window's end get their right context there. `default_stride` caps it for shorter windows.
DEFAULT_STRIDE = 128

Entity = dict[str, Any]
WORD_DELIMITER = " "  # words given split are joined by it into the text, as the pipeline joins them


@dataclass(frozen=True)
class Words:
    """A text given as words: the words joined by WORD_DELIMITER, and where each word starts and ends in it."""

    text: str
    starts: list[int]
    ends: list[int]

    @classmethod
    def join(cls, words: Sequence[str]) -> Words:
        starts, ends, position = [], [], 0
        for word in words:
            starts.append(position)
            ends.append(position + len(word))
            position += len(word) + len(WORD_DELIMITER)
        return cls(WORD_DELIMITER.join(words), starts, ends)

    def first(self, start: int) -> int:
        """The first word that ends after character `start` (the next word, where `start` is a delimiter)."""
        return min(bisect_right(self.ends, start), len(self.ends) - 1)

    def span(self, start: int, end: int) -> tuple[int, int]:
        """The first and the last word that characters [start, end) reach."""
        first = self.first(start)
        return first, max(first, bisect_left(self.starts, end) - 1)


class TokenSpan(NamedTuple):
    """One non-special token of a window: what the entities need besides its scores.

    A named tuple, not a dataclass: one is made per token of every request, and a tuple is made several times
    faster (post-processing is on the serving path)."""

    position: int  # index in its window's row
    text_index: int  # index in the tokens of the whole text, as if it fitted in one window (= position in window 0)
    word: str  # the vocabulary string, or for the unknown token the text it stands for
    start: int
    end: int
    is_subword: bool  # continues the word of the token before it
    given_word: int = -1  # where the text came as words (`Words`): the index of the word it is in


@dataclass(frozen=True)
class NerFeatures:
    rows: list[Row]  # one model input row per window
    tokens: list[Sequence[TokenSpan]]  # the non-special tokens of each window (`_Spans`, or a list for words)
    join_tokens: Callable[[Sequence[str]], str]  # the tokenizer's decoder over token strings
    words: Words | None = None  # the caller's words, where the text came split into words


class _Tagged(NamedTuple):
    """A token or word with its label: the step before grouping and filtering."""

    label: str
    score: float  # a float32 score, exactly
    word: str
    start: int
    end: int
    text_index: int  # the entity's `index`: of the token in the whole text's tokens


def window_capacity(tokenizer: TextTokenizer, max_length: int) -> int:
    """Text tokens per window: the model's maximum length less the special tokens added to every window."""
    return max_length - tokenizer.num_special_tokens(pair=False)


def max_stride(tokenizer: TextTokenizer, max_length: int) -> int:
    """The largest usable stride: windows must advance by at least one token."""
    return window_capacity(tokenizer, max_length) - 1


def default_stride(tokenizer: TextTokenizer, max_length: int) -> int:
    """DEFAULT_STRIDE, but at most a quarter of `max_length` (and below `max_stride`) for short windows."""
    return max(0, min(DEFAULT_STRIDE, max_length // 4, max_stride(tokenizer, max_length)))


def check_strategy(strategy: str) -> None:
    if strategy not in AGGREGATION_STRATEGIES:
        raise TaskInputError(
            f"unknown aggregation strategy {shown(strategy)}; expected one of: {', '.join(AGGREGATION_STRATEGIES)}",
            field="aggregation_strategy",
        )


def check_stride(tokenizer: TextTokenizer, max_length: int, stride: int) -> None:
    """Windows of `max_length` tokens can overlap by `stride` tokens and still advance."""
    if window_capacity(tokenizer, max_length) < 1:
        raise TaskInputError(f"max_length {max_length} leaves no room for text between the special tokens")
    if not 0 <= stride <= max_stride(tokenizer, max_length):
        raise TaskInputError(
            f"stride must be between 0 and {max_stride(tokenizer, max_length)} for max_length {max_length}, "
            f"got {stride}",
            field="stride",
        )


def prepare(tokenizer: TextTokenizer, source: str | Words, max_length: int, stride: int) -> NerFeatures:
    """Tokenize a text (or words, joined) into windows of at most `max_length` tokens overlapping by `stride`."""
    check_stride(tokenizer, max_length, stride)
    words = source if isinstance(source, Words) else None
    text = source.text if isinstance(source, Words) else source
    encodings = tokenizer.encode_windows(text, max_length, stride)
    step = window_capacity(tokenizer, max_length) - stride  # text tokens each window moves on by
    word_aware = tokenizer.continuing_subword_prefix is not None
    unk_id = tokenizer.unk_token_id
    return NerFeatures(
        rows=[Row.from_encoding(encoding) for encoding in encodings],
        tokens=[
            _Spans(text, encoding, window * step, word_aware, unk_id)
            if words is None
            else _token_spans(text, encoding, window * step, word_aware, unk_id, words)
            for window, encoding in enumerate(encodings)
        ],
        join_tokens=tokenizer.tokens_to_string,
        words=words,
    )


def _whole_words(windows: Sequence[Sequence[TokenSpan]]) -> list[Sequence[TokenSpan]]:
    """The windows' tokens, each given word's in one window only: the first that holds the whole word or, where
    none does (a word longer than the windows' overlap), the one that holds its first piece."""
    kept = []
    for w, window in enumerate(windows):
        start, stop = 0, len(window)
        if w > 0 and window:  # pieces of a word begun in the window before: labelled there
            begun = _given_word(windows[w - 1], window[0].text_index - 1)
            while start < stop and window[start].given_word == begun:
                start += 1
        if w + 1 < len(windows) and window and windows[w + 1]:  # a word cut by the window's end ...
            last = window[-1].given_word
            cut = _given_word(windows[w + 1], window[-1].text_index + 1) == last
            if cut and windows[w + 1][0].given_word != last:  # ... that the next window holds from its first piece
                while stop > start and window[stop - 1].given_word == last:
                    stop -= 1
        kept.append(window[start:stop])
    return kept


def _given_word(window: Sequence[TokenSpan], text_index: int) -> int | None:
    """The given word of the window's token at `text_index` of the whole text (None where the window lacks it)."""
    position = text_index - window[0].text_index if window else -1
    return window[position].given_word if 0 <= position < len(window) else None


def _token_spans(
    text: str,
    encoding: Encoding | PlainEncoding | _EncodingLists,
    shift: int,
    word_aware: bool,
    unk_id: int | None,
    words: Words | None,
) -> list[TokenSpan]:
    """The window's non-special tokens (of an encoding, or of its lists where they were read already). Where they are
    all made, one is made per token of a request: the loop is written out (no call per token but the tuple's own)."""
    spans: list[TokenSpan] = []
    append = spans.append
    make = tuple.__new__  # TokenSpan's fields in order, without the named tuple's Python-level __new__
    given_word, previous = -1, -1
    lists = encoding if isinstance(encoding, _EncodingLists) else _EncodingLists.of(encoding)
    for position, (token_id, token, (start, end), special) in enumerate(zip(*lists, strict=True)):
        if special:
            continue
        unknown = token_id == unk_id
        word = text[start:end] if unknown else token
        if words is not None:  # a token continues the given word that the token before it is in
            previous, given_word = given_word, words.first(start)
            is_subword = given_word == previous
        elif unknown:  # an unknown token starts a word
            is_subword = False
        elif word_aware:  # a continuation piece carries its mark ("##ing" covers "ing"): the lengths differ
            is_subword = len(token) != len(text[start:end])
        else:  # no marks to go by: a token continues a word unless a space ends the text before it or starts its own
            is_subword = start > 0 and " " not in text[start - 1 : start + 1]
        append(make(TokenSpan, (position, position + shift, word, start, end, is_subword, given_word)))
    return spans


class _EncodingLists(NamedTuple):
    """What a window's tokens are made of, read from its encoding once (each read makes a new list)."""

    ids: list[int]
    tokens: list[str]
    offsets: list[tuple[int, int]]
    special_tokens_mask: list[int]

    @classmethod
    def of(cls, encoding: Encoding | PlainEncoding) -> _EncodingLists:
        return cls(encoding.ids, encoding.tokens, encoding.offsets, encoding.special_tokens_mask)


class _Spans(Sequence[TokenSpan]):
    """A window's non-special tokens, each made when it is asked for: what `_token_spans` makes for a text that came
    whole, but "simple" (the default strategy) reads only the window's ends and its entities' tokens, and most of a
    text is dropped "O" runs: a tuple per token of every request was a third of NER's preparation."""

    __slots__ = ("_lists", "_made", "_positions", "_shift", "_text", "_unk_id", "_word_aware")

    def __init__(
        self, text: str, encoding: Encoding | PlainEncoding, shift: int, word_aware: bool, unk_id: int | None
    ) -> None:
        self._text, self._shift, self._word_aware, self._unk_id = text, shift, word_aware, unk_id
        self._lists = _EncodingLists.of(encoding)
        self._positions = [position for position, special in enumerate(self._lists.special_tokens_mask) if not special]
        self._made: list[TokenSpan] | None = None  # every token, once something read them all

    def __len__(self) -> int:
        return len(self._positions)

    @overload
    def __getitem__(self, index: int) -> TokenSpan: ...

    @overload
    def __getitem__(self, index: slice) -> list[TokenSpan]: ...

    def __getitem__(self, index: int | slice) -> TokenSpan | list[TokenSpan]:
        if self._made is not None:
            return self._made[index]
        if isinstance(index, slice):
            return [self._span(position) for position in self._positions[index]]
        return self._span(self._positions[index])

    def __iter__(self) -> Iterator[TokenSpan]:
        return iter(self._every())

    def _every(self) -> list[TokenSpan]:
        """Every token, made once ("none" and the word strategies read them all, some twice), by `_token_spans`."""
        if self._made is None:
            self._made = _token_spans(self._text, self._lists, self._shift, self._word_aware, self._unk_id, None)
        return self._made

    def _span(self, position: int) -> TokenSpan:
        """One token, as `_token_spans` makes it for a text that came whole (its loop inlines this rule, a call per
        token being most of its cost; the tests hold the two equal)."""
        token, (start, end) = self._lists.tokens[position], self._lists.offsets[position]
        text = self._text
        if self._lists.ids[position] == self._unk_id:  # an unknown token starts a word, its text its own
            word, is_subword = text[start:end], False
        elif self._word_aware:
            word, is_subword = token, len(token) != len(text[start:end])
        else:
            word, is_subword = token, start > 0 and " " not in text[start - 1 : start + 1]
        return tuple.__new__(TokenSpan, (position, position + self._shift, word, start, end, is_subword, -1))

    @property
    def positions(self) -> list[int]:
        """The tokens' positions in the window (their rows), without making the tokens."""
        return self._positions


def postprocess(
    text: str,
    features: NerFeatures,
    logits: list[np.ndarray],
    labels: list[str],
    strategy: str,
    ignore_labels: tuple[str, ...] = ("O",),
) -> list[Entity]:
    """Entities of the text from each window's logits, shape (len(rows[i]), len(labels))."""
    return postprocess_all([text], [features], [logits], labels, strategy, ignore_labels)[0]


def postprocess_all(
    texts: Sequence[str],
    features: Sequence[NerFeatures],
    logits: Sequence[list[np.ndarray]],
    labels: list[str],
    strategy: str,
    ignore_labels: tuple[str, ...] = ("O",),
) -> list[list[Entity]]:
    """Each text's `postprocess`, the label scores of all the texts' windows found at once (`score_windows`)."""
    check_strategy(strategy)
    for text_features, text_logits in zip(features, logits, strict=True):
        _check_logits(text_features, text_logits, labels)
    scored = iter(score_windows([window for text_logits in logits for window in text_logits]))
    return [
        _entities(text, text_features, [next(scored) for _ in text_logits], labels, strategy, ignore_labels)
        for text, text_features, text_logits in zip(texts, features, logits, strict=True)
    ]


class WindowScores(NamedTuple):
    """A window's label scores: the softmax over labels of each of its rows, and each row's best label and score
    (the first of equals)."""

    probabilities: np.ndarray  # (rows, labels), float32
    best: list[int]  # each row's best label id
    best_scores: np.ndarray  # (rows,), float32: each row's score of its best label

    def at(self, positions: list[int]) -> tuple[list[int], np.ndarray]:
        """The best label ids and their scores of the rows at `positions` (ascending): slices where they are in a
        row, as a window's text tokens are between its special ones."""
        if positions and positions[-1] - positions[0] + 1 == len(positions):
            return self.best[positions[0] : positions[-1] + 1], self.best_scores[positions[0] : positions[-1] + 1]
        return [self.best[position] for position in positions], self.best_scores[positions]


def score_windows(logits: Sequence[np.ndarray]) -> list[WindowScores]:
    """The scores of windows (of one request: its texts' windows one after another), for all their rows in one
    numpy pass. A row's scores are those of the row alone (softmax, argmax and max run row by row); a call per
    window cost more than the rest of a sentence's post-processing."""
    if not logits:
        return []
    probabilities = _softmax(logits[0] if len(logits) == 1 else np.concatenate(logits))
    best = probabilities.argmax(axis=-1).tolist()
    best_scores = _row_max(probabilities)
    windows, start = [], 0
    for window in logits:
        end = start + len(window)
        windows.append(WindowScores(probabilities[start:end], best[start:end], best_scores[start:end]))
        start = end
    return windows


def _entities(
    text: str,
    features: NerFeatures,
    scored: list[WindowScores],
    labels: list[str],
    strategy: str,
    ignore_labels: tuple[str, ...],
) -> list[Entity]:
    windows = features.tokens
    if features.words is not None and strategy in WORD_STRATEGIES:
        windows = _whole_words(windows)
    per_window = [
        _window_entities(tokens, window_scores, labels, strategy, features.join_tokens, ignore_labels)
        for tokens, window_scores in zip(windows, scored, strict=True)
    ]
    if len(per_window) == 1:
        entities = per_window[0]
    elif strategy == "none":
        entities = _merge_token_windows(per_window)
    else:
        entities = _merge_overlapping([entity for entities in per_window for entity in entities])
    if features.words is not None:
        for entity in entities:
            entity["first_word"], entity["last_word"] = features.words.span(entity["start"], entity["end"])
    return entities


def _check_logits(features: NerFeatures, logits: list[np.ndarray], labels: list[str]) -> None:
    if len(logits) != len(features.rows):
        raise ValueError(f"expected logits for {len(features.rows)} windows, got {len(logits)}")
    for window, (row, window_logits) in enumerate(zip(features.rows, logits, strict=True)):
        if window_logits.shape != (len(row), len(labels)):
            raise ValueError(
                f"window {window}: expected logits of shape {(len(row), len(labels))}, got {window_logits.shape}"
            )


def _softmax(logits: np.ndarray) -> np.ndarray:
    logits = logits.astype(np.float32, copy=False)
    exp = np.exp(logits - _row_max(logits)[:, np.newaxis])
    return exp / exp.sum(axis=-1, keepdims=True)


def _row_max(values: np.ndarray) -> np.ndarray:
    """Each row's largest value, for rows of label scores (rows, labels): the very values of `values.max(axis=-1)`
    (a maximum is exact in any order; a NaN wins either way), ~6x faster for NER's few labels (a 16-sentence
    request's 480 x 9: 3.5 µs against 21.4), since numpy reduces a short last axis row by row and a transposed
    copy's first axis in one vectorized pass."""
    return np.ascontiguousarray(values.T).max(axis=0)


def _window_entities(
    tokens: Sequence[TokenSpan],
    scores: WindowScores,
    labels: list[str],
    strategy: str,
    join_tokens: Callable[[Sequence[str]], str],
    ignore_labels: tuple[str, ...],
) -> list[Entity]:
    """One window's entities, filtered: tokens for "none"; otherwise groups of tokens ("simple") or of words, each
    group's text joined only where it is kept (most of a text is "O" runs, dropped unseen: the decoder's call per
    word was most of the word strategies' work), without an object per token."""
    if strategy == "none":
        tagged = _tag_tokens(tokens, scores, labels)
        return [_token_entity(item) for item in tagged if item.label not in ignore_labels]
    if not tokens:
        return []
    best_scores: Sequence[float] | np.ndarray
    if strategy == "simple":
        best, best_scores = _token_labels(tokens, scores)

        def text(start: int, end: int) -> str:
            return join_tokens([token.word for token in tokens[start:end]])

        def span(start: int, end: int) -> tuple[int, int]:
            return tokens[start].start, tokens[end - 1].end  # a _Spans token costs a tuple: two made at most

    else:
        words = _split_words(tokens)
        best, best_scores = _word_labels(words, scores, strategy)

        def text(start: int, end: int) -> str:
            return join_tokens([join_tokens([token.word for token in word]) for word in words[start:end]])

        def span(start: int, end: int) -> tuple[int, int]:
            return words[start][0].start, words[end - 1][-1].end

    entities = []
    for start, end, group_tag in _kept_groups(best, tuple(labels), ignore_labels):
        first, last = span(start, end)
        score = _mean_score(best_scores[start:end])
        entities.append(
            {"entity_group": group_tag, "score": score, "word": text(start, end), "start": first, "end": last}
        )
    return entities


def _tag_tokens(tokens: Sequence[TokenSpan], scores: WindowScores, labels: list[str]) -> list[_Tagged]:
    """Every token's best label and its score."""
    best, best_scores = _token_labels(tokens, scores)
    return [
        _Tagged(labels[label], score, token.word, token.start, token.end, token.text_index)
        for token, label, score in zip(tokens, best, best_scores.tolist(), strict=True)
    ]


def _token_labels(tokens: Sequence[TokenSpan], scores: WindowScores) -> tuple[list[int], np.ndarray]:
    """Every token's best label id and its score (a `_Spans` window's positions read without making its tokens)."""
    return scores.at(tokens.positions if isinstance(tokens, _Spans) else [token.position for token in tokens])


def _word_labels(
    words: list[list[TokenSpan]], scores: WindowScores, strategy: str
) -> tuple[list[int], Sequence[float] | np.ndarray]:
    """Every word's best label id and its score (`_word_scores`): "first"'s for all words at once."""
    if strategy == "first":
        return scores.at([word[0].position for word in words])
    best, best_scores = [], []
    for word in words:
        row = _word_scores(word, scores.probabilities, strategy)
        label = int(row.argmax())
        best.append(label)
        best_scores.append(float(row[label]))
    return best, best_scores


def _kept_groups(
    best: list[int], labels: tuple[str, ...], ignore_labels: tuple[str, ...]
) -> list[tuple[int, int, str]]:
    """Items labelled `best` (label ids) in groups: adjacent items with the same tag (`_bio`), a new group at every
    B- tag and at every tag change; less the groups whose entity_group (the first label cut at its first "-", as
    the pipeline cuts it) is in `ignore_labels`. (start, end, entity_group) of each kept group."""
    begins, tag_ids, group_tags, kept = _label_kinds(labels, ignore_labels)
    bounds = [0]  # a new group at the first item, at every B- tag and at every change of tag
    previous = tag_ids[best[0]]
    for index in range(1, len(best)):
        label = best[index]
        tag = tag_ids[label]
        if begins[label] or tag != previous:
            bounds.append(index)
        previous = tag
    bounds.append(len(best))
    return [(start, end, group_tags[best[start]]) for start, end in pairwise(bounds) if kept[best[start]]]


class _LabelKinds(NamedTuple):
    """What grouping needs of each label, by label id."""

    begins: list[bool]  # a B- label
    tag_ids: list[int]  # the same id for labels of the same tag (B-PER, I-PER)
    group_tags: list[str]  # the entity_group a group starting with the label is named
    kept: list[bool]  # a group starting with the label is not in ignore_labels


@lru_cache(maxsize=64)
def _label_kinds(labels: tuple[str, ...], ignore_labels: tuple[str, ...]) -> _LabelKinds:
    bio = [_bio(label) for label in labels]
    tag_ids: dict[str, int] = {}
    group_tags = [label.split("-", 1)[-1] for label in labels]  # cut at the first "-", as the pipeline cuts
    return _LabelKinds(
        begins=[prefix == "B" for prefix, _ in bio],
        tag_ids=[tag_ids.setdefault(tag, len(tag_ids)) for _, tag in bio],
        group_tags=group_tags,
        kept=[tag not in ignore_labels for tag in group_tags],
    )


def _split_words(tokens: Sequence[TokenSpan]) -> list[list[TokenSpan]]:
    """Tokens into words: a word starts at the window's first token and at every token that is not a subword."""
    words: list[list[TokenSpan]] = []
    for token in tokens:
        if words and token.is_subword:
            words[-1].append(token)
        else:
            words.append([token])
    return words


def _word_scores(word: list[TokenSpan], scores: np.ndarray, strategy: str) -> np.ndarray:
    """The label scores that decide a word's label."""
    if strategy == "first" or len(word) == 1:
        return scores[word[0].position]  # of one token, its row is the mean and the most confident alike
    if strategy == "max":
        # The most confident token; the first of equals.
        return max((scores[token.position] for token in word), key=lambda token_scores: token_scores.max())
    return np.nanmean(scores[[token.position for token in word]], axis=0)  # "average"


def _bio(label: str) -> tuple[str, str]:
    """("B" or "I", tag) of a label; a label without a B-/I- prefix continues like an I- tag."""
    if label.startswith(("B-", "I-")):
        return label[0], label[2:]
    return "I", label


def _mean_score(scores: Sequence[float] | np.ndarray) -> float:
    """The pipeline's `np.nanmean` over float32 scores. One score is its own mean; without a NaN among several it
    is the plain float32 mean (the same sum and division, checked bit for bit), at a third of the cost."""
    if len(scores) == 1:
        return float(scores[0])
    values = np.asarray(scores, dtype=np.float32)
    mean = values.mean()
    return float(np.nanmean(values) if np.isnan(mean) else mean)


def _token_entity(item: _Tagged) -> Entity:
    return {
        "entity": item.label,
        "score": float(item.score),
        "index": item.text_index,
        "word": item.word,
        "start": item.start,
        "end": item.end,
    }


def _merge_overlapping(entities: list[Entity]) -> list[Entity]:
    """Entities of overlapping windows, ordered by start; of those starting inside a kept one, the longest wins.

    As in the pipeline, the scan compares the first entity with itself: an empty first entity (start == end,
    from a token such as byte-level BPE's lone "Ġ") is therefore kept twice.
    """
    if not entities:
        return []
    ordered = sorted(entities, key=lambda entity: entity["start"])  # stable: window order among equal starts
    merged: list[Entity] = []
    kept = ordered[0]
    for entity in ordered:
        if kept["start"] <= entity["start"] < kept["end"]:
            if _outranks(entity, kept):
                kept = entity
        else:
            merged.append(kept)
            kept = entity
    merged.append(kept)
    return merged


def _outranks(entity: Entity, other: Entity) -> bool:
    length, other_length = entity["end"] - entity["start"], other["end"] - other["start"]
    return length > other_length or (length == other_length and entity["score"] > other["score"])


def _merge_token_windows(per_window: list[list[Entity]]) -> list[Entity]:
    """Strategy "none" over several windows: each token once, from the window that scored it highest."""
    best: dict[int, Entity] = {}
    for entities in per_window:
        for entity in entities:
            current = best.get(entity["index"])
            if current is None or entity["score"] > current["score"]:
                best[entity["index"]] = entity
    return [best[index] for index in sorted(best)]
