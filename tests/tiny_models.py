"""Tiny real checkpoints for every architecture x task, each with its own tokenizer family trained in seconds.

WordPiece for BERT and DistilBERT (vocabulary counted from the corpus: the WordPiece trainer breaks ties at
random), byte-level BPE for RoBERTa, Unigram with a SentencePiece-style (Metaspace)
pre-tokenizer for ALBERT: special tokens, pad ids, offsets and input names differ per family as they do in
real checkpoints. Weights are random (seeded); heads are real task heads.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path
from typing import Any

import torch
import transformers
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

from export.sample_text import QUESTIONS, SENTENCES

ARCHS = ("bert", "roberta", "albert", "distilbert")
# The encoder families of issue 31: their own tests export each once (tests/export/test_families.py).
FAMILIES = ("xlm-roberta", "camembert", "electra", "ernie", "mobilebert", "deberta-v2", "modernbert", "xlnet")
TASK_HEADS = {
    "classification": "ForSequenceClassification",
    "ner": "ForTokenClassification",
    "qa": "ForQuestionAnswering",
}
CLASS_PREFIX = {
    "bert": "Bert",
    "roberta": "Roberta",
    "albert": "Albert",
    "distilbert": "DistilBert",
    "xlm-roberta": "XLMRoberta",
    "camembert": "Camembert",
    "electra": "Electra",
    "ernie": "Ernie",
    "mobilebert": "MobileBert",
    "deberta-v2": "DebertaV2",
    "modernbert": "ModernBert",
    "xlnet": "XLNet",
}
MAX_POSITIONS = 64
# Head weights spread so labels are well defined; XLNet's classification head is `logits_proj`.
HEAD_PARTS = ("classifier", "qa_outputs", "pre_classifier", "logits_proj")
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
    return with_bert_specials(tokenizer, model_max_length=MAX_POSITIONS, model_input_names=input_names)


def with_bert_specials(tokenizer: Tokenizer, **options: Any) -> PreTrainedTokenizerFast:
    """`tokenizer` as transformers' fast tokenizer, with BERT's special tokens named."""
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        unk_token="[UNK]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
        **options,
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


def sentencepiece_tokenizer(
    specials: list[str], unk: str, single: str, pair: str, template_specials: list[str], **tokens: Any
) -> PreTrainedTokenizerFast:
    """A cased SentencePiece (Unigram, Metaspace) tokenizer as XLM-R, CamemBERT, DeBERTa-v3 and XLNet ship one:
    `specials` first (their ids as listed), the trained pieces, then <mask>/[MASK] last where it is not a special."""
    tokenizer = Tokenizer(models.Unigram())
    tokenizer.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Replace(Regex(" {2,}"), " ")])
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always")
    tokenizer.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme="always")
    mask = tokens["mask_token"]
    tokenizer.train_from_iterator(
        CORPUS, trainers.UnigramTrainer(vocab_size=320, special_tokens=specials, unk_token=unk)
    )
    # The trainer's pieces are stable, their scores not (last digits move from run to run): score each piece by
    # its own count in the corpus's words instead, a log frequency computed the same way every time.
    trained = json.loads(tokenizer.to_str())["model"]["vocab"]
    words = Counter(
        word
        for text in CORPUS
        for word, _ in tokenizer.pre_tokenizer.pre_tokenize_str(tokenizer.normalizer.normalize_str(text))
    )
    counts = {p: 1 + sum(n * w.count(p) for w, n in words.items()) for p, _ in trained if p not in [*specials, mask]}
    total = sum(counts.values())
    pieces = [(p, round(math.log(n / total), 4)) for p, n in sorted(counts.items())]
    ordered = [(p, 0.0) for p in specials] + pieces + ([] if mask in specials else [(mask, 0.0)])
    tokenizer.model = models.Unigram(ordered, unk_id=specials.index(unk), byte_fallback=False)
    tokenizer.post_processor = processors.TemplateProcessing(
        single=single, pair=pair, special_tokens=[(t, tokenizer.token_to_id(t)) for t in template_specials]
    )
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, model_max_length=MAX_POSITIONS, **tokens)


def xlm_roberta_tokenizer(camembert: bool = False) -> PreTrainedTokenizerFast:
    # XLM-R: <s> <pad> </s> <unk> (pad 1), <mask> last; CamemBERT: fairseq's unused slots first, <s> and </s> after.
    specials = (
        ["<s>NOTUSED", "<pad>", "</s>NOTUSED", "<unk>", "<s>", "</s>"]
        if camembert
        else ["<s>", "<pad>", "</s>", "<unk>"]
    )
    return sentencepiece_tokenizer(
        specials,
        "<unk>",
        single="<s> $A </s>",
        pair="<s> $A </s> </s> $B </s>",
        template_specials=["<s>", "</s>"],
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        pad_token="<pad>",
        cls_token="<s>",
        sep_token="</s>",
        mask_token="<mask>",
        model_input_names=["input_ids", "attention_mask"],
    )


def deberta_v3_tokenizer() -> PreTrainedTokenizerFast:
    return sentencepiece_tokenizer(
        ["[PAD]", "[CLS]", "[SEP]", "[UNK]"],
        "[UNK]",
        single="[CLS]:0 $A:0 [SEP]:0",
        pair="[CLS]:0 $A:0 [SEP]:0 $B:1 [SEP]:1",
        template_specials=["[CLS]", "[SEP]"],
        bos_token="[CLS]",
        eos_token="[SEP]",
        unk_token="[UNK]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
        model_input_names=["input_ids", "token_type_ids", "attention_mask"],
    )


def xlnet_tokenizer() -> PreTrainedTokenizerFast:
    # XLNet: the classifier token last (segment 2), padding on the left, as its tokenizer has it.
    return sentencepiece_tokenizer(
        ["<unk>", "<s>", "</s>", "<cls>", "<sep>", "<pad>", "<mask>"],
        "<unk>",
        single="$A:0 <sep>:0 <cls>:2",
        pair="$A:0 <sep>:0 $B:1 <sep>:1 <cls>:2",
        template_specials=["<sep>", "<cls>"],
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        pad_token="<pad>",
        cls_token="<cls>",
        sep_token="<sep>",
        mask_token="<mask>",
        padding_side="left",
        model_input_names=["input_ids", "token_type_ids", "attention_mask"],
    )


def modernbert_tokenizer() -> PreTrainedTokenizerFast:
    # ModernBERT: byte-level BPE (OLMo's) with BERT's [CLS] ... [SEP] template and no segment ids.
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    specials = ["[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]"]
    trainer = trainers.BpeTrainer(
        vocab_size=500, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tokenizer.train_from_iterator(CORPUS, trainer)
    tokenizer.post_processor = processors.Sequence(
        [
            processors.ByteLevel(trim_offsets=True),
            processors.TemplateProcessing(
                single="[CLS]:0 $A:0 [SEP]:0",
                pair="[CLS]:0 $A:0 [SEP]:0 $B:0 [SEP]:0",
                special_tokens=[("[CLS]", 1), ("[SEP]", 2)],
            ),
        ]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        unk_token="[UNK]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
        model_max_length=MAX_POSITIONS,
        model_input_names=["input_ids", "attention_mask"],
    )


def make_tokenizer(arch: str) -> PreTrainedTokenizerFast:
    with_segments = ["input_ids", "token_type_ids", "attention_mask"]
    without_segments = ["input_ids", "attention_mask"]
    return {
        "bert": lambda: wordpiece_tokenizer(with_segments),
        "distilbert": lambda: wordpiece_tokenizer(without_segments),
        "roberta": lambda: byte_bpe_tokenizer(without_segments),
        "albert": lambda: unigram_tokenizer(with_segments),
        "xlm-roberta": xlm_roberta_tokenizer,
        "camembert": lambda: xlm_roberta_tokenizer(camembert=True),
        "electra": lambda: wordpiece_tokenizer(with_segments),
        "ernie": lambda: wordpiece_tokenizer(with_segments),
        "mobilebert": lambda: wordpiece_tokenizer(with_segments),
        "deberta-v2": deberta_v3_tokenizer,
        "modernbert": modernbert_tokenizer,
        "xlnet": xlnet_tokenizer,
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
    if arch in FAMILIES:
        return family_config(arch, tokenizer, sizes, common, overrides)
    return transformers.BertConfig(max_position_embeddings=MAX_POSITIONS, **sizes, **common, **overrides)


def family_config(
    arch: str, tokenizer: PreTrainedTokenizerFast, sizes: dict[str, Any], common: dict[str, Any], overrides: dict
) -> Any:
    """The issue-31 families, each with the settings its real checkpoints have where they change the graph
    (`overrides` win: benchmarks.family_speed builds MiniLM-sized ones)."""
    positions = MAX_POSITIONS
    if arch in ("xlm-roberta", "camembert"):
        positions += tokenizer.pad_token_id + 1
    settings: dict[str, Any] = {"max_position_embeddings": positions, **sizes, **common}
    if arch in ("xlm-roberta", "camembert"):
        settings["type_vocab_size"] = 1
    elif arch == "electra":  # embeddings narrower than the encoder, projected up (as ELECTRA-small)
        settings["embedding_size"] = 16
    elif arch == "mobilebert":  # bottlenecks, stacked feed-forward networks and NoNorm, as MobileBERT has them
        settings.update(embedding_size=16, intra_bottleneck_size=16, num_feedforward_networks=2)
    elif arch == "deberta-v2":  # DeBERTa-v3: no segment embedding, shared relative keys, log buckets
        settings.update(
            type_vocab_size=0,
            position_biased_input=False,
            relative_attention=True,
            pos_att_type=["p2c", "c2p"],
            position_buckets=16,
            max_relative_positions=-1,
            norm_rel_ebd="layer_norm",
            share_att_key=True,
        )
    elif arch == "modernbert":  # 3 layers: global, local (a 16-token window, shorter than the inputs), global
        settings.update(
            num_hidden_layers=max(3, sizes["num_hidden_layers"]),
            global_attn_every_n_layers=2,
            local_attention=16,
            cls_token_id=tokenizer.cls_token_id,
            sep_token_id=tokenizer.sep_token_id,
            bos_token_id=tokenizer.cls_token_id,
            eos_token_id=tokenizer.sep_token_id,
            reference_compile=False,
        )
    elif arch == "xlnet":  # relative positions (no table), its own names for the sizes
        del settings["max_position_embeddings"]
        settings.update(
            d_model=settings.pop("hidden_size"),
            n_layer=settings.pop("num_hidden_layers"),
            n_head=settings.pop("num_attention_heads"),
            d_inner=settings.pop("intermediate_size"),
        )
    config_class = {
        "xlm-roberta": transformers.XLMRobertaConfig,
        "camembert": transformers.CamembertConfig,
        "electra": transformers.ElectraConfig,
        "ernie": transformers.ErnieConfig,
        "mobilebert": transformers.MobileBertConfig,
        "deberta-v2": transformers.DebertaV2Config,
        "modernbert": transformers.ModernBertConfig,
        "xlnet": transformers.XLNetConfig,
    }[arch]
    return config_class(**{**settings, **overrides})


def write_tiny_checkpoint(
    directory: Path, arch: str, task: str, dtype: torch.dtype = torch.float32, safe: bool = True, **overrides: Any
) -> Path:
    """A fine-tuned-looking checkpoint: config with architectures, weights, tokenizer files."""
    tokenizer = make_tokenizer(arch)
    config = make_config(arch, task, tokenizer, **overrides)
    head = TASK_HEADS[task] + ("Simple" if arch == "xlnet" and task == "qa" else "")  # XLNet's span head
    model_class = getattr(transformers, CLASS_PREFIX[arch] + head)
    torch.manual_seed(sum(map(ord, arch + task)))
    model = model_class(config).eval()
    # Random heads on random encoders give near-equal logits; spread them so labels are well defined.
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if any(part in name for part in HEAD_PARTS) and parameter.dim() == 2:
                parameter.mul_(20.0)
    model.to(dtype).save_pretrained(str(directory))
    if not safe:  # the older pickle format, which transformers 5 still reads but no longer writes
        torch.save(model.state_dict(), directory / "pytorch_model.bin")
        (directory / "model.safetensors").unlink()
    tokenizer.save_pretrained(str(directory))
    return directory
