"""The model variants written from the fused fp32 graph: fp16 for the CUDA provider, int8 for the CPU.

`int8` is static (batch-invariant: activation scales fixed at export from calibration text, see
export/calibration.py); `int8-dynamic` computes activation scales per batch at run time, so a row's answer can
move with its batch neighbours. It is a little faster, and kept for those who accept that.
"""

from __future__ import annotations

import logging
from pathlib import Path

import onnx
from onnxruntime.quantization import QuantType, quantize_dynamic
from onnxruntime.transformers.onnx_model import OnnxModel

VARIANTS = ("fp32", "fp16", "int8", "int8-dynamic")
DEFAULT_VARIANTS = ("fp32", "fp16", "int8")
VARIANT_PROVIDERS = {
    "fp32": ["CPUExecutionProvider"],
    "fp16": ["CUDAExecutionProvider"],
    "int8": ["CPUExecutionProvider"],
    "int8-dynamic": ["CPUExecutionProvider"],
}


# int8 weights use 7 bits (-64..64). ONNX Runtime's int8 product on a CPU without AVX-512 VNNI (AVX2: vpmaddubsw)
# adds two uint8 x int8 products into an int16 that saturates: 255 x 127 x 2 does not fit, 255 x 64 x 2 does. With
# the full range, on an AVX2-only machine, SST-2 int8 labels agreed with fp32 on 37 of 48 real sentences and the
# SQuAD start/end logits moved 0.46-0.47 rms where VNNI machines (exact int32 sums) met the tests; with 7 bits both
# kinds of CPU compute the same exact sums, so an int8 model answers alike wherever it runs.
INT8_WEIGHT_LIMIT = 64


def file_name(variant: str) -> str:
    return f"model.{variant}.onnx"


def write_fp16(fused_fp32: Path, out: Path) -> None:
    """fp16 weights and compute; inputs and outputs stay as in fp32 (int64 ids in, float32 logits out)."""
    model = OnnxModel(onnx.load(str(fused_fp32)))
    model.convert_float_to_float16(keep_io_types=True)
    model.save_model_to_file(str(out))


def write_int8_dynamic(fused_fp32: Path, out: Path) -> None:
    """Dynamic quantization: int8 weights (per channel), activation scales computed per batch at run time."""
    graph = onnx.load(str(fused_fp32), load_external_data=False).graph
    # ALBERT's embedding projection feeds the residual stream itself (every other MatMul's output meets the
    # residual in a SkipLayerNormalization): quantizing its input put the quantization error into every layer's
    # residual. Kept in fp32 (one small MatMul): CoNLL-2003 entity F1 loss against fp32 0.96 -> 0.34 points
    # with static int8 on the ported MiniLM (1,500 sentences), the same as the other architectures.
    residual_projections = [
        node.name for node in graph.node if node.op_type == "MatMul" and "embedding_hidden_mapping_in" in node.name
    ]
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)  # quantize_dynamic logs a pre-processing hint on the root logger
    try:
        quantize_dynamic(
            str(fused_fp32),
            str(out),
            weight_type=QuantType.QInt8,
            nodes_to_exclude=residual_projections,
            # Per-channel weight scales: on SST-2 dev (MiniLM) int8 labels agree with fp32 on 98.3% of sentences,
            # against 96.6% per tensor, at the same size and speed.
            per_channel=True,
            reduce_range=True,  # weights in -64..64: INT8_WEIGHT_LIMIT
            # Shape inference does not know the fused contrib ops' output types without this.
            extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT},
        )
    finally:
        root.setLevel(level)
