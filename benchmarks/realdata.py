"""The real checkpoints and evaluation data in ../shared: the architecture x task cells (twelve, and five of the
families of issue 31), and real text.

`../shared/models` holds BERT-layout MiniLM checkpoints fine-tuned on SST-2, CoNLL-2003 and SQuAD (and a
DistilBERT SST-2 one); `../shared/tools/port_checkpoint.py` maps them exactly into the other architectures.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("BERTSERVE_SHARED", ROOT.parent / "shared"))
ARCHS = ("bert", "distilbert", "roberta", "albert")
DATASETS = {"sst2": "classification", "conll03": "ner", "squad": "qa"}


@dataclass(frozen=True)
class Cell:
    arch: str
    dataset: str

    @property
    def task(self) -> str:
        return DATASETS[self.dataset]

    @property
    def name(self) -> str:
        return f"minilm-{self.arch}-{self.dataset}"


CELLS = tuple(Cell(arch, dataset) for dataset in DATASETS for arch in ARCHS)
# Issue 31's families with exact ports of the same checkpoints: XLM-RoBERTa takes all three; ELECTRA's
# classification head (GELU) is not BERT's tanh pooler, so it takes NER and QA only.
FAMILY_CELLS = (
    *(Cell("xlm-roberta", dataset) for dataset in DATASETS),
    Cell("electra", "conll03"),
    Cell("electra", "squad"),
)
ALL_CELLS = CELLS + FAMILY_CELLS


def shared_available() -> bool:
    return (SHARED / "models" / "minilm-bert-sst2" / "config.json").is_file() and (SHARED / "data").is_dir()


def checkpoint_for(cell: Cell, workdir: Path) -> Path:
    """The shared checkpoint itself where one exists for the cell, else an exact port of the BERT one."""
    own = SHARED / "models" / cell.name
    if (own / "config.json").is_file():
        return own
    target = workdir / cell.name
    if not (target / "config.json").is_file():
        tool = SHARED / "tools" / "port_checkpoint.py"
        source = SHARED / "models" / f"minilm-bert-{cell.dataset}"
        subprocess.run(
            [sys.executable, str(tool), str(source), str(target), "--to", cell.arch],
            check=True,
            capture_output=True,
            env={**os.environ, "HF_HUB_OFFLINE": "1"},
        )
    return target


def sst2(limit: int | None = None) -> list[tuple[str, int]]:
    with (SHARED / "data" / "sst2" / "dev.tsv").open(encoding="utf-8") as stream:
        rows = [(row["sentence"].strip(), int(row["label"])) for row in csv.DictReader(stream, delimiter="\t")]
    return rows[:limit]


def conll03(limit: int | None = None) -> list[tuple[list[str], list[str]]]:
    sentences, words, tags = [], [], []
    for line in (SHARED / "data" / "conll2003" / "test.txt").read_text(encoding="utf-8").splitlines():
        if not line.strip():
            if words:
                sentences.append((words, tags))
            words, tags = [], []
            continue
        word, tag = line.rsplit(" ", 1)
        words.append(word)
        tags.append(tag)
    if words:
        sentences.append((words, tags))
    sentences = [(w, t) for w, t in sentences if w != ["-DOCSTART-"]]  # document separators, not sentences
    return sentences[:limit]


def squad(limit: int | None = None) -> list[tuple[str, str, list[str]]]:
    """(question, context, gold answer texts)."""
    data = json.loads((SHARED / "data" / "squad" / "dev-v1.1-eval-half.json").read_text(encoding="utf-8"))
    examples = [
        (qa["question"], paragraph["context"], [a["text"] for a in qa["answers"]])
        for article in data["data"]
        for paragraph in article["paragraphs"]
        for qa in paragraph["qas"]
    ]
    return examples[:limit]


def texts_for(task: str, limit: int | None = None) -> list[tuple[str, str | None]]:
    """Real inputs for a task: SST-2 sentences, CoNLL-2003 sentences, SQuAD (question, context) pairs."""
    if task == "classification":
        return [(sentence, None) for sentence, _ in sst2(limit)]
    if task == "ner":
        return [(" ".join(words), None) for words, _ in conll03(limit)]
    return [(question, context) for question, context, _ in squad(limit)]


def encoded_batches(
    tokenizer, task: str, texts: list[tuple[str, str | None]], input_names: list[str], batch_size: int
) -> list[dict]:
    """Padded numpy feeds of `batch_size` rows; QA contexts truncated to 384 tokens as the pipeline does."""
    batches = []
    for start in range(0, len(texts), batch_size):
        chunk = texts[start : start + batch_size]
        firsts = [first for first, _ in chunk]
        seconds = [second for _, second in chunk] if task == "qa" else None
        encoded = tokenizer(
            firsts,
            seconds,
            padding=True,
            truncation="only_second" if task == "qa" else True,
            max_length=384 if task == "qa" else 512,
            return_tensors="np",
        )
        feed = {"input_ids": encoded["input_ids"], "attention_mask": encoded["attention_mask"]}
        feed["token_type_ids"] = encoded.get("token_type_ids", feed["input_ids"] * 0)
        batches.append({name: feed[name].astype("int64") for name in input_names})
    return batches
