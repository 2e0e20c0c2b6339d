"""An embedding variant against sentence-transformers' own `encode` on real text: the cosine of each input's vector.

The reference is sentence-transformers itself where it is installed (the directory loaded as its users load it, or,
for a base checkpoint exported with --pooling, its Transformer + Pooling (+ Normalize) modules built on the same
checkpoint), in fp32; where it is not (the export image leaves it out), the PyTorch module the graph was traced
from, and model.json says which. Inputs: the built-in sentences, paragraphs of them, and one text longer than the
model's window (truncated by both sides alike), in batches of 4 so that rows are padded.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import onnxruntime as ort
import torch

from bertcore.messages import one_line
from export.calibration_text import paragraphs
from export.checkpoint import Checkpoint
from export.errors import ExportError
from export.sample_text import CONTEXT, SENTENCES
from export.validation import pad_rows

# The least cosine between a variant's vector and sentence-transformers' for every input; a variant below is
# refused (fp32: the export stops). int8 has no bound here: --eval's retrieval recall judges it.
COSINE_BOUNDS = {"fp32": 0.99999, "fp16": 0.999}
BATCH = 4


@dataclass(frozen=True)
class EmbeddingReference:
    texts: list[str]  # as both sides encode them (the default prompt, if any, already in front)
    vectors: np.ndarray  # [texts, dimension], float64
    source: str  # what made them


def reference_texts() -> list[str]:
    return [*SENTENCES, *paragraphs(3), " ".join([CONTEXT] * 8)]


def embedding_reference(checkpoint: Checkpoint) -> EmbeddingReference:
    head = checkpoint.embedding
    assert head is not None
    prompt = head.prompts.get(head.default_prompt_name, "") if head.default_prompt_name else ""
    texts = [prompt + text for text in reference_texts()]
    try:
        import sentence_transformers
    except ImportError:
        return EmbeddingReference(
            texts, _torch_vectors(checkpoint, texts), "PyTorch (sentence-transformers is not installed)"
        )
    try:
        model = _sentence_transformer(checkpoint)
        with torch.no_grad():
            vectors = model.encode(texts, batch_size=BATCH, convert_to_numpy=True, prompt="")
    except Exception as exc:
        raise ExportError(f"sentence-transformers could not encode with {checkpoint.source}: {one_line(exc)}") from exc
    return EmbeddingReference(
        texts, np.asarray(vectors, dtype=np.float64), f"sentence-transformers {sentence_transformers.__version__}"
    )


def _sentence_transformer(checkpoint: Checkpoint) -> Any:
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Normalize, Pooling, Transformer

    head = checkpoint.embedding
    assert head is not None
    fp32 = {"dtype": torch.float32}
    if head.directory is not None:
        model = SentenceTransformer(head.directory, device="cpu", model_kwargs=fp32)
    else:
        encoder = Transformer(checkpoint.source, model_kwargs=fp32, max_seq_length=checkpoint.max_length)
        modules = [encoder, Pooling(checkpoint.hidden_size, head.pooling)]
        model = SentenceTransformer(modules=[*modules, *([Normalize()] if head.normalize else [])], device="cpu")
    model.max_seq_length = checkpoint.max_length
    return model.eval()


def _torch_vectors(checkpoint: Checkpoint, texts: list[str]) -> np.ndarray:
    parts = []
    with torch.no_grad():
        for feed in encode_batches(checkpoint, texts):
            tensors = {name: torch.from_numpy(array) for name, array in feed.items()}
            parts.append(checkpoint.model(**tensors, return_dict=True)["sentence_embedding"].numpy())
    return np.concatenate(parts).astype(np.float64)


def encode_batches(checkpoint: Checkpoint, texts: list[str]) -> list[dict[str, np.ndarray]]:
    rows = [
        dict(checkpoint.tokenizer(text, truncation=True, max_length=checkpoint.max_length).items()) for text in texts
    ]
    return [pad_rows(rows[i : i + BATCH], checkpoint) for i in range(0, len(rows), BATCH)]


def cosines(session: ort.InferenceSession, checkpoint: Checkpoint, reference: EmbeddingReference) -> np.ndarray:
    """Each reference text's cosine between the variant's vector and the reference's."""
    produced = np.concatenate(
        [session.run(["sentence_embedding"], feed)[0] for feed in encode_batches(checkpoint, reference.texts)]
    ).astype(np.float64)
    return cosine_rows(produced, reference.vectors)


def cosine_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a = a.astype(np.float64)
    b = b.astype(np.float64)
    norms = np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1)
    return np.sum(a * b, axis=-1) / np.maximum(norms, 1e-30)


def main(argv: list[str] | None = None) -> int:
    """`python -m export.embedding_check ENTRY`: each variant file of an embedding entry against
    sentence-transformers again, on a provider of your choice (the CPU runs the fp16 graph too, where no CUDA is)."""
    import argparse
    import json
    import sys
    from pathlib import Path

    from export.checkpoint import load_checkpoint
    from export.quiet import quiet_libraries
    from export.validation import create_session

    parser = argparse.ArgumentParser(prog="python -m export.embedding_check", description=main.__doc__)
    parser.add_argument("entry", type=Path, help="an embedding entry of a model repository (models/NAME)")
    parser.add_argument(
        "--checkpoint", default=None, help="the checkpoint it was exported from (default: model.json's)"
    )
    parser.add_argument("--provider", default="CPUExecutionProvider", help="onnxruntime provider for every variant")
    args = parser.parse_args(argv)
    quiet_libraries()
    try:
        config = json.loads((args.entry / "model.json").read_text(encoding="utf-8"))
        spec = config.get("embedding") or {}
        if config.get("task") != "embedding":
            raise ExportError(f"{args.entry} is not an embedding entry (task {config.get('task')!r})")
        plain = spec.get("source") == "--pooling"
        checkpoint = load_checkpoint(
            args.checkpoint or config["source"]["checkpoint"],
            "embedding",
            config["max_length"],
            spec["pooling"] if plain else None,
            bool(spec["normalize"]) if plain else False,
        )
        reference = embedding_reference(checkpoint)
    except (ExportError, OSError, ValueError, KeyError) as exc:
        print(f"error: {one_line(exc)}", file=sys.stderr)
        return 1
    print(f"{args.entry}: {len(reference.texts)} texts against {reference.source}, on {args.provider}")
    for variant, record in config["variants"].items():
        found = cosines(create_session(str(args.entry / record["file"]), args.provider), checkpoint, reference)
        bound = COSINE_BOUNDS.get(variant)
        verdict = "" if bound is None else (" within" if found.min() >= bound else " UNDER") + f" the bound {bound:g}"
        print(f"  {variant:<12} cosine min {found.min():.7f} mean {found.mean():.7f}{verdict}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
