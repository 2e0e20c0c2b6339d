"""Repository entries made to fail the way real ones do, for the tests of what the server does then."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper
from tokenizers import Tokenizer


def poison_word(entry: Path, avoid: str) -> tuple[int, str]:
    """A whole word of the entry's vocabulary, not among `avoid`'s tokens (texts that must stay finite): its id and
    text. The text alone encodes to that one id between the special tokens."""
    tokenizer = Tokenizer.from_file(str(entry / "tokenizer.json"))
    avoided = set(tokenizer.encode(avoid).ids)
    for token_id in range(tokenizer.get_vocab_size()):
        word = tokenizer.id_to_token(token_id)
        if word and word.isalpha() and word.islower() and token_id not in avoided:
            ids = tokenizer.encode(word).ids
            if ids.count(token_id) == 1 and len(ids) <= 3:
                return token_id, word
    raise AssertionError(f"no whole word in {entry}'s vocabulary")


def poisoned_copy(entry: Path, destination: Path, token_id: int) -> Path:
    """The entry with one token's embedding set to infinity in its fp32 graph, a stand-in for a graph that overflows
    on some inputs (an fp16 variant where fp32 does not): every row holding that token answers NaN, every other row
    as before."""
    shutil.copytree(entry, destination)
    path = destination / "model.fp32.onnx"
    model = onnx.load(str(path))
    table = next(t for t in model.graph.initializer if t.name.endswith("word_embeddings.weight"))
    values = numpy_helper.to_array(table).copy()
    values[token_id] = np.inf
    table.CopyFrom(numpy_helper.from_array(values, table.name))
    onnx.save(model, str(path))
    return destination
