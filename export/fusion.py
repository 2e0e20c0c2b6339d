"""Graph fusion with ONNX Runtime's transformer optimizer, plus the one pattern it misses (ALBERT's first layer);
and the CPU graph, in which the fused residual LayerNorm is split again (its CPU kernel is the slow one)."""

from __future__ import annotations

import logging
from pathlib import Path

import onnx
from onnx import helper
from onnxruntime.transformers.fusion_attention import FusionAttention
from onnxruntime.transformers.fusion_options import FusionOptions
from onnxruntime.transformers.onnx_model_bert import BertOnnxModel
from onnxruntime.transformers.optimizer import optimize_by_onnxruntime

from export.errors import ExportError

# The attention block's output projection as the optimizer matches it from the residual Add/SkipLayerNorm:
# Add(bias) <- MatMul(dense) <- Reshape <- Transpose <- MatMul(probs x V).
ATTENTION_OUTPUT_PATH = ["Add", "MatMul", "Reshape", "Transpose", "MatMul"]
LAYER_NORM_OPSET = 17


class ResidualOrderAttentionFusion(FusionAttention):
    """FusionAttention that also fuses a layer whose residual input is itself produced by an Add.

    FusionAttention looks for the attention output path from the first input of the residual node that comes
    from an Add. In ALBERT's first layer the residual input is the bias Add of `embedding_hidden_mapping_in`
    (every other layer's comes from a LayerNorm), so it follows the wrong input and gives up. Adding is
    commutative, so we put the attention branch first and let the stock fusion do the rest.
    """

    def fuse(self, node: onnx.NodeProto, input_name_to_nodes: dict, output_name_to_node: dict) -> None:
        residual = node if node.op_type == "SkipLayerNormalization" else self.model.match_parent(node, "Add", 0)
        if residual is not None:
            self._put_attention_branch_first(residual, output_name_to_node)
        super().fuse(node, input_name_to_nodes, output_name_to_node)

    def _put_attention_branch_first(self, residual: onnx.NodeProto, output_name_to_node: dict) -> None:
        first_parent = output_name_to_node.get(residual.input[0])
        if first_parent is None or first_parent.op_type != "Add":
            return  # the stock matcher takes the right input already
        on_first = self.model.match_parent_path(residual, ATTENTION_OUTPUT_PATH, [0, None, 0, 0, 0])
        on_second = self.model.match_parent_path(residual, ATTENTION_OUTPUT_PATH, [1, None, 0, 0, 0])
        if on_first is None and on_second is not None:
            residual.input[0], residual.input[1] = residual.input[1], residual.input[0]


class EncoderOnnxModel(BertOnnxModel):
    """The optimizer's BERT model with the attention fusion above; every other fusion is the stock one."""

    def __init__(self, model: onnx.ModelProto, num_heads: int, hidden_size: int) -> None:
        super().__init__(model, num_heads, hidden_size)
        self.attention_fusion = ResidualOrderAttentionFusion(
            self, self.hidden_size, self.num_heads, self.attention_mask
        )


def optimize(raw_path: Path, fused_path: Path, num_heads: int, hidden_size: int) -> None:
    """Constant-fold with ONNX Runtime (level 1), then fuse with the optimizer's BERT fusions, and save."""
    for name in ("onnxruntime.transformers", "fusion_base", "onnx_model", "onnx_model_bert", "fusion_utils"):
        logging.getLogger(name).setLevel(logging.ERROR)
    folded = fused_path.with_name(fused_path.stem + ".folded.onnx")
    try:
        optimize_by_onnxruntime(
            str(raw_path),
            use_gpu=False,
            optimized_model_path=str(folded),
            opt_level=1,
            disabled_optimizers=["ConstantSharing"],
        )
        model = EncoderOnnxModel(onnx.load(str(folded)), num_heads, hidden_size)
        model.optimize(FusionOptions("bert"))
        model.topological_sort()
        model.model.producer_name = "bertserve-export"
        model.save_model_to_file(str(fused_path))
    finally:
        folded.unlink(missing_ok=True)


def check_attention_fused(fused_operators: dict[str, int], num_layers: int, unfused_reason: str | None) -> dict:
    """How many layers' attention was fused, for model.json. A family the optimizer can fuse (`unfused_reason`
    None) must be fused in every layer, or the export stops; another is recorded with the reason."""
    fused = fused_operators.get("Attention", 0) + fused_operators.get("MultiHeadAttention", 0)
    if unfused_reason is not None:
        return {"fused_layers": fused, "layers": num_layers, "reason": unfused_reason}
    if fused != num_layers:
        raise ExportError(
            f"attention is fused in {fused} of {num_layers} layers (fused operators: {fused_operators}); "
            "an unfused layer runs several times slower, so the export stops here"
        )
    return {"fused_layers": fused, "layers": num_layers, "reason": None}


def write_cpu_graph(fused_path: Path, cpu_path: Path) -> int:
    """The fused graph with each SkipLayerNormalization split into Add (+ Add of its bias) + LayerNormalization.

    onnxruntime's CPU SkipLayerNormalization kernel is the slow one (1.31: 863 ns a 384-wide row on 2 threads,
    1,086 ns on one, against 215 and 159 ns for the Add, Add, LayerNormalization it replaces), and it was 14% of
    fp32 and 24% of int8 kernel time on MiniLM. Split: fp32 8-10% and int8 11-16% faster on SST-2, CoNLL and
    SQuAD batches, outputs within 2e-5 of the fused graph's, still one row at a time. The CUDA graph (fp16)
    keeps the fused kernel. Returns how many were split.
    """
    model = onnx.load(str(fused_path))
    opset = next((entry.version for entry in model.opset_import if entry.domain in ("", "ai.onnx")), 0)
    if opset < LAYER_NORM_OPSET:  # no LayerNormalization operator before opset 17: the fused graph as it is
        onnx.save(model, str(cpu_path))
        return 0
    used = {name for node in model.graph.node for name in node.input} | {out.name for out in model.graph.output}
    nodes: list[onnx.NodeProto] = []
    split = 0
    for node in model.graph.node:
        statistics = [name for name in list(node.output)[1:3] if name and name in used]  # mean, inverse std dev
        if node.op_type != "SkipLayerNormalization" or statistics:
            nodes.append(node)
            continue
        nodes.extend(_add_and_layer_norm(node))
        split += 1
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    onnx.save(model, str(cpu_path))
    return split


def _add_and_layer_norm(node: onnx.NodeProto) -> list[onnx.NodeProto]:
    """SkipLayerNormalization(input, skip, gamma, beta?, bias?) as ONNX operators (opset 17's LayerNormalization)."""
    inputs = list(node.input) + [""] * (5 - len(node.input))
    source, skip, gamma, beta, bias = inputs[:5]
    epsilon = next((attribute.f for attribute in node.attribute if attribute.name == "epsilon"), 1e-12)
    base = node.name or node.output[0]  # unique either way: new tensor names must not collide between nodes
    # the sum is an output of its own (input + skip + bias) where the graph reads it
    total = node.output[3] if len(node.output) > 3 and node.output[3] else f"{base}.sum"
    residual = f"{base}.residual" if bias else total
    parts = [helper.make_node("Add", [source, skip], [residual], name=f"{base}.add_residual")]
    if bias:
        parts.append(helper.make_node("Add", [residual, bias], [total], name=f"{base}.add_bias"))
    parts.append(
        helper.make_node(
            "LayerNormalization",
            [total, gamma, beta] if beta else [total, gamma],
            [node.output[0]],
            name=node.name,
            axis=-1,
            epsilon=epsilon,
        )
    )
    return parts
