"""Static int8: the dynamic int8 graph with every activation scale fixed at export from calibration text.

Dynamic quantization (DynamicQuantizeLinear) computes each activation's scale and zero point from the whole
batch tensor at run time, so a row's answer depends on the rows it is batched with. Here each
DynamicQuantizeLinear becomes a QuantizeLinear with a constant scale and zero point, computed from the range
the tensor took over the calibration inputs (each run alone, so padding never widens a range). The integer
operators (QAttention, MatMulInteger, QEmbedLayerNormalization) and the per-channel int8 weights stay as
quantize_dynamic wrote them, so the speed stays close to dynamic int8's, and every operator now treats each
row on its own: a row's output is the same alone or in any batch.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper, numpy_helper

from bertcore.messages import one_line
from export.calibration_text import builtin_texts
from export.checkpoint import Checkpoint
from export.errors import ExportError
from export.variants import INT8_WEIGHT_LIMIT

Text = tuple[str, str | None]
MAX_CALIBRATION_INPUTS = 2000


@dataclass(frozen=True)
class CalibrationSet:
    source: str  # "built-in" or the file's path
    texts: list[Text]


def calibration_set(task: str, path: Path | None) -> CalibrationSet:
    """The user's text (one input a line; for QA `question<TAB>context`), or the built-in set."""
    if path is None:
        return CalibrationSet("built-in", builtin_texts(task))
    try:
        with path.open(encoding="utf-8", newline="") as stream:
            rows = [row for row in csv.reader(stream, delimiter="\t", quoting=csv.QUOTE_NONE) if any(row)]
    except (OSError, UnicodeDecodeError) as exc:
        raise ExportError(f"cannot read the calibration text {path}: {one_line(exc)}") from exc
    if not rows:
        raise ExportError(f"the calibration text {path} has no text: static int8 needs at least one input line")
    if task == "qa":
        bad = next((i for i, row in enumerate(rows, 1) if len(row) < 2 or not row[0].strip() or not row[1].strip()), 0)
        if bad:
            raise ExportError(f"{path} line {bad}: question-answering calibration lines are `question<TAB>context`")
        texts: list[Text] = [(row[0], "\t".join(row[1:])) for row in rows]
    else:
        texts = [("\t".join(row), None) for row in rows]
    return CalibrationSet(str(path), texts[:MAX_CALIBRATION_INPUTS])


def calibration_feeds(checkpoint: Checkpoint, texts: list[Text]) -> list[dict[str, np.ndarray]]:
    """One row per feed, truncated to the model's window (QA: the context is cut, never the question)."""
    tokenizer = checkpoint.tokenizer
    feeds = []
    for first, second in texts:
        encoded = tokenizer(
            first,
            second,
            truncation="only_second" if second is not None else True,
            max_length=checkpoint.max_length,
            return_tensors="np",
        )
        ids = encoded["input_ids"].astype(np.int64)
        row = {"input_ids": ids, "attention_mask": np.ones_like(ids)}
        row["token_type_ids"] = encoded.get("token_type_ids", np.zeros_like(ids)).astype(np.int64)
        feeds.append({name: row[name] for name in checkpoint.input_names})
    return feeds


def write_int8_static(
    dynamic: Path, out: Path, feeds: list[dict[str, np.ndarray]], fp32: Path | None = None
) -> dict[str, Any]:
    """Freeze the activation scales of `dynamic` (a quantize_dynamic output of `fp32`) on `feeds`.

    Returns what was done. `fp32` gives the exact weight rows for the outlier channels (else they are the
    dequantized int8 rows, whose rounding those channels' large values amplify).
    """
    model = onnx.load(str(dynamic))
    quantizers = [node for node in model.graph.node if node.op_type == "DynamicQuantizeLinear"]
    if not quantizers:
        raise ExportError("static int8: the int8 graph has no dynamically quantized activations to calibrate")
    if not feeds:
        raise ExportError("static int8: no calibration inputs")
    ranges = _observed_ranges(model, sorted({node.input[0] for node in quantizers}), feeds)
    chains = _integer_matmul_chains(model)
    initializers = {tensor.name: tensor for tensor in model.graph.initializer}
    exact = _float_weights(fp32, {chain.matmul.input[1] for chain in chains}) if fp32 is not None else {}
    before: dict[int, list[onnx.NodeProto]] = {}
    after: dict[int, list[onnx.NodeProto]] = {}
    replacements: dict[int, onnx.NodeProto] = {}
    split = copied = 0
    for node in quantizers:
        source = str(node.input[0])
        quantized, scale_name, zero_point_name = (str(name) for name in node.output)
        low, high = ranges[source]
        users = [chain for chain in chains if chain.matmul.input[0] == quantized]
        splittable = (
            users
            and len(users) == _use_count(model, quantized)
            and all(_use_count(model, chain.matmul.input[1]) == 1 for chain in users)  # its weight rows get zeroed
        )
        outliers = outlier_channels(low, high) if splittable else []
        keep = np.ones(len(low), dtype=bool)
        keep[outliers] = False
        scale, zero_point = uint8_scale(float(low[keep].min()), float(high[keep].max()))
        model.graph.initializer.extend(
            [
                numpy_helper.from_array(np.array(scale, dtype=np.float32), scale_name),
                numpy_helper.from_array(np.array(zero_point, dtype=np.uint8), zero_point_name),
            ]
        )
        exact_rows = [_exact_rows(chain, outliers, initializers, exact) for chain in users] if outliers else []
        copies = (
            _copies_needed(low[outliers], high[outliers], scale, zero_point)
            if outliers
            and all(_widens(chain, initializers) for chain in users)
            and all(rows is not None for rows in exact_rows)
            else 0
        )
        if copies:
            split += 1
            copied += 1
            after[id(node)] = _outlier_copies(model, node, outliers, copies, scale, users, exact_rows, initializers)
        elif outliers:
            split += 1
            gather, gathered = _gather_outliers(model, node.name, source, outliers)
            before[id(node)] = [gather]
            for chain, rows in zip(users, exact_rows, strict=True):
                after[id(chain.mul)] = _outlier_product(model, chain, gathered, outliers, rows, initializers)
        replacements[id(node)] = helper.make_node(
            "QuantizeLinear", [source, scale_name, zero_point_name], [quantized], name=f"{node.name}.static"
        )
    nodes = []
    for node in model.graph.node:
        nodes.extend(before.get(id(node), []))
        nodes.append(replacements.get(id(node), node))
        nodes.extend(after.get(id(node), []))
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    fused = fuse_integer_matmuls(model)
    onnx.save(model, str(out))
    return {
        "activations": len(replacements),
        "inputs": len(feeds),
        "method": (
            "min-max over the calibration inputs; outlier channels (largest |value| over "
            f"{OUTLIER_RATIO:g}x the median channel's, at most {MAX_OUTLIER_CHANNELS}) of a MatMul's input "
            "left out of its int8 range: into a widening MatMul as dithered int8 copies at the range's step, "
            "else multiplied in fp32"
        ),
        "outlier_split_activations": split,
        "outlier_copied_activations": copied,
        "fused_matmuls": fused,
    }


# BERT-family hidden states carry a few channels with values an order of magnitude above the rest at every token
# (MiniLM: one channel near 28-30 against a median channel of 1.8 after the attention LayerNorm). One per-tensor
# uint8 scale over that range leaves the other 383 channels with a handful of levels. Those channels go round
# the int8 product: left out of the range (their int8 weight rows zeroed, so their saturated values count for
# nothing), multiplied in fp32 by their exact weight rows and added back in the same Gemm.
OUTLIER_RATIO = 8.0
MAX_OUTLIER_CHANNELS = 4


def outlier_channels(low: np.ndarray, high: np.ndarray) -> list[int]:
    """Channels whose largest |value| is OUTLIER_RATIO times the median channel's or more, largest first."""
    peak = np.maximum(np.abs(low), np.abs(high))
    median = float(np.median(peak))
    if peak.size < 2 * MAX_OUTLIER_CHANNELS or median <= 0:
        return []
    order = [int(c) for c in np.argsort(-peak, kind="stable") if peak[c] >= OUTLIER_RATIO * median]
    return order[:MAX_OUTLIER_CHANNELS]


@dataclass(frozen=True)
class _Chain:
    """MatMulInteger -> Cast -> Mul(by scales = a_scale * b_scale): the int8 product as quantize_dynamic writes it."""

    matmul: onnx.NodeProto
    cast: onnx.NodeProto
    mul: onnx.NodeProto
    scales: onnx.NodeProto

    @property
    def weight_scale(self) -> str:
        return str(self.scales.input[1])


def _integer_matmul_chains(model: onnx.ModelProto) -> list[_Chain]:
    producer = {output: node for node in model.graph.node for output in node.output}
    consumers = _consumers(model)
    chains = []
    for node in model.graph.node:
        if node.op_type != "MatMulInteger" or len(node.input) != 4:
            continue
        cast = _only_consumer(consumers, node.output[0], "Cast")
        if cast is None:
            continue
        mul = _only_consumer(consumers, cast.output[0], "Mul")
        if mul is None:
            continue
        scales = producer.get(mul.input[1] if mul.input[0] == cast.output[0] else mul.input[0])
        if scales is None or scales.op_type != "Mul":
            continue
        chains.append(_Chain(node, cast, mul, scales))
    return chains


# Outlier channels as copies inside the int8 product. A channel x that needs C times the range of the others goes
# in as C extra input channels, each x/C plus a dither of (i + 0.5 - C/2) steps, quantized at the others' step: the
# C rounded copies sum to x rounded at that step (Hermite's identity), so x is as precise as any other channel
# and never saturates. Its weight row goes in C times, each copy rounded with a dither of its own from the exact
# fp32 row, so that the C copies sum to the row at C times int8's precision (the plain int8 row, multiplied by
# x's large values, cost 1.3 points of CoNLL F1). For a MatMul that widens (MiniLM's FFN input: 384 channels in,
# 1536 out) this replaces the fp32 Gemm's pass over the wide output by a concatenation of uint8 input channels:
# measured 5% less time for static int8 on SQuAD-length input (4 x 384 tokens), and no change on SST-2 batches.
OUTLIER_RANGE_MARGIN = 1.5  # serving text may reach past the calibration's peak; the copies cover 1.5x it
MAX_OUTLIER_COPIES = 16


def _widens(chain: _Chain, initializers: dict[str, onnx.TensorProto]) -> bool:
    rows, columns = initializers[chain.matmul.input[1]].dims
    return columns > rows


def _copies_needed(low: np.ndarray, high: np.ndarray, scale: float, zero_point: int) -> int:
    """Copies that keep every outlier value (with the margin) inside the uint8 range at `scale`; 0: none do."""
    room_up, room_down = (254 - zero_point) * scale, (zero_point - 1) * scale  # half a step kept clear each side
    need = 1.0
    for peak, room in ((float(high.max()), room_up), (-float(low.min()), room_down)):
        if peak > 0:
            if room <= 0:
                return 0
            need = max(need, OUTLIER_RANGE_MARGIN * peak / room)
    copies = int(np.ceil(need))
    return copies if copies <= MAX_OUTLIER_COPIES else 0


def _outlier_copies(
    model: onnx.ModelProto,
    node: onnx.NodeProto,
    outliers: list[int],
    copies: int,
    scale: float,
    users: list[_Chain],
    exact_rows: list[np.ndarray | None],
    initializers: dict[str, onnx.TensorProto],
) -> list[onnx.NodeProto]:
    """The nodes that append the outlier channels' copies to the quantized input of `users`, whose weights get the
    dithered copies of those rows (and zeros in the rows of the original, saturated channels)."""
    source, quantized, zero_point_name = str(node.input[0]), str(node.output[0]), str(node.output[2])
    name = node.name
    steps = np.arange(copies) + 0.5 - copies / 2  # the activation's dither, in steps of the range
    names = {part: f"{name}.outlier_copies_{part}" for part in ("index", "dither", "scale", "float", "uint8", "all")}
    model.graph.initializer.extend(
        [
            numpy_helper.from_array(np.repeat(np.array(outliers, dtype=np.int64), copies), names["index"]),
            numpy_helper.from_array(np.tile(steps * scale, len(outliers)).astype(np.float32), names["dither"]),
            numpy_helper.from_array(np.array(scale * copies, dtype=np.float32), names["scale"]),
        ]
    )
    for chain, rows in zip(users, exact_rows, strict=True):
        assert rows is not None
        _, weight, _, weight_zero_point = chain.matmul.input
        kept = _without_rows(chain, outliers, initializers)
        zero_point = numpy_helper.to_array(initializers[weight_zero_point]).astype(np.float64)
        weight_scale = numpy_helper.to_array(initializers[chain.weight_scale]).astype(np.float64)
        # int8 weights are symmetric, in the 7-bit range that every CPU sums without saturating
        low, high = (-INT8_WEIGHT_LIMIT, INT8_WEIGHT_LIMIT) if kept.dtype == np.int8 else (0, 255)
        dithered = [
            np.clip(np.round(row / weight_scale + (copies - 1 - i + 0.5) / copies - 0.5) + zero_point, low, high)
            for row in rows.astype(np.float64)
            for i in range(copies)  # the reverse of the activation's dither: the two do not round together
        ]
        widened = np.concatenate([kept, np.array(dithered, dtype=kept.dtype)])
        initializers[weight].CopyFrom(numpy_helper.from_array(widened, weight))
        chain.matmul.input[0] = names["all"]
    return [
        helper.make_node(
            "Gather", [source, names["index"]], [f"{names['float']}_x"], name=f"{name}.gather_copies", axis=-1
        ),
        helper.make_node("Add", [f"{names['float']}_x", names["dither"]], [names["float"]], name=f"{name}.dither"),
        helper.make_node(
            "QuantizeLinear", [names["float"], names["scale"], zero_point_name], [names["uint8"]], name=f"{name}.copies"
        ),
        helper.make_node("Concat", [quantized, names["uint8"]], [names["all"]], name=f"{name}.with_copies", axis=-1),
    ]


def _gather_outliers(model: onnx.ModelProto, name: str, source: str, outliers: list[int]) -> tuple[onnx.NodeProto, str]:
    """The outlier channels of `source`, gathered apart. The int8 product still sees them (quantized, saturated)
    but multiplies them by weight rows set to zero: no pass over the whole tensor to mask them."""
    index, gathered = f"{name}.outlier_index", f"{source}.outliers"
    model.graph.initializer.append(numpy_helper.from_array(np.array(outliers, dtype=np.int64), index))
    return helper.make_node("Gather", [source, index], [gathered], name=f"{name}.gather_outliers", axis=-1), gathered


def _outlier_product(
    model: onnx.ModelProto,
    chain: _Chain,
    gathered: str,
    outliers: list[int],
    exact_rows: np.ndarray | None,
    initializers: dict[str, onnx.TensorProto],
) -> list[onnx.NodeProto]:
    """The outlier channels times their weight rows in fp32 (`exact_rows`, else the dequantized int8 rows), added
    to the int8 product, whose rows for those channels become zero.

    One Gemm (outliers x rows + int8 product, on 2-D views) does the product and the sum: a MatMul then an Add
    made two more passes over the product's output (measured: static int8 on SQuAD-length input 5% faster,
    bit-identical output, still one row at a time)."""
    weight = chain.matmul.input[1]
    rows = exact_rows if exact_rows is not None else _dequantized_rows(chain, outliers, initializers)
    without = _without_rows(chain, outliers, initializers)
    initializers[weight].CopyFrom(numpy_helper.from_array(without, weight))
    name = chain.matmul.name
    # the 2-D shapes Gemm takes: (tokens, outlier channels) and (tokens, outputs)
    rows_name, outliers_shape, product_shape = (
        f"{name}.outlier_rows",
        f"{name}.outliers_2d_shape",
        f"{name}.product_2d_shape",
    )
    model.graph.initializer.extend(
        [
            numpy_helper.from_array(rows, rows_name),
            numpy_helper.from_array(np.array([-1, len(outliers)], dtype=np.int64), outliers_shape),
            numpy_helper.from_array(np.array([-1, rows.shape[1]], dtype=np.int64), product_shape),
        ]
    )
    output = chain.mul.output[0]
    inliers = chain.mul.output[0] = f"{output}.inliers"
    return [
        helper.make_node("Reshape", [gathered, outliers_shape], [f"{name}.outliers"], name=f"{name}.outliers_2d"),
        helper.make_node("Reshape", [inliers, product_shape], [f"{inliers}_2d"], name=f"{name}.inliers_2d"),
        helper.make_node(
            "Gemm", [f"{name}.outliers", rows_name, f"{inliers}_2d"], [f"{output}_2d"], name=f"{name}.outlier_gemm"
        ),
        helper.make_node("Shape", [inliers], [f"{output}.shape"], name=f"{name}.output_shape"),
        helper.make_node("Reshape", [f"{output}_2d", f"{output}.shape"], [output], name=f"{name}.add_outliers"),
    ]


def _exact_rows(
    chain: _Chain, outliers: list[int], initializers: dict[str, onnx.TensorProto], exact: dict[str, np.ndarray]
) -> np.ndarray | None:
    """The fp32 weight rows of `outliers`, or None where the fp32 tensor of the weight's name is not this weight
    (a MatMul by a transposed initializer is folded by quantize_dynamic into a new weight under the old name): it
    must have the same shape, and rows within one rounding step of the int8 ones."""
    weight = chain.matmul.input[1]
    original = exact.get(weight)
    if original is None or original.shape != tuple(initializers[weight].dims):
        return None
    weight_scale = numpy_helper.to_array(initializers[chain.weight_scale]).astype(np.float32)
    candidate = original[outliers].astype(np.float32)
    rows = _dequantized_rows(chain, outliers, initializers)
    return candidate if np.all(np.abs(candidate - rows) <= np.abs(weight_scale) * 0.5 + 1e-6) else None


def _dequantized_rows(chain: _Chain, outliers: list[int], initializers: dict[str, onnx.TensorProto]) -> np.ndarray:
    _, weight, _, weight_zero_point = chain.matmul.input
    integer = numpy_helper.to_array(initializers[weight])
    zero_point = numpy_helper.to_array(initializers[weight_zero_point]).astype(np.float32)
    weight_scale = numpy_helper.to_array(initializers[chain.weight_scale]).astype(np.float32)
    return (integer[outliers].astype(np.float32) - zero_point) * weight_scale


def _without_rows(chain: _Chain, outliers: list[int], initializers: dict[str, onnx.TensorProto]) -> np.ndarray:
    """The int8 weight with the rows of `outliers` at the zero point: their saturated inputs count for nothing."""
    _, weight, _, weight_zero_point = chain.matmul.input
    integer = numpy_helper.to_array(initializers[weight]).copy()
    zero_point = numpy_helper.to_array(initializers[weight_zero_point])
    integer[outliers] = np.broadcast_to(zero_point, integer[outliers].shape)
    return integer


def _float_weights(fp32: Path, quantized: set[str]) -> dict[str, np.ndarray]:
    """The fp32 weights behind quantize_dynamic's `NAME_quantized` initializers, by the quantized name."""
    wanted = {name.removesuffix("_quantized"): name for name in quantized if name.endswith("_quantized")}
    graph = onnx.load(str(fp32)).graph
    return {wanted[t.name]: numpy_helper.to_array(t) for t in graph.initializer if t.name in wanted}


def _use_count(model: onnx.ModelProto, tensor: str) -> int:
    return sum(name == tensor for node in model.graph.node for name in node.input)


def _consumers(model: onnx.ModelProto) -> dict[str, list[onnx.NodeProto]]:
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in model.graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    return consumers


def fuse_integer_matmuls(model: onnx.ModelProto) -> int:
    """MatMulInteger -> Cast -> Mul(by a_scale * b_scale) becomes one MatMulIntegerToFloat.

    onnxruntime fuses this chain itself only while the scale product is computed by a node; with the activation
    scale now a constant, its constant folding removes that node first and the chain stays three kernels
    (measured: static int8 at about two thirds of dynamic int8's speed). Same arithmetic, one kernel.
    """
    graph = model.graph
    consumers = _consumers(model)
    removed: set[int] = set()
    replaced: dict[int, onnx.NodeProto] = {}
    for chain in _integer_matmul_chains(model):
        if len(consumers.get(chain.scales.output[0], [])) != 1:
            continue
        a_scale, b_scale = chain.scales.input
        a, b, a_zero_point, b_zero_point = chain.matmul.input
        fused = helper.make_node(
            "MatMulIntegerToFloat",
            [a, b, a_scale, b_scale, a_zero_point, b_zero_point],
            [chain.mul.output[0]],
            name=f"{chain.matmul.name}.to_float",
            domain="com.microsoft",
        )
        replaced[id(chain.matmul)] = fused
        removed.update({id(chain.cast), id(chain.mul), id(chain.scales)})
    nodes = [replaced.get(id(node), node) for node in graph.node if id(node) not in removed]
    del graph.node[:]
    graph.node.extend(nodes)
    return len(replaced)


def _only_consumer(consumers: dict[str, list[onnx.NodeProto]], tensor: str, op_type: str) -> onnx.NodeProto | None:
    found = consumers.get(tensor, [])
    return found[0] if len(found) == 1 and found[0].op_type == op_type else None


def uint8_scale(low: float, high: float) -> tuple[float, int]:
    """DynamicQuantizeLinear's own rule, over a fixed range: uint8, the range widened to include 0."""
    low, high = min(low, 0.0), max(high, 0.0)
    if high == low:
        return 1.0, 0
    scale = (high - low) / 255.0
    return scale, int(np.clip(round(-low / scale), 0, 255))


def _observed_ranges(
    model: onnx.ModelProto, tensors: list[str], feeds: list[dict[str, np.ndarray]]
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Per tensor, the lowest and highest value of each channel (last axis) over the feeds."""
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    del probe.graph.output[:]
    probe.graph.output.extend(helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None) for name in tensors)
    options = ort.SessionOptions()
    options.log_severity_level = 3
    try:
        session = ort.InferenceSession(probe.SerializeToString(), options, providers=["CPUExecutionProvider"])
    except Exception as exc:
        raise ExportError(f"static int8: cannot run the graph to calibrate it: {one_line(exc)}") from exc
    low: dict[str, np.ndarray] = {}
    high: dict[str, np.ndarray] = {}
    for feed in feeds:
        for name, value in zip(tensors, session.run(tensors, feed), strict=True):
            rows = value.reshape(-1, value.shape[-1]) if value.ndim else value.reshape(1, 1)
            low[name] = np.minimum(low[name], rows.min(axis=0)) if name in low else rows.min(axis=0)
            high[name] = np.maximum(high[name], rows.max(axis=0)) if name in high else rows.max(axis=0)
    for name in tensors:
        if not (np.isfinite(low[name]).all() and np.isfinite(high[name]).all()):
            raise ExportError(
                f"static int8: calibration found a non-finite value in {name}; the model cannot be quantized"
            )
    return {name: (low[name].astype(np.float64), high[name].astype(np.float64)) for name in tensors}
