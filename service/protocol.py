"""The wire between front-end processes and an engine process: length-prefixed frames over a unix socket.

A frame is `!II` (header length, body length), a JSON header, and a body of raw arrays back to back; the
header's `arrays` lists each array's name, dtype and shape. Token ids and logits travel as arrays, never as
per-token Python objects.

Front-end -> engine:
  {"op": "infer", "id": N, "model": NAME, "timeout": SECONDS, "lengths": [...]}  + input_ids, token_type_ids
      (every row's tokens concatenated; `lengths` cuts them apart)
  {"op": "cancel", "id": N}   the client went away: drop the rows not run yet
Engine -> front-end:
  {"op": "state", "ready": BOOL, "models": {NAME: {...}}}   on connect and whenever a model's state changes
  {"op": "beat"}   every 0.2 s: the engine's event loop runs (a front-end that hears nothing calls it silent)
  {"op": "result", "id": N, "timings": {...}}  + one array per output: (rows, labels) for a classification model,
      per-token outputs with every row's tokens concatenated (lengths as sent)
  {"op": "error", "id": N, "kind": CLASS, "message": TEXT, "field": FIELD}   a domain error, re-raised as such
"""

from __future__ import annotations

import asyncio
import json
import math
import struct
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from service import errors

PREFIX = struct.Struct("!II")
MAX_HEADER = 16 * 1024 * 1024
MAX_BODY = 1024 * 1024 * 1024


@dataclass
class Frame:
    header: dict[str, Any]
    arrays: dict[str, np.ndarray] = field(default_factory=dict)


def encode(header: dict[str, Any], arrays: dict[str, np.ndarray] | None = None) -> bytes:
    arrays = arrays or {}
    contiguous = {name: np.ascontiguousarray(array) for name, array in arrays.items()}
    described = {**header, "arrays": [[name, a.dtype.str, list(a.shape)] for name, a in contiguous.items()]}
    head = json.dumps(described, separators=(",", ":")).encode()
    body = b"".join(a.tobytes() for a in contiguous.values())
    return PREFIX.pack(len(head), len(body)) + head + body


async def read_frame(reader: asyncio.StreamReader) -> Frame:
    """The next frame; asyncio.IncompleteReadError at the end of the stream."""
    head_length, body_length = PREFIX.unpack(await reader.readexactly(PREFIX.size))
    if head_length > MAX_HEADER or body_length > MAX_BODY:
        raise ValueError(f"frame too large ({head_length} + {body_length} bytes)")
    header = json.loads(await reader.readexactly(head_length))
    body = await reader.readexactly(body_length) if body_length else b""
    arrays, offset = {}, 0
    for name, dtype, shape in header.pop("arrays", []):
        array_type = np.dtype(dtype)
        count = math.prod(shape)
        arrays[name] = np.frombuffer(body, array_type, count, offset).reshape(shape)
        offset += count * array_type.itemsize
    return Frame(header, arrays)


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
        "input_ids": np.concatenate(input_ids).astype(np.int32, copy=False),
        "token_type_ids": np.concatenate(token_type_ids).astype(np.uint8, copy=False),
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
    join = np.concatenate if per_token else np.stack
    return {name: join([row[name] for row in outputs]) for name in outputs[0]}


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
