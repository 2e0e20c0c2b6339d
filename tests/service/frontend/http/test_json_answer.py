"""JsonAnswer: orjson's bytes where they read as the standard library's, the standard library's answer elsewhere."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from fastapi.responses import JSONResponse

from service.frontend.http.json_answer import JsonAnswer


def stdlib(content: object) -> bytes:
    return JSONResponse(content).body


def test_an_answer_reads_back_as_the_same_values_and_the_same_text_where_no_number_is_under_1e_4() -> None:
    vector = np.random.default_rng(0).standard_normal(384).astype(np.float32)
    content = {
        "model": "m",
        "results": [
            [{"label": "POSITIVE", "score": 0.9987654321}, {"label": "NEGATIVE", "score": 0.0012345678}],
            [{"entity_group": "PER", "word": "Zoë Ünal 東京 🙂", "start": 0, "end": 9, "score": 1.0}],
        ],
        "data": [{"object": "embedding", "index": 0, "embedding": (vector / np.linalg.norm(vector)).tolist()}],
        "flags": [True, False],
        "big": 2**63 - 1,
        "quote": 'a "quoted" \\ line\nbreak\ttab',
    }
    body = JsonAnswer(content).body
    assert body == stdlib(content)  # no number under 1e-4 here: the very same bytes
    assert json.loads(body) == content


def test_small_numbers_are_written_differently_but_read_back_to_the_same_doubles() -> None:
    values = [1e-05, 1.5e-07, 3.0517578125e-05, 5e-324, 1e-300, -2.5e-10]
    content = {"scores": values}
    body = JsonAnswer(content).body
    assert body != stdlib(content)
    assert body.isascii() and b"e-05" not in body
    parsed = json.loads(body)["scores"]
    assert [x.hex() for x in parsed] == [x.hex() for x in values]  # bit for bit


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_nan_and_the_infinities_are_refused_as_before(value: float) -> None:
    with pytest.raises(ValueError, match="Out of range float values are not JSON compliant"):
        JsonAnswer({"results": [{"score": value}]})
    with pytest.raises(ValueError, match="Out of range float values are not JSON compliant"):
        JSONResponse({"results": [{"score": value}]})


@pytest.mark.parametrize(
    "content",
    [
        {"id": None, "results": []},  # a real null: the standard library's bytes (they are the same)
        {"word": "nullify"},  # the word, in a string
        {"count": 2**64 + 1},  # past 64 bits: orjson refuses it, the standard library writes it
        {"nested": [[[[1, 2.5, "x"]]]]},
    ],
)
def test_what_orjson_would_answer_differently_is_the_standard_librarys_answer(content: object) -> None:
    assert JsonAnswer(content).body == stdlib(content)


def test_what_neither_can_write_is_an_error_as_before() -> None:
    with pytest.raises(TypeError):
        JSONResponse({"score": object()})
    with pytest.raises(TypeError):
        JsonAnswer({"score": object()})


def test_a_float32_array_is_written_as_float32_values_that_read_back_bit_for_bit() -> None:
    """An embedding as the pipeline hands it over: each value the shortest text of its float32 (TEI's form), far
    shorter than its double's repr; parsed and made float32 again, the very same vector."""
    rng = np.random.default_rng(1)
    vectors = [rng.standard_normal(384).astype(np.float32) / 20 for _ in range(3)]
    edge = np.array([0.1, 1e-5, 1e-45, -3.4028235e38, 0.0, -0.0, 1.0], dtype=np.float32)
    content = {"data": [{"index": i, "embedding": v} for i, v in enumerate([*vectors, edge])]}
    body = JsonAnswer(content).body
    parsed = json.loads(body)["data"]
    for written, vector in zip(parsed, [*vectors, edge], strict=True):
        assert np.array_equal(np.array(written["embedding"], dtype=np.float32).view(np.uint32), vector.view(np.uint32))
    assert b"[0.1,0.00001,1e-45,-3.4028235e+38,0.0,-0.0,1.0]" in body
    as_lists = stdlib({"data": [{"index": i, "embedding": v.tolist()} for i, v in enumerate(vectors)]})
    assert len(body) < 0.7 * len(as_lists)


def test_an_array_on_the_slow_path_is_the_standard_librarys_list_and_a_nan_in_one_is_refused() -> None:
    vector = np.array([0.5, 0.25], dtype=np.float32)
    assert JsonAnswer({"id": None, "embedding": vector}).body == b'{"id":null,"embedding":[0.5,0.25]}'
    assert JsonAnswer({"score": np.float64(0.5), "count": np.int64(3)}).body == b'{"score":0.5,"count":3}'
    with pytest.raises(ValueError, match="Out of range float values are not JSON compliant"):
        JsonAnswer({"embedding": np.array([0.5, np.nan], dtype=np.float32)})


def test_the_answer_is_json_with_its_length() -> None:
    response = JsonAnswer({"results": [1]}, headers={"x-rows": "1"})
    headers = dict(response.raw_headers)
    assert headers[b"content-type"] == b"application/json"
    assert headers[b"content-length"] == str(len(response.body)).encode()
    assert headers[b"x-rows"] == b"1"


def test_a_lone_surrogate_a_client_sent_is_echoed_escaped_as_it_came() -> None:
    """UTF-8 cannot carry it (the answer was a 500); JSON's escape can, and reads back to the same string."""
    content = {"documents": [{"text": "x", "meta": "\ud800"}], "score": 0.5}
    body = JsonAnswer(content).body
    assert b"\\ud800" in body and json.loads(body) == content
