"""Every architecture x task exports, fuses attention in every layer, matches PyTorch, and reloads."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from tokenizers import Tokenizer
from transformers import (
    AutoModelForQuestionAnswering,
    AutoModelForSequenceClassification,
    AutoModelForTokenClassification,
)

from bertcore.model_config import ModelConfig
from export.errors import ExportError
from export.pipeline import export_checkpoint
from export.repository import read_config
from tests.tiny_models import ARCHS, CROSS_ENCODER

TASKS = ("classification", "ner", "qa")
EXPECTED_INPUTS = {
    "bert": ["input_ids", "attention_mask", "token_type_ids"],
    "albert": ["input_ids", "attention_mask", "token_type_ids"],
    "roberta": ["input_ids", "attention_mask"],
    "distilbert": ["input_ids", "attention_mask"],
}
AUTO = {
    "classification": AutoModelForSequenceClassification,
    "ner": AutoModelForTokenClassification,
    "qa": AutoModelForQuestionAnswering,
}
FRESH_TEXTS = [
    ("Nobody expected the small museum in Oslo to draw such crowds.", "Where is the museum?"),
    ("Terrible.", "Why?"),
    ("Maria and Peter flew from Lisbon to Berlin on a rainy Monday morning with their two dogs.", "Who flew?"),
]


@pytest.mark.parametrize("task", TASKS)
@pytest.mark.parametrize("arch", ARCHS)
def test_export_fuses_validates_and_reloads(tiny_checkpoint, tmp_path: Path, arch: str, task: str) -> None:
    checkpoint = tiny_checkpoint(arch, task)
    result = export_checkpoint(str(checkpoint), f"{arch}-{task}", tmp_path / "models")
    entry = tmp_path / "models" / f"{arch}-{task}"
    config = read_config(entry)
    assert config == json.loads(json.dumps(result.config))
    layers = config["encoder"]["layers"]

    fp32 = config["variants"]["fp32"]
    assert fp32["fused_operators"]["Attention"] == layers
    # the CPU graph: each residual LayerNorm as Add + LayerNormalization (onnxruntime's CPU kernel for the fused
    # SkipLayerNormalization is 4x slower); the CUDA one (fp16) keeps the fused kernel
    assert "SkipLayerNormalization" not in fp32["fused_operators"]
    assert fp32["fused_operators"]["LayerNormalization"] >= 2 * layers
    assert fp32["validation"]["validated"] and fp32["validation"]["passed"]
    assert fp32["validation"]["max_abs_diff"] <= 1e-4
    assert fp32["validation"]["agreement"] == 1.0
    shapes = {tuple(case["shape"]) for case in fp32["validation"]["cases"]}
    assert {1, 3} == {batch for batch, _ in shapes}
    assert max(length for _, length in shapes) == config["max_length"]

    int8 = config["variants"]["int8"]
    assert int8["validation"]["validated"]
    # QA's long windows attend through flash attention (MultiHeadAttention, the mask in an extra key channel)
    attention = "MultiHeadAttention" if task == "qa" else "QAttention"
    assert int8["fused_operators"].get(attention) == layers
    assert ({"QAttention", "MultiHeadAttention"} - {attention}).isdisjoint(int8["fused_operators"])
    assert int8["validation"]["agreement"] >= (0.5 if task == "qa" else 0.9)
    assert int8["size_bytes"] < fp32["size_bytes"]

    fp16 = config["variants"]["fp16"]
    if "CUDAExecutionProvider" in ort.get_available_providers():
        assert fp16["validation"]["validated"]
    else:
        assert not fp16["validation"]["validated"]
        assert "CUDAExecutionProvider is not available" in fp16["validation"]["reason"]
    assert fp16["fused_operators"]["SkipLayerNormalization"] == 2 * layers
    assert "SkipLayerNormalization" not in config["variants"]["int8"]["fused_operators"]
    fp16_graph = onnx.load(str(entry / fp16["file"]))
    assert {i.type.tensor_type.elem_type for i in fp16_graph.graph.output} == {onnx.TensorProto.FLOAT}
    assert any(init.data_type == onnx.TensorProto.FLOAT16 for init in fp16_graph.graph.initializer)

    assert config["inputs"] == EXPECTED_INPUTS[arch]
    assert config["task"] == task and config["model_type"] == arch and config["demo"] is False
    assert config["source"]["checkpoint"] == str(checkpoint.resolve())
    assert config["export"]["version"] and config["max_length"] == 64
    if task == "qa":
        assert config["labels"] is None and config["outputs"] == ["start_logits", "end_logits"]
    else:
        assert config["labels"] and config["outputs"] == ["logits"]
    assert not [p for p in (tmp_path / "models").iterdir() if p.name.startswith(".")], "staging left behind"
    assert sorted(p.name for p in entry.glob("*.onnx")) == sorted(v["file"] for v in config["variants"].values())

    _check_reload_matches_pytorch(entry, config, checkpoint, task)


def _check_reload_matches_pytorch(entry: Path, config: dict, checkpoint: Path, task: str) -> None:
    """From the entry alone (tokenizer.json + ONNX), on texts the export never saw, match PyTorch."""
    tokenizer = Tokenizer.from_file(str(entry / config["tokenizer"]["file"]))
    assert tokenizer.truncation is None and tokenizer.padding is None  # as the checkpoint's: no call's settings
    side = config["tokenizer"]["padding_side"]  # XLNet's pads on the left
    tokenizer.enable_padding(pad_id=config["tokenizer"]["pad_token_id"], direction=side)
    encodings = tokenizer.encode_batch(FRESH_TEXTS if task != "ner" else [t for t, _ in FRESH_TEXTS])
    feed = {
        "input_ids": np.array([e.ids for e in encodings], dtype=np.int64),
        "attention_mask": np.array([e.attention_mask for e in encodings], dtype=np.int64),
        "token_type_ids": np.array([e.type_ids for e in encodings], dtype=np.int64),
    }
    session = ort.InferenceSession(str(entry / "model.fp32.onnx"), providers=["CPUExecutionProvider"])
    assert [i.name for i in session.get_inputs()] == config["inputs"]
    feed = {name: feed[name] for name in config["inputs"]}
    produced = session.run(config["outputs"], feed)
    model = AUTO[task].from_pretrained(str(checkpoint), attn_implementation="eager").eval()
    with torch.no_grad():
        expected = model(**{k: torch.from_numpy(v) for k, v in feed.items()})
    mask = feed["attention_mask"].astype(bool)
    for name, got in zip(config["outputs"], produced, strict=True):
        want = expected[name].numpy()
        if task != "classification":
            want, got = want[mask], got[mask]
        np.testing.assert_allclose(got, want, atol=1e-4, rtol=0)


def test_an_fp32_only_entrys_tokenizer_cuts_no_text(tiny_checkpoint, tmp_path: Path) -> None:
    """The export's last call into the tokenizer (validation's 32-token cases with --variants fp32; the window
    otherwise) stayed on it and was saved: the entry's tokenizer.json cut every text at 32 tokens and padded."""
    checkpoint = tiny_checkpoint("bert", "ner")
    export_checkpoint(str(checkpoint), "m", tmp_path / "models", variants=["fp32"])
    tokenizer = Tokenizer.from_file(str(tmp_path / "models" / "m" / "tokenizer.json"))
    assert tokenizer.truncation is None and tokenizer.padding is None
    text = " ".join(["word"] * 60)
    own = Tokenizer.from_file(str(checkpoint / "tokenizer.json")).encode(text).ids
    assert tokenizer.encode(text).ids == own and len(own) > 64  # over the window: nothing cut


@pytest.mark.parametrize("arch", ["bert", "roberta"])
def test_multi_label_classification(tiny_checkpoint, tmp_path: Path, arch: str) -> None:
    checkpoint = tiny_checkpoint(
        arch, "classification", problem_type="multi_label_classification", labels=["a", "b", "c", "d"]
    )
    config = export_checkpoint(str(checkpoint), "multi", tmp_path, variants="fp32").config
    assert config["problem_type"] == "multi_label_classification"
    assert config["labels"] == ["a", "b", "c", "d"]
    assert config["variants"]["fp32"]["validation"]["passed"]
    assert list(config["variants"]) == ["fp32"]


@pytest.mark.parametrize(
    "overrides",
    [CROSS_ENCODER, {"labels": ["LABEL_0"], "problem_type": None}],  # regression, or one label and no problem type
    ids=["regression", "one-label"],
)
def test_a_one_label_cross_encoder_is_marked_rerank(tiny_checkpoint, tmp_path: Path, overrides: dict) -> None:
    checkpoint = tiny_checkpoint("bert", "classification", **overrides)
    config = export_checkpoint(str(checkpoint), "cross-encoder", tmp_path, variants="fp32,int8").config
    assert config["rerank"] is True and config["labels"] == ["LABEL_0"]
    assert config["problem_type"] == overrides["problem_type"]
    assert config["variants"]["fp32"]["validation"]["passed"]
    assert ModelConfig.read(tmp_path / "cross-encoder").rerank is True


def test_regression_with_several_labels_is_refused(tiny_checkpoint, tmp_path: Path) -> None:
    checkpoint = tiny_checkpoint("bert", "classification", problem_type="regression", labels=["x", "y"])
    with pytest.raises(ExportError, match="regression with one label"):
        export_checkpoint(str(checkpoint), "two-scores", tmp_path, variants="fp32")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_checkpoint_is_exported_from_fp32(tiny_checkpoint, tmp_path: Path, dtype) -> None:
    from tests.tiny_models import write_tiny_checkpoint

    checkpoint = write_tiny_checkpoint(tmp_path / "ckpt", "bert", "ner", dtype=dtype)
    config = export_checkpoint(str(checkpoint), "half", tmp_path / "models", variants="fp32").config
    assert config["source"]["stored_dtype"] == str(dtype).replace("torch.", "")
    fp32 = config["variants"]["fp32"]
    assert fp32["validation"]["passed"] and fp32["validation"]["max_abs_diff"] <= 1e-4
    graph = onnx.load(str(tmp_path / "models" / "half" / "model.fp32.onnx"))
    assert {init.data_type for init in graph.graph.initializer if init.data_type in (1, 10, 16)} == {1}


def test_weights_that_hold_nan_are_refused_naming_them(tmp_path: Path) -> None:
    """NaN in two embedding rows: an fp32 export passed its validation (whose texts never met those words) and its
    served entry failed every request with one of them; int8 failed on an assertion naming neither."""
    from safetensors.torch import load_file, save_file

    from tests.tiny_models import write_tiny_checkpoint

    checkpoint = write_tiny_checkpoint(tmp_path / "ckpt", "bert", "classification")
    weights = load_file(str(checkpoint / "model.safetensors"))
    name = next(key for key in weights if key.endswith("word_embeddings.weight"))
    weights[name][[5, 7]] = float("nan")
    save_file(weights, str(checkpoint / "model.safetensors"))
    with pytest.raises(ExportError, match=r"hold NaN or infinite values: \S*word_embeddings.weight \(\d+ values\)"):
        export_checkpoint(str(checkpoint), "nan", tmp_path / "models", variants="fp32")
    assert not (tmp_path / "models" / "nan").exists()


def test_pytorch_bin_weights(tmp_path: Path) -> None:
    from tests.tiny_models import write_tiny_checkpoint

    checkpoint = write_tiny_checkpoint(tmp_path / "ckpt", "distilbert", "qa", safe=False)
    assert (checkpoint / "pytorch_model.bin").is_file()
    config = export_checkpoint(str(checkpoint), "bin", tmp_path / "models", variants="fp32").config
    assert config["variants"]["fp32"]["validation"]["passed"]
    assert config["source"]["weights"][0]["file"] == "pytorch_model.bin"


@pytest.mark.parametrize("groups", [1, 3])
def test_albert_every_layer_fused_with_and_without_weight_sharing(tiny_checkpoint, tmp_path: Path, groups: int):
    checkpoint = tiny_checkpoint("albert", "classification", num_hidden_layers=6, num_hidden_groups=groups)
    config = export_checkpoint(str(checkpoint), "albert6", tmp_path, variants="fp32").config
    assert config["encoder"]["layers"] == 6
    assert config["variants"]["fp32"]["fused_operators"]["Attention"] == 6


def test_max_length_and_opset_are_recorded(tiny_checkpoint, tmp_path: Path) -> None:
    config = export_checkpoint(
        str(tiny_checkpoint("bert", "ner")), "short", tmp_path, variants="fp32", max_length=32, opset=14
    ).config
    assert config["max_length"] == 32 and config["export"]["opset"] == 14
    assert max(case["shape"][1] for case in config["variants"]["fp32"]["validation"]["cases"]) == 32
    assert onnx.load(str(tmp_path / "short" / "model.fp32.onnx")).opset_import[0].version == 14


def test_reexport_replaces_the_entry(tiny_checkpoint, tmp_path: Path) -> None:
    first = export_checkpoint(str(tiny_checkpoint("bert", "qa")), "m", tmp_path, variants="fp32")
    second = export_checkpoint(str(tiny_checkpoint("roberta", "qa")), "m", tmp_path, variants="fp32,int8")
    assert first.config["model_type"] == "bert"
    assert read_config(tmp_path / "m")["model_type"] == "roberta"
    assert sorted(p.name for p in (tmp_path / "m").glob("*.onnx")) == ["model.fp32.onnx", "model.int8.onnx"]
    assert [p.name for p in tmp_path.iterdir()] == ["m"]
    assert second.entry == tmp_path / "m"
