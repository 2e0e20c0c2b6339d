"""The protocol's codec, shared by REST and gRPC: the raw BYTES form both ways, shapes, and the metadata of each
task (the servers themselves: http/test_open_inference.py and grpc/test_server.py)."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from tritonclient.utils import deserialize_bytes_tensor, serialize_byte_tensor

from service.errors import BadRequest
from service.frontend import open_inference as oip


def test_raw_bytes_are_tritonclients_serialization_both_ways() -> None:
    texts = ["a gorgeous movie", "", "café ☕"]
    raw = serialize_byte_tensor(np.array([t.encode() for t in texts], dtype=object)).item()
    assert oip.decode_raw(raw, 3, "text") == [t.encode() for t in texts]
    out = oip.OutputTensor("label", "BYTES", [3], texts).raw()
    assert [x.decode() for x in deserialize_bytes_tensor(out)] == texts
    scores = oip.OutputTensor("score", "FP32", [2], [0.25, 0.75]).raw()
    assert np.frombuffer(scores, dtype="<f4").tolist() == [0.25, 0.75]


@pytest.mark.parametrize(
    ("raw", "count", "words"),
    [
        (struct.pack("<I", 1) + b"a", 2, "fewer elements"),
        (struct.pack("<I", 5) + b"ab", 1, "runs past the end"),
        (struct.pack("<I", 1) + b"ab", 1, "more than the 1 elements"),
        (b"\x01\x00", 1, "fewer elements"),
    ],
)
def test_raw_bytes_that_disagree_with_the_shape_are_refused(raw: bytes, count: int, words: str) -> None:
    with pytest.raises(BadRequest, match=words):
        oip.decode_raw(raw, count, "text")


@pytest.mark.parametrize(("shape", "count"), [([3], 3), ([3, 1], 3), ([0], 0)])
def test_shapes_taken(shape: list[int], count: int) -> None:
    assert oip.count_of(oip.InputTensor("text", "BYTES", shape)) == count


@pytest.mark.parametrize("shape", [[], [2, 2], [-1], [1, 1, 1]])
def test_shapes_refused(shape: list[int]) -> None:
    with pytest.raises(BadRequest, match=r"expected \[N\] or \[N, 1\]"):
        oip.count_of(oip.InputTensor("text", "BYTES", shape))


def test_every_task_declares_text_in_and_its_answers_out() -> None:
    for tensors in oip.TASKS.values():
        assert all(spec.datatype == "BYTES" for spec in tensors.inputs)
        assert {spec.datatype for spec in tensors.outputs} <= {"BYTES", "FP32"}
    assert oip.check_parameters(oip.TASKS["qa"], {"top_k": 2, "binary_data_output": True}) == {"top_k": 2}
    with pytest.raises(BadRequest, match="'top_k' is not one this model takes"):
        oip.check_parameters(oip.TASKS["ner"], {"top_k": 2})
