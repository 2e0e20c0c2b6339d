"""The wire between front-end processes and an engine process: length-prefixed frames over a unix socket.

A frame is `!BII` (kind, head length, body length), a head, and a body of raw arrays back to back. Token ids and
logits travel as arrays, never as per-token Python objects.

- Kind JSON: the head is a JSON object; its `arrays` lists each array's name, dtype and shape.
- Kinds INFER and RESULT, a request and its answer, thousands a second: the head is packed binary (fixed fields,
  then strings, row lengths and the arrays' descriptions), because JSON of those fields was a tenth of the engine's
  CPU per 1-input request. They decode to the same header dicts as JSON would, and carry exactly the fields below.

Front-end -> engine:
  {"op": "infer", "id": N, "model": NAME, "timeout": SECONDS, "lengths": [...], "request_id": TEXT | None,
   "trace": [TRACE_ID, SPAN_ID, FLAGS] | None}
      + input_ids, token_type_ids (every row's tokens concatenated; `lengths` cuts them apart); `trace`: the
      request's span (sampled) that its time in the engine belongs to, as W3C trace context's three fields
  {"op": "cancel", "id": N}   the client went away: drop the rows not run yet
  {"op": "use", "model": NAME, "versions": [...]}   the versions of a model this front-end still uses: the one it
      serves and older ones its requests in flight hold (the engine closes a version no front-end uses)
  {"op": "reject", "model": NAME, "version": V, "reason": TEXT}   this front-end cannot serve that version (its
      self-test failed): the version before keeps serving
  {"op": "control", "id": N, "action": "load" | "unload" | "index", "model": NAME}   an admin call
  An infer frame's model is NAME@VERSION: the version its front-end tokenized for, served while it is open.
Engine -> front-end:
  {"op": "state", "ready": BOOL, "models": {NAME: {...}}}   on connect and whenever a model's state changes
  {"op": "beat"}   every 0.2 s: the engine's event loop runs (a front-end that hears nothing calls it silent)
  {"op": "result", "id": N, "per_token": BOOL, "timings": {"queue_s": S, "inference_s": S, "inference_calls": N}}
      + one array per output: (rows, labels) for a classification model, per-token outputs with every row's
      tokens concatenated (lengths as sent)
  {"op": "error", "id": N, "kind": CLASS, "message": TEXT, "field": FIELD}   a domain error, re-raised as such
  {"op": "done", "id": N, "result": {...}}   a control call's answer
"""

from __future__ import annotations

import asyncio
import functools
import json
import math
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from service import errors

PREFIX = struct.Struct("!BII")
JSON, INFER, RESULT = 0, 1, 2
MAX_HEADER = 16 * 1024 * 1024
MAX_BODY = 1024 * 1024 * 1024
INFER_HEAD = struct.Struct("!QdIHH?")  # id, timeout, rows, model name bytes, request id bytes (NO_REQUEST_ID: none),
# traced; then the model name, the request id, the trace context (TRACE, where traced) and the rows' lengths; the body:
# input ids, then token types
TRACE = struct.Struct("!QQQB")  # trace id (high, low 64 bits), span id, flags
RESULT_HEAD = struct.Struct("!QddI?")  # id, queue_s, inference_s, inference_calls, per_token
ARRAY_HEAD = struct.Struct("!BBB")  # name bytes, dtype bytes, dimensions; then name, dtype and `!Q` per dimension
NO_REQUEST_ID = 0xFFFF
LENGTHS, INFER_IDS, INFER_TYPES = np.dtype("<u4"), np.dtype("<i4"), np.dtype("u1")
MAX_DESCRIBED = 4096  # array descriptions remembered, each way (a model's outputs at each row count)
MAX_NAME = 0xFFFE  # model names and request ids are shorter than this by far: the front-end bounds both


@dataclass
class Frame:
    header: dict[str, Any]
    arrays: dict[str, np.ndarray] = field(default_factory=dict)


def encode(header: dict[str, Any], arrays: dict[str, np.ndarray] | None = None) -> bytes:
    """Any frame from its header dict: infer and result frames packed binary, the others as JSON."""
    arrays = arrays or {}
    op = header.get("op")
    if op == "infer":
        return encode_infer(
            int(header["id"]),
            str(header["model"]),
            float(header["timeout"]),
            header["lengths"],
            header.get("request_id"),
            arrays,
            header.get("trace"),
        )
    if op == "result":
        timings = header.get("timings", {})
        return encode_result(
            int(header["id"]),
            bool(header.get("per_token")),
            float(timings.get("queue_s", 0.0)),
            float(timings.get("inference_s", 0.0)),
            int(timings.get("inference_calls", 0)),
            arrays,
        )
    contiguous = {name: np.ascontiguousarray(array) for name, array in arrays.items()}
    described = {**header, "arrays": [[name, a.dtype.str, list(a.shape)] for name, a in contiguous.items()]}
    return _frame(JSON, json.dumps(described, separators=(",", ":")).encode(), contiguous)


def encode_infer(
    request_id: int,
    model: str,
    timeout: float,
    lengths: list[int],
    http_request_id: str | None,
    arrays: dict[str, np.ndarray],
    trace: Sequence[int] | None = None,
) -> bytes:
    """The rows as `pack_rows` gives them: the body is every row's input ids (int32), then their token types
    (uint8), so the head describes no arrays."""
    name = _short(model.encode(), "model name")
    rid = b"" if http_request_id is None else _short(http_request_id.encode(), "request id")
    rid_bytes = NO_REQUEST_ID if http_request_id is None else len(rid)
    head = INFER_HEAD.pack(request_id, timeout, len(lengths), len(name), rid_bytes, trace is not None)
    if trace is not None:
        trace_id, span_id, flags = trace
        rid += TRACE.pack(trace_id >> 64, trace_id & 0xFFFFFFFFFFFFFFFF, span_id, flags)
    ids = np.ascontiguousarray(arrays["input_ids"], INFER_IDS)
    types = np.ascontiguousarray(arrays["token_type_ids"], INFER_TYPES)
    total = sum(lengths)
    if ids.ndim != 1 or ids.shape != types.shape or len(ids) != total:
        raise ValueError(f"rows of {total} tokens in all, arrays of {ids.shape} and {types.shape}")
    lengths_bytes = np.asarray(lengths, LENGTHS).tobytes()
    body = ids.tobytes() + types.tobytes()
    return b"".join(
        (
            PREFIX.pack(INFER, len(head) + len(name) + len(rid) + len(lengths_bytes), len(body)),
            head,
            name,
            rid,
            lengths_bytes,
            body,
        )
    )


def encode_result(
    request_id: int,
    per_token: bool,
    queue_s: float,
    inference_s: float,
    inference_calls: int,
    arrays: dict[str, np.ndarray],
) -> bytes:
    return _binary(RESULT, [RESULT_HEAD.pack(request_id, queue_s, inference_s, inference_calls, per_token)], arrays)


def _short(text: bytes, what: str) -> bytes:
    if len(text) > MAX_NAME:
        raise ValueError(f"{what} too long for a frame ({len(text)} bytes)")
    return text


def _binary(kind: int, head: list[bytes], arrays: dict[str, np.ndarray]) -> bytes:
    contiguous = {name: np.ascontiguousarray(array) for name, array in arrays.items()}
    head.append(bytes((len(contiguous),)))
    head += [_description(name, array.dtype, array.shape) for name, array in contiguous.items()]
    return _frame(kind, b"".join(head), contiguous)


@functools.lru_cache(maxsize=MAX_DESCRIBED)
def _description(name: str, dtype: np.dtype, shape: tuple[int, ...]) -> bytes:
    """One array's description in a binary head (the same few, over and over: a model's outputs)."""
    encoded, dtype_str = name.encode(), dtype.str.encode()
    return (
        ARRAY_HEAD.pack(len(encoded), len(dtype_str), len(shape))
        + encoded
        + dtype_str
        + struct.pack(f"!{len(shape)}Q", *shape)
    )


def _frame(kind: int, head: bytes, arrays: dict[str, np.ndarray]) -> bytes:
    body = [array.tobytes() for array in arrays.values()]
    return b"".join([PREFIX.pack(kind, len(head), sum(map(len, body))), head, *body])


async def read_frame(reader: asyncio.StreamReader) -> Frame:
    """The next frame; asyncio.IncompleteReadError at the end of the stream, ValueError for one that cannot be
    decoded."""
    kind, head_length, body_length = PREFIX.unpack(await reader.readexactly(PREFIX.size))
    if head_length > MAX_HEADER or body_length > MAX_BODY:
        raise ValueError(f"frame too large ({head_length} + {body_length} bytes)")
    return _decode(kind, await reader.readexactly(head_length + body_length), head_length)


def decode(frame: bytes) -> Frame:
    """One whole frame, prefix included (what `encode` made)."""
    kind, head_length, body_length = PREFIX.unpack_from(frame)
    if len(frame) != PREFIX.size + head_length + body_length:
        raise ValueError(f"frame of {len(frame)} bytes, its prefix says {PREFIX.size + head_length + body_length}")
    return _decode(kind, frame[PREFIX.size :], head_length)


def _decode(kind: int, data: bytes, head_length: int) -> Frame:
    decoder = _DECODERS.get(kind)
    if decoder is None:
        raise ValueError(f"unknown frame kind {kind}")
    try:
        return decoder(data, head_length)
    except (struct.error, IndexError) as exc:  # a head shorter than its own fields say
        raise ValueError(f"a frame that cannot be decoded: {exc}") from None


def _decode_json(data: bytes, head_length: int) -> Frame:
    header = json.loads(data[:head_length])
    if not isinstance(header, dict):
        raise ValueError("a JSON frame's head is not an object")
    described = [(str(name), np.dtype(dtype), tuple(shape)) for name, dtype, shape in header.pop("arrays", [])]
    return Frame(header, _arrays(described, data, head_length))


def _decode_infer(data: bytes, head_length: int) -> Frame:
    request_id, timeout, rows, name_bytes, rid_bytes, traced = INFER_HEAD.unpack_from(data)
    at = INFER_HEAD.size
    model = data[at : at + name_bytes].decode()
    at += name_bytes
    http_request_id = None
    if rid_bytes != NO_REQUEST_ID:
        http_request_id = data[at : at + rid_bytes].decode()
        at += rid_bytes
    trace = None
    if traced:
        high, low, span_id, flags = TRACE.unpack_from(data, at)
        trace = [high << 64 | low, span_id, flags]
        at += TRACE.size
    lengths = np.frombuffer(data, LENGTHS, rows, at).tolist()
    total = sum(lengths)
    if at + 4 * rows != head_length or len(data) != head_length + 5 * total:
        raise ValueError(f"an infer frame's head or body does not hold its {rows} rows of {total} tokens")
    arrays: dict[str, np.ndarray] = {
        "input_ids": np.frombuffer(data, INFER_IDS, total, head_length),
        "token_type_ids": np.frombuffer(data, INFER_TYPES, total, head_length + 4 * total),
    }
    header = {
        "op": "infer",
        "id": request_id,
        "model": model,
        "timeout": timeout,
        "lengths": lengths,
        "request_id": http_request_id,
        "trace": trace,
    }
    return Frame(header, arrays)


def _decode_result(data: bytes, head_length: int) -> Frame:
    request_id, queue_s, inference_s, calls, per_token = RESULT_HEAD.unpack_from(data)
    timings = {"queue_s": queue_s, "inference_s": inference_s, "inference_calls": calls}
    header = {"op": "result", "id": request_id, "per_token": per_token, "timings": timings}
    return Frame(header, _arrays(_described(data, RESULT_HEAD.size, head_length), data, head_length))


def _described(data: bytes, at: int, head_length: int) -> tuple[tuple[str, np.dtype, tuple[int, ...]], ...]:
    """The arrays' descriptions that a binary head ends with (from `at` to the head's end)."""
    return _parse_descriptions(data[at:head_length])


@functools.lru_cache(maxsize=MAX_DESCRIBED)
def _parse_descriptions(descriptions: bytes) -> tuple[tuple[str, np.dtype, tuple[int, ...]], ...]:
    """Results of one model and row count describe their arrays alike, byte for byte: parsed once (`_description`
    is the other direction). A description that cannot be parsed raises, and nothing is remembered."""
    count, at = descriptions[0], 1
    described = []
    for _ in range(count):
        name_bytes, dtype_bytes, dims = ARRAY_HEAD.unpack_from(descriptions, at)
        at += ARRAY_HEAD.size
        name = descriptions[at : at + name_bytes].decode()
        at += name_bytes
        dtype = np.dtype(descriptions[at : at + dtype_bytes].decode())
        at += dtype_bytes
        shape = struct.unpack_from(f"!{dims}Q", descriptions, at)
        at += 8 * dims
        described.append((name, dtype, shape))
    if at != len(descriptions):
        raise ValueError(f"a frame's head has {len(descriptions) - at} bytes past its last field")
    return tuple(described)


def _arrays(
    described: Sequence[tuple[str, np.dtype, tuple[int, ...]]], data: bytes, offset: int
) -> dict[str, np.ndarray]:
    """Views of the body (read-only, no copy), one per description; the body must hold exactly those."""
    arrays = {}
    for name, array_type, shape in described:
        count = math.prod(shape)
        arrays[name] = np.frombuffer(data, array_type, count, offset).reshape(shape)
        offset += count * array_type.itemsize
    if offset != len(data):
        raise ValueError(f"a frame's body has {len(data) - offset} bytes past its arrays")
    return arrays


_DECODERS: dict[int, Callable[[bytes, int], Frame]] = {JSON: _decode_json, INFER: _decode_infer, RESULT: _decode_result}


class FrameWriter:
    """Frames written during one event-loop turn leave in one write: at thousands of requests a second, one
    syscall (and one wake-up of the process at the other end) per turn rather than one per frame."""

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self._writer = writer
        self._frames: list[bytes] = []

    def write(self, frame: bytes) -> None:
        if not self._frames:
            asyncio.get_running_loop().call_soon(self._flush)
        self._frames.append(frame)

    def _flush(self) -> None:
        frames, self._frames = self._frames, []
        if not self._writer.is_closing():
            self._writer.writelines(frames)

    def is_closing(self) -> bool:
        return self._writer.is_closing()

    def close(self) -> None:
        self._flush()
        self._writer.close()


def pack_rows(input_ids: list[np.ndarray], token_type_ids: list[np.ndarray]) -> dict[str, np.ndarray]:
    """Rows as two flat arrays (int32 ids, uint8 segments); the lengths travel in the header."""
    return {
        "input_ids": np.concatenate(input_ids).astype(INFER_IDS, copy=False),
        "token_type_ids": np.concatenate(token_type_ids).astype(INFER_TYPES, copy=False),
    }


def split_rows(flat: np.ndarray, lengths: list[int]) -> list[np.ndarray]:
    """Views of `flat`, one per length. Plain slices: np.split costs ~20x more, and the engine does this for
    every request (it was a fifth of the engine's main thread at 2k requests/s)."""
    rows, start = [], 0
    for length in lengths:
        rows.append(flat[start : start + length])
        start += length
    return rows


def pack_outputs(outputs: list[dict[str, np.ndarray]], per_token: bool) -> dict[str, np.ndarray]:
    """Per-row outputs as one array per output name: stacked rows, or every row's tokens concatenated."""
    if not outputs:
        return {}
    if len(outputs) == 1:  # most requests under 1-input load: a view, where np.stack copies
        only = outputs[0]
        return dict(only) if per_token else {name: array[np.newaxis] for name, array in only.items()}
    if per_token:
        return {name: np.concatenate([row[name] for row in outputs]) for name in outputs[0]}
    # np.array of equal-shaped rows is np.stack's result (a new array, their dtype) in one C call: np.stack's own
    # Python (shape checks, a view per row) was ~5x the cost, paid for every request the engine answers
    return {name: np.array([row[name] for row in outputs]) for name in outputs[0]}


def unpack_outputs(arrays: dict[str, np.ndarray], lengths: list[int], per_token: bool) -> list[dict[str, np.ndarray]]:
    if per_token:
        split = {name: split_rows(array, lengths) for name, array in arrays.items()}
        return [{name: parts[i] for name, parts in split.items()} for i in range(len(lengths))]
    return [{name: array[i] for name, array in arrays.items()} for i in range(len(lengths))]


def error_header(request_id: int, exc: errors.ServiceError) -> dict[str, Any]:
    header = {"op": "error", "id": request_id, "kind": type(exc).__name__, "message": exc.message, "field": exc.field}
    if "Retry-After" in exc.headers:
        header["retry_after"] = exc.headers["Retry-After"]
    return header


def raise_error(header: dict[str, Any]) -> None:
    """Re-raise an engine's domain error in the front-end, as the same class (a generic 500 if unknown)."""
    kind = getattr(errors, str(header.get("kind")), None)
    if not (isinstance(kind, type) and issubclass(kind, errors.ServiceError)):
        raise errors.InferenceFailed("inference failed for this request")
    message = str(header.get("message", ""))
    if issubclass(kind, errors.Overloaded):
        retry_after = str(header.get("retry_after", "1"))
        raise kind(message, retry_after_s=int(retry_after) if retry_after.isdigit() else 1)
    if issubclass(kind, errors.NotReady):
        raise kind(message)
    raise kind(message, field=header.get("field"))
