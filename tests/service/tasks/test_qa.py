"""Question-answering pre- and post-processing against transformers 4.57's question-answering pipeline.

The pipeline is gone from transformers 5: its answers were recorded once by tools/qa_golden.py (transformers 4.57.6
in its own virtualenv) in tests/fixtures/qa/. Here the same checkpoints are rebuilt (the tiny ones) or read
(../shared), our windows must be the pipeline's windows, our logits come from the PyTorch model on our rows, and
the answers must be equal: text, start and end exactly, scores within 1e-4.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from transformers import AutoModelForQuestionAnswering

from service.tasks import qa
from service.tokenization import TextTokenizer

ARCHS = ("bert", "roberta", "albert", "distilbert")
SCORE_TOLERANCE = 1e-4
FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "qa"
SHARED = Path(__file__).resolve().parents[3].parent / "shared"
REAL_NAME = "minilm-bert-squad"
REAL_CHECKPOINT = SHARED / "models" / REAL_NAME
REGENERATE = "regenerate the fixtures with tools/qa_golden.py (see its docstring)"


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread() -> Iterator[None]:
    """Small models on a shared 2-core machine: extra threads only spin."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def load_fixture(name: str) -> dict[str, Any]:
    fixture = json.loads((FIXTURES / f"{name}.json").read_text(encoding="utf-8"))
    assert fixture["generator"]["transformers"].startswith("4.57."), "the reference is transformers 4.57"
    return fixture


def check_fingerprint(directory: Path, fixture: dict[str, Any]) -> None:
    """The checkpoint must be the one the fixture was generated from, or the comparison means nothing."""
    for name, expected in fixture["checkpoint"]["fingerprint"].items():
        actual = hashlib.sha256((directory / name).read_bytes()).hexdigest()
        if actual != expected:
            pytest.fail(
                f"{fixture['checkpoint']['name']}: {name} has sha256 {actual}, but the golden fixture was made "
                f"from {expected}: the checkpoint changed (tests/tiny_models.py, transformers or ../shared); "
                + REGENERATE
            )


def window_hash(ids: np.ndarray) -> str:
    return hashlib.sha256(",".join(map(str, ids.tolist())).encode()).hexdigest()[:16]


@dataclass
class Model:
    """A checkpoint as the server sees it (tokenizer.json) and its PyTorch model for the logits."""

    tokenizer: TextTokenizer
    module: Any
    input_names: list[str]
    max_length: int
    cache: dict[tuple[bytes, bytes], tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)

    @classmethod
    def load(cls, directory: Path, fixture: dict[str, Any]) -> Model:
        check_fingerprint(directory, fixture)
        module = AutoModelForQuestionAnswering.from_pretrained(
            str(directory), attn_implementation="eager", dtype=torch.float32
        ).eval()
        info = fixture["checkpoint"]
        tokenizer = TextTokenizer(directory / "tokenizer.json", module.config.pad_token_id)
        return cls(tokenizer, module, info["model_input_names"], info["model_max_length"])

    def logits(self, features: qa.QaFeatures) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """Start and end logits of each row, one row at a time, fed what the pipeline fed the model."""
        starts, ends = [], []
        for row in features.rows:
            key = (row.input_ids.tobytes(), row.token_type_ids.tobytes())
            if key not in self.cache:
                inputs = {
                    "input_ids": torch.from_numpy(row.input_ids)[None],
                    "token_type_ids": torch.from_numpy(row.token_type_ids)[None],
                    "attention_mask": torch.ones((1, len(row)), dtype=torch.int64),
                }
                with torch.no_grad():
                    output = self.module(**{name: inputs[name] for name in self.input_names})
                self.cache[key] = (output.start_logits[0].numpy(), output.end_logits[0].numpy())
            starts.append(self.cache[key][0])
            ends.append(self.cache[key][1])
        return starts, ends

    def answer(self, question: str, context: str, params: qa.QaParams) -> tuple[qa.QaFeatures, list[dict[str, Any]]]:
        features = qa.prepare(self.tokenizer, question, context, params, self.max_length)
        starts, ends = self.logits(features)
        return features, qa.postprocess(question, context, features, starts, ends, params)


def compare_case(model: Model, fixture: dict[str, Any], case: dict[str, Any]) -> str | None:
    """None when our module does what the pipeline did for this case, else what differs."""
    question, context = fixture["questions"][case["question"]], fixture["contexts"][case["context"]]
    label = f"question {case['question']} / context {case['context']} {case['params']}"
    if "error" in case:
        try:
            model.answer(question, context, qa.QaParams(**case["params"]))
        except ValueError:
            return None
        return f"{label}: the pipeline raised ({case['error']}), ours did not"
    features, got = model.answer(question, context, qa.QaParams(**case["params"]))
    windows = [[len(row), window_hash(row.input_ids)] for row in features.rows]
    if windows != case["windows"]:
        return f"{label}: windows {windows} != the pipeline's {case['windows']}"
    expected = case["answers"]
    if [(a["answer"], a["start"], a["end"]) for a in got] != [(a["answer"], a["start"], a["end"]) for a in expected]:
        return f"{label}:\n  ours     {got}\n  pipeline {expected}"
    for have, want in zip(got, expected, strict=True):
        if not isinstance(have["score"], float) or abs(have["score"] - want["score"]) > SCORE_TOLERANCE:
            return f"{label}: score {have['score']} != {want['score']} for {want['answer']!r}"
    return None


def compare_fixture(model: Model, fixture: dict[str, Any]) -> None:
    failures = [failure for case in fixture["cases"] if (failure := compare_case(model, fixture, case))]
    total = len(fixture["cases"])
    assert not failures, f"{len(failures)} of {total} cases differ from the pipeline:\n" + "\n".join(failures[:10])


# --- the golden cases ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("arch", ARCHS)
def test_tiny_checkpoint_answers_match_the_pipeline(tiny_checkpoint: Callable[..., Path], arch: str) -> None:
    fixture = load_fixture(f"tiny-{arch}")
    model = Model.load(tiny_checkpoint(arch, "qa"), fixture)
    cases = fixture["cases"]
    # The fixture must exercise what it claims to: windows, several answers, the empty answer, errors.
    assert sum(len(case.get("windows", [])) > 2 for case in cases) >= 20
    assert sum(len(case.get("answers", [])) >= 3 for case in cases) >= 20
    assert any(answer["answer"] == "" for case in cases for answer in case.get("answers", []))
    assert sum("error" in case for case in cases) >= 4
    compare_fixture(model, fixture)


@pytest.mark.shared
@pytest.mark.skipif(not (REAL_CHECKPOINT / "config.json").is_file(), reason=f"{REAL_CHECKPOINT} is absent")
def test_real_checkpoint_answers_match_the_pipeline_on_squad() -> None:
    fixture = load_fixture(REAL_NAME)
    model = Model.load(REAL_CHECKPOINT, fixture)
    assert sum(case["params"] == {} for case in fixture["cases"]) >= 150
    assert sum(len(case["windows"]) >= 3 for case in fixture["cases"] if "windows" in case) >= 9
    compare_fixture(model, fixture)


def test_a_changed_checkpoint_is_reported(tmp_path: Path) -> None:
    for name in ("model.safetensors", "tokenizer.json"):
        (tmp_path / name).write_text("changed")
    with pytest.raises(pytest.fail.Exception, match=r"model\.safetensors has sha256 .* the checkpoint changed"):
        check_fingerprint(tmp_path, load_fixture("tiny-bert"))


# --- parameters --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"top_k": 0}, "top_k must be >= 1"),
        ({"top_k": -2}, "top_k must be >= 1"),
        ({"max_answer_len": 0}, "max_answer_len must be >= 1"),
        ({"max_question_len": 0}, "max_question_len must be >= 1"),
        ({"max_seq_len": 0}, "max_seq_len must be >= 1"),
        ({"doc_stride": -1}, "doc_stride must be >= 0"),
        ({"max_seq_len": 48, "doc_stride": 50}, r"doc_stride \(50\) is larger than max_seq_len \(48\)"),
        ({"top_k": 1.5}, "top_k must be an integer"),
        ({"top_k": True}, "top_k must be an integer"),
        ({"max_seq_len": "384"}, "max_seq_len must be an integer"),
        ({"handle_impossible_answer": 1}, "handle_impossible_answer must be true or false"),
        ({"align_to_words": None}, "align_to_words must be true or false"),
    ],
)
def test_impossible_parameters_are_refused(params: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        qa.QaParams(**params)


def test_defaults_are_the_pipelines() -> None:
    params = qa.QaParams()
    assert (params.top_k, params.max_answer_len, params.max_question_len) == (1, 15, 64)
    assert (params.handle_impossible_answer, params.align_to_words) == (False, True)
    # max_seq_len: min(model limit, 384); doc_stride: min(max_seq_len // 2, 128).
    assert params.window(512) == (384, 128)
    assert params.window(64) == (64, 32)
    assert params.window(201) == (201, 100)
    # Ours caps an explicit max_seq_len at the model's limit; an explicit doc_stride is kept.
    assert qa.QaParams(max_seq_len=384).window(64) == (64, 32)
    assert qa.QaParams(max_seq_len=48, doc_stride=16).window(512) == (48, 16)
    with pytest.raises(ValueError, match=r"doc_stride \(128\) is larger than max_seq_len \(64\)"):
        qa.QaParams(doc_stride=128).window(64)
    assert params.candidates_per_window == 12
    assert qa.QaParams(top_k=3, align_to_words=False).candidates_per_window == 3


@pytest.fixture(scope="module")
def tiny_bert(tiny_checkpoint: Callable[..., Path]) -> Model:
    return Model.load(tiny_checkpoint("bert", "qa"), load_fixture("tiny-bert"))


LONG_CONTEXT = " ".join(
    [
        "The committee will meet again in Geneva next week to review the budget and the new rules.",
        "Scientists in Tokyo and Berlin reported faster trains, cheaper batteries and cleaner water.",
        "Marie Curie was the first person to win Nobel prizes in two different sciences.",
    ]
)


def test_stride_and_question_length_are_checked_only_when_windows_are_needed(tiny_bert: Model) -> None:
    question = "Who met in Brussels?"  # 5 tokens: with [CLS] and two [SEP], 8 tokens outside the context
    short = "Peter met Maria in Brussels."
    # The context fits: no window, so no stride is needed (the pipeline answers too).
    features, answers = tiny_bert.answer(question, short, qa.QaParams(max_seq_len=48, doc_stride=45))
    assert len(features.rows) == 1 and len(answers) == 1
    with pytest.raises(ValueError, match=r"doc_stride \(40\) must be smaller than the room left .* \(40 tokens"):
        qa.prepare(tiny_bert.tokenizer, question, LONG_CONTEXT, qa.QaParams(max_seq_len=48, doc_stride=40), 64)
    features = qa.prepare(tiny_bert.tokenizer, question, LONG_CONTEXT, qa.QaParams(max_seq_len=48, doc_stride=39), 64)
    assert len(features.rows) > 1 and all(len(row) <= 48 for row in features.rows)
    with pytest.raises(ValueError, match="leaves no room for the context"):
        qa.prepare(tiny_bert.tokenizer, question, LONG_CONTEXT, qa.QaParams(max_seq_len=8, doc_stride=0), 64)
    for empty in ("question", "context"):
        texts = {"question": question, "context": short, empty: ""}
        with pytest.raises(ValueError, match=f"{empty} must be a non-empty string"):
            qa.prepare(tiny_bert.tokenizer, texts["question"], texts["context"], qa.QaParams(), 64)


def test_max_question_len_does_not_change_the_windows(tiny_bert: Model) -> None:
    question = "Where will the committee meet again next week?"
    rows = [
        qa.prepare(tiny_bert.tokenizer, question, LONG_CONTEXT, qa.QaParams(max_question_len=length), 64).rows
        for length in (2, 64)
    ]
    assert [row.input_ids.tolist() for row in rows[0]] == [row.input_ids.tolist() for row in rows[1]]


def test_windows_hold_the_whole_question_and_cover_the_context(tiny_bert: Model) -> None:
    question = "Which river flows through London?"
    params = qa.QaParams(max_seq_len=32, doc_stride=8)
    features = qa.prepare(tiny_bert.tokenizer, question, LONG_CONTEXT, params, 64)
    whole = tiny_bert.tokenizer.encode(question, LONG_CONTEXT)[0]
    question_ids = [i for i, s in zip(whole.ids, whole.sequence_ids, strict=True) if s == 0]
    covered: set[int] = set()
    for encoding, candidates in zip(features.encodings, features.candidates, strict=True):
        assert [i for i, s in zip(encoding.ids, encoding.sequence_ids, strict=True) if s == 0] == question_ids
        context_positions = [p for p, s in enumerate(encoding.sequence_ids) if s == 1]
        assert candidates.tolist() == [p == 0 or p in context_positions for p in range(len(encoding))]
        covered.update(encoding.offsets[p] for p in context_positions)
    assert covered == {o for o, s in zip(whole.offsets, whole.sequence_ids, strict=True) if s == 1}


def test_answers_are_always_a_list_and_come_from_the_context(tiny_bert: Model) -> None:
    question, context = "Who met in Brussels?", LONG_CONTEXT
    _, one = tiny_bert.answer(question, context, qa.QaParams())
    assert isinstance(one, list) and len(one) == 1
    _, several = tiny_bert.answer(question, context, qa.QaParams(top_k=5, handle_impossible_answer=True))
    assert 1 < len(several) <= 5
    assert [a["score"] for a in several] == sorted((a["score"] for a in several), reverse=True)
    for answer in several:
        assert set(answer) == {"score", "start", "end", "answer"}
        assert answer["answer"] == context[answer["start"] : answer["end"]]


def test_postprocess_refuses_logits_that_do_not_fit_the_windows(tiny_bert: Model) -> None:
    params = qa.QaParams()
    features = qa.prepare(tiny_bert.tokenizer, "Who?", LONG_CONTEXT, params, 64)
    starts, ends = tiny_bert.logits(features)
    with pytest.raises(ValueError, match="expected logits for"):
        qa.postprocess("Who?", LONG_CONTEXT, features, starts[:-1], ends[:-1], params)
    with pytest.raises(ValueError, match="logits have shape"):
        qa.postprocess("Who?", LONG_CONTEXT, features, [s[:-1] for s in starts], ends, params)
