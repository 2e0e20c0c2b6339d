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


ARCHITECTURES: dict[str, Architecture] = {
    "bert": Architecture("bert", "BERT", ("input_ids", "attention_mask", "token_type_ids")),
    "roberta": Architecture("roberta", "RoBERTa", ("input_ids", "attention_mask"), reserved_positions=2),
    "albert": Architecture("albert", "ALBERT", ("input_ids", "attention_mask", "token_type_ids")),
    "distilbert": Architecture("distilbert", "DistilBERT", ("input_ids", "attention_mask")),
}

# Suffix of a Hugging Face architecture class name -> our task.
HEAD_SUFFIXES: dict[str, Task] = {
    "ForSequenceClassification": "classification",
    "ForTokenClassification": "ner",
    "ForQuestionAnswering": "qa",
}

OUTPUT_NAMES: dict[Task, tuple[str, ...]] = {
    "classification": ("logits",),
    "ner": ("logits",),
    "qa": ("start_logits", "end_logits"),
}

# Dynamic axes of each output: classification logits are per row, the others per token.
OUTPUT_AXES: dict[Task, dict[int, str]] = {
    "classification": {0: "batch"},
    "ner": {0: "batch", 1: "sequence"},
    "qa": {0: "batch", 1: "sequence"},
}


def supported_summary() -> str:
    names = ", ".join(a.display_name for a in ARCHITECTURES.values())
    return (
        f"supported: {names} with a sequence classification, token classification (ner) or question answering (qa) head"
    )


def task_of_architecture(class_name: str) -> Task | None:
    for suffix, task in HEAD_SUFFIXES.items():
        if class_name.endswith(suffix):
            return task
    return None
