"""What a task hands the engine: model input rows of token ids, one per sequence or window."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np


class Encoded(Protocol):
    """What a row is made of: a tokenizer's encoding, or what a task makes without it (`bertcore.plain_wordpiece`)."""

    @property
    def ids(self) -> list[int]: ...

    @property
    def type_ids(self) -> list[int]: ...


class ArrayTypes:
    """An encoding that makes its type ids as an int64 array itself (`bertcore.plain_wordpiece`'s, whose segments
    are runs): one numpy call, where converting a list of Python ints cost ~4 µs a 150-token pair."""

    __slots__ = ()

    def type_array(self) -> np.ndarray:
        raise NotImplementedError


@dataclass(slots=True, eq=False)
class Row:
    """One model input row, unpadded. The attention mask is all ones over `input_ids`; the batcher pads.

    Not frozen, though nothing changes a row once made: the engine makes one per row it is sent, tens of thousands
    a second, and a frozen dataclass's `__init__` (`object.__setattr__` per field) cost 2.5x a plain one's (475
    against 194 ns). Compared by identity: equality of arrays is not one truth value."""

    input_ids: np.ndarray  # int64, shape (length,)
    token_type_ids: np.ndarray  # int64, shape (length,)

    @classmethod
    def from_encoding(cls, encoding: Encoded) -> Row:
        if isinstance(encoding, ArrayTypes):
            return cls(np.asarray(encoding.ids, dtype=np.int64), encoding.type_array())
        return cls(np.asarray(encoding.ids, dtype=np.int64), np.asarray(encoding.type_ids, dtype=np.int64))

    def __len__(self) -> int:
        return len(self.input_ids)
