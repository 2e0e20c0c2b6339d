"""Accuracy of each variant on the user's labelled data (`--eval FILE`), against fp32, with a loss budget.

Formats, one per task:
- classification: a TSV, `text<TAB>label` or `text<TAB>text_pair<TAB>label`; the label is a label name of the
  model or its index (only its name where the model's labels are numbers other than their indices, star ratings
  "1".."5": "1" is never read as index 1); a first line whose label is neither, nor a number, is a header and is
  skipped, and the export's summary quotes it (one whose first column has no name is pandas' index column,
  refused). Metric: accuracy.
- ner: CoNLL: one `word ... TAG` line per word (first column the word, last the IOB tag), a blank line between
  sentences, `-DOCSTART-` lines ignored. Metric: entity F1 (conlleval's exact span and type match), each word
  tagged by its first sub-token.
- qa: SQuAD v1.1 JSON (data / paragraphs / context / qas / question / answers). Metrics: exact match and F1
  (the official normalisation, best over the gold answers) of the answer the server gives at its defaults: the
  server's own windows and decoding (`bertcore.tasks.qa`: windows of 384 tokens overlapping by 128, the best
  answer of at most 15 tokens by the pipeline's scores). The budget applies to F1.
- embedding: retrieval JSON (queries, passages, which passages answer each query: export/retrieval.py). Metrics:
  recall@1, recall@10 and MRR@10 of every query searched against every passage. The budget applies to recall@10.
Scores are in points (percent). Inputs run in batches of 16 rows of like length, as the server batches them.
"""

from __future__ import annotations

import collections
import csv
import json
import re
import string
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from bertcore.messages import cut, one_line
from bertcore.tasks import ner, qa
from bertcore.tokenization import TextTokenizer
from export import retrieval
from export.checkpoint import Checkpoint
from export.errors import ExportError
from export.validation import pad_rows

PRIMARY_METRIC = {"classification": "accuracy", "ner": "f1", "qa": "f1", "embedding": retrieval.METRIC}
FORMATS = {"classification": "text/label TSV", "ner": "CoNLL", "qa": "SQuAD JSON", "embedding": retrieval.FORMAT}
AGREEMENT_OF = {"classification": "labels", "ner": "word tags", "qa": "answer spans", "embedding": "top-1 passages"}
DEFAULT_MAX_LOSS = 0.5
SQUAD_SHAPE = "data/paragraphs/context/qas/question/answers/text"
BATCH_ROWS = 16
QA_PARAMS = qa.QaParams()  # the server's defaults


@dataclass
class EvalSet:
    """Labelled examples, encoded once for every variant."""

    task: str
    path: Path
    golds: list[Any]  # label index / word tags / gold answer texts / relevant passage indices
    feeds: list[dict[str, np.ndarray]]  # the model's inputs, BATCH_ROWS rows each
    order: list[list[int]]  # the row index of each row of each feed (rows: one per example, QA: one per window)
    extras: list[Any] = field(default_factory=list)  # per example: first token of each word, or a QaExample
    similarity: str = "cosine"  # embedding: how query and passage vectors are compared
    header: list[str] | None = None  # a TSV's first line, where it was read as its header and skipped

    def __len__(self) -> int:
        return len(self.golds)


@dataclass(frozen=True)
class QaExample:
    question: str
    context: str
    features: qa.QaFeatures  # the server's windows of the pair
    rows: list[int]  # the row index of each window


def load_eval_set(path: Path, checkpoint: Checkpoint, limit: int | None = None) -> EvalSet:
    """Read and encode the evaluation data; every problem is an ExportError that names the file (and line)."""
    if not path.is_file():
        raise ExportError(f"--eval {path}: {'a folder, not a file' if path.is_dir() else 'no such file'}")
    if checkpoint.task == "classification" and checkpoint.problem_type == "multi_label_classification":
        raise ExportError("--eval supports single-label classification only (this model is multi-label)")
    if checkpoint.rerank:
        raise ExportError("--eval takes labelled classes; this model has one label (a cross-encoder's score)")
    if checkpoint.task == "embedding":
        return _retrieval_set(path, checkpoint, limit)
    if checkpoint.task in ("classification", "ner") and _starts_as_json(path):
        raise ExportError(
            f"--eval {path} is JSON, and a {checkpoint.task} model's --eval is {FORMATS[checkpoint.task]} "
            f"(SQuAD JSON is a QA model's; see docs/export.md)"
        )
    try:
        header: list[str] | None = None
        if checkpoint.task == "classification":
            examples, header = _read_tsv(path, checkpoint)
        else:
            readers: dict[str, Callable[[Path, Checkpoint], list[Any]]] = {"ner": _read_conll, "qa": _read_squad}
            examples = readers[checkpoint.task](path, checkpoint)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ExportError(f"--eval {path}: cannot read it as {FORMATS[checkpoint.task]}: {one_line(exc)}") from exc
    examples = examples[:limit] if limit else examples
    if not examples:
        skipped = f" (line 1 was read as its header: {_shown_row(header)})" if header is not None else ""
        raise ExportError(f"--eval {path} has no examples ({FORMATS[checkpoint.task]} expected){skipped}")
    eval_set = _encode(path, checkpoint, examples)
    eval_set.header = header
    return eval_set


def _shown_row(row: list[str]) -> str:
    """A TSV line as a message quotes it: its cells, each cut short."""
    return ", ".join(cut(repr(cell), 40) for cell in row)


def _starts_as_json(path: Path) -> bool:
    """The file opens as a JSON object or array would (a SQuAD file given to a classifier was read as one TSV line
    over csv's field limit, and the error said so: "field larger than field limit (131072)")."""
    try:
        with path.open("rb") as stream:
            start = stream.read(256).lstrip(b"\xef\xbb\xbf \t\r\n")
    except OSError:
        return False
    return start[:1] in (b"{", b"[") and start[1:2] in (b'"', b"{", b"[", b"]", b"}", b"\n", b"\r", b" ", b"\t")


def _read_tsv(path: Path, checkpoint: Checkpoint) -> tuple[list[tuple[str, str | None, int]], list[str] | None]:
    """The examples, and the first line where it was read as the header (the export's summary shows it: a first
    example whose label is not the model's was skipped as one without a word)."""
    labels = checkpoint.labels or []
    header = None
    # labels that are numbers, but not their own indices: a digit in the file is a name, never an index (read both
    # ways, "0" was index 0 and "1".."4" names, four of five examples shifted, without a word)
    by_index = not any(label.isascii() and label.isdigit() for label in labels) or labels == [
        str(i) for i in range(len(labels))
    ]
    examples = []
    with path.open(encoding="utf-8-sig", newline="") as stream:
        reader = csv.reader(stream, delimiter="\t", quoting=csv.QUOTE_NONE)
        try:
            for number, row in enumerate(reader, 1):
                if not any(cell.strip() for cell in row):
                    continue
                if len(row) not in (2, 3):
                    raise ExportError(
                        f"--eval {path} line {number}: expected text<TAB>label (or text<TAB>pair<TAB>label)"
                    )
                label = _label_index(row[-1].strip(), labels, by_index)
                if label is None:
                    if number == 1 and len(row) == 3 and not row[0].strip():
                        raise ExportError(
                            f"--eval {path} line 1: the header's first column has no name, as pandas writes its "
                            "index (its numbers would be read as the texts): write the file with "
                            "to_csv(..., sep='\\t', index=False)"
                        )
                    if number == 1 and not (row[-1].strip().isascii() and row[-1].strip().isdigit()):
                        header = [cell.strip() for cell in row]  # a number is a label, never a column's name
                        continue
                    shown = cut(repr(row[-1]), 60)
                    indices = " or 0..N-1" if by_index else " (the model's labels are numbers: read as names only)"
                    raise ExportError(f"--eval {path} line {number}: label {shown} is not one of {labels}{indices}")
                examples.append((row[0].strip(), row[1].strip() if len(row) == 3 else None, label))
        except csv.Error as exc:  # a field over csv's limit (131,072 characters), a NUL byte...
            raise ExportError(f"--eval {path} line {reader.line_num}: not a text<TAB>label line: {exc}") from exc
    return examples, header


def _label_index(text: str, labels: list[str], by_index: bool = True) -> int | None:
    if text in labels:
        return labels.index(text)
    if by_index and text.isascii() and text.isdigit() and int(text) < len(labels):  # not '²', which isdigit() takes
        return int(text)
    return None


def _read_conll(path: Path, checkpoint: Checkpoint) -> list[tuple[list[str], list[str]]]:
    sentences: list[tuple[list[str], list[str]]] = []
    words: list[str] = []
    tags: list[str] = []
    known = set(checkpoint.labels or [])
    unknown: dict[str, int] = {}  # tag -> the first line it is on
    for number, line in enumerate([*path.read_text(encoding="utf-8-sig").splitlines(), ""], 1):
        parts = line.split()
        if parts and parts[0] == "-DOCSTART-":
            continue
        if not parts:
            if words:
                sentences.append((words, tags))
            words, tags = [], []
            continue
        if len(parts) < 2:
            raise ExportError(f"--eval {path} line {number}: expected `word TAG` (CoNLL), got {line!r}")
        words.append(parts[0])
        tags.append(parts[-1])
        if parts[-1] not in known:
            unknown.setdefault(parts[-1], number)
    if unknown:  # as the TSV reader refuses labels the model does not have: scored, they would only be misses
        shown = ", ".join(cut(tag, 30) for tag in list(unknown)[:5]) + (", ..." if len(unknown) > 5 else "")
        first = min(unknown.values())
        raise ExportError(
            f"--eval {path}: {len(unknown)} tag(s) the model does not have ({shown}; first on line {first}); "
            f"its tags: {', '.join(checkpoint.labels or [])}"
        )
    return sentences


def _read_squad(path: Path, checkpoint: Checkpoint) -> list[tuple[str, str, list[str]]]:
    data = json.loads(path.read_text(encoding="utf-8-sig"))

    def field_of(parent: Any, key: str, kind: type, where: str) -> Any:
        """parent[key], which must be a `kind`; else an error naming the field, as data[0].paragraphs[1].qas[2]."""
        if not isinstance(parent, dict):
            raise ExportError(f"--eval {path}: {where or 'the file'} is not an object: not SQuAD JSON ({SQUAD_SHAPE})")
        named = f"{where}.{key}" if where else key
        if key not in parent:
            raise ExportError(f"--eval {path}: {where or 'the file'} has no {key!r}: not SQuAD JSON ({SQUAD_SHAPE})")
        value = parent[key]
        if not isinstance(value, kind):
            raise ExportError(
                f"--eval {path}: {named} is {type(value).__name__}, not {kind.__name__}: not SQuAD JSON ({SQUAD_SHAPE})"
            )
        return value

    examples = []
    for a, article in enumerate(field_of(data, "data", list, "")):
        for p, paragraph in enumerate(field_of(article, "paragraphs", list, f"data[{a}]")):
            where = f"data[{a}].paragraphs[{p}]"
            context = field_of(paragraph, "context", str, where)
            for q, question in enumerate(field_of(paragraph, "qas", list, where)):
                asked = f"{where}.qas[{q}]"
                if isinstance(question, dict) and not question.get("answers"):
                    continue  # unanswerable (SQuAD v2): not scored
                text = field_of(question, "question", str, asked)
                answers = field_of(question, "answers", list, asked)
                golds = [field_of(answer, "text", str, f"{asked}.answers[{i}]") for i, answer in enumerate(answers)]
                examples.append((text, context, golds))
    return examples


def _encode(path: Path, checkpoint: Checkpoint, examples: list) -> EvalSet:
    tokenizer, task = checkpoint.tokenizer, checkpoint.task
    if task == "qa":  # the server's tokenizer, from the tokenizer.json the export writes
        served = TextTokenizer(
            tokenizer.backend_tokenizer.to_str(), tokenizer.pad_token_id or 0, checkpoint.padding_side
        )
    rows: list[Any] = []
    golds: list[Any] = []
    extras: list[Any] = []
    for example in examples:
        if task == "classification":
            text, pair, label = example
            encoded = tokenizer(text, pair, truncation=True, max_length=checkpoint.max_length)
            golds.append(label)
            extras.append(None)
        elif task == "ner":
            words, tags = example
            joined = ner.Words.join(words)  # the text the server tags for these words (is_split_into_words)
            encoded = tokenizer(
                joined.text, truncation=True, max_length=checkpoint.max_length, return_offsets_mapping=True
            )
            golds.append(tags)
            spans = list(zip(joined.starts, joined.ends, strict=True))
            extras.append(_first_token_of_words(spans, encoded["offset_mapping"]))
        else:
            question, context, answers = example
            try:
                features = qa.prepare(served, question, context, QA_PARAMS, checkpoint.max_length)
            except qa.QaInputError as exc:  # what the server would refuse (422) at its defaults
                shown = cut(question, 60)
                raise ExportError(f"--eval {path}: the question {shown!r} cannot be asked: {exc}") from exc
            windows = [{"input_ids": row.input_ids, "token_type_ids": row.token_type_ids} for row in features.rows]
            golds.append(answers)
            extras.append(QaExample(question, context, features, list(range(len(rows), len(rows) + len(windows)))))
            rows.extend(windows)
            continue
        rows.append(encoded)
    by_length = sorted(range(len(rows)), key=lambda i: len(rows[i]["input_ids"]))
    order = [by_length[i : i + BATCH_ROWS] for i in range(0, len(by_length), BATCH_ROWS)]
    feeds = [pad_rows([rows[i] for i in chunk], checkpoint) for chunk in order]
    return EvalSet(task, path, golds, feeds, order, extras)


def _retrieval_set(path: Path, checkpoint: Checkpoint, limit: int | None) -> EvalSet:
    data = retrieval.read_retrieval(path, limit)
    rows = retrieval.encode_rows(checkpoint, data)
    by_length = sorted(range(len(rows)), key=lambda i: len(rows[i]["input_ids"]))
    order = [by_length[i : i + BATCH_ROWS] for i in range(0, len(by_length), BATCH_ROWS)]
    feeds = [pad_rows([rows[i] for i in chunk], checkpoint) for chunk in order]
    similarity = checkpoint.embedding.similarity if checkpoint.embedding is not None else "cosine"
    return EvalSet("embedding", path, list(data.answers), feeds, order, similarity=similarity)


def _first_token_of_words(spans: list[tuple[int, int]], offsets: list[tuple[int, int]]) -> list[int | None]:
    """Per word, the first token that covers part of it (None where truncation cut the word off)."""
    firsts: list[int | None] = []
    token = 0
    for start, end in spans:
        while token < len(offsets) and (offsets[token][1] <= start or offsets[token][0] == offsets[token][1]):
            token += 1
        firsts.append(token if token < len(offsets) and offsets[token][0] < end else None)
    return firsts


def predict(session: ort.InferenceSession, data: EvalSet, labels: list[str] | None) -> list[Any]:
    """Each example's answer: a label index, a tag per word, or an answer span (start, end) in characters."""
    if data.task == "qa":
        return _answer(session, data)
    if data.task == "embedding":
        return list(retrieval.search(session, data.feeds, data.order, len(data), data.similarity))
    answers: list[Any] = [None] * len(data)
    tag_names = labels or []  # NER only: a token-classification checkpoint always names its labels
    for feed, chunk in zip(data.feeds, data.order, strict=True):
        (logits,) = session.run(["logits"], feed)
        real = feed["attention_mask"].astype(bool)  # each row's own tokens, wherever its padding is
        for row, index in enumerate(chunk):  # one row per example: the row index is the example's
            if data.task == "classification":
                answers[index] = int(logits[row].argmax())
            else:
                tags = logits[row][real[row]].argmax(-1)
                answers[index] = [tag_names[tags[t]] if t is not None else "O" for t in data.extras[index]]
    return answers


def _answer(session: ort.InferenceSession, data: EvalSet) -> list[tuple[int, int]]:
    """Each question's best answer (start, end in characters), decoded from its windows' logits as the server
    decodes them."""
    logits: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    for feed, chunk in zip(data.feeds, data.order, strict=True):
        starts, ends = session.run(["start_logits", "end_logits"], feed)
        real = feed["attention_mask"].astype(bool)  # each window's own tokens, wherever its padding is
        for row, index in enumerate(chunk):
            logits[index] = (starts[row][real[row]], ends[row][real[row]])
    spans = []
    for example in data.extras:
        window_logits = [logits[index] for index in example.rows]
        best = qa.postprocess(
            example.question,
            example.context,
            example.features,
            [start for start, _ in window_logits],
            [end for _, end in window_logits],
            QA_PARAMS,
        )[0]
        spans.append((best["start"], best["end"]))
    return spans


def score(data: EvalSet, answers: list[Any]) -> dict[str, float]:
    """The task's metrics, in points."""
    if data.task == "embedding":
        return retrieval.score(answers, data.golds)
    if data.task == "classification":
        return {"accuracy": round(100 * float(np.mean([a == g for a, g in zip(answers, data.golds, strict=True)])), 2)}
    if data.task == "ner":
        found = gold = hit = 0
        for predicted, expected in zip(answers, data.golds, strict=True):
            p, e = entity_spans(predicted), entity_spans(expected)
            found, gold, hit = found + len(p), gold + len(e), hit + len(p & e)
        precision, recall = hit / max(found, 1), hit / max(gold, 1)
        f1 = 2 * precision * recall / (precision + recall) if hit else 0.0
        return {"f1": round(100 * f1, 2), "precision": round(100 * precision, 2), "recall": round(100 * recall, 2)}
    texts = [example.context[start:end] for example, (start, end) in zip(data.extras, answers, strict=True)]
    pairs = list(zip(texts, data.golds, strict=True))
    exact = [max(normalize_answer(t) == normalize_answer(g) for g in golds) for t, golds in pairs]
    f1s = [max(answer_f1(t, g) for g in golds) for t, golds in pairs]
    return {"exact_match": round(100 * float(np.mean(exact)), 2), "f1": round(100 * float(np.mean(f1s)), 2)}


def agreement(task: str, answers: list[Any], reference: list[Any]) -> float:
    """Share of labels / word tags / answer spans / best passages equal to the reference's."""
    if task == "embedding":
        return retrieval.agreement(answers, reference)
    if task == "ner":
        pairs = [(a, r) for words, ref in zip(answers, reference, strict=True) for a, r in zip(words, ref, strict=True)]
    else:
        pairs = list(zip(answers, reference, strict=True))
    return round(sum(a == r for a, r in pairs) / max(len(pairs), 1), 4)


def entity_spans(tags: list[str]) -> set[tuple[int, int, str]]:
    """IOB tags -> (first word, last word, type) spans, as conlleval counts them. A tag with no B-/I- prefix (IO
    tags: `PER`, `LOC`; or another scheme's `S-PER`) is read as the transformers pipelines, and so the server,
    group it: inside an entity of that whole tag (its F1 had been 0 whatever the model: no span began)."""
    spans: set[tuple[int, int, str]] = set()
    start: int | None = None
    kind = ""
    for i, tag in enumerate([*tags, "O"]):
        if tag[:2] in ("B-", "I-"):
            prefix, label = tag[0], tag[2:]
        else:
            prefix, label = ("O", "") if tag == "O" else ("I", tag)
        if start is not None and (prefix != "I" or label != kind):
            spans.add((start, i - 1, kind))
            start, kind = None, ""
        if prefix == "B" or (prefix == "I" and start is None):
            start, kind = i, label
    return spans


def iob_tags(count: int, entities: list[tuple[int, int, str]]) -> list[str]:
    """IOB tags of `count` words from (first word, last word, type) entities."""
    tags = ["O"] * count
    for first, last, kind in entities:
        for i in range(first, last + 1):
            tags[i] = ("B-" if i == first else "I-") + kind
    return tags


def normalize_answer(text: str) -> str:
    """SQuAD's normalisation: lower case, no punctuation, no articles, single spaces."""
    text = "".join(ch for ch in text.lower() if ch not in set(string.punctuation))
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def answer_f1(prediction: str, gold: str) -> float:
    predicted, expected = normalize_answer(prediction).split(), normalize_answer(gold).split()
    same = sum((collections.Counter(predicted) & collections.Counter(expected)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(predicted), same / len(expected)
    return 2 * precision * recall / (precision + recall)


def judge(task: str, scores: dict[str, float], reference: dict[str, float], agreed: float, budget: float) -> dict:
    """One variant's record: its scores, its loss against fp32 on the primary metric, and whether it is in budget."""
    metric = PRIMARY_METRIC[task]
    loss = round(reference[metric] - scores[metric], 2)
    return {
        "measured": True,
        "metric": metric,
        "scores": scores,
        "loss_points": loss,
        "agreement": agreed,
        "agreement_of": AGREEMENT_OF[task],
        "budget_points": budget,
        "within_budget": loss <= budget,
    }


def refusal_reason(variant: str, record: dict, data: EvalSet) -> str:
    metric = record["metric"]
    return (
        f"{variant} refused: {metric} {record['scores'][metric]:.2f} against fp32's "
        f"{record['scores'][metric] + record['loss_points']:.2f} on {data.path.name} ({len(data)} examples) loses "
        f"{record['loss_points']:.2f} points, over the budget of {record['budget_points']:g}"
    )


def measure_variants(
    data: EvalSet,
    sessions: dict[str, ort.InferenceSession | str],
    labels: list[str] | None,
    budget: float,
    progress: Callable[[str], None] = lambda _: None,
) -> dict[str, dict]:
    """Per variant, its record; a str in place of a session is why that variant could not be measured."""
    progress(f"measuring fp32 on {data.path.name} ({len(data)} examples)")
    reference = predict(sessions["fp32"], data, labels)
    reference_scores = score(data, reference)
    records = {"fp32": judge(data.task, reference_scores, reference_scores, 1.0, budget)}
    for variant, session in sessions.items():
        if variant == "fp32":
            continue
        if isinstance(session, str):
            records[variant] = {"measured": False, "reason": session}
            continue
        progress(f"measuring {variant} on {data.path.name}")
        answers = predict(session, data, labels)
        records[variant] = judge(
            data.task, score(data, answers), reference_scores, agreement(data.task, answers, reference), budget
        )
    return records
