"""Load a fine-tuned checkpoint (local directory or hub id) and decide what it is and whether we can export it."""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import torch

from bertcore.messages import article, cut, natural_order, one_line
from export.architectures import (
    ARCHITECTURES,
    HEAD_SUFFIXES,
    Architecture,
    Task,
    supported_summary,
    task_of_architecture,
)
from export.embedding import (
    EmbeddingHead,
    SentenceEncoder,
    check_dense_shapes,
    head_from_options,
    is_sentence_transformers,
    read_sentence_transformers,
)
from export.errors import ExportError

WEIGHT_FILES = (
    "model.safetensors",
    "pytorch_model.bin",
    "model.safetensors.index.json",
    "pytorch_model.bin.index.json",
)
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")
MIN_LENGTH = 8  # the shortest --max-length (validation's shortest case is 8 tokens)
# Files a tokenizer is read from: tokenizer.json, or a family's vocabulary (WordPiece, BPE, SentencePiece).
TOKENIZER_FILES = (
    "tokenizer.json",
    "vocab.txt",
    "vocab.json",
    "spiece.model",
    "sentencepiece.bpe.model",
    "spm.model",
    "tokenizer.model",
)
# Buffers that checkpoints need not carry; their absence is no sign of a missing head.
NON_PERSISTENT_SUFFIXES = ("position_ids", "token_type_ids")


@dataclass
class Checkpoint:
    """A checkpoint that passed every check: fp32 eager PyTorch model, fast tokenizer, task and limits."""

    source: str
    architecture: Architecture
    class_name: str
    task: Task
    model: Any  # transformers PreTrainedModel, fp32, eager attention, eval mode
    tokenizer: Any  # a fast (tokenizers-backed) transformers tokenizer
    max_length: int
    labels: list[str] | None
    problem_type: str | None
    num_layers: int
    num_heads: int
    hidden_size: int
    source_info: dict[str, Any] = field(default_factory=dict)
    input_names: tuple[str, ...] = ()  # what the graph takes: the architecture's, less segments it has no use for
    embedding: EmbeddingHead | None = None  # task embedding: what follows the encoder inside the graph

    def __post_init__(self) -> None:
        if not self.input_names:
            self.input_names = self.architecture.input_names

    @property
    def padding_side(self) -> str:
        return self.architecture.padding_side

    @property
    def rerank(self) -> bool:
        """A classification head with one label (problem_type regression or one label): a cross-encoder, whose
        score of a (query, document) pair ranks documents."""
        return self.task == "classification" and self.labels is not None and len(self.labels) == 1


def load_checkpoint(
    source: str,
    task: str = "auto",
    max_length: int | None = None,
    pooling: str | None = None,
    normalize: bool = False,
) -> Checkpoint:
    """Load and check everything the export needs, before anything is written anywhere. `pooling` and `normalize`
    (--pooling, --normalize) make an embedding model of a base checkpoint; a sentence-transformers directory
    (modules.json) is an embedding model of its own."""
    from transformers import AutoConfig

    local_dir = _local_dir(source)
    head = _embedding_head(source, local_dir, task, pooling, normalize)
    if head is not None and local_dir is not None and head.transformer_path:
        local_dir = local_dir / head.transformer_path  # the encoder's own folder inside the directory
    raw = _read_raw_config(local_dir) if local_dir else None
    if raw is not None:
        _check_architecture(source, raw.get("model_type"), raw.get("architectures"))
    try:
        config = AutoConfig.from_pretrained(str(local_dir or source))
    except Exception as exc:  # transformers raises OSError, ValueError, KeyError... for the same "cannot load" story
        if local_dir:
            raise ExportError(f"could not read {local_dir / 'config.json'}: {one_line(exc)}") from exc
        raise ExportError(
            f"checkpoint {source!r} is not a local directory and could not be fetched from the hub ({one_line(exc)})"
        ) from exc
    architecture, class_name = _check_architecture(source, config.model_type, config.architectures)
    resolved_task = _resolve_task(source, class_name, task, head)
    model = _load_model(source, local_dir, resolved_task)
    class_name = class_name or type(model).__name__  # no architectures in config.json: the class --task loaded
    if head is not None:
        check_dense_shapes(head, int(config.hidden_size))
        model = SentenceEncoder(model, head).eval()
    tokenizer = _load_tokenizer(source, local_dir)
    if head is not None and head.do_lower_case and not _lower_cases(tokenizer):
        raise ExportError(
            f"{source}: do_lower_case is set but the tokenizer keeps case; the server tokenizes with "
            "tokenizer.json alone, so it would not lower-case as sentence-transformers does"
        )
    if head is not None and max_length is None and head.max_seq_length is not None:
        longest = _max_length(config, architecture, tokenizer, None)
        if head.max_seq_length < MIN_LENGTH:
            where = Path(head.directory or str(local_dir)) / head.transformer_path / "sentence_bert_config.json"
            raise ExportError(
                f"{where}: max_seq_length {head.max_seq_length} is out of range: this model takes "
                f"{MIN_LENGTH} to {longest} tokens"
            )
        max_length = min(head.max_seq_length, longest)
    if len(tokenizer) > config.vocab_size:
        raise ExportError(
            f"the tokenizer has {len(tokenizer)} tokens but the model's vocabulary has {config.vocab_size}: "
            "they do not belong together"
        )
    labels = _labels(config, resolved_task)
    source_info = _source_info(source, local_dir, config)
    root = head.directory if head is not None else None  # a sentence-transformers directory, not its encoder's folder
    if root is not None:
        source_info["checkpoint"] = root
    return Checkpoint(
        source=root or (str(local_dir.resolve()) if local_dir else source),
        architecture=architecture,
        class_name=class_name,
        task=resolved_task,
        model=model,
        tokenizer=tokenizer,
        max_length=_max_length(config, architecture, tokenizer, max_length),
        labels=labels,
        problem_type=_problem_type(config, resolved_task),
        num_layers=int(config.num_hidden_layers),  # XLNet's n_layer, n_head and d_model answer to these names too
        num_heads=int(config.num_attention_heads),
        hidden_size=int(config.hidden_size),
        source_info=source_info,
        input_names=_input_names(architecture, config),
        embedding=head,
    )


def _lower_cases(tokenizer: Any) -> bool:
    normalizer = tokenizer.backend_tokenizer.normalizer
    return normalizer is not None and normalizer.normalize_str("A") == "a"


def _embedding_head(
    source: str, local_dir: Path | None, task: str, pooling: str | None, normalize: bool
) -> EmbeddingHead | None:
    """The embedding head of a sentence-transformers directory or of --task embedding --pooling; None for the
    other tasks (which take neither --pooling nor --normalize)."""
    if is_sentence_transformers(local_dir) and task not in ("auto", "embedding"):
        raise ExportError(
            f"task mismatch: {source} is a sentence-transformers directory (embedding) but --task {task} was given"
        )
    if is_sentence_transformers(local_dir):
        if pooling is not None or normalize:
            raise ExportError(
                f"{source} is a sentence-transformers directory: its pooling and normalization come from its "
                "modules.json; leave out --pooling and --normalize"
            )
        assert local_dir is not None
        return read_sentence_transformers(local_dir)
    if task == "embedding":
        return head_from_options(pooling, normalize)
    if pooling is not None or normalize:
        raise ExportError(f"--pooling and --normalize are for --task embedding, not --task {task}")
    return None


def _input_names(architecture: Architecture, config: Any) -> tuple[str, ...]:
    """The architecture's inputs, without token_type_ids where the model has no segment embedding to feed
    (DeBERTa-v3: type_vocab_size 0; its tokenizer still writes segment ids, which the model never reads)."""
    if getattr(config, "type_vocab_size", None) == 0:
        return tuple(name for name in architecture.input_names if name != "token_type_ids")
    return architecture.input_names


def _local_dir(source: str) -> Path | None:
    path = Path(source).expanduser()
    if path.is_dir():
        return path
    if path.exists():
        raise ExportError(f"checkpoint {source!r} is a file; give the checkpoint directory (with config.json)")
    looks_like_path = source.startswith((".", "/", "~")) or source.count("/") > 1 or not HUB_ID.match(source)
    if looks_like_path:
        raise ExportError(f"checkpoint directory {source!r} does not exist")
    return None  # a hub id


def _read_raw_config(local_dir: Path) -> dict[str, Any]:
    path = local_dir / "config.json"
    if not path.is_file():
        raise ExportError(f"{local_dir} has no config.json: is it a Hugging Face checkpoint directory?")
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ExportError(f"could not read {path}: {one_line(exc)}") from exc
    if not isinstance(raw, dict):
        raise ExportError(f"{path} is not a JSON object")
    return raw


def _check_architecture(source: str, model_type: Any, architectures: Any) -> tuple[Architecture, str]:
    class_name = architectures[0] if isinstance(architectures, list) and architectures else ""
    architecture = ARCHITECTURES.get(str(model_type))
    if architecture is None:
        what = f"model_type {model_type!r}" + (f" ({class_name})" if class_name else "")
        raise ExportError(f"{source}: unsupported {what}; {supported_summary()}")
    return architecture, class_name


def _resolve_task(source: str, class_name: str, requested: str, head: EmbeddingHead | None = None) -> Task:
    if class_name == "XLNetForQuestionAnswering":  # AutoModelForQuestionAnswering loads the Simple class over it
        raise ExportError(
            f"{source} is an XLNetForQuestionAnswering: its head (start and end found by beam search, with an "
            "answerability classifier) is not one this server serves; XLNetForQuestionAnsweringSimple, a start and "
            "an end logit per token as the other families' QA heads give, is"
        )
    detected = task_of_architecture(class_name) if class_name else None
    if head is not None:
        if detected is not None and not head.sentence_transformers:  # a task head: its encoder is not an embedder
            raise ExportError(
                f"task mismatch: {source} is {article(class_name)} {class_name} ({detected}) but --task embedding "
                "was given; embeddings come from a base model (*Model) or a sentence-transformers directory"
            )
        return "embedding"
    if detected is None and class_name and not _is_base_model(class_name):
        raise ExportError(
            f"{source} is {article(class_name)} {class_name}: its head ({_head_of(class_name)}) is not one this "
            "server serves; export a checkpoint with a sequence classification, token classification or question "
            "answering head, or its "
            "encoder as an embedding model with --task embedding --pooling mean|cls|max [--normalize]"
        )
    if not class_name:
        if requested in HEAD_SUFFIXES.values():  # the head's weights are checked at their load: another's refused
            return cast(Task, requested)
        raise ExportError(
            f"config.json of {source} names no architectures, so which head its weights hold is not known: give "
            "--task classification, ner or qa for a checkpoint fine-tuned with that head, or --task embedding "
            "--pooling mean|cls|max [--normalize] to serve its encoder's vectors"
        )
    if detected is None:
        raise ExportError(
            f"{source} is {class_name}: a base model with no task head; export it as an embedding model with "
            f"--task embedding --pooling mean|cls|max [--normalize], or export a checkpoint with a task head "
            f"({supported_summary()})"
        )
    if requested not in ("auto", detected):
        raise ExportError(
            f"task mismatch: {source} is {article(class_name)} {class_name} ({detected}) "
            f"but --task {requested} was given"
        )
    return detected


def _is_base_model(class_name: str) -> bool:
    """BertModel, XLMRobertaModel: an encoder alone; not BertForMaskedLM, BertLMHeadModel, BertForPreTraining."""
    return class_name.endswith("Model") and "For" not in class_name and "Head" not in class_name


def _head_of(class_name: str) -> str:
    """BertForMultipleChoice -> 'MultipleChoice', BertLMHeadModel -> 'LMHeadModel': the head, as the class names it."""
    if "For" in class_name:
        return class_name[class_name.index("For") + 3 :]
    match = re.search(r"[A-Z]+Head\w*$", class_name)
    return match.group(0) if match else class_name


# A weight of one of an encoder's numbered layers: its layer's prefix (bert.encoder.layer.4,
# distilbert.transformer.layer.5, roberta.encoder.layer.11, ...)
LAYER_KEY = re.compile(r"^(.*?\.(?:layer|layers)\.\d+)\.")


# The top-level parts of another task's fine-tuned head, where a model of the task loads without missing a weight of
# its own (another head's weights beside missing ones are named by the missing-weights error): a tagger takes a
# sequence classifier's `classifier` (same name, same shape), so only DistilBERT's `pre_classifier` tells; an
# embedder (AutoModel) misses nothing, so every head tells. A BERT sequence classifier's pooler is not one: older
# token classifiers keep theirs too.
OTHER_HEADS: dict[Task, frozenset[str]] = {
    "ner": frozenset({"pre_classifier"}),
    "embedding": frozenset({"pre_classifier", "classifier", "qa_outputs", "sequence_summary", "logits_proj"}),
}


def _first_few(items: list[str], separator: str, count: int = 3, more_of: str = "") -> str:
    """The first `count` items joined, and how many more there are (of `more_of`: "tensors")."""
    more = f" (and {len(items) - count} more{' ' + more_of if more_of else ''})" if len(items) > count else ""
    return separator.join(items[:count]) + more


def _load_model(source: str, local_dir: Path | None, task: Task) -> Any:
    from transformers import (
        AutoModel,
        AutoModelForQuestionAnswering,
        AutoModelForSequenceClassification,
        AutoModelForTokenClassification,
    )

    auto_class = {
        "classification": AutoModelForSequenceClassification,
        "ner": AutoModelForTokenClassification,
        "qa": AutoModelForQuestionAnswering,
        "embedding": AutoModel,
    }[task]
    if local_dir is not None and not any((local_dir / name).is_file() for name in WEIGHT_FILES):
        raise ExportError(f"{local_dir} has no weights ({' or '.join(WEIGHT_FILES[:2])})")
    try:
        # fp32 whatever the stored dtype; eager attention, which the ONNX Runtime optimizer can fuse (SDPA it cannot).
        model, info = auto_class.from_pretrained(
            str(local_dir or source),
            dtype=torch.float32,
            attn_implementation="eager",
            output_loading_info=True,
            ignore_mismatched_sizes=True,  # reported below, tensor by tensor (transformers' own error says neither)
        )
    except Exception as exc:
        raise ExportError(f"could not load the weights of {source}: {one_line(exc)}") from exc
    missing = sorted(
        k
        for k in info.get("missing_keys", ())
        if not k.endswith(NON_PERSISTENT_SUFFIXES) and not (task == "embedding" and k.startswith("pooler."))
    )
    mismatched = sorted(info.get("mismatched_keys", ()), key=str)
    if mismatched:
        shown = _first_few([_mismatch(entry) for entry in mismatched], "; ")
        raise ExportError(
            f"config.json of {source} does not match its weights: {shown}; "
            "its labels or sizes (id2label, max_position_embeddings, ...) do not describe these weights"
        )
    unexpected = sorted(info.get("unexpected_keys", ()))
    if missing:
        shown = _first_few(missing, ", ", count=4, more_of="tensors")
        # weights of another head or layout beside the missing ones: the config names another model than the weights
        other = sorted(  # a head's names first: a pooler the other head had says less
            (key for key in unexpected if not key.endswith(NON_PERSISTENT_SUFFIXES)),
            key=lambda key: ("pooler" in key, key),
        )
        hint = (
            f"; its weights hold parts this model has not ({_first_few(other, ', ', more_of='tensors')}): "
            "config.json's architectures and "
            "model_type may not describe them"
            if other
            else ""
        )
        raise ExportError(
            f"{source} lacks trained weights for part of the {task} model ({shown}): "
            f"export a checkpoint fine-tuned for this task{hint}"
        )
    other_head = [key for key in unexpected if key.split(".")[0] in OTHER_HEADS.get(task, ())]
    if other_head:
        # a sequence classifier given as --task ner (no architectures in config.json, or the wrong one): its
        # classifier fits a token classifier's shape, so only the parts left over tell (DistilBERT's pre_classifier)
        raise ExportError(
            f"{source}'s weights hold a head that a model of task {task} has not "
            f"({_first_few(other_head, ', ', more_of='tensors')}): config.json's architectures or --task do not "
            "describe this checkpoint"
        )
    unused_layers = sorted({found.group(1) for key in unexpected if (found := LAYER_KEY.match(key))}, key=natural_order)
    if unused_layers:
        # a config with fewer layers than the weights: transformers drops the rest, and validation, against a
        # PyTorch model of the same config, passes; the entry answered at chance (SST-2: 0.495 of 200, measured)
        shown = _first_few(unused_layers, ", ")
        raise ExportError(
            f"config.json of {source} does not match its weights: they hold trained layers its model does not use "
            f"({shown}); its num_hidden_layers (or n_layers) is fewer than the weights' layers"
        )
    _check_finite(model, source)
    return model.eval()


def _check_finite(model: Any, source: str) -> None:
    """Weights that hold NaN or infinity (a corrupt file, a fine-tune that diverged) answer NaN for the inputs that
    meet them: validation's texts may meet none (an fp32 export passed, then failed requests with such a word), and
    int8's calibration failed on an assertion that named neither."""
    import torch

    broken = []
    for name, tensor in model.state_dict().items():
        if tensor.is_floating_point() and (bad := int((~torch.isfinite(tensor)).sum())):
            broken.append(f"{name} ({bad} values)")
    if broken:
        raise ExportError(
            f"the weights of {source} hold NaN or infinite values: {_first_few(broken, ', ', more_of='tensors')}; "
            "the checkpoint is corrupt or its training diverged"
        )


def _mismatch(entry: Any) -> str:
    """transformers' (key, shape in the checkpoint, shape in the model config.json describes) as words."""
    if isinstance(entry, (tuple, list)) and len(entry) == 3:
        key, stored, expected = entry
        return f"{key} is {list(stored)} in the weights but {list(expected)} by config.json"
    return str(entry)


def _load_tokenizer(source: str, local_dir: Path | None) -> Any:
    from transformers import AutoTokenizer

    where = local_dir or source
    no_tokenizer = (
        f"no tokenizer in {where}: expected tokenizer.json (or the family's vocabulary files, e.g. vocab.txt)"
    )
    if local_dir is not None and not any((local_dir / name).is_file() for name in TOKENIZER_FILES):
        raise ExportError(no_tokenizer)
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(where))
    except Exception as exc:  # the whole message: transformers' first line can end in "from one of:"
        if isinstance(exc, TypeError) and "special_tokens" in " ".join(getattr(exc, "__notes__", ())):
            # tokenizers' TemplateProcessing given no id for a token: the family's tokenizer (ALBERT's, of the
            # twelve) asks its SentencePiece vocabulary for [CLS] and [SEP] and gets None where they are absent
            raise ExportError(
                f"could not load the tokenizer of {source}: its vocabulary has no id for a special token that its "
                "tokenizer puts around each text (ALBERT's [CLS] and [SEP]): save the vocabulary the model was "
                "trained with, which holds them"
            ) from exc
        reason = cut(" ".join(f"{type(exc).__name__}: {exc}".split()), 300)
        raise ExportError(f"could not load the tokenizer of {source}: {reason}") from exc
    # transformers 5 builds an empty tokenizer (special tokens only) where it finds no vocabulary to read
    if set(tokenizer.get_vocab()) <= set(tokenizer.all_special_tokens):
        raise ExportError(no_tokenizer)
    if getattr(tokenizer, "backend_tokenizer", None) is None:
        raise ExportError(
            f"the tokenizer of {source} ({type(tokenizer).__name__}) has no fast (tokenizers) form; "
            "the server needs tokenizer.json"
        )
    return tokenizer


def _labels(config: Any, task: Task) -> list[str] | None:
    if task in ("qa", "embedding"):
        return None
    id2label = {int(k): str(v) for k, v in (config.id2label or {}).items()}
    if sorted(id2label) != list(range(config.num_labels)):
        raise ExportError(f"id2label does not cover labels 0..{config.num_labels - 1}: {id2label}")
    labels = [id2label[i] for i in range(config.num_labels)]
    empty = [i for i, label in enumerate(labels) if not label.strip()]
    if empty:
        raise ExportError(
            f"id2label gives label {', '.join(map(str, empty))} an empty name: every label needs one (the server "
            "answers with it)"
        )
    for label in dict.fromkeys(labels):
        ids = [i for i, other in enumerate(labels) if other == label]
        if len(ids) > 1:
            raise ExportError(
                f"id2label names label {cut(repr(label), 60)} more than once (ids {', '.join(map(str, ids))}): "
                "labels must differ, or the server's answers cannot be told apart"
            )
    return labels


def _problem_type(config: Any, task: Task) -> str | None:
    """single- or multi-label classification; regression only with one label (a cross-encoder's relevance score)."""
    if task != "classification":
        return None
    if config.num_labels == 1 and config.problem_type in (None, "regression"):
        return (
            config.problem_type
        )  # a cross-encoder's one score: as the checkpoint says (None: sigmoid, as its pipeline)
    problem_type = config.problem_type or "single_label_classification"
    if problem_type not in ("single_label_classification", "multi_label_classification"):
        raise ExportError(
            f"problem_type {problem_type!r} is not served with {config.num_labels} labels; "
            "single_label_classification and multi_label_classification are, and regression with one label "
            "(a cross-encoder)"
        )
    return problem_type


def _max_length(config: Any, architecture: Architecture, tokenizer: Any, requested: int | None) -> int:
    if int(getattr(config, "max_position_embeddings", None) or -1) < 1:  # XLNet: relative positions, no table (-1)
        positions = int(getattr(tokenizer, "model_max_length", 512) or 512)
        positions = positions if positions < 1_000_000 else 512
    else:
        positions = int(config.max_position_embeddings)
    if architecture.reserved_positions:
        positions -= int(config.pad_token_id or 0) + 1
    tokenizer_limit = int(getattr(tokenizer, "model_max_length", positions) or positions)
    default = min(positions, tokenizer_limit) if tokenizer_limit < 1_000_000 else positions
    if requested is None:
        return default
    if not MIN_LENGTH <= requested <= positions:
        raise ExportError(f"--max-length {requested} is out of range: this model takes 8 to {positions} tokens")
    return requested


SAFETENSORS_DTYPES = {"F32": "float32", "F16": "float16", "BF16": "bfloat16", "F64": "float64"}


def _weights_dtype(local_dir: Path | None) -> str | None:
    """The stored dtype read from model.safetensors' header (most of its floating tensors), where config.json names
    none (sentence-transformers' configs: the summary said "stored unknown")."""
    path = local_dir / "model.safetensors" if local_dir is not None else None
    if path is None or not path.is_file():
        return None
    try:
        with path.open("rb") as stream:
            size = int.from_bytes(stream.read(8), "little")
            header = json.loads(stream.read(size)) if 0 < size <= 100_000_000 else {}
    except (OSError, ValueError):
        return None
    kinds = [entry.get("dtype") for name, entry in header.items() if name != "__metadata__" and isinstance(entry, dict)]
    floats = [SAFETENSORS_DTYPES[kind] for kind in kinds if kind in SAFETENSORS_DTYPES]
    return max(set(floats), key=floats.count) if floats else None


def _source_info(source: str, local_dir: Path | None, config: Any) -> dict[str, Any]:
    info: dict[str, Any] = {"checkpoint": str(local_dir.resolve()) if local_dir else source}
    info["kind"] = "local" if local_dir else "hub"
    stored = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    info["stored_dtype"] = str(stored).replace("torch.", "") if stored is not None else _weights_dtype(local_dir)
    if local_dir is None:
        info["revision"] = getattr(config, "_commit_hash", None)
        return info
    info["weights"] = [
        {"file": name, "sha256": _sha256(local_dir / name)} for name in WEIGHT_FILES if (local_dir / name).is_file()
    ]
    return info


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        for block in iter(lambda: stream.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
