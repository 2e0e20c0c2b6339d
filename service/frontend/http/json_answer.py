"""The JSON body of an inference answer, rendered by orjson.

The standard library's encoder writes a float through Python's `repr`, one call per number: an embedding of 384
floats took ~170 µs to render (a 16-input request's answer ~2.6 ms, more than the rest of the front-end's work on
it), a 16-input NER answer ~41 µs. orjson writes the same JSON in C, ~15-20x faster, and each number is the same
value: both write the shortest text that reads back to the very same double. The text differs in one way only,
numbers under 1e-4 written as `0.00001` or `1.5e-7` where `repr` writes `1e-05` and `1.5e-07`: the same values
to every JSON parser.

numpy arrays (embeddings' vectors) are written as they are, with no Python float per value: a float32 value as the
shortest text that reads back to the same float32 (`0.1`, where its double's `repr` is `0.10000000149011612`), as
TEI writes its vectors; read as float32, the very same vector, in ~40% fewer bytes.

Everything else is as Starlette's JSONResponse renders it: UTF-8 without escapes, no spaces, keys in order. Where
orjson would answer differently, the standard library renders the body instead: orjson writes NaN and the
infinities as `null` where the server refuses them (an error, as before), and refuses what the standard library
takes (integers past 64 bits). Answers that hold `null` (or the word in a string) take that slower path; the
inference answers hold none.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import orjson
from starlette.responses import JSONResponse

OPTIONS = orjson.OPT_SERIALIZE_NUMPY


def plain(value: Any) -> Any:
    """What the standard library's encoder cannot write but an answer may hold: numpy's arrays and numbers, as lists
    and Python numbers (its `default`)."""
    if isinstance(value, np.ndarray | np.generic):
        return value.tolist()
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def stdlib_json(content: Any, allow_nan: bool = False) -> bytes:
    """`content` as Starlette's JSONResponse writes it, numpy's values as lists and Python numbers; `allow_nan`
    writes NaN and the infinities as `NaN` and `Infinity` where they are refused by default. A string that UTF-8
    cannot carry (a lone surrogate, which JSON's escapes can: a client's echoed value) is written escaped, as the
    client sent it."""

    def dumps(ascii_only: bool) -> str:
        return json.dumps(
            content, ensure_ascii=ascii_only, allow_nan=allow_nan, indent=None, separators=(",", ":"), default=plain
        )

    try:
        return dumps(ascii_only=False).encode("utf-8")
    except UnicodeEncodeError:
        return dumps(ascii_only=True).encode("ascii")


class JsonAnswer(JSONResponse):
    def render(self, content: Any) -> bytes:
        try:
            body = orjson.dumps(content, option=OPTIONS)
        except orjson.JSONEncodeError:  # what orjson cannot write: the standard library's answer (or its error)
            return stdlib_json(content)
        if b"null" in body:  # a NaN or an infinity, written as null: refused by the standard library, as before
            return stdlib_json(content)
        return body
