"""A model's tokenizer (tokenizer.json), safe to use from several threads at once.

`tokenizers.Tokenizer` keeps truncation settings on the object, and the tasks need different settings per
request (QA's max_seq_len and doc_stride, NER's window stride). Each thread gets its own copy, so setting
truncation for one call never races with another thread's encode.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from functools import cached_property
from pathlib import Path
from typing import Literal

from tokenizers import Encoding, Tokenizer

TruncationStrategy = Literal["longest_first", "only_first", "only_second"]
# A text (or pair) this short is encoded holding the GIL (`Tokenizer.encode`: tens of microseconds), not through
# `encode_batch`, which lets go of the GIL for longer work but costs more for one short text.
SHORT_CHARS = 1000


class TextTokenizer:
    def __init__(self, tokenizer_json: str, pad_token_id: int, padding_side: str = "right") -> None:
        """From the text of a tokenizer.json (the file, or a fast tokenizer's `backend_tokenizer.to_str()`).
        `padding_side`: the model's (model.json); "left" (XLNet) also puts a QA context before its question."""
        self._json = tokenizer_json
        self.padding_side = padding_side
        loaded = Tokenizer.from_str(self._json)  # fail at load time, not on the first request
        self.max_token_id = max(loaded.get_vocab(with_added_tokens=True).values(), default=-1)
        self.pad_token_id = pad_token_id
        self._local = threading.local()

    @classmethod
    def load(cls, path: Path, pad_token_id: int, padding_side: str = "right") -> TextTokenizer:
        return cls(path.read_text(encoding="utf-8"), pad_token_id, padding_side)

    def _tokenizer(self) -> Tokenizer:
        tokenizer = getattr(self._local, "tokenizer", None)
        if tokenizer is None:
            tokenizer = Tokenizer.from_str(self._json)
            tokenizer.no_padding()
            tokenizer.no_truncation()
            self._local.tokenizer = tokenizer
            self._local.truncation = None
        return tokenizer

    def _truncating(self, truncation: tuple[int, int, TruncationStrategy] | None) -> Tokenizer:
        """This thread's tokenizer, truncating as asked (max_length, stride, strategy) or not at all (None); set
        only where the thread's last call asked otherwise (most calls of a model ask the same)."""
        tokenizer = self._tokenizer()
        if self._local.truncation != truncation:
            if truncation is None:
                tokenizer.no_truncation()
            else:
                max_length, stride, strategy = truncation
                tokenizer.enable_truncation(max_length, stride=stride, strategy=strategy, direction="right")
            self._local.truncation = truncation
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
        tokenizer = self._truncating(None if max_length is None else (max_length, stride, strategy))
        encoding = tokenizer.encode(text, pair, add_special_tokens=add_special_tokens)
        return [encoding, *encoding.overflowing] if max_length is not None else [encoding]

    def encode_batch(self, items: Sequence[str | tuple[str, str]], offsets: bool = True) -> list[Encoding]:
        """Encode many texts (or pairs) at once, untruncated: one call into the tokenizers library, which lets
        go of the GIL while it works (`encode` holds it). `offsets=False`: the encodings' offsets may be left out
        (all (0, 0)), for tasks that never map a token back to the text (classification, rerank, embeddings): the
        same ids and type ids in ~17% less time (41.7 -> 34.5 µs an SST-2 sentence, one thread). A lone short text
        is still encoded holding the GIL, with its offsets: letting go of the GIL for tens of microseconds on the
        event loop would let another thread take it for up to a switch interval."""
        tokenizer = self._truncating(None)
        if len(items) == 1:  # one short text: `encode`, without the batch's machinery, costs ~15% less
            text, pair = (items[0], None) if isinstance(items[0], str) else items[0]
            if len(text) + len(pair or "") <= SHORT_CHARS:
                return [tokenizer.encode(text, pair)]
        return tokenizer.encode_batch(list(items)) if offsets else tokenizer.encode_batch_fast(list(items))

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
