"""The `model.json` contract between the export (which writes it) and the server (which reads it), defined once.

The export checks every config it writes by parsing it here; the server's front-end and engine read entries
only through `ModelConfig.read`. A field the server relies on that is missing or of the wrong kind is a
ValueError naming the field, not a KeyError deep inside a request.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, cast

MODEL_CONFIG = "model.json"
FORMAT_VERSION = 1
Task = Literal["classification", "ner", "qa", "embedding"]
TASKS: tuple[Task, ...] = ("classification", "ner", "qa", "embedding")
# An embedding entry's pooling of the encoder's token states into one vector (sentence-transformers' modes).
POOLING_MODES = ("mean", "cls", "max", "mean_sqrt_len_tokens")


@dataclass(frozen=True)
class TokenizerSpec:
    file: str
    pad_token_id: int
    padding_side: str = "right"  # "left" for XLNet, whose classifier token is last


@dataclass(frozen=True)
class EmbeddingSpec:
    """What an embedding entry's graph does after the encoder (all inside the graph, whose one output is a vector
    per input): its pooling, its Dense layers, whether it L2-normalizes; `dimension` is the vector's size."""

    pooling: str
    normalize: bool
    dimension: int
    dense_layers: int = 0
    similarity: str = "cosine"  # sentence-transformers' similarity_fn_name: how its vectors are compared
    prompts: Mapping[str, str] = field(default_factory=dict)  # sentence-transformers' named prompts (prefixes)
    default_prompt_name: str | None = None


@dataclass(frozen=True)
class ModelConfig:
    name: str
    task: Task
    architecture: str
    labels: tuple[str, ...]
    problem_type: str | None
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    max_length: int
    tokenizer: TokenizerSpec
    variants: Mapping[str, Mapping[str, Any]]  # name -> {"file": ..., validation and other figures}
    demo: bool
    vocab_size: int | None  # the model's word-embedding rows (entries exported before it was recorded: None)
    raw: Mapping[str, Any]  # the whole document, for what only reports read
    # A one-label classification entry (a cross-encoder): its score of a (query, document) pair ranks documents.
    # Entries exported before it was recorded: False.
    rerank: bool = False
    # An embedding entry's pooling, normalization and vector size (None for every other task).
    embedding: EmbeddingSpec | None = None

    @property
    def per_token(self) -> bool:
        """Outputs per token (NER, QA) rather than one per sequence (classification logits, an embedding)."""
        return self.task not in ("classification", "embedding")

    def variant_file(self, variant: str) -> str:
        return str(self.variants[variant]["file"])

    @classmethod
    def parse(cls, data: Mapping[str, Any]) -> ModelConfig:
        if not isinstance(data, Mapping):  # `[]`: "'list' object has no attribute 'get'" was the load's reason
            raise ValueError(f"{MODEL_CONFIG} is not a JSON object")
        if data.get("format_version") != FORMAT_VERSION:
            raise ValueError(f"{MODEL_CONFIG} format_version {data.get('format_version')!r} is not {FORMAT_VERSION}")
        task = data.get("task")
        if task not in TASKS:
            raise ValueError(f"unknown task {task!r}")
        tokenizer = _field(data, "tokenizer", dict)
        variants = _field(data, "variants", dict)
        if "fp32" not in variants or not all(isinstance(v, dict) and "file" in v for v in variants.values()):
            raise ValueError(f"{MODEL_CONFIG} variants must include fp32 and name each variant's file")
        max_length = _field(data, "max_length", int)
        if max_length < 2:
            raise ValueError(f"{MODEL_CONFIG} max_length {max_length} is too small")
        return cls(
            name=str(data.get("name", "")),
            task=cast(Task, task),
            architecture=_field(data, "architecture", str),
            labels=tuple(str(label) for label in data.get("labels") or ()),
            problem_type=data.get("problem_type"),
            inputs=tuple(_field(data, "inputs", list)),
            outputs=tuple(_field(data, "outputs", list)),
            max_length=max_length,
            tokenizer=_tokenizer_spec(tokenizer),
            variants=variants,
            demo=bool(data.get("demo", False)),
            vocab_size=_vocab_size(data),
            raw=data,
            rerank=_rerank(data),
            embedding=_embedding(data),
        )

    @classmethod
    def read(cls, entry: Path) -> ModelConfig:
        return cls.parse(json.loads((entry / MODEL_CONFIG).read_text(encoding="utf-8")))


def _field(data: Mapping[str, Any], name: str, kind: type) -> Any:
    value = data.get(name)
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        raise ValueError(f"{MODEL_CONFIG} field {name!r} is missing or not a {kind.__name__}")
    return value


def _tokenizer_spec(tokenizer: Mapping[str, Any]) -> TokenizerSpec:
    side = tokenizer.get("padding_side") or "right"  # entries exported before it was recorded pad on the right
    if side not in ("left", "right"):
        raise ValueError(f"{MODEL_CONFIG} tokenizer.padding_side {side!r} is neither 'left' nor 'right'")
    return TokenizerSpec(str(_field(tokenizer, "file", str)), int(tokenizer.get("pad_token_id") or 0), str(side))


def _vocab_size(data: Mapping[str, Any]) -> int | None:
    """encoder.vocab_size; None in entries exported before it was recorded."""
    encoder = data.get("encoder")
    if not isinstance(encoder, Mapping) or encoder.get("vocab_size") is None:
        return None
    size = _field(encoder, "vocab_size", int)
    if size < 1:
        raise ValueError(f"{MODEL_CONFIG} encoder.vocab_size {size} is not a vocabulary size")
    return size


def _rerank(data: Mapping[str, Any]) -> bool:
    """model.json's "rerank": only a classification entry with one label can rank documents by its score."""
    rerank = data.get("rerank", False)
    if not isinstance(rerank, bool):
        raise ValueError(f"{MODEL_CONFIG} field 'rerank' is not true or false")
    if rerank and (data.get("task") != "classification" or len(data.get("labels") or ()) != 1):
        raise ValueError(f"{MODEL_CONFIG} marks a rerank entry that is not a classification entry with one label")
    return rerank


def _embedding(data: Mapping[str, Any]) -> EmbeddingSpec | None:
    """model.json's "embedding": required of an embedding entry, refused on any other."""
    if data.get("task") != "embedding":
        if data.get("embedding") is not None:
            raise ValueError(f"{MODEL_CONFIG} has an 'embedding' section but task {data.get('task')!r}")
        return None
    spec = _field(data, "embedding", dict)
    pooling = _field(spec, "pooling", str)
    if pooling not in POOLING_MODES:
        raise ValueError(f"{MODEL_CONFIG} embedding.pooling {pooling!r} is not one of {', '.join(POOLING_MODES)}")
    dimension = _field(spec, "dimension", int)
    if dimension < 1:
        raise ValueError(f"{MODEL_CONFIG} embedding.dimension {dimension} is not a vector size")
    prompts = spec.get("prompts") or {}
    if not isinstance(prompts, dict) or not all(isinstance(v, str) for v in prompts.values()):
        raise ValueError(f"{MODEL_CONFIG} embedding.prompts is not a map of names to prefixes")
    default_prompt = spec.get("default_prompt_name")
    if default_prompt is not None and default_prompt not in prompts:
        raise ValueError(f"{MODEL_CONFIG} embedding.default_prompt_name {default_prompt!r} names no prompt")
    return EmbeddingSpec(
        pooling=pooling,
        normalize=_field(spec, "normalize", bool),
        dimension=dimension,
        dense_layers=int(spec.get("dense_layers") or 0),
        similarity=str(spec.get("similarity") or "cosine"),
        prompts={str(k): v for k, v in prompts.items()},
        default_prompt_name=default_prompt,
    )
