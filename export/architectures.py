"""What the export supports: architectures, tasks, and the ONNX inputs and outputs of each."""

from __future__ import annotations

from dataclasses import dataclass

from bertcore.model_config import TASKS, Task

__all__ = ["TASKS", "Task"]


@dataclass(frozen=True)
class Architecture:
    model_type: str
    display_name: str
    input_names: tuple[str, ...]
    # RoBERTa numbers positions from pad_token_id + 1, so two position embeddings are not usable.
    reserved_positions: int = 0
    # None where ONNX Runtime's optimizer fuses this family's attention (its "bert" fusions, every layer: the
    # export stops when one is left unfused). Otherwise why it cannot: the export then records the reason in
    # model.json (`attention_fusion`) and goes on with the attention as plain operators.
    unfused_attention: str | None = None
    # XLNet's tokenizer pads on the left and puts its classifier token last.
    padding_side: str = "right"


SEGMENTS = ("input_ids", "attention_mask", "token_type_ids")
NO_SEGMENTS = ("input_ids", "attention_mask")

ARCHITECTURES: dict[str, Architecture] = {
    "bert": Architecture("bert", "BERT", SEGMENTS),
    "roberta": Architecture("roberta", "RoBERTa", NO_SEGMENTS, reserved_positions=2),
    "albert": Architecture("albert", "ALBERT", SEGMENTS),
    "distilbert": Architecture("distilbert", "DistilBERT", NO_SEGMENTS),
    "xlm-roberta": Architecture("xlm-roberta", "XLM-RoBERTa", NO_SEGMENTS, reserved_positions=2),
    "camembert": Architecture("camembert", "CamemBERT", NO_SEGMENTS, reserved_positions=2),
    "electra": Architecture("electra", "ELECTRA", SEGMENTS),
    "ernie": Architecture("ernie", "ERNIE", SEGMENTS),
    "mobilebert": Architecture(
        "mobilebert",
        "MobileBERT",
        SEGMENTS,
        unfused_attention="MobileBERT's queries and keys come from a bottleneck of the layer input and its values "
        "from the input itself; the optimizer's attention fusion needs Q, K and V from one input",
    ),
    "deberta-v2": Architecture(
        "deberta-v2",
        "DeBERTa-v2/v3",
        SEGMENTS,
        unfused_attention="DeBERTa's disentangled attention adds content-to-position and position-to-content "
        "scores gathered from relative position embeddings; onnxruntime's optimizer has no fusion for it",
    ),
    "modernbert": Architecture(
        "modernbert",
        "ModernBERT",
        NO_SEGMENTS,
        unfused_attention="ModernBERT rotates queries and keys (rotary positions) and masks local layers to a "
        "sliding window; onnxruntime's optimizer has no encoder fusion for either",
    ),
    "xlnet": Architecture(
        "xlnet",
        "XLNet",
        SEGMENTS,
        unfused_attention="XLNet's relative attention adds position and segment scores to the content scores; "
        "onnxruntime's optimizer has no fusion for it",
        padding_side="left",
    ),
}

# Suffix of a Hugging Face architecture class name -> our task.
HEAD_SUFFIXES: dict[str, Task] = {
    "ForSequenceClassification": "classification",
    "ForTokenClassification": "ner",
    "ForQuestionAnswering": "qa",
    "ForQuestionAnsweringSimple": "qa",  # XLNet's span head (its ForQuestionAnswering is a beam search)
}

OUTPUT_NAMES: dict[Task, tuple[str, ...]] = {
    "classification": ("logits",),
    "ner": ("logits",),
    "qa": ("start_logits", "end_logits"),
    "embedding": ("sentence_embedding",),  # [batch, dimension]: pooled (and Dense, normalized) inside the graph
}

# Dynamic axes of each output: classification logits and embeddings are per row, the others per token.
OUTPUT_AXES: dict[Task, dict[int, str]] = {
    "classification": {0: "batch"},
    "embedding": {0: "batch"},
    "ner": {0: "batch", 1: "sequence"},
    "qa": {0: "batch", 1: "sequence"},
}


def supported_summary() -> str:
    names = ", ".join(a.display_name for a in ARCHITECTURES.values())
    return (
        f"supported: {names} with a sequence classification, token classification (ner) or question answering (qa) "
        "head, or as sentence embeddings (a sentence-transformers directory, or a base model with --task embedding)"
    )


def task_of_architecture(class_name: str) -> Task | None:
    for suffix, task in HEAD_SUFFIXES.items():
        if class_name.endswith(suffix):
            return task
    return None
