"""Token ids of plain ASCII text for a WordPiece model, without the tokenizers library's per-text machinery.

For text `plain_ascii` accepts, a BERT tokenizer (BertNormalizer, BertPreTokenizer, WordPiece, a template of special
tokens) comes to: lowercase (where the model is uncased), split into runs of letters and digits and single
punctuation characters (every other printable ASCII character is punctuation to BERT), each run through WordPiece,
the template around. The library does that in ~30 µs for a 25-token sentence, most of it building the normalized
string's alignments, offsets and the encoding's Python object; a task that only needs the ids (classification,
rerank, embeddings) gets them here in a few µs: each word's pieces come from the tokenizer's own WordPiece model and
are remembered, and the template's tokens and segments are read off the tokenizer's encodings of probe texts.

What is not certain to come out alike falls back to the library: text holding an added token's content (`[SEP]`
typed into a review) and every tokenizer that is not this pipeline. Before it serves, a tokenizer's probes must come
out equal both ways (ids and type ids).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence

from tokenizers import Tokenizer

# BertPreTokenizer on ASCII without control characters: whitespace splits, punctuation (every printable ASCII
# character but letters and digits) stands alone
_WORDS = re.compile(r"[A-Za-z0-9]+|[^A-Za-z0-9\s]")
# Words remembered per tokenizer and process (~230 bytes each: at most ~7 MiB; SST-2 and 3,000 SQuAD questions hold
# ~11,500): past this, a word not seen yet is split without being kept
MAX_WORDS = 32_768
_PROBES = (
    ("Hello, World! It's 3.14 o'clock -- e-mail: a.b@c.org, https://x.y/z?q=1&r=2#s", None),
    ("Tabs\tand\nnew lines\r\nand   spaces; unaffable CamelCase_with_underscores", "A PAIR: (with) {braces}"),
    ("MiXeD CaSe 1,000,000 $5.99 50% #hash ~`^|\\/<>=+*", "supercalifragilisticexpialidocious" * 4),
    ("", None),
    ("", "only the second"),
)


class TokenIds:
    """What a task that never maps a token back to the text needs of an encoding."""

    __slots__ = ("ids", "type_ids")

    def __init__(self, ids: list[int], type_ids: list[int]) -> None:
        self.ids = ids
        self.type_ids = type_ids


class _Template:
    """The special tokens around one text (or a pair) and every token's segment, as the post-processor adds them."""

    def __init__(self, tokenizer: Tokenizer, first: str, second: str | None) -> None:
        encoding = tokenizer.encode(first, second)
        ids, types = encoding.ids, encoding.type_ids
        self.ids: list[list[int]] = []  # the special tokens before, between and after the parts
        self.types: list[list[int]] = []  # their segments
        self.part_types: list[int] = []  # each part's segment
        start = 0
        for text in (first,) if second is None else (first, second):
            part = tokenizer.encode(text, add_special_tokens=False).ids
            at = _find(ids, part, start)
            if not part or len(set(types[at : at + len(part)])) != 1:
                raise ValueError("a probe's part is not of one segment")
            self.ids.append(ids[start:at])
            self.types.append(types[start:at])
            self.part_types.append(types[at])
            start = at + len(part)
        self.ids.append(ids[start:])
        self.types.append(types[start:])


def _find(ids: list[int], part: list[int], start: int) -> int:
    for at in range(start, len(ids) - len(part) + 1):
        if ids[at : at + len(part)] == part:
            return at
    raise ValueError("a probe's tokens are not in its encoding")


class PlainWordPiece:
    """Ids and type ids of plain ASCII text (or pairs), equal to the tokenizer's, for one tokenizer."""

    def __init__(self, tokenizer: Tokenizer, lowercase: bool, added: Sequence[str]) -> None:
        self._model = tokenizer.model
        self._lowercase = lowercase
        self._added = tuple(content.lower() for content in added)
        self._words: dict[str, tuple[int, ...]] = {}
        self._single = _Template(tokenizer, "probe words", None)
        self._pair = _Template(tokenizer, "first probe", "second probe")

    @classmethod
    def of(cls, tokenizer_json: str, tokenizer: Tokenizer, lowercase: bool) -> PlainWordPiece | None:
        """The fast path for this tokenizer (an untruncated, unpadded one), None where it is not a BERT pipeline
        or its probes do not come out alike."""
        described = json.loads(tokenizer_json)
        model, pre_tokenizer = described.get("model") or {}, described.get("pre_tokenizer") or {}
        if model.get("type") != "WordPiece" or pre_tokenizer.get("type") != "BertPreTokenizer":
            return None
        added = [token["content"] for token in described.get("added_tokens") or []]
        try:
            plain = cls(tokenizer, lowercase, added)
        except ValueError:
            return None
        for text, pair in _PROBES:
            encoding, ids = tokenizer.encode(text, pair), plain.ids(text, pair)
            if ids is None or (ids.ids, ids.type_ids) != (encoding.ids, encoding.type_ids):
                return None
        plain._words.clear()  # the probes' words are no corpus's
        return plain

    @property
    def words_remembered(self) -> int:
        return len(self._words)

    def ids(self, text: str, pair: str | None = None) -> TokenIds | None:
        """The encoding's ids and type ids of plain ASCII text (the caller's check), None where the library must
        encode it (an added token's content in it)."""
        lowered = text.lower()
        lowered_pair = None if pair is None else pair.lower()
        for content in self._added:  # matched without regard to case: "[sep]" falls back too, to be sure
            if content in lowered or (lowered_pair is not None and content in lowered_pair):
                return None
        if self._lowercase:
            text, pair = lowered, lowered_pair
        template = self._single if pair is None else self._pair
        ids = list(template.ids[0])
        types = list(template.types[0])
        for index, part in enumerate((text,) if pair is None else (text, pair)):
            start = len(ids)
            self._extend(ids, part)
            types += [template.part_types[index]] * (len(ids) - start)
            ids += template.ids[index + 1]
            types += template.types[index + 1]
        return TokenIds(ids, types)

    def _extend(self, ids: list[int], text: str) -> None:
        words = self._words
        for word in _WORDS.findall(text):
            pieces = words.get(word)
            if pieces is None:
                pieces = tuple([token.id for token in self._model.tokenize(word)])
                if len(words) < MAX_WORDS:
                    words[word] = pieces
            ids += pieces
