"""The export, start to end: checkpoint -> ONNX -> fused graph -> variants -> validation -> repository entry."""

from __future__ import annotations

import datetime as dt
import math
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import onnx
import onnxruntime as ort
from tokenizers import Tokenizer

from bertcore.messages import one_line
from bertcore.model_config import FORMAT_VERSION
from bertcore.version import __version__
from export.architectures import OUTPUT_NAMES
from export.calibration import CalibrationSet, calibration_feeds, calibration_set, write_int8_static
from export.checkpoint import Checkpoint, load_checkpoint
from export.embedding_check import COSINE_BOUNDS, EmbeddingReference, cosines, embedding_reference
from export.errors import ExportError
from export.evaluation import (
    DEFAULT_MAX_LOSS,
    FORMATS,
    PRIMARY_METRIC,
    EvalSet,
    load_eval_set,
    measure_variants,
    refusal_reason,
)
from export.flash_attention import rewrite_int8_attention
from export.fusion import check_attention_fused, optimize, write_cpu_graph
from export.graph import DEFAULT_OPSET, MAX_OPSET, MIN_OPSET, export_onnx
from export.repository import check_name, check_target, staged_entry, write_config
from export.validation import (
    FP32_TOLERANCE,
    Case,
    Validation,
    build_cases,
    create_session,
    reference_outputs,
    validate,
)
from export.variants import (
    DEFAULT_VARIANTS,
    VARIANT_PROVIDERS,
    VARIANTS,
    file_name,
    write_fp16,
    write_int8_dynamic,
)

FUSED_FILE = "model.fused.onnx"  # the optimizer's graph: fp16 is made from it, the CPU graphs split it
# int8 attention through flash attention (export/flash_attention.py) where inputs are long: QA's question and
# context windows. One thread, MiniLM int8: 4 x 384 tokens 11% faster, 8 x 192 8%, 16 x 160 6%. At SST-2 and CoNLL
# lengths it gains 0-6% on one thread and loses 3-10% on two (16 x 24 to 32 x 24 tokens), so they keep QAttention.
FLASH_ATTENTION_TASKS = ("qa",)
FLASH_ATTENTION_VARIANTS = ("int8", "int8-dynamic")

Progress = Callable[[str], None]


@dataclass
class ExportResult:
    entry: Path
    config: dict[str, Any]
    seconds: float


def parse_variants(variants: str | Iterable[str]) -> list[str]:
    """fp32 always comes first (the others are made from it, and it is the CPU default)."""
    names = [v.strip() for v in (variants.split(",") if isinstance(variants, str) else variants) if v.strip()]
    unknown = sorted(set(names) - set(VARIANTS))
    if unknown:
        raise ExportError(f"unknown variant(s) {', '.join(unknown)}; choose from {', '.join(VARIANTS)}")
    return [v for v in VARIANTS if v == "fp32" or v in names]


def export_checkpoint(
    source: str,
    name: str,
    repository: Path,
    task: str = "auto",
    variants: str | Iterable[str] = DEFAULT_VARIANTS,
    max_length: int | None = None,
    opset: int = DEFAULT_OPSET,
    demo: bool = False,
    progress: Progress = lambda _: None,
    eval_path: Path | None = None,
    eval_limit: int | None = None,
    max_accuracy_loss: float = DEFAULT_MAX_LOSS,
    calibration: Path | None = None,
    source_info: Mapping[str, Any] | None = None,
    pooling: str | None = None,
    normalize: bool = False,
) -> ExportResult:
    """source_info: what the caller knows of where the checkpoint came from (the demo's hub id and commit),
    recorded in model.json's `source` over what the loader found. pooling, normalize: --task embedding on a base
    checkpoint (a sentence-transformers directory says its own)."""
    started = time.perf_counter()
    check_name(name)
    check_target(repository, name, source)
    wanted = parse_variants(variants)
    if not math.isfinite(max_accuracy_loss):
        raise ExportError(f"--max-accuracy-loss {max_accuracy_loss:g} is not a finite number of points")
    if max_accuracy_loss < 0:
        raise ExportError(f"--max-accuracy-loss {max_accuracy_loss:g} is negative: it is the points a variant may lose")
    if eval_limit is not None and eval_limit < 1:
        raise ExportError(f"--eval-limit {eval_limit} is out of range: give the number of examples to use, 1 or more")
    if not MIN_OPSET <= opset <= MAX_OPSET:
        raise ExportError(f"--opset {opset} is out of range: {MIN_OPSET} to {MAX_OPSET} are supported")
    progress(f"loading {source}")
    checkpoint = load_checkpoint(source, task, max_length, pooling, normalize)
    eval_set = load_eval_set(eval_path, checkpoint, eval_limit) if eval_path is not None else None
    calibration_texts = calibration_set(checkpoint.task, calibration) if "int8" in wanted else None
    cases = build_cases(checkpoint)
    references = reference_outputs(checkpoint, cases)
    embedding_ref = None
    if checkpoint.embedding is not None:
        embedding_ref = embedding_reference(checkpoint)
        progress(f"reference vectors of {len(embedding_ref.texts)} texts from {embedding_ref.source}")
    with staged_entry(repository, name) as staging:
        raw = staging / "model.raw.onnx"
        progress(f"exporting {checkpoint.class_name} to ONNX (opset {opset})")
        export_onnx(checkpoint, raw, opset)
        progress("fusing the graph")
        optimize(raw, staging / FUSED_FILE, checkpoint.num_heads, checkpoint.hidden_size)
        raw.unlink()
        write_cpu_graph(staging / FUSED_FILE, staging / file_name("fp32"))
        variant_entries = {}
        refused_early: dict[str, dict[str, Any]] = {}
        attention_fusion: dict[str, Any] = {}
        for variant in wanted:
            path = staging / file_name(variant)
            progress(f"writing and validating {variant}")
            extra = _write_variant(variant, staging, checkpoint, calibration_texts, progress)
            operators = contrib_operator_counts(path)
            if variant == "fp32":
                unfused = checkpoint.architecture.unfused_attention
                attention_fusion = check_attention_fused(operators, checkpoint.num_layers, unfused)
                if unfused is not None:
                    progress(
                        f"attention left unfused ({attention_fusion['fused_layers']} of "
                        f"{checkpoint.num_layers} layers fused): {unfused}"
                    )
            validation = _validate_variant(variant, path, checkpoint, cases, references, embedding_ref)
            if variant == "fp32" and not validation.passed:
                if validation.reason:  # outputs not finite
                    raise ExportError(f"{validation.reason}: the fp32 graph does not compute what PyTorch does")
                if validation.max_abs_diff is not None and validation.max_abs_diff > FP32_TOLERANCE:
                    raise ExportError(
                        f"fp32 ONNX output differs from PyTorch by {validation.max_abs_diff:.3g} "
                        f"(tolerance {FP32_TOLERANCE:g}); see the cases: {validation.cases}"
                    )
                raise ExportError(_cosine_refusal("fp32", validation))
            if validation.passed is False:  # outputs not finite, or an embedding variant below its cosine bound
                reason = f"{variant} refused: {validation.reason}" if validation.reason else None
                reason = reason or _cosine_refusal(variant, validation)
                progress(reason)
                path.unlink()
                refused_early[variant] = {"reason": reason, "validation": validation.to_dict()}
                continue
            variant_entries[variant] = {
                "file": path.name,
                "providers": VARIANT_PROVIDERS[variant],
                "size_bytes": path.stat().st_size,
                "fused_operators": operators,
                "validation": validation.to_dict(),
                **extra,
            }
        if "int8-dynamic" not in wanted:  # static int8 is made from it
            (staging / file_name("int8-dynamic")).unlink(missing_ok=True)
        (staging / FUSED_FILE).unlink()
        refused = refused_early | _measure_accuracy(
            staging, variant_entries, eval_set, checkpoint, max_accuracy_loss, progress
        )
        tokenizer_info = _save_tokenizer(checkpoint, staging)
        seconds = time.perf_counter() - started
        config = _entry_config(checkpoint, name, demo, opset, variant_entries, tokenizer_info, seconds)
        config["source"] = {**config["source"], **(source_info or {})}
        if checkpoint.embedding is not None:
            config["embedding"] = checkpoint.embedding.spec(checkpoint.hidden_size)
        if eval_set is not None:
            config["evaluation"] = {
                "data": str(eval_set.path),
                "format": FORMATS[checkpoint.task],
                "examples": len(eval_set),
                "metric": PRIMARY_METRIC[checkpoint.task],
                "budget_points": max_accuracy_loss,
            }
            if eval_set.header is not None:
                config["evaluation"]["header"] = eval_set.header
        config["refused_variants"] = refused
        config["attention_fusion"] = attention_fusion
        write_config(staging, config)
    return ExportResult(entry=repository / name, config=config, seconds=time.perf_counter() - started)


def _write_variant(
    variant: str, staging: Path, checkpoint: Checkpoint, calibration: CalibrationSet | None, progress: Progress
) -> dict[str, Any]:
    """Write one variant from the fused fp32 graph; returns what model.json records about how it was made."""
    fp32, dynamic = staging / file_name("fp32"), staging / file_name("int8-dynamic")
    if variant == "fp16":  # from the fused graph: CUDA's SkipLayerNormalization kernel is the fast one there
        write_fp16(staging / FUSED_FILE, staging / file_name(variant))
    if variant in ("int8", "int8-dynamic") and not dynamic.exists():
        write_int8_dynamic(fp32, dynamic)
    made: dict[str, Any] = {}
    if variant == "int8" and calibration is not None:
        progress(f"calibrating int8 on {len(calibration.texts)} inputs ({calibration.source})")
        feeds = calibration_feeds(checkpoint, calibration.texts)
        made["calibration"] = {
            "text": calibration.source,
            **write_int8_static(dynamic, staging / file_name(variant), feeds, fp32),
        }
    if variant in FLASH_ATTENTION_VARIANTS and checkpoint.task in FLASH_ATTENTION_TASKS:
        path = staging / file_name(variant)  # int8-dynamic's is also static int8's source: rewritten after it
        model = onnx.load(str(path))
        rewrite_int8_attention(model)  # model.json's fused operators show it: MultiHeadAttention for QAttention
        onnx.save(model, str(path))
    return made


def _measure_accuracy(
    staging: Path,
    entries: dict[str, dict[str, Any]],
    eval_set: EvalSet | None,
    checkpoint: Checkpoint,
    budget: float,
    progress: Progress,
) -> dict[str, dict[str, Any]]:
    """Record each variant's accuracy on the eval data; remove (and return) those over the budget. fp32 stays."""
    if eval_set is None:
        for entry in entries.values():
            entry["accuracy"] = {"measured": False, "reason": "no --eval data was given"}
        return {}
    sessions: dict[str, Any] = {}
    for variant, entry in entries.items():
        validation = entry["validation"]
        if validation["validated"]:
            sessions[variant] = create_session(str(staging / entry["file"]), validation["provider"])
        else:
            sessions[variant] = validation["reason"]
    records = measure_variants(eval_set, sessions, checkpoint.labels, budget, progress)
    refused = {}
    for variant, record in records.items():
        entries[variant]["accuracy"] = record
        if variant != "fp32" and record["measured"] and not record["within_budget"]:
            reason = refusal_reason(variant, record, eval_set)
            progress(reason)
            (staging / entries[variant]["file"]).unlink()
            refused[variant] = {"reason": reason, "accuracy": record}
            del entries[variant]
    return refused


def cpu_default(variants: dict[str, Any]) -> str:
    """int8 (the batch-invariant one) where it was measured within the accuracy budget, else fp32."""
    accuracy = variants.get("int8", {}).get("accuracy", {})
    return "int8" if accuracy.get("measured") and accuracy.get("within_budget") else "fp32"


def contrib_operator_counts(path: Path) -> dict[str, int]:
    """Fused (com.microsoft) operators in a graph, plus LayerNormalization, which the fusion also produces."""
    graph = onnx.load(str(path), load_external_data=False).graph
    counts = Counter(
        node.op_type for node in graph.node if node.domain == "com.microsoft" or node.op_type == "LayerNormalization"
    )
    return dict(sorted(counts.items()))


def _validate_variant(
    variant: str,
    path: Path,
    checkpoint: Checkpoint,
    cases: list[Case],
    references: list[dict],
    embedding_ref: EmbeddingReference | None = None,
) -> Validation:
    provider = VARIANT_PROVIDERS[variant][0]
    if provider not in ort.get_available_providers():
        return Validation(
            variant=variant,
            validated=False,
            reason=f"{provider} is not available on this machine "
            f"(onnxruntime {ort.__version__} has {', '.join(ort.get_available_providers())})",
        )
    try:
        session = create_session(str(path), provider)
    except Exception as exc:
        if variant == "fp32":
            raise ExportError(f"onnxruntime cannot load the fused fp32 graph: {one_line(exc)}") from exc
        return Validation(variant=variant, validated=False, reason=f"session failed: {one_line(exc)}")
    if session.get_providers()[0] != provider:
        return Validation(variant=variant, validated=False, reason=f"{provider} could not be initialised")
    tolerance = FP32_TOLERANCE if variant == "fp32" else None
    validation = validate(variant, session, checkpoint, cases, references, tolerance)
    if embedding_ref is not None:
        found = cosines(session, checkpoint, embedding_ref)
        bound = COSINE_BOUNDS.get(variant)
        validation.embedding_reference = {
            "reference": embedding_ref.source,
            "texts": len(found),
            "min_cosine": float(found.min()),
            "mean_cosine": float(found.mean()),
            "bound": bound,
            "cosines": [round(float(c), 7) for c in found],
        }
        if bound is not None:
            within = bool(found.min() >= bound)
            validation.passed = within if validation.passed is None else validation.passed and within
    return validation


def _cosine_refusal(variant: str, validation: Validation) -> str:
    record = validation.embedding_reference or {}
    return (
        f"{variant} refused: its vectors' least cosine with {record.get('reference')} is "
        f"{record.get('min_cosine', float('nan')):.6f} over {record.get('texts')} real texts, under the bound of "
        f"{record.get('bound')}"
    )


def _save_tokenizer(checkpoint: Checkpoint, entry: Path) -> dict[str, Any]:
    tokenizer = checkpoint.tokenizer
    try:
        tokenizer.save_pretrained(str(entry))
    except Exception as exc:
        raise ExportError(f"could not save the tokenizer: {one_line(exc)}") from exc
    if not (entry / "tokenizer.json").is_file():
        raise ExportError("the tokenizer did not produce tokenizer.json, which the server loads")
    _without_call_settings(entry / "tokenizer.json")
    special = {
        key: getattr(tokenizer, key, None)
        for key in ("pad_token", "unk_token", "cls_token", "sep_token", "mask_token", "bos_token", "eos_token")
    }
    return {
        "file": "tokenizer.json",
        "class": type(tokenizer).__name__,
        "pad_token_id": tokenizer.pad_token_id,
        "special_tokens": {key: value for key, value in special.items() if value is not None},
        "model_input_names": list(tokenizer.model_input_names),
        "padding_side": tokenizer.padding_side,
        "model_max_length": min(int(tokenizer.model_max_length), 1_000_000_000),
    }


def _without_call_settings(path: Path) -> None:
    """The saved tokenizer without the truncation and padding that the export's own calls left on it: a fast
    tokenizer keeps its last call's settings and saves them, and the entry's tokenizer.json cut every text at the
    validation's last length (32 or the model's window) and padded batches, for anyone who loaded it but the
    server (which sets its own). A checkpoint's tokenizer.json carries neither."""
    tokenizer = Tokenizer.from_file(str(path))
    if tokenizer.truncation is None and tokenizer.padding is None:
        return
    tokenizer.no_truncation()
    tokenizer.no_padding()
    tokenizer.save(str(path))


def _entry_config(
    checkpoint: Checkpoint,
    name: str,
    demo: bool,
    opset: int,
    variants: dict[str, Any],
    tokenizer: dict[str, Any],
    seconds: float,
) -> dict[str, Any]:
    import torch
    import transformers

    return {
        "format_version": FORMAT_VERSION,
        "name": name,
        "task": checkpoint.task,
        "architecture": checkpoint.class_name,
        "model_type": checkpoint.architecture.model_type,
        "demo": demo,
        "problem_type": checkpoint.problem_type,
        "labels": checkpoint.labels,
        "rerank": checkpoint.rerank,
        "inputs": list(checkpoint.input_names),
        "outputs": list(OUTPUT_NAMES[checkpoint.task]),
        "max_length": checkpoint.max_length,
        "encoder": {
            "layers": checkpoint.num_layers,
            "heads": checkpoint.num_heads,
            "hidden_size": checkpoint.hidden_size,
            # rows of the word-embedding table: the server refuses a tokenizer.json with ids past it
            "vocab_size": int(checkpoint.model.config.vocab_size),
        },
        "tokenizer": tokenizer,
        "default_variant": {"cpu": cpu_default(variants), "cuda": "fp16" if "fp16" in variants else "fp32"},
        "variants": variants,
        "source": {**checkpoint.source_info, "kind": "demo", "checkpoint": f"random-weight {checkpoint.class_name}"}
        if demo
        else checkpoint.source_info,
        "export": {
            "tool": "bertserve-export",
            "version": __version__,
            "opset": opset,
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "onnxruntime": ort.__version__,
            "onnx": onnx.__version__,
            "seconds": round(seconds, 2),
            "created_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        },
    }
