"""Tiny real embedding checkpoints: a base (*Model) encoder of any family saved plain, or as a sentence-transformers
directory written by sentence-transformers itself (modules.json, 1_Pooling, optional 2_Dense, Normalize)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import transformers

from tests.tiny_models import CLASS_PREFIX, make_config, make_tokenizer

# "max_seq_length" of the tiny sentence-transformers directories: shorter than their 64 positions, so that the
# export's window comes from the directory
MAX_SEQ_LENGTH = 48

# The least model.json of an embedding entry that bertcore.model_config reads
MINIMAL_ENTRY_CONFIG: dict[str, Any] = {
    "format_version": 1,
    "name": "embed",
    "task": "embedding",
    "architecture": "BertModel",
    "labels": None,
    "inputs": ["input_ids", "attention_mask"],
    "outputs": ["sentence_embedding"],
    "max_length": 128,
    "tokenizer": {"file": "tokenizer.json", "pad_token_id": 0},
    "variants": {"fp32": {"file": "model.fp32.onnx"}},
    "embedding": {"pooling": "mean", "normalize": True, "dimension": 384},
}


def write_base_model(directory: Path, arch: str) -> Path:
    """A base encoder (BertModel, RobertaModel, ...) with its tokenizer: random weights, seeded."""
    tokenizer = make_tokenizer(arch)
    config = make_config(arch, "embedding", tokenizer)
    torch.manual_seed(sum(map(ord, arch + "embedding")))
    model = getattr(transformers, CLASS_PREFIX[arch] + "Model")(config).eval()
    model.save_pretrained(str(directory))
    tokenizer.save_pretrained(str(directory))
    return directory


def write_sentence_transformers(
    directory: Path, arch: str, pooling: str = "mean", dense: int | None = None, normalize: bool = True
) -> Path:
    """A sentence-transformers directory as sentence-transformers saves it: Transformer -> Pooling [-> Dense
    (tanh, to `dense` dimensions)] [-> Normalize]."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Dense, Normalize, Pooling, Transformer

    base = write_base_model(directory.with_name(directory.name + "-base"), arch)
    encoder = Transformer(str(base), max_seq_length=MAX_SEQ_LENGTH, model_kwargs={"dtype": torch.float32})
    hidden = int(encoder.auto_model.config.hidden_size)
    modules: list[Any] = [encoder, Pooling(hidden, pooling)]
    if dense is not None:
        torch.manual_seed(7)
        modules.append(Dense(hidden, dense))
    if normalize:
        modules.append(Normalize())
    SentenceTransformer(modules=modules, device="cpu").save(str(directory))
    return directory
