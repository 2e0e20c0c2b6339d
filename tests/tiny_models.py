"""Tiny real checkpoints for every architecture x task, each with its own tokenizer family trained in seconds.

WordPiece for BERT and DistilBERT (vocabulary counted from the corpus: the WordPiece trainer breaks ties at
random), byte-level BPE for RoBERTa, Unigram with a SentencePiece-style (Metaspace)
pre-tokenizer for ALBERT: special tokens, pad ids, offsets and input names differ per family as they do in
real checkpoints. Weights are random (seeded); heads are real task heads.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import torch
import transformers
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

from export.sample_text import QUESTIONS, SENTENCES

ARCHS = ("bert", "roberta", "albert", "distilbert")
TASK_HEADS = {
    "classification": "ForSequenceClassification",
    "ner": "ForTokenClassification",
    "qa": "ForQuestionAnswering",
}
CLASS_PREFIX = {"bert": "Bert", "roberta": "Roberta", "albert": "Albert", "distilbert": "DistilBert"}
MAX_POSITIONS = 64
# A cross-encoder: a sequence classifier with one label trained as regression (as the MS MARCO cross-encoders are),
# whose logit of a (query, document) pair is its relevance. tiny_checkpoint(arch, "classification", **CROSS_ENCODER)
CROSS_ENCODER: dict[str, Any] = {"labels": ["LABEL_0"], "problem_type": "regression"}
NER_TAGS = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]
CORPUS = [
    *SENTENCES,
    *QUESTIONS,
    "The committee will meet again in Geneva next week to review the budget and the new rules.",
    "Scientists in Tokyo and Berlin reported faster trains, cheaper batteries and cleaner water.",
    "I loved every minute of it; the music, the actors and the city all shine.",
    "What a dull, clumsy and forgettable waste of two hours.",
]


def wordpiece_tokenizer(input_names: list[str]) -> PreTrainedTokenizerFast:
    # The vocabulary is built, not trained: the WordPiece trainer breaks ties differently from run to run.
    normalizer = normalizers.BertNormalizer(lowercase=True)
    pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    words = Counter(
        word for text in CORPUS for word, _ in pre_tokenizer.pre_tokenize_str(normalizer.normalize_str(text))
    )
    chars = sorted({char for word in words for char in word})
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    whole_words = sorted(word for word in words if 1 < len(word) <= 8)  # longer words split into pieces
    extra = ["##ing", "##ed", "##s", "##ly"]
    pieces = list(dict.fromkeys(specials + chars + [f"##{char}" for char in chars] + whole_words + extra))
    tokenizer = Tokenizer(models.WordPiece({piece: i for i, piece in enumerate(pieces)}, unk_token="[UNK]"))
    tokenizer.normalizer = normalizer
    tokenizer.pre_tokenizer = pre_tokenizer
    cls, sep = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", cls), ("[SEP]", sep)]
    )
    tokenizer.decoder = decoders.WordPiece()
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        unk_token="[UNK]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
        model_max_length=MAX_POSITIONS,
        model_input_names=input_names,
    )


def byte_bpe_tokenizer(input_names: list[str]) -> PreTrainedTokenizerFast:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    specials = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]  # RoBERTa's ids: pad is 1, not 0
    trainer = trainers.BpeTrainer(
        vocab_size=500, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tokenizer.train_from_iterator(CORPUS, trainer)
    tokenizer.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0), trim_offsets=True)
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        pad_token="<pad>",
        cls_token="<s>",
        sep_token="</s>",
        mask_token="<mask>",
        model_max_length=MAX_POSITIONS,
        model_input_names=input_names,
    )


def unigram_tokenizer(input_names: list[str]) -> PreTrainedTokenizerFast:
    tokenizer = Tokenizer(models.Unigram())
    tokenizer.normalizer = normalizers.Sequence(
        [normalizers.Replace("``", '"'), normalizers.NFKD(), normalizers.StripAccents(), normalizers.Lowercase()]
    )
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    tokenizer.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
    specials = ["<pad>", "<unk>", "[CLS]", "[SEP]", "[MASK]"]
    tokenizer.train_from_iterator(
        CORPUS, trainers.UnigramTrainer(vocab_size=300, special_tokens=specials, unk_token="<unk>")
    )
    # The trainer's pieces are stable but their ids and last digits of score are not: fix both.
    trained = json.loads(tokenizer.to_str())["model"]["vocab"]
    ordered = [(p, 0.0) for p in specials] + sorted((p, round(s, 2)) for p, s in trained if p not in specials)
    tokenizer.model = models.Unigram(ordered, unk_id=1, byte_fallback=False)
    cls, sep = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS]:0 $A:0 [SEP]:0",
        pair="[CLS]:0 $A:0 [SEP]:0 $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls), ("[SEP]", sep)],
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        unk_token="<unk>",
        pad_token="<pad>",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
        model_max_length=MAX_POSITIONS,
        model_input_names=input_names,
    )


def make_tokenizer(arch: str) -> PreTrainedTokenizerFast:
    with_segments = ["input_ids", "token_type_ids", "attention_mask"]
    without_segments = ["input_ids", "attention_mask"]
    return {
        "bert": lambda: wordpiece_tokenizer(with_segments),
        "distilbert": lambda: wordpiece_tokenizer(without_segments),
        "roberta": lambda: byte_bpe_tokenizer(without_segments),
        "albert": lambda: unigram_tokenizer(with_segments),
    }[arch]()


def make_config(arch: str, task: str, tokenizer: PreTrainedTokenizerFast, **overrides: Any) -> Any:
    common: dict[str, Any] = {"vocab_size": len(tokenizer), "pad_token_id": tokenizer.pad_token_id}
    if task == "classification":
        labels = overrides.pop("labels", ["negative", "neutral", "positive"])
        common["id2label"] = dict(enumerate(labels))
        common["problem_type"] = overrides.pop("problem_type", "single_label_classification")
    elif task == "ner":
        common["id2label"] = dict(enumerate(NER_TAGS))
    # ALBERT gets 3 layers: its first layer is the one the stock optimizer leaves unfused.
    layers = 3 if arch == "albert" else 2
    sizes = {"hidden_size": 32, "num_hidden_layers": layers, "num_attention_heads": 4, "intermediate_size": 64}
    sizes.update({k: overrides.pop(k) for k in list(overrides) if k in sizes})
    if arch == "distilbert":
        return transformers.DistilBertConfig(
            dim=sizes["hidden_size"],
            n_layers=sizes["num_hidden_layers"],
            n_heads=sizes["num_attention_heads"],
            hidden_dim=sizes["intermediate_size"],
            max_position_embeddings=MAX_POSITIONS,
            **common,
            **overrides,
        )
    if arch == "roberta":
        positions = MAX_POSITIONS + tokenizer.pad_token_id + 1
        return transformers.RobertaConfig(max_position_embeddings=positions, **sizes, **common, **overrides)
    if arch == "albert":
        overrides.setdefault("embedding_size", 16)
        return transformers.AlbertConfig(max_position_embeddings=MAX_POSITIONS, **sizes, **common, **overrides)
    return transformers.BertConfig(max_position_embeddings=MAX_POSITIONS, **sizes, **common, **overrides)


def write_tiny_checkpoint(
    directory: Path, arch: str, task: str, dtype: torch.dtype = torch.float32, safe: bool = True, **overrides: Any
) -> Path:
    """A fine-tuned-looking checkpoint: config with architectures, weights, tokenizer files."""
    tokenizer = make_tokenizer(arch)
    config = make_config(arch, task, tokenizer, **overrides)
    model_class = getattr(transformers, CLASS_PREFIX[arch] + TASK_HEADS[task])
    torch.manual_seed(sum(map(ord, arch + task)))
    model = model_class(config).eval()
    # Random heads on random encoders give near-equal logits; spread them so labels are well defined.
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if any(part in name for part in ("classifier", "qa_outputs", "pre_classifier")) and parameter.dim() == 2:
                parameter.mul_(20.0)
    model.to(dtype).save_pretrained(str(directory))
    if not safe:  # the older pickle format, which transformers 5 still reads but no longer writes
        torch.save(model.state_dict(), directory / "pytorch_model.bin")
        (directory / "model.safetensors").unlink()
    tokenizer.save_pretrained(str(directory))
    return directory
