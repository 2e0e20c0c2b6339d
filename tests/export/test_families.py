"""Issue 31's encoder families x task: each exports once (the session's family_repository), validates against
PyTorch at 1e-4 on padded batches, fuses attention where onnxruntime's optimizer can and says why where it cannot,
writes int8 and fp16, and its entry alone (tokenizer.json + ONNX) matches PyTorch on text the export never saw."""

from __future__ import annotations

import json

import onnxruntime as ort
import pytest

from bertcore.model_config import ModelConfig
from export.architectures import ARCHITECTURES
from export.pipeline import ExportResult
from export.report import summary
from export.repository import read_config
from tests.export.test_pipeline import _check_reload_matches_pytorch
from tests.tiny_models import FAMILIES

TASKS = ("classification", "ner", "qa")
# Where the optimizer fuses attention (one Attention per layer) and where the export records why it does not.
FUSED = {"xlm-roberta", "camembert", "electra", "ernie"}
EXPECTED_INPUTS = {
    "xlm-roberta": ["input_ids", "attention_mask"],
    "camembert": ["input_ids", "attention_mask"],
    "electra": ["input_ids", "attention_mask", "token_type_ids"],
    "ernie": ["input_ids", "attention_mask", "token_type_ids"],
    "mobilebert": ["input_ids", "attention_mask", "token_type_ids"],
    "deberta-v2": ["input_ids", "attention_mask"],  # DeBERTa-v3 has no segment embedding (type_vocab_size 0)
    "modernbert": ["input_ids", "attention_mask"],
    "xlnet": ["input_ids", "attention_mask", "token_type_ids"],
}
ARCHITECTURE_CLASSES = {
    "classification": "ForSequenceClassification",
    "ner": "ForTokenClassification",
    "qa": "ForQuestionAnswering",
}


@pytest.mark.parametrize("task", TASKS)
@pytest.mark.parametrize("arch", FAMILIES)
def test_family_exports_validates_and_reloads(family_repository, tiny_checkpoint, arch: str, task: str) -> None:
    repository, _ = family_repository
    entry = repository / f"{arch}-{task}"
    config = read_config(entry)
    ModelConfig.parse(config)  # what the server reads
    layers = config["encoder"]["layers"]
    assert config["model_type"] == arch and config["task"] == task
    assert config["inputs"] == EXPECTED_INPUTS[arch]
    assert ARCHITECTURE_CLASSES[task] in config["architecture"]
    assert config["tokenizer"]["padding_side"] == ("left" if arch == "xlnet" else "right")

    fp32 = config["variants"]["fp32"]
    validation = fp32["validation"]
    assert validation["passed"] and validation["max_abs_diff"] <= 1e-4 and validation["agreement"] == 1.0
    assert {case["shape"][0] for case in validation["cases"]} == {1, 3}  # padded batches of three rows
    assert max(case["shape"][1] for case in validation["cases"]) == config["max_length"] == 64
    assert validation["batch_invariance_max_abs_diff"] <= 1e-5

    fusion = config["attention_fusion"]
    assert fusion["layers"] == layers
    said = [line for line in summary(ExportResult(entry, config, 1.0)).splitlines() if "unfused" in line]
    if arch in FUSED:
        assert fusion == {"fused_layers": layers, "layers": layers, "reason": None}
        assert fp32["fused_operators"]["Attention"] == layers
        assert said == []
    else:
        assert fusion["fused_layers"] == 0 and fusion["reason"] == ARCHITECTURES[arch].unfused_attention
        assert "Attention" not in fp32["fused_operators"]
        # --quiet prints the summary alone: it says why, as the progress line and model.json do
        assert said == [f"  attention     unfused (0 of {layers} layers fused): {fusion['reason']}"]

    int8 = config["variants"]["int8"]
    assert int8["validation"]["validated"] and int8["validation"]["batch_invariance_max_abs_diff"] == 0.0
    assert int8["fused_operators"]["MatMulIntegerToFloat"] >= layers
    assert int8["size_bytes"] < fp32["size_bytes"]
    if arch in FUSED:
        attention = "MultiHeadAttention" if task == "qa" else "QAttention"
        assert int8["fused_operators"][attention] == layers
    fp16 = config["variants"]["fp16"]
    assert fp16["validation"]["validated"] == ("CUDAExecutionProvider" in ort.get_available_providers())
    assert sorted(p.name for p in entry.glob("*.onnx")) == sorted(v["file"] for v in config["variants"].values())

    _check_reload_matches_pytorch(entry, config, tiny_checkpoint(arch, task), task)


def test_family_export_costs_are_bounded(family_repository) -> None:
    """24 exports (fp32, fp16 and int8 each) of 2-3 layer models: seconds each, not minutes."""
    repository, seconds = family_repository
    assert sorted(seconds) == sorted(f"{arch}-{task}" for arch in FAMILIES for task in TASKS)
    assert max(seconds.values()) < 60, seconds
    report = {name: json.loads((repository / name / "model.json").read_text())["export"]["seconds"] for name in seconds}
    assert all(value > 0 for value in report.values())


def test_detection_names_every_family() -> None:
    from export.architectures import supported_summary, task_of_architecture

    summary = supported_summary()
    for arch in FAMILIES:
        assert ARCHITECTURES[arch].display_name in summary
    assert task_of_architecture("XLNetForQuestionAnsweringSimple") == "qa"
    assert task_of_architecture("DebertaV2ForTokenClassification") == "ner"
