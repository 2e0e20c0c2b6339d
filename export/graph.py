"""PyTorch -> ONNX: one graph with dynamic batch and sequence axes and exactly the inputs the architecture uses."""

from __future__ import annotations

import warnings
from pathlib import Path

import torch

from bertcore.messages import one_line
from export.architectures import OUTPUT_AXES, OUTPUT_NAMES
from export.checkpoint import Checkpoint
from export.errors import ExportError

MIN_OPSET = 14
MAX_OPSET = 20
DEFAULT_OPSET = 17


def export_onnx(checkpoint: Checkpoint, path: Path, opset: int) -> None:
    """Trace the model with the legacy (TorchScript) exporter.

    The dynamo exporter was measured here too: on transformers 5 encoders its graph is not fused by the
    ONNX Runtime optimizer (Attention: 0) and it exports about 30x slower, so the legacy path is used.
    """
    if not MIN_OPSET <= opset <= MAX_OPSET:
        raise ExportError(f"--opset {opset} is out of range: {MIN_OPSET} to {MAX_OPSET} are supported")
    input_names = list(checkpoint.input_names)
    output_names = list(OUTPUT_NAMES[checkpoint.task])
    wrapper = PositionalOutputs(checkpoint.model, input_names, output_names).eval()
    example = _example_inputs(checkpoint)
    dynamic_axes: dict[str, dict[int, str]] = {name: {0: "batch", 1: "sequence"} for name in input_names}
    dynamic_axes.update({name: OUTPUT_AXES[checkpoint.task] for name in output_names})
    try:
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # tracer warnings about Python branches on shapes; validation checks them
            torch.onnx.export(
                wrapper,
                tuple(example[name] for name in input_names),
                str(path),
                input_names=input_names,
                output_names=output_names,
                dynamic_axes=dynamic_axes,
                opset_version=opset,
                do_constant_folding=True,
                dynamo=False,
            )
    except Exception as exc:
        raise ExportError(f"torch.onnx.export failed: {one_line(exc)}") from exc


class PositionalOutputs(torch.nn.Module):
    """Positional tensors in, a tuple of the named outputs out: what the tracer wants."""

    def __init__(self, model: torch.nn.Module, input_names: list[str], output_names: list[str]) -> None:
        super().__init__()
        self.model = model
        self.input_names = input_names
        self.output_names = output_names

    def forward(self, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        outputs = self.model(**dict(zip(self.input_names, tensors, strict=True)), return_dict=True)
        return tuple(outputs[name] for name in self.output_names)


def _example_inputs(checkpoint: Checkpoint) -> dict[str, torch.Tensor]:
    """Two rows, the second padded, so that no 'mask is all ones' shortcut gets traced into the graph."""
    tokenizer = checkpoint.tokenizer
    encoded = tokenizer(
        ["The quick brown fox jumps over the lazy dog near the river bank.", "A short one."],
        ["Who jumps?", "What?"],
        padding=True,
        truncation=True,
        max_length=min(32, checkpoint.max_length),
        return_tensors="pt",
    )
    ids = encoded["input_ids"]
    inputs = {"input_ids": ids, "attention_mask": encoded["attention_mask"]}
    inputs["token_type_ids"] = encoded.get("token_type_ids", torch.zeros_like(ids))
    return {name: inputs[name].to(torch.int64) for name in checkpoint.input_names}
