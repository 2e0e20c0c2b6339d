"""The ALBERT first-layer gap of the stock optimizer, and the fusion pass that closes it."""

from __future__ import annotations

from pathlib import Path

import pytest
from onnxruntime.transformers.optimizer import optimize_model

from export.checkpoint import load_checkpoint
from export.errors import ExportError
from export.fusion import check_attention_fused, optimize
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
        check_attention_fused({"Attention": 2, "SkipLayerNormalization": 6}, 3)
