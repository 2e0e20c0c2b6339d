"""The frames between front-ends and the engine: every kind round-trips, and bytes that are not a frame are refused
with ValueError (the engine then closes that one connection), never half-read or misread as another frame."""

from __future__ import annotations

import asyncio
import struct

import numpy as np
import pytest

from service.wire import frames


def read_all(data: bytes, chunk: int | None = None) -> list[frames.Frame]:
    """The frames in `data` through a real asyncio StreamReader, fed whole or `chunk` bytes at a time."""

    async def main() -> list[frames.Frame]:
        reader = asyncio.StreamReader()
        step = chunk or len(data) or 1
        for at in range(0, len(data), step):
            reader.feed_data(data[at : at + step])
        reader.feed_eof()
        found = []
        while True:
            try:
                found.append(await frames.read_frame(reader))
            except asyncio.IncompleteReadError:
                return found

    return asyncio.run(main())


def rows(*lengths: int) -> dict[str, np.ndarray]:
    return frames.pack_rows(
        [np.arange(100, 100 + n, dtype=np.int64) for n in lengths], [np.arange(n) % 2 for n in lengths]
    )


def test_an_infer_frame_carries_its_rows_lengths_and_ids() -> None:
    arrays = rows(3, 1, 4)
    frame = frames.encode_infer(7, "bert-classification", 2.5, [3, 1, 4], "req-ü", arrays)
    (got,) = read_all(frame, chunk=3)
    assert got.header == {
        "op": "infer",
        "id": 7,
        "model": "bert-classification",
        "timeout": 2.5,
        "lengths": [3, 1, 4],
        "request_id": "req-ü",
        "trace": None,
    }
    assert got.arrays["input_ids"].dtype == np.int32 and got.arrays["token_type_ids"].dtype == np.uint8
    assert got.arrays["input_ids"].tolist() == [100, 101, 102, 100, 100, 101, 102, 103]
    assert got.arrays["token_type_ids"].tolist() == [0, 1, 0, 0, 0, 1, 0, 1]
    ids = frames.split_rows(got.arrays["input_ids"], got.header["lengths"])
    assert [row.tolist() for row in ids] == [[100, 101, 102], [100], [100, 101, 102, 103]]


def test_an_infer_frame_carries_its_requests_trace_context() -> None:
    trace = [0x4BF92F3577B34DA6A3CE929D0E0E4736, 0x00F067AA0BA902B7, 1]  # 128-bit trace id, 64-bit span id, flags
    frame = frames.encode_infer(9, "m", 1.0, [2, 3], "r", rows(2, 3), trace)
    (got,) = read_all(frame, chunk=5)
    assert got.header["trace"] == trace and got.header["request_id"] == "r" and got.header["lengths"] == [2, 3]
    assert got.arrays["input_ids"].tolist() == [100, 101, 100, 101, 102]
    header = {"op": "infer", "id": 9, "model": "m", "timeout": 1.0, "lengths": [2, 3], "request_id": "r"}
    header["trace"] = trace
    assert frames.encode(header, rows(2, 3)) == frame


def test_the_header_dict_form_encodes_the_same_frames() -> None:
    arrays = rows(2, 5)
    header = {"op": "infer", "id": 3, "model": "m", "timeout": 1.0, "lengths": [2, 5]}  # no request id: None
    assert frames.encode(header, arrays) == frames.encode_infer(3, "m", 1.0, [2, 5], None, arrays)
    assert frames.decode(frames.encode(header, arrays)).header["request_id"] is None
    logits = {"logits": np.ones((2, 3), np.float32)}
    timings = {"queue_s": 0.25, "inference_s": 0.5, "inference_calls": 2}
    result = {"op": "result", "id": 3, "per_token": False, "timings": timings}
    assert frames.encode(result, logits) == frames.encode_result(3, False, 0.25, 0.5, 2, logits)
    assert frames.decode(frames.encode(result, logits)).header == result


def test_results_of_every_shape_decode_as_sent_one_after_another() -> None:
    """Result heads' array descriptions are remembered between frames: a frame must never be read with another
    frame's shapes (same names, other row counts; per-token outputs of other lengths; other dtypes)."""
    sent = [
        {"logits": np.arange(2, dtype=np.float32).reshape(1, 2)},
        {"logits": np.arange(6, dtype=np.float32).reshape(3, 2)},
        {"logits": np.arange(6, dtype=np.float16).reshape(3, 2)},
        {"start_logits": np.arange(7, dtype=np.float32), "end_logits": -np.arange(7, dtype=np.float32)},
        {"start_logits": np.arange(9, dtype=np.float32), "end_logits": -np.arange(9, dtype=np.float32)},
        {},
    ]
    data = b"".join(frames.encode_result(i, i >= 3, 0.0, 0.0, 1, arrays) for i, arrays in enumerate(sent * 2))
    found = read_all(data)
    assert len(found) == 2 * len(sent)
    for frame, arrays in zip(found, sent * 2, strict=True):
        assert frame.arrays.keys() == arrays.keys()
        for name, array in arrays.items():
            assert frame.arrays[name].dtype == array.dtype
            np.testing.assert_array_equal(frame.arrays[name], array)


def test_json_frames_keep_their_fields_and_arrays() -> None:
    state = {"op": "state", "ready": True, "models": {"m": {"status": "ready", "error": None}}}
    error = {"op": "error", "id": 9, "kind": "Overloaded", "message": "queue full", "field": None}
    extra = {"mask": np.array([[True, False]])}
    found = read_all(frames.encode(state) + frames.encode({"op": "beat"}) + frames.encode(error, extra))
    assert [f.header for f in found] == [state, {"op": "beat"}, error]
    assert found[2].arrays["mask"].tolist() == [[True, False]]


def test_pack_outputs_gives_one_array_per_output_for_one_row_or_many() -> None:
    one = [{"logits": np.array([1.0, 2.0], np.float32)}]
    assert frames.pack_outputs(one, per_token=False)["logits"].shape == (1, 2)
    many = [*one, {"logits": np.array([3.0, 4.0], np.float32)}]
    assert frames.pack_outputs(many, per_token=False)["logits"].tolist() == [[1, 2], [3, 4]]
    # rows as the engine hands them over (views of one batch's outputs, float16 on a GPU): np.stack's result, a copy
    batch = np.arange(12, dtype=np.float16).reshape(4, 3)
    rows = [{"logits": batch[i], "extra": batch[i, :2]} for i in (2, 0, 3)]
    packed = frames.pack_outputs(rows, per_token=False)
    for name in ("logits", "extra"):
        want = np.stack([row[name] for row in rows])
        assert packed[name].dtype == want.dtype and packed[name].shape == want.shape
        assert packed[name].tobytes() == want.tobytes() and not np.shares_memory(packed[name], batch)
    with pytest.raises(ValueError):  # rows of different shapes are an error, as np.stack made them
        frames.pack_outputs([{"x": np.zeros(2)}, {"x": np.zeros(3)}], per_token=False)
    tokens = [{"start": np.arange(3.0)}, {"start": np.arange(2.0)}]
    assert frames.pack_outputs(tokens[:1], per_token=True)["start"].tolist() == [0, 1, 2]
    packed = frames.pack_outputs(tokens, per_token=True)
    unpacked = frames.unpack_outputs(packed, [3, 2], per_token=True)
    assert [row["start"].tolist() for row in unpacked] == [[0, 1, 2], [0, 1]]


def test_rows_whose_arrays_disagree_with_their_lengths_are_not_sent() -> None:
    with pytest.raises(ValueError, match="tokens in all"):
        frames.encode_infer(1, "m", 1.0, [3, 3], None, rows(3, 2))


def infer_frame() -> bytes:
    return frames.encode_infer(1, "m", 1.0, [2, 3], "r", rows(2, 3))


def with_prefix(kind: int, head: bytes, body: bytes = b"") -> bytes:
    return frames.PREFIX.pack(kind, len(head), len(body)) + head + body


def lying_lengths() -> bytes:
    """An infer frame whose lengths say 2 + 4 tokens where the body holds 5."""
    frame = bytearray(infer_frame())
    head_start = frames.PREFIX.size + frames.INFER_HEAD.size + 1 + 1  # past the fixed head, "m", "r"
    struct.pack_into("<I", frame, head_start + 4, 4)
    return bytes(frame)


def result_with_a_byte_more() -> bytes:
    frame = frames.encode_result(1, False, 0.0, 0.0, 1, {"logits": np.zeros((1, 2), np.float32)})
    kind, head, body = frames.PREFIX.unpack_from(frame)
    return frames.PREFIX.pack(kind, head, body + 1) + frame[frames.PREFIX.size :] + b"\0"


HOSTILE: dict[str, tuple[bytes, str | None]] = {
    "unknown kind": (with_prefix(9, b"{}"), "unknown frame kind"),
    "too large": (frames.PREFIX.pack(frames.JSON, frames.MAX_HEADER + 1, 0), "too large"),
    "JSON head not an object": (with_prefix(frames.JSON, b"[1, 2]"), "not an object"),
    "JSON head not JSON": (with_prefix(frames.JSON, b"\xff{"), None),
    "JSON arrays past the body": (with_prefix(frames.JSON, b'{"arrays": [["a", "<f4", [4]]]}', b"\0" * 8), None),
    "binary head cut short": (with_prefix(frames.INFER, b"\0" * 5), "cannot be decoded"),
    "infer lengths that lie": (lying_lengths(), "does not hold"),
    "result body with a byte more": (result_with_a_byte_more(), "past its arrays"),
    "result head cut short": (with_prefix(frames.RESULT, frames.RESULT_HEAD.pack(1, 0, 0, 1, False)), None),
    "result array count past its head": (
        with_prefix(frames.RESULT, frames.RESULT_HEAD.pack(1, 0, 0, 1, False) + b"\x05"),
        "cannot be decoded",
    ),
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_bytes_that_are_not_a_frame_are_refused(name: str) -> None:
    data, message = HOSTILE[name]
    with pytest.raises(ValueError, match=message):
        read_all(data)
    with pytest.raises((ValueError, struct.error)):  # the whole-frame form too
        frames.decode(data)
