"""int8 attention on the CPU through flash attention: each `QAttention` becomes three int8 projections and
onnxruntime's `MultiHeadAttention`, whose CPU kernel runs flash attention (MLAS: tiled, one pass over the keys)
when it is given no mask.

The padding mask is not dropped: it moves into the product Q x K itself. Every head gets one more query and key
channel. The query's is 1 (a zero weight column and a bias of 1); the key's is 0 for a real token and
-mask_filter / scale for padding (a zero weight column, plus the mask added to the keys). So scale * (q . k)
gains exactly 0 for real keys and mask_filter (-10000) for padding: QAttention's scores, and the softmax gives
padding the same zero weight. Padding keys come after the real ones and add exact zeros, so a row's output is
bit-identical alone and in any batch (checked up to 2,500 tokens, one and two threads).

Why only int8: QAttention's attention core (Q x K, softmax, x V) is slower than fp32 `Attention`'s. Measured on
this project's 2-core AVX-512 machine, onnxruntime 1.31, one thread, one layer of 12 heads of 32, core alone:
QAttention 8.95 ms at 4 x 384 tokens and 5.4 ms at 8 x 192; fp32 Attention 7.4 and 4.1; MultiHeadAttention's flash
7.4 and ~4 (with the mask channel). fp32 gains nothing from the rewrite (whole graphs within +-3%); int8 does.

The projections are MatMulIntegerToFloat on QAttention's own quantized input, scales and zero points (the int8
product QAttention computed); the biases go into MultiHeadAttention, which adds them while it lays Q, K and V out
per head. The key mask is computed once per graph from the mask that QAttention's mask index counts.
"""

from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import helper, numpy_helper

MS_DOMAIN = "com.microsoft"
MASK_FILTER_VALUE = -10000.0  # QAttention's default
EMBEDDING_OPS = ("EmbedLayerNormalization", "QEmbedLayerNormalization")
EMBEDDING_MASK_INPUT = 7  # the fused embedding's mask input (int32, batch x sequence)
KEY_MASK = "flash_attention.key_mask"


def rewrite_int8_attention(model: onnx.ModelProto) -> int:
    """Rewrite every plain QAttention of `model` in place; returns how many were rewritten.

    Plain: its mask is a count of the mask's ones (right padding), no past state, not unidirectional, no
    custom scale or hidden sizes, one head size for every rewritten layer. Any other attention node stays."""
    graph = model.graph
    producer = {output: node for node in graph.node for output in node.output}
    initializers = {tensor.name: tensor for tensor in graph.initializer}
    rewrites = [
        rewrite
        for node in graph.node
        if node.op_type == "QAttention" and node.domain == MS_DOMAIN
        for rewrite in [_Rewrite.of(node, producer, initializers)]
        if rewrite is not None
    ]
    if not rewrites or len({(r.mask, r.heads, r.head_size, r.mask_filter) for r in rewrites}) != 1:
        return 0
    first = rewrites[0]
    replaced = {id(rewrite.node): rewrite.nodes(graph, initializers) for rewrite in rewrites}
    nodes: list[onnx.NodeProto] = []
    for node in graph.node:
        if id(node) == id(first.node):  # the mask index's producer, and so the mask's, come before it
            nodes.extend(_key_mask_nodes(graph, first))
        nodes.extend(replaced.get(id(node), [node]))
    del graph.node[:]
    graph.node.extend(nodes)
    used = {name for node in graph.node for name in node.input}
    kept = [tensor for tensor in graph.initializer if tensor.name in used]
    del graph.initializer[:]
    graph.initializer.extend(kept)
    return len(rewrites)


def _padding_mask(
    mask_index: str, producer: dict[str, onnx.NodeProto], initializers: dict[str, onnx.TensorProto]
) -> str:
    """The (batch, sequence) mask that QAttention's 1-D mask index counts, or "" where it is made another way.

    The optimizer counts it in the fused embedding (BERT, ALBERT, DistilBERT) or, where the embedding is not fused
    (RoBERTa: positions from a cumulative sum), with a ReduceSum over the sequence axis of the cast mask."""
    made_by = producer.get(mask_index)
    if made_by is None:
        return ""
    if made_by.op_type in EMBEDDING_OPS and list(made_by.output)[1:2] == [mask_index]:
        return (list(made_by.input) + [""] * 8)[EMBEDDING_MASK_INPUT]
    if made_by.op_type == "ReduceSum" and len(made_by.input) == 2 and made_by.input[1] in initializers:
        axes = numpy_helper.to_array(initializers[made_by.input[1]]).reshape(-1).tolist()
        keepdims = next((helper.get_attribute_value(a) for a in made_by.attribute if a.name == "keepdims"), 1)
        if axes in ([1], [-1]) and keepdims == 0:
            return str(made_by.input[0])
    return ""


class _Rewrite:
    """One QAttention node: input, weight, bias, input scale, weight scale, mask index, input and weight zero points."""

    def __init__(self, node: onnx.NodeProto, mask: str, heads: int, hidden: int, mask_filter: float) -> None:
        self.node = node
        self.name = node.name or node.output[0]
        self.mask = mask
        self.heads = heads
        self.hidden = hidden
        self.head_size = hidden // heads
        self.mask_filter = mask_filter

    @classmethod
    def of(
        cls, node: onnx.NodeProto, producer: dict[str, onnx.NodeProto], initializers: dict[str, onnx.TensorProto]
    ) -> _Rewrite | None:
        if {attribute.name for attribute in node.attribute} - {"num_heads", "mask_filter_value"}:
            return None  # unidirectional, scale, qkv_hidden_sizes...: not the plain case
        inputs = list(node.input) + [""] * 10
        _, weight, bias, _, weight_scale, mask_index, _, weight_zero_point, past = inputs[:9]
        if past or any(inputs[9:]) or any(name not in initializers for name in (weight, bias, weight_scale)):
            return None
        if weight_zero_point and weight_zero_point not in initializers:
            return None
        mask = _padding_mask(mask_index, producer, initializers)
        heads = next((helper.get_attribute_value(a) for a in node.attribute if a.name == "num_heads"), 0)
        dims = list(initializers[weight].dims)
        if not mask or heads < 1 or len(dims) != 2 or dims[1] % (3 * heads):
            return None
        mask_filter = next(
            (helper.get_attribute_value(a) for a in node.attribute if a.name == "mask_filter_value"), MASK_FILTER_VALUE
        )
        return cls(node, mask, heads, dims[1] // 3, float(mask_filter))

    def _widened(self, columns: np.ndarray, extra: float) -> np.ndarray:
        """Per head, its columns (last axis) and then one column of `extra`."""
        shaped = columns.reshape(*columns.shape[:-1], self.heads, self.head_size)
        pad = np.full((*shaped.shape[:-1], 1), extra, dtype=columns.dtype)
        return np.concatenate([shaped, pad], axis=-1).reshape(*columns.shape[:-1], -1)

    def _thirds(self, values: np.ndarray) -> list[np.ndarray]:
        """Q, K and V's parts of a per-output-channel tensor; a per-tensor value serves all three."""
        if values.ndim == 0:
            return [values] * 3
        return [values[..., i * self.hidden : (i + 1) * self.hidden] for i in range(3)]

    def nodes(self, graph: onnx.GraphProto, initializers: dict[str, onnx.TensorProto]) -> list[onnx.NodeProto]:
        x, weight_name, bias_name, x_scale, scale_name, _, x_zero_point, zero_point_name = (
            list(self.node.input) + [""] * 8
        )[:8]
        weight = numpy_helper.to_array(initializers[weight_name])
        scale = numpy_helper.to_array(initializers[scale_name]).astype(np.float32)
        zero_point = (
            numpy_helper.to_array(initializers[zero_point_name]) if zero_point_name else np.zeros((), weight.dtype)
        )
        bias_q, bias_k, bias_v = self._thirds(numpy_helper.to_array(initializers[bias_name]).astype(np.float32))
        name = self.name
        graph.initializer.append(
            numpy_helper.from_array(
                np.concatenate([self._widened(bias_q, 1.0), self._widened(bias_k, 0.0), bias_v]), f"{name}.qkv_bias"
            )
        )
        projections = []
        parts = zip("qkv", self._thirds(weight), self._thirds(scale), self._thirds(zero_point), strict=True)
        for part, w, s, z in parts:
            if part != "v":  # the extra channel: weights at the zero point (a zero product), scale 1, zero point 0
                w = self._widened(w, z.item() if z.ndim == 0 else 0)
                s = self._widened(s, 1.0) if s.ndim else s
                z = self._widened(z, 0) if z.ndim else z
            own = (f"{name}.{part}_weight", f"{name}.{part}_weight_scale", f"{name}.{part}_weight_zero_point")
            graph.initializer.extend(
                numpy_helper.from_array(np.ascontiguousarray(value), tensor)
                for value, tensor in zip((w, s, z), own, strict=True)
            )
            output = f"{name}.k_unmasked" if part == "k" else f"{name}.{part}"
            projections.append(
                helper.make_node(
                    "MatMulIntegerToFloat",
                    [x, own[0], x_scale, own[1], x_zero_point, own[2]],
                    [output],
                    name=f"{name}.{part}_projection",
                    domain=MS_DOMAIN,
                )
            )
        return [
            *projections,
            helper.make_node("Add", [f"{name}.k_unmasked", KEY_MASK], [f"{name}.k"], name=f"{name}.mask_keys"),
            helper.make_node(
                "MultiHeadAttention",
                [f"{name}.q", f"{name}.k", f"{name}.v", f"{name}.qkv_bias"],
                list(self.node.output),
                name=name,
                domain=MS_DOMAIN,
                num_heads=self.heads,
                scale=1.0 / math.sqrt(self.head_size),  # not 1/sqrt(head_size + 1)
            ),
        ]


def _key_mask_nodes(graph: onnx.GraphProto, rewrite: _Rewrite) -> list[onnx.NodeProto]:
    """KEY_MASK, (batch, sequence, heads x (head_size + 1)): 0 but in each head's extra channel, where it is
    mask_filter / scale at padding (mask 0) and 0 at real tokens (mask 1)."""
    pattern = np.zeros((rewrite.heads, rewrite.head_size + 1), dtype=np.float32)
    pattern[:, rewrite.head_size] = -rewrite.mask_filter * math.sqrt(rewrite.head_size)
    graph.initializer.extend(
        [
            numpy_helper.from_array(pattern.reshape(-1), f"{KEY_MASK}.pattern"),
            numpy_helper.from_array(np.array(1.0, dtype=np.float32), f"{KEY_MASK}.one"),
            numpy_helper.from_array(np.array([-1], dtype=np.int64), f"{KEY_MASK}.last_axis"),
        ]
    )
    return [
        helper.make_node("Cast", [rewrite.mask], [f"{KEY_MASK}.float"], name=f"{KEY_MASK}.cast", to=1),
        helper.make_node("Sub", [f"{KEY_MASK}.float", f"{KEY_MASK}.one"], [f"{KEY_MASK}.pad"], name=f"{KEY_MASK}.pad"),
        helper.make_node(
            "Unsqueeze", [f"{KEY_MASK}.pad", f"{KEY_MASK}.last_axis"], [f"{KEY_MASK}.column"], name=f"{KEY_MASK}.column"
        ),
        helper.make_node("Mul", [f"{KEY_MASK}.column", f"{KEY_MASK}.pattern"], [KEY_MASK], name=KEY_MASK),
    ]
