"""What a task hands the engine: model input rows of token ids, one per sequence or window."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # the engine takes rows and never loads a tokenizer
    from tokenizers import Encoding


@dataclass(frozen=True)
class Row:
    """One model input row, unpadded. The attention mask is all ones over `input_ids`; the batcher pads."""

    input_ids: np.ndarray  # int64, shape (length,)
    token_type_ids: np.ndarray  # int64, shape (length,)

    @classmethod
    def from_encoding(cls, encoding: Encoding) -> Row:
        return cls(np.asarray(encoding.ids, dtype=np.int64), np.asarray(encoding.type_ids, dtype=np.int64))

    def __len__(self) -> int:
        return len(self.input_ids)
