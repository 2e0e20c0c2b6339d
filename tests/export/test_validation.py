"""Validation sees NaN and infinity: in the checkpoint's own outputs, in a variant's, and in their differences."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper
from safetensors.torch import load_file, save_file

from export.checkpoint import load_checkpoint
from export.cli import main
from export.validation import build_cases, create_session, max_abs_diff, reference_outputs, validate


def test_nan_weights_are_refused(tiny_checkpoint, tmp_path: Path, capsys) -> None:
    checkpoint = shutil.copytree(tiny_checkpoint("bert", "classification"), tmp_path / "nan")
    weights = load_file(str(checkpoint / "model.safetensors"))
    weights["bert.embeddings.position_embeddings.weight"][5:] = float("nan")
    save_file(weights, str(checkpoint / "model.safetensors"), metadata={"format": "pt"})
    repository = tmp_path / "models"
    code = main([str(checkpoint), "--name", "nan", "--repository", str(repository), "--variants", "fp32", "--quiet"])
    err = capsys.readouterr().err.strip()
    assert code == 1
    assert err.startswith("error: the weights of ") and "\n" not in err, err  # found in the weights themselves
    assert "hold NaN or infinite values: bert.embeddings.position_embeddings.weight (" in err, err
    assert err.endswith("the checkpoint is corrupt or its training diverged"), err
    assert not repository.exists()


def test_a_variant_with_nan_outputs_fails_validation(tiny_checkpoint, tmp_path: Path) -> None:
    """A real fp32 graph whose first logit gets NaN added: its differences are NaN, not 0, and it fails."""
    repository = tmp_path / "models"
    source = str(tiny_checkpoint("bert", "classification"))
    assert main([source, "--name", "m", "--repository", str(repository), "--variants", "fp32", "--quiet"]) == 0
    model = onnx.load(str(repository / "m" / "model.fp32.onnx"))
    (last,) = [node for node in model.graph.node if "logits" in node.output]
    last.output[list(last.output).index("logits")] = "logits_before_nan"
    model.graph.initializer.append(numpy_helper.from_array(np.array([np.nan, 0, 0], dtype=np.float32), "nan_row"))
    model.graph.node.append(onnx.helper.make_node("Add", ["logits_before_nan", "nan_row"], ["logits"]))
    onnx.save(model, str(tmp_path / "nan.onnx"))

    checkpoint = load_checkpoint(source)
    cases = build_cases(checkpoint)
    references = reference_outputs(checkpoint, cases)
    session = create_session(str(tmp_path / "nan.onnx"), "CPUExecutionProvider")
    for tolerance in (1e-4, None):  # fp32 against its tolerance; the others have none, and still fail
        report = validate("fp32", session, checkpoint, cases, references, tolerance)
        assert report.passed is False
        assert report.reason == "fp32 outputs are not finite (NaN) on 9 of 9 inputs"
        assert report.max_abs_diff is not None and np.isnan(report.max_abs_diff)
        recorded = report.to_dict()
        assert recorded["max_abs_diff"] is None
        json.dumps(recorded, allow_nan=False)  # model.json stays JSON


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_a_non_finite_difference_is_the_largest(bad: float) -> None:
    reference = {"logits": np.array([[0.0, 1.0], [2.0, 3.0]], dtype=np.float32)}
    produced = {"logits": np.array([[0.0, bad], [2.0, 3.0]], dtype=np.float32)}
    diff = max_abs_diff("classification", reference, produced, np.ones((2, 2), dtype=bool))
    assert not np.isfinite(diff)
    assert not diff <= 1e-4
