"""Check each ONNX variant against the PyTorch fp32 model on several shapes, with padding, on real tokens."""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import onnxruntime as ort
import torch

from export.architectures import OUTPUT_NAMES, Task
from export.checkpoint import Checkpoint
from export.errors import ExportError
from export.sample_text import CONTEXT, QUESTIONS, SENTENCES

FP32_TOLERANCE = 1e-4
PER_ROW_TASKS = ("classification", "embedding")  # one output per input; the others have one per token
EMBEDDING_AGREEMENT = 0.999  # an embedding "agrees" with PyTorch's where their cosine is at least this


@dataclass(frozen=True)
class Case:
    name: str
    inputs: dict[str, np.ndarray]

    @property
    def shape(self) -> list[int]:
        return list(self.inputs["input_ids"].shape)


@dataclass
class Validation:
    """What one variant's check found; `validated` False means it was not run, with the reason."""

    variant: str
    validated: bool
    provider: str | None = None
    max_abs_diff: float | None = None
    agreement: float | None = None
    agreement_of: str | None = None
    agreed: int | None = None  # of `compared` labels, tags or spans: how many the agreement is a share of
    compared: int | None = None
    batch_invariance_max_abs_diff: float | None = None  # each batched row run alone against its row in the batch
    tolerance: float | None = None
    passed: bool | None = None
    reason: str | None = None
    cases: list[dict[str, Any]] = field(default_factory=list)
    # Embeddings: each reference text's cosine against sentence-transformers' encode (export/embedding_check.py)
    embedding_reference: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return _finite(asdict(self))  # model.json is JSON: no NaN or Infinity (a non-finite difference is None)


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not np.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_finite(item) for item in value]
    return value


def build_cases(checkpoint: Checkpoint) -> list[Case]:
    """Batch 1 and 3; short, odd and maximum lengths; rows padded to the longest in their batch."""
    limit = checkpoint.max_length
    short = min(8, limit)
    odd = 37 if limit > 37 else limit - 1 - (limit % 2 == 0)
    plans = {
        "batch1-short": [short],
        "batch1-odd": [odd],
        "batch1-max": [limit],
        "batch3-padded": [odd, short, max(short, limit // 2)],
        "batch3-max": [short, limit, odd],
    }
    return [Case(name, _batch(checkpoint, lengths)) for name, lengths in plans.items()]


def _batch(checkpoint: Checkpoint, lengths: list[int]) -> dict[str, np.ndarray]:
    return pad_rows([_encode_row(checkpoint, length, index) for index, length in enumerate(lengths)], checkpoint)


def pad_rows(rows: list[dict[str, list[int]]], checkpoint: Checkpoint) -> dict[str, np.ndarray]:
    """Encoded rows as one padded batch of exactly the inputs the checkpoint's graph takes: padded on the right,
    or on the left where the family's tokenizer pads there (XLNet, whose classifier token is last)."""
    width = max(len(row["input_ids"]) for row in rows)
    pad_id = checkpoint.tokenizer.pad_token_id or 0
    batch = {
        "input_ids": np.full((len(rows), width), pad_id, dtype=np.int64),
        "attention_mask": np.zeros((len(rows), width), dtype=np.int64),
        "token_type_ids": np.zeros((len(rows), width), dtype=np.int64),
    }
    left = checkpoint.padding_side == "left"
    for i, row in enumerate(rows):
        n = len(row["input_ids"])
        where = slice(width - n, width) if left else slice(0, n)
        batch["input_ids"][i, where] = row["input_ids"]
        batch["attention_mask"][i, where] = 1
        if "token_type_ids" in row:
            batch["token_type_ids"][i, where] = row["token_type_ids"]
    return {name: batch[name] for name in checkpoint.input_names}


def _encode_row(checkpoint: Checkpoint, length: int, index: int) -> dict[str, list[int]]:
    """Exactly `length` tokens of real text: a sentence, a sentence pair, or a (question, context) pair."""
    tokenizer = checkpoint.tokenizer
    rotated = " ".join(SENTENCES[index:] + SENTENCES[:index])
    repeat = 1
    while True:
        text = " ".join([rotated] * repeat)
        if checkpoint.task == "qa":
            encoded = tokenizer(
                QUESTIONS[index % len(QUESTIONS)], " ".join([CONTEXT] * repeat), truncation=True, max_length=length
            )
        elif checkpoint.task == "classification" and index % 2 == 1:
            encoded = tokenizer(text, SENTENCES[index], truncation=True, max_length=length)
        else:
            encoded = tokenizer(text, truncation=True, max_length=length)
        if len(encoded["input_ids"]) >= length or repeat > 64:
            return {key: list(value) for key, value in encoded.items()}
        repeat *= 2


def reference_outputs(checkpoint: Checkpoint, cases: list[Case]) -> list[dict[str, np.ndarray]]:
    names = OUTPUT_NAMES[checkpoint.task]
    results = []
    with torch.no_grad():
        for case in cases:
            tensors = {name: torch.from_numpy(array) for name, array in case.inputs.items()}
            outputs = checkpoint.model(**tensors, return_dict=True)
            results.append({name: outputs[name].float().numpy() for name in names})
    bad, total, kinds = non_finite_rows(checkpoint.task, cases, results)
    if bad:
        raise ExportError(
            f"the checkpoint's outputs are not finite ({kinds}) on {bad} of {total} inputs: corrupt weights?"
        )
    return results


def non_finite_rows(task: Task, cases: list[Case], outputs: list[dict[str, np.ndarray]]) -> tuple[int, int, str]:
    """How many input rows have a NaN or infinite output (on their real tokens, for per-token outputs), of how
    many; and which of NaN, inf were seen."""
    bad, total = 0, 0
    kinds: set[str] = set()
    for case, produced in zip(cases, outputs, strict=True):
        mask = case.inputs["attention_mask"].astype(bool)
        for row in range(len(mask)):
            total += 1
            values = [v[row][mask[row]] if task not in PER_ROW_TASKS else v[row] for v in produced.values()]
            if all(np.isfinite(v).all() for v in values):
                continue
            bad += 1
            kinds.update(k for v in values for k, f in (("NaN", np.isnan), ("inf", np.isinf)) if f(v).any())
    return bad, total, ", ".join(sorted(kinds))


def create_session(path: str, provider: str) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.log_severity_level = 3
    return ort.InferenceSession(path, options, providers=[provider])


def validate(
    variant: str,
    session: ort.InferenceSession,
    checkpoint: Checkpoint,
    cases: list[Case],
    references: list[dict[str, np.ndarray]],
    tolerance: float | None,
) -> Validation:
    names = OUTPUT_NAMES[checkpoint.task]
    report = Validation(variant=variant, validated=True, provider=session.get_providers()[0], tolerance=tolerance)
    agree_total, count_total, worst = 0, 0, 0.0
    all_produced = []
    for case, reference in zip(cases, references, strict=True):
        produced = dict(zip(names, session.run(list(names), case.inputs), strict=True))
        all_produced.append(produced)
        mask = case.inputs["attention_mask"].astype(bool)
        diff = max_abs_diff(checkpoint.task, reference, produced, mask)
        agree, count, unit = agreement(checkpoint.task, checkpoint.problem_type, reference, produced, mask)
        report.cases.append({"name": case.name, "shape": case.shape, "max_abs_diff": diff, "agreement": agree / count})
        worst = _larger(worst, diff)
        agree_total += agree
        count_total += count
        report.agreement_of = unit
    invariance = [
        batch_invariance(session, names, case, checkpoint.task not in PER_ROW_TASKS)
        for case in cases
        if case.shape[0] > 1
    ]
    report.batch_invariance_max_abs_diff = functools.reduce(_larger, invariance) if invariance else None
    report.max_abs_diff = worst
    report.agreement = agree_total / count_total
    report.agreed, report.compared = agree_total, count_total
    report.passed = worst <= tolerance if tolerance is not None else None
    bad, total, kinds = non_finite_rows(checkpoint.task, cases, all_produced)
    if bad:
        report.passed = False
        report.reason = f"{variant} outputs are not finite ({kinds}) on {bad} of {total} inputs"
    return report


def _larger(a: float, b: float) -> float:
    """max() where NaN wins (Python's max(0.0, nan) is 0.0): a NaN difference is the worst there is."""
    return a if np.isnan(a) or a >= b else b


def batch_invariance(session: ort.InferenceSession, names: tuple[str, ...], case: Case, per_token: bool) -> float:
    """Largest |difference| between a row's outputs in the batch and the same row run alone, unpadded (its
    tokens are where its mask is: at the start of a right-padded row, at the end of a left-padded one)."""
    batched = session.run(list(names), case.inputs)
    worst = 0.0
    for row, real in enumerate(case.inputs["attention_mask"].astype(bool)):
        alone = session.run(list(names), {name: array[row : row + 1, real] for name, array in case.inputs.items()})
        for together, single in zip(batched, alone, strict=True):
            mine = together[row : row + 1, real] if per_token else together[row : row + 1]
            worst = _larger(worst, float(np.max(np.abs(mine.astype(np.float64) - single.astype(np.float64)))))
    return worst


def max_abs_diff(task: Task, reference: dict, produced: dict, mask: np.ndarray) -> float:
    worst = 0.0
    for name, expected in reference.items():
        got = produced[name]
        if task not in PER_ROW_TASKS:  # per-token outputs: padded positions carry no answer
            expected, got = expected[mask], got[mask]
        worst = _larger(worst, float(np.max(np.abs(expected.astype(np.float64) - got.astype(np.float64)))))
    return worst


def agreement(
    task: Task, problem_type: str | None, reference: dict, produced: dict, mask: np.ndarray
) -> tuple[int, int, str]:
    """How often the variant gives the same answer: labels per row, tags per token, (start, end) per row, or a
    vector within cosine EMBEDDING_AGREEMENT."""
    if task == "embedding":
        expected, got = reference["sentence_embedding"].astype(np.float64), produced["sentence_embedding"]
        got = got.astype(np.float64)
        cosine = np.sum(expected * got, -1) / np.maximum(
            np.linalg.norm(expected, axis=-1) * np.linalg.norm(got, axis=-1), 1e-30
        )
        return int((cosine >= EMBEDDING_AGREEMENT).sum()), len(cosine), f"vectors (cosine >= {EMBEDDING_AGREEMENT:g})"
    if task == "classification":
        expected, got = reference["logits"], produced["logits"]
        if problem_type == "multi_label_classification" or expected.shape[-1] == 1:  # one label: its sign
            same = np.all((expected > 0) == (got > 0), axis=-1)
        else:
            same = expected.argmax(-1) == got.argmax(-1)
        return int(same.sum()), len(same), "labels"
    if task == "ner":
        same = reference["logits"].argmax(-1)[mask] == produced["logits"].argmax(-1)[mask]
        return int(same.sum()), int(mask.sum()), "token tags"
    spans_ref = _best_positions(reference, mask)
    spans_got = _best_positions(produced, mask)
    same = np.all(spans_ref == spans_got, axis=-1)
    return int(same.sum()), len(same), "answer spans"


def _best_positions(outputs: dict, mask: np.ndarray, max_answer_tokens: int = 15) -> np.ndarray:
    """Per row, the (start, end) that maximises start + end logits with start <= end < start + 15 (real tokens)."""
    start = np.where(mask, outputs["start_logits"], -np.inf)
    end = np.where(mask, outputs["end_logits"], -np.inf)
    length = start.shape[1]
    offsets = np.arange(length)[None, :] - np.arange(length)[:, None]  # end - start
    allowed = (offsets >= 0) & (offsets < max_answer_tokens)
    scores = np.where(allowed[None], start[:, :, None] + end[:, None, :], -np.inf)
    best = scores.reshape(len(scores), -1).argmax(-1)
    return np.stack([best // length, best % length], axis=-1)
