"""The ALBERT first-layer gap of the stock optimizer, the fusion pass that closes it, and the CPU graph."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.transformers.optimizer import optimize_model

from export.checkpoint import load_checkpoint
from export.errors import ExportError
from export.fusion import check_attention_fused, optimize, write_cpu_graph
from export.graph import export_onnx
from export.pipeline import contrib_operator_counts


def _raw_graph(checkpoint_dir: Path, tmp_path: Path) -> tuple[Path, object]:
    checkpoint = load_checkpoint(str(checkpoint_dir))
    raw = tmp_path / "raw.onnx"
    export_onnx(checkpoint, raw, 17)
    return raw, checkpoint


@pytest.mark.parametrize("groups", [1, 3])
def test_stock_optimizer_misses_albert_first_layer_and_ours_does_not(tiny_checkpoint, tmp_path: Path, groups: int):
    raw, checkpoint = _raw_graph(tiny_checkpoint("albert", "qa", num_hidden_groups=groups), tmp_path)
    stock = optimize_model(
        str(raw), model_type="bert", num_heads=checkpoint.num_heads, hidden_size=checkpoint.hidden_size
    )
    assert stock.get_fused_operator_statistics()["Attention"] == checkpoint.num_layers - 1

    fused = tmp_path / "fused.onnx"
    optimize(raw, fused, checkpoint.num_heads, checkpoint.hidden_size)
    assert contrib_operator_counts(fused)["Attention"] == checkpoint.num_layers == 3


@pytest.mark.parametrize("arch", ["bert", "roberta", "distilbert"])
def test_other_architectures_fuse_the_same_as_the_stock_optimizer(tiny_checkpoint, tmp_path: Path, arch: str):
    raw, checkpoint = _raw_graph(tiny_checkpoint(arch, "ner"), tmp_path)
    stock = optimize_model(
        str(raw), model_type="bert", num_heads=checkpoint.num_heads, hidden_size=checkpoint.hidden_size
    )
    fused = tmp_path / "fused.onnx"
    optimize(raw, fused, checkpoint.num_heads, checkpoint.hidden_size)
    ours = contrib_operator_counts(fused)
    stock_counts = {k: v for k, v in stock.get_fused_operator_statistics().items() if v}
    assert ours == stock_counts
    assert ours["Attention"] == checkpoint.num_layers


def test_partial_fusion_is_refused() -> None:
    with pytest.raises(ExportError, match="attention is fused in 2 of 3 layers"):
        check_attention_fused({"Attention": 2, "SkipLayerNormalization": 6}, 3, None)


def _skip_layer_norm_graph(
    path: Path, opset: int, with_bias: bool, sum_read: bool, names: tuple[str, ...] = ("ln",)
) -> None:
    """x, skip -> one SkipLayerNormalization per name, chained (-> the last one's input+skip+bias sum read by an
    Add, as the optimizer can leave it)."""
    rng = np.random.default_rng(0)
    width = 24
    weights = {
        name: rng.normal(scale, 0.3, width).astype(np.float32) for name, scale in [("g", 1), ("b", 0), ("bias", 0)]
    }
    nodes = []
    source = "x"
    for index, name in enumerate(names):
        last = index == len(names) - 1
        output = "y" if last else f"h{index}"
        inputs = [source, "skip", "g", "b"] + (["bias"] if with_bias else [])
        outputs = [output, "", "", "sum"] if sum_read and last else [output]
        nodes.append(
            helper.make_node("SkipLayerNormalization", inputs, outputs, name=name, domain="com.microsoft", epsilon=1e-5)
        )
        source = output
    graph_outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "sequence", width])]
    if sum_read:
        nodes.append(helper.make_node("Add", ["sum", "y"], ["z"], name="reader"))
        graph_outputs.append(helper.make_tensor_value_info("z", TensorProto.FLOAT, ["batch", "sequence", width]))
    graph = helper.make_graph(
        nodes,
        "g",
        [
            helper.make_tensor_value_info(name, TensorProto.FLOAT, ["batch", "sequence", width])
            for name in ("x", "skip")
        ],
        graph_outputs,
        [numpy_helper.from_array(value, name) for name, value in weights.items()],
    )
    imports = [helper.make_opsetid("", opset), helper.make_opsetid("com.microsoft", 1)]
    onnx.save(helper.make_model(graph, opset_imports=imports, ir_version=8), str(path))


def _assert_same_outputs(fused: Path, cpu: Path) -> None:
    feed = {name: np.random.default_rng(1).normal(0, 2, (3, 7, 24)).astype(np.float32) for name in ("x", "skip")}
    expected = ort.InferenceSession(str(fused), providers=["CPUExecutionProvider"]).run(None, feed)
    produced = ort.InferenceSession(str(cpu), providers=["CPUExecutionProvider"]).run(None, feed)
    for want, got in zip(expected, produced, strict=True):
        np.testing.assert_allclose(got, want, atol=1e-5)


@pytest.mark.parametrize(("with_bias", "sum_read"), [(True, False), (True, True), (False, True), (False, False)])
def test_the_cpu_graph_splits_skip_layer_norm_into_onnx_operators(tmp_path: Path, with_bias: bool, sum_read: bool):
    fused, cpu = tmp_path / "fused.onnx", tmp_path / "cpu.onnx"
    _skip_layer_norm_graph(fused, 17, with_bias, sum_read)
    assert write_cpu_graph(fused, cpu) == 1
    operators = [node.op_type for node in onnx.load(str(cpu)).graph.node]
    assert "SkipLayerNormalization" not in operators and operators.count("LayerNormalization") == 1
    assert operators.count("Add") == 1 + with_bias + sum_read
    _assert_same_outputs(fused, cpu)


def test_before_opset_17_the_cpu_graph_keeps_the_fused_operator(tmp_path: Path) -> None:
    fused, cpu = tmp_path / "fused.onnx", tmp_path / "cpu.onnx"
    _skip_layer_norm_graph(fused, 16, True, False)
    assert write_cpu_graph(fused, cpu) == 0  # LayerNormalization is an opset-17 operator
    assert [node.op_type for node in onnx.load(str(cpu)).graph.node] == ["SkipLayerNormalization"]


def test_unnamed_skip_layer_norms_split_into_distinct_tensors(tmp_path: Path) -> None:
    """Two chained SkipLayerNormalization nodes without names: the new tensors must not share a name."""
    fused, cpu = tmp_path / "fused.onnx", tmp_path / "cpu.onnx"
    _skip_layer_norm_graph(fused, 17, False, False, names=("", ""))
    assert write_cpu_graph(fused, cpu) == 2
    outputs = [name for node in onnx.load(str(cpu)).graph.node for name in node.output]
    assert len(outputs) == len(set(outputs)) == 4
    _assert_same_outputs(fused, cpu)
