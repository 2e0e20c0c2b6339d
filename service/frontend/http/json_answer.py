"""The JSON body of an inference answer, rendered by orjson.

The standard library's encoder writes a float through Python's `repr`, one call per number: an embedding of 384
floats took ~170 µs to render (a 16-input request's answer ~2.6 ms, more than the rest of the front-end's work on
it), a 16-input NER answer ~41 µs. orjson writes the same JSON in C, ~15-20x faster, and each number is the same
value: both write the shortest text that reads back to the very same double. The text differs in one way only,
numbers under 1e-4 written as `0.00001` or `1.5e-7` where `repr` writes `1e-05` and `1.5e-07`: the same values
to every JSON parser.

Everything else is as Starlette's JSONResponse renders it: UTF-8 without escapes, no spaces, keys in order. Where
orjson would answer differently, the standard library renders the body instead: orjson writes NaN and the
infinities as `null` where the server refuses them (an error, as before), and refuses what the standard library
takes (integers past 64 bits). Answers that hold `null` (or the word in a string) take that slower path; the
inference answers hold none.
"""

from __future__ import annotations

from typing import Any

import orjson
from starlette.responses import JSONResponse


class JsonAnswer(JSONResponse):
    def render(self, content: Any) -> bytes:
        try:
            body = orjson.dumps(content)
        except orjson.JSONEncodeError:  # what orjson cannot write: the standard library's answer (or its error)
            return super().render(content)
        if b"null" in body:  # a NaN or an infinity, written as null: refused by the standard library, as before
            return super().render(content)
        return body
