"""int8 attention through MultiHeadAttention's flash kernel: the same attention as QAttention, padding included."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from export.flash_attention import rewrite_int8_attention

HEADS, HEAD_SIZE = 4, 8
HIDDEN = HEADS * HEAD_SIZE
QATTENTION_INPUTS = [
    "quantized",
    "weight",
    "bias",
    "input_scale",
    "weight_scale",
    "mask_index",
    "input_zero_point",
    "weight_zero_point",
]


def attention_graph(
    per_channel: bool = True, weight_zero_point: int = 0, mask_index_by: str = "embedding", **attributes: object
) -> onnx.ModelProto:
    """One QAttention over a quantized embedding, its mask index counted by the fused embedding (BERT, ALBERT,
    DistilBERT) or by a ReduceSum (RoBERTa, whose embedding the optimizer does not fuse): the int8 export's shape."""
    rng = np.random.default_rng(7)
    weight = rng.integers(-127, 128, (HIDDEN, 3 * HIDDEN)).astype(np.int8)
    scale = (rng.random(3 * HIDDEN) * 0.004 + 0.001).astype(np.float32) if per_channel else np.float32(0.003)
    zero_point = np.zeros(3 * HIDDEN, np.int8) if per_channel else np.int8(weight_zero_point)
    words = rng.standard_normal((50, HIDDEN)).astype(np.float32)
    initializers = {
        "words": words,
        "positions": rng.standard_normal((64, HIDDEN)).astype(np.float32),
        "gamma": np.ones(HIDDEN, np.float32),
        "beta": np.zeros(HIDDEN, np.float32),
        "weight": weight,
        "bias": rng.standard_normal(3 * HIDDEN).astype(np.float32),
        "weight_scale": np.asarray(scale),
        "weight_zero_point": np.asarray(zero_point),
        "input_scale": np.float32(0.04),
        "input_zero_point": np.uint8(128),
        "sequence_axis": np.array([1], np.int64),
    }
    nodes = [
        helper.make_node("Cast", ["input_ids"], ["ids32"], to=TensorProto.INT32),
        helper.make_node("Cast", ["attention_mask"], ["mask32"], to=TensorProto.INT32),
        helper.make_node(
            "EmbedLayerNormalization",
            ["ids32", "", "words", "positions", "", "gamma", "beta", "mask32"],
            ["embedded", "embedding_mask_index"],
            domain="com.microsoft",
        ),
        helper.make_node("ReduceSum", ["mask32", "sequence_axis"], ["summed_mask_index"], keepdims=0),
        helper.make_node("QuantizeLinear", ["embedded", "input_scale", "input_zero_point"], ["quantized"]),
        helper.make_node(
            "QAttention",
            [f"{mask_index_by}_mask_index" if name == "mask_index" else name for name in QATTENTION_INPUTS],
            ["attended"],
            domain="com.microsoft",
            num_heads=HEADS,
            **attributes,
        ),
    ]
    graph = helper.make_graph(
        nodes,
        "attention",
        [
            helper.make_tensor_value_info(name, TensorProto.INT64, ["batch", "sequence"])
            for name in ("input_ids", "attention_mask")
        ],
        [helper.make_tensor_value_info("attended", TensorProto.FLOAT, ["batch", "sequence", HIDDEN])],
        [numpy_helper.from_array(np.asarray(value), name) for name, value in initializers.items()],
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=9)


def session(model: onnx.ModelProto, threads: int = 1) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def padded_batch(lengths: list[int], width: int, seed: int = 3) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    ids = rng.integers(1, 50, (len(lengths), width)).astype(np.int64)  # padding positions carry real-looking ids
    mask = (np.arange(width)[None, :] < np.array(lengths)[:, None]).astype(np.int64)
    return {"input_ids": ids, "attention_mask": mask}


def rewritten(model: onnx.ModelProto) -> onnx.ModelProto:
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    assert rewrite_int8_attention(copy) == 1
    return copy


@pytest.mark.parametrize(
    ("per_channel", "weight_zero_point", "mask_index_by"),
    [(True, 0, "embedding"), (False, 0, "embedding"), (False, 3, "embedding"), (True, 0, "summed")],
    ids=["per-channel", "per-tensor", "zero-point", "mask-index-by-reducesum"],
)
def test_the_rewrite_attends_as_qattention_did_padding_included(
    per_channel: bool, weight_zero_point: int, mask_index_by: str
) -> None:
    model = attention_graph(per_channel, weight_zero_point, mask_index_by)
    flash = rewritten(model)
    ops = [node.op_type for node in flash.graph.node]
    assert "QAttention" not in ops and ops.count("MultiHeadAttention") == 1 and ops.count("MatMulIntegerToFloat") == 3
    feed = padded_batch([40, 23, 1, 37], 40)
    expected = session(model).run(None, feed)[0]
    produced = session(flash).run(None, feed)[0]
    mask = feed["attention_mask"].astype(bool)
    # real tokens: the same scores, softmax and values, summed in another order; padding keys get no weight
    np.testing.assert_allclose(produced[mask], expected[mask], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("threads", [1, 2])
def test_a_row_is_bit_identical_alone_and_in_any_padded_batch(threads: int) -> None:
    """Padding keys come after the real ones and add exact zeros to the flash kernel's sums."""
    flash = session(rewritten(attention_graph()), threads)
    lengths = [60, 9, 33, 64, 1]
    together = flash.run(None, padded_batch(lengths, 64))[0]
    for row, length in enumerate(lengths):
        feed = {name: value[row : row + 1, :length] for name, value in padded_batch(lengths, 64).items()}
        alone = flash.run(None, feed)[0]
        assert np.array_equal(alone[0], together[row, :length]), f"row {row} ({length} tokens) moved with its batch"


def test_only_plain_attention_is_rewritten() -> None:
    one_way = attention_graph(unidirectional=1)  # causal: the mask channel cannot express it
    assert rewrite_int8_attention(one_way) == 0
    assert [node.op_type for node in one_way.graph.node].count("QAttention") == 1

    without_embedding = attention_graph()  # a mask index that neither a fused embedding nor a ReduceSum made
    graph = without_embedding.graph
    attention = next(node for node in graph.node if node.op_type == "QAttention")
    graph.input.append(helper.make_tensor_value_info("given_mask_index", TensorProto.INT32, ["batch"]))
    attention.input[5] = "given_mask_index"
    assert rewrite_int8_attention(without_embedding) == 0


def test_the_rewritten_graph_keeps_only_the_weights_it_uses() -> None:
    flash = rewritten(attention_graph())
    used = {name for node in flash.graph.node for name in node.input}
    names = {tensor.name for tensor in flash.graph.initializer}
    assert names <= used and "weight" not in names
    widened = {t.name: numpy_helper.to_array(t) for t in flash.graph.initializer if t.name.endswith("_weight")}
    assert {array.shape[1] for name, array in widened.items() if not name.endswith("v_weight")} == {
        HEADS * (HEAD_SIZE + 1)
    }
