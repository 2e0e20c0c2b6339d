"""Question-answering pre- and post-processing against transformers 4.57's question-answering pipeline.

The pipeline is gone from transformers 5: its windows, answers and the logits its model gave for each window were
recorded once by tools/qa_golden.py (transformers 4.57.6 in its own virtualenv) in tests/fixtures/qa/. The golden
tests rebuild the checkpoints' tokenizers (the tiny ones) or read them (../shared): our windows must be the
pipeline's windows, and our post-processing of the very logits the pipeline saw must give its answers. The model is
not run there, so no CPU's arithmetic enters them. Whether our PyTorch model still gives those logits is a test of
its own (LOGIT_TOLERANCE).

What may differ between two CPUs on the same logits, and so is not compared (measured with numpy's
NPY_DISABLE_CPU_FEATURES on an AVX-512 machine: AVX-512 and AVX2 give bitwise equal softmax values, but
np.argpartition breaks ties differently; builds without AVX2 give exp values a few ulp apart):
- Which spans of equal score a window selects. Most spans score exactly 0 (end before start, too long, or an
  underflowed probability), so when a window has fewer positive spans than it selects, the spans of score 0 that
  come back depend on the CPU. Answers below NEGLIGIBLE (the smallest normal float32: below it a probability has
  underflowed into subnormals, which differ between exp implementations) are only checked to be spans of the
  context; the answers above it must be the pipeline's, the same number of them.
- The order of answers whose scores are within SCORE_TOLERANCE of each other (ties and few-ulp differences).
test_answers_do_not_depend_on_how_ties_are_broken replays the goldens with other tie orders; and
test_a_changed_postprocessing_fails_the_goldens shows that the comparison still catches real changes.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from transformers import AutoModelForQuestionAnswering

from bertcore.tasks import qa
from bertcore.tokenization import TextTokenizer

# with issue 31's families (XLNet's tokenizer pads on the left: the pipeline, and so we, put its context first)
ARCHS = (
    "bert",
    "roberta",
    "albert",
    "distilbert",
    "xlm-roberta",
    "camembert",
    "electra",
    "ernie",
    "mobilebert",
    "deberta-v2",
    "modernbert",
    "xlnet",
)
SCORE_TOLERANCE = 1e-4
NEGLIGIBLE = float(np.finfo(np.float32).tiny)  # scores below: underflowed probabilities, CPU-dependent
LOGIT_TOLERANCE = 1e-3  # ours (transformers 5) vs the pipeline's model (4.57), fp32 eager: measured <= 2.2e-5
FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "qa"
SHARED = Path(__file__).resolve().parents[3].parent / "shared"
REAL_NAME = "minilm-bert-squad"
REAL_CHECKPOINT = SHARED / "models" / REAL_NAME
REGENERATE = "regenerate the fixtures with tools/qa_golden.py (see its docstring)"
Answer = dict[str, Any]


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread() -> Iterator[None]:
    """Small models on a shared 2-core machine: extra threads only spin."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@dataclass(frozen=True)
class Golden:
    """A fixture: the pipeline's cases, and the start and end logits its model gave for each window (by hash)."""

    fixture: dict[str, Any]
    logits: dict[str, np.ndarray]  # window hash -> float32 array of shape (2, window length)

    @property
    def cases(self) -> list[dict[str, Any]]:
        return self.fixture["cases"]

    def texts(self, case: dict[str, Any]) -> tuple[str, str]:
        return self.fixture["questions"][case["question"]], self.fixture["contexts"][case["context"]]


@cache
def load_golden(name: str) -> Golden:
    fixture = json.loads((FIXTURES / f"{name}.json").read_text(encoding="utf-8"))
    assert fixture["generator"]["transformers"].startswith("4.57."), "the reference is transformers 4.57"
    with np.load(FIXTURES / f"{name}.logits.npz") as stored:
        windows, lengths, logits = stored["windows"], stored["lengths"], stored["logits"]
    assert logits.dtype == np.float32 and logits.shape == (2, lengths.sum()), f"{name}.logits.npz: " + REGENERATE
    ends = np.cumsum(lengths)
    by_window = {
        str(key): logits[:, end - length : end] for key, length, end in zip(windows, lengths, ends, strict=True)
    }
    return Golden(fixture, by_window)


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


@dataclass(frozen=True)
class Checkpoint:
    """What the server reads of a checkpoint to make windows: tokenizer.json and the model's token limit."""

    tokenizer: TextTokenizer
    max_length: int

    @classmethod
    def load(cls, directory: Path, golden: Golden) -> Checkpoint:
        check_fingerprint(directory, golden.fixture)
        config = json.loads((directory / "config.json").read_text(encoding="utf-8"))
        side = golden.fixture["checkpoint"].get("padding_side", "right")  # recorded where it is not "right"
        tokenizer = TextTokenizer.load(directory / "tokenizer.json", config.get("pad_token_id"), side)
        return cls(tokenizer, golden.fixture["checkpoint"]["model_max_length"])

    def prepare(self, question: str, context: str, params: qa.QaParams) -> qa.QaFeatures:
        return qa.prepare(self.tokenizer, question, context, params, self.max_length)


@dataclass
class TorchModel:
    """A checkpoint's PyTorch model (transformers 5, fp32, eager attention), run on our rows one at a time."""

    checkpoint: Checkpoint
    module: Any
    input_names: list[str]
    cache: dict[tuple[bytes, bytes], np.ndarray] = dataclasses.field(default_factory=dict)

    @classmethod
    def load(cls, directory: Path, golden: Golden) -> TorchModel:
        module = AutoModelForQuestionAnswering.from_pretrained(
            str(directory), attn_implementation="eager", dtype=torch.float32
        ).eval()
        return cls(Checkpoint.load(directory, golden), module, golden.fixture["checkpoint"]["model_input_names"])

    @property
    def tokenizer(self) -> TextTokenizer:
        return self.checkpoint.tokenizer

    def row_logits(self, row: Any) -> np.ndarray:
        """Start and end logits of one row, shape (2, length)."""
        key = (row.input_ids.tobytes(), row.token_type_ids.tobytes())
        if key not in self.cache:
            inputs = {
                "input_ids": torch.from_numpy(row.input_ids)[None],
                "token_type_ids": torch.from_numpy(row.token_type_ids)[None],
                "attention_mask": torch.ones((1, len(row)), dtype=torch.int64),
            }
            with torch.no_grad():
                output = self.module(**{name: inputs[name] for name in self.input_names})
            self.cache[key] = np.stack([output.start_logits[0].numpy(), output.end_logits[0].numpy()])
        return self.cache[key]

    def logits(self, features: qa.QaFeatures) -> tuple[list[np.ndarray], list[np.ndarray]]:
        both = [self.row_logits(row) for row in features.rows]
        return [logits[0] for logits in both], [logits[1] for logits in both]

    def answer(self, question: str, context: str, params: qa.QaParams) -> tuple[qa.QaFeatures, list[Answer]]:
        features = self.checkpoint.prepare(question, context, params)
        starts, ends = self.logits(features)
        return features, qa.postprocess(question, context, features, starts, ends, params)


# --- comparing answers ---------------------------------------------------------------------------------------------


def significant(answers: list[Answer]) -> list[Answer]:
    return [answer for answer in answers if answer["score"] >= NEGLIGIBLE]


def answers_differ(got: list[Answer], expected: list[Answer], context: str, top_k: int) -> str | None:
    """None when `got` are the pipeline's answers up to what a CPU may change (see the module docstring)."""
    if len(got) > top_k:
        return f"{len(got)} answers for top_k {top_k}"
    for answer in got:
        if not isinstance(answer["score"], float) or context[answer["start"] : answer["end"]] != answer["answer"]:
            return f"{answer} is not a span of the context with a float score"
    ours, theirs = significant(got), significant(expected)
    if len(ours) != len(theirs):
        return f"{len(ours)} answers score >= {NEGLIGIBLE:.3g}, the pipeline's {len(theirs)}"
    for position, (have, want) in enumerate(zip(ours, theirs, strict=True)):
        if abs(have["score"] - want["score"]) > SCORE_TOLERANCE:
            return f"answer {position} scores {have['score']}, the pipeline's {want['score']}"
    # The same answers, each with its own score: the order may differ only between answers of (nearly) equal score.
    unmatched = list(theirs)
    for have in ours:
        match = next((want for want in unmatched if same_answer(have, want)), None)
        if match is None:
            return f"{have} is not among the pipeline's answers"
        unmatched.remove(match)
    return None


def same_answer(have: Answer, want: Answer) -> bool:
    span = (have["answer"], have["start"], have["end"]) == (want["answer"], want["start"], want["end"])
    return span and abs(have["score"] - want["score"]) <= SCORE_TOLERANCE


def golden_logits(golden: Golden, features: qa.QaFeatures) -> tuple[list[np.ndarray], list[np.ndarray]]:
    stored = []
    for row in features.rows:
        key = window_hash(row.input_ids)
        if key not in golden.logits:
            pytest.fail(f"no stored logits for window {key}: " + REGENERATE)
        stored.append(golden.logits[key])
    return [logits[0] for logits in stored], [logits[1] for logits in stored]


def compare_case(checkpoint: Checkpoint, golden: Golden, case: dict[str, Any]) -> str | None:
    """None when our module does what the pipeline did for this case, on the pipeline's logits; else what differs."""
    question, context = golden.texts(case)
    label = f"question {case['question']} / context {case['context']} {case['params']}"
    if "error" in case:
        try:
            checkpoint.prepare(question, context, qa.QaParams(**case["params"]))
        except ValueError:
            return None
        return f"{label}: the pipeline raised ({case['error']}), ours did not"
    params = qa.QaParams(**case["params"])
    features = checkpoint.prepare(question, context, params)
    windows = [[len(row), window_hash(row.input_ids)] for row in features.rows]
    if windows != case["windows"]:
        return f"{label}: windows {windows} != the pipeline's {case['windows']}"
    starts, ends = golden_logits(golden, features)
    got = qa.postprocess(question, context, features, starts, ends, params)
    difference = answers_differ(got, case["answers"], context, params.top_k)
    return None if difference is None else f"{label}: {difference}\n  ours     {got}\n  pipeline {case['answers']}"


def golden_failures(checkpoint: Checkpoint, golden: Golden) -> list[str]:
    return [failure for case in golden.cases if (failure := compare_case(checkpoint, golden, case))]


def compare_golden(checkpoint: Checkpoint, golden: Golden) -> None:
    failures = golden_failures(checkpoint, golden)
    total = len(golden.cases)
    assert not failures, f"{len(failures)} of {total} cases differ from the pipeline:\n" + "\n".join(failures[:10])


# --- the golden cases ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny(tiny_checkpoint: Callable[..., Path]) -> Callable[[str], tuple[Checkpoint, Golden]]:
    """tiny(arch): the rebuilt tiny checkpoint's tokenizer (fingerprint checked) and its golden fixture."""

    def get(arch: str) -> tuple[Checkpoint, Golden]:
        golden = load_golden(f"tiny-{arch}")
        return Checkpoint.load(tiny_checkpoint(arch, "qa"), golden), golden

    return get


@pytest.mark.parametrize("arch", ARCHS)
def test_tiny_checkpoint_answers_match_the_pipeline(
    tiny: Callable[[str], tuple[Checkpoint, Golden]], arch: str
) -> None:
    checkpoint, golden = tiny(arch)
    cases = golden.cases
    # The fixture must exercise what it claims to: windows, several answers, the empty answer, errors.
    assert sum(len(case.get("windows", [])) > 2 for case in cases) >= 20
    assert sum(len(significant(case.get("answers", []))) >= 3 for case in cases) >= 20
    assert any(answer["answer"] == "" for case in cases for answer in significant(case.get("answers", [])))
    assert sum("error" in case for case in cases) >= 4
    compare_golden(checkpoint, golden)


@pytest.mark.parametrize("arch", ARCHS)
def test_tiny_checkpoint_logits_are_the_pipelines(tiny_checkpoint: Callable[..., Path], arch: str) -> None:
    golden = load_golden(f"tiny-{arch}")
    check_model_logits(TorchModel.load(tiny_checkpoint(arch, "qa"), golden), golden)


def check_model_logits(model: TorchModel, golden: Golden) -> None:
    """Our PyTorch model on our rows gives the logits the pipeline's model gave on its (equal) windows."""
    worst, compared = 0.0, set()
    for case in golden.cases:
        if "windows" not in case:
            continue
        features = model.checkpoint.prepare(*golden.texts(case), qa.QaParams(**case["params"]))
        for row in features.rows:
            key = window_hash(row.input_ids)
            if key not in compared:
                compared.add(key)
                worst = max(worst, float(np.abs(model.row_logits(row) - golden.logits[key]).max()))
    assert compared == set(golden.logits), "every stored window must be one of ours"
    assert worst <= LOGIT_TOLERANCE, f"logits differ from the pipeline's model by up to {worst:.3g}"


@pytest.mark.shared
@pytest.mark.skipif(not (REAL_CHECKPOINT / "config.json").is_file(), reason=f"{REAL_CHECKPOINT} is absent")
def test_real_checkpoint_answers_match_the_pipeline_on_squad() -> None:
    golden = load_golden(REAL_NAME)
    assert sum(case["params"] == {} for case in golden.cases) >= 150
    assert sum(len(case["windows"]) >= 3 for case in golden.cases if "windows" in case) >= 9
    compare_golden(Checkpoint.load(REAL_CHECKPOINT, golden), golden)


@pytest.mark.shared
@pytest.mark.skipif(not (REAL_CHECKPOINT / "config.json").is_file(), reason=f"{REAL_CHECKPOINT} is absent")
def test_real_checkpoint_logits_are_the_pipelines() -> None:
    golden = load_golden(REAL_NAME)
    check_model_logits(TorchModel.load(REAL_CHECKPOINT, golden), golden)


def test_a_changed_checkpoint_is_reported(tmp_path: Path) -> None:
    for name in ("model.safetensors", "tokenizer.json"):
        (tmp_path / name).write_text("changed")
    with pytest.raises(pytest.fail.Exception, match=r"model\.safetensors has sha256 .* the checkpoint changed"):
        check_fingerprint(tmp_path, load_golden("tiny-bert").fixture)


# --- what the comparison tolerates, and what it catches ---------------------------------------------------------------


def ties_first_by_position(flat: np.ndarray, count: int) -> np.ndarray:
    return np.argsort(-flat, kind="stable")[:count]


def ties_last_by_position(flat: np.ndarray, count: int) -> np.ndarray:
    return (len(flat) - 1 - np.argsort(-flat[::-1], kind="stable"))[:count]


@pytest.mark.parametrize("arch", ARCHS)
def test_answers_do_not_depend_on_how_ties_are_broken(
    tiny: Callable[[str], tuple[Checkpoint, Golden]], monkeypatch: pytest.MonkeyPatch, arch: str
) -> None:
    """Another CPU's numpy selects other spans among equal scores: the goldens must hold for any such choice."""
    checkpoint, golden = tiny(arch)
    answered = [case for case in golden.cases if "answers" in case]
    results = []
    for top_indices in (ties_first_by_position, ties_last_by_position):
        monkeypatch.setattr(qa, "_top_indices", top_indices)
        compare_golden(checkpoint, golden)
        results.append([answers(checkpoint, golden, case) for case in answered])
    if arch == "albert":  # the fixture that broke on AVX2: some of its windows select spans of score 0
        changed = sum(first != last for first, last in zip(*results, strict=True))
        assert changed > 0, "the two tie orders gave the same answers: this test would show nothing"


def answers(checkpoint: Checkpoint, golden: Golden, case: dict[str, Any]) -> list[Answer]:
    question, context = golden.texts(case)
    params = qa.QaParams(**case["params"])
    features = checkpoint.prepare(question, context, params)
    return qa.postprocess(question, context, features, *golden_logits(golden, features), params)


def answers_one_token_longer(patch: pytest.MonkeyPatch) -> None:
    best_spans = qa._best_spans

    def spans(p_start: np.ndarray, p_end: np.ndarray, candidates: np.ndarray, params: qa.QaParams) -> Any:
        return best_spans(
            p_start, p_end, candidates, dataclasses.replace(params, max_answer_len=params.max_answer_len + 1)
        )

    patch.setattr(qa, "_best_spans", spans)


def cls_not_a_candidate(patch: pytest.MonkeyPatch) -> None:
    candidate_tokens = qa._candidate_tokens
    patch.setattr(
        qa,
        "_candidate_tokens",
        lambda encoding, *every: candidate_tokens(encoding, *every) & (np.arange(len(encoding)) > 0),
    )


def token_offsets_instead_of_words(patch: pytest.MonkeyPatch) -> None:
    patch.setattr(qa._CharSpans, "_word_chars", lambda self, token: None)  # no token has a word: offsets always


def answers_merged_case_sensitively(patch: pytest.MonkeyPatch) -> None:
    def add(self: Any, score: float, start: int, end: int, context: str) -> None:
        for answer in self.answers:
            if answer.answer == context[start:end]:
                answer.score += score
                return
        self.answers.append(qa._Answer(score, start, end, context[start:end]))

    patch.setattr(qa._Collector, "add", add)


def softmax_over_the_question_too(patch: pytest.MonkeyPatch) -> None:
    patch.setattr(qa, "MASKED_LOGIT", np.float32(-5.0))


PERTURBATIONS = (
    answers_one_token_longer,
    cls_not_a_candidate,
    token_offsets_instead_of_words,
    answers_merged_case_sensitively,
    softmax_over_the_question_too,
)


@pytest.mark.parametrize("perturbation", PERTURBATIONS, ids=lambda perturbation: perturbation.__name__)
def test_a_changed_postprocessing_fails_the_goldens(
    tiny: Callable[[str], tuple[Checkpoint, Golden]],
    monkeypatch: pytest.MonkeyPatch,
    perturbation: Callable[[pytest.MonkeyPatch], None],
) -> None:
    perturbation(monkeypatch)
    failures = sum(len(golden_failures(*tiny(arch))) for arch in ARCHS[:4])  # four tokenizer kinds are enough
    assert failures > 0, f"the goldens did not notice: {perturbation.__name__}"


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
    # a capped max_seq_len is said as such: "max_seq_len (512)" named a value the client never sent
    with pytest.raises(
        ValueError, match=r"doc_stride \(600\) is larger than max_seq_len \(512: the model's limit, 1000 "
    ):
        qa.QaParams(max_seq_len=1000, doc_stride=600).window(512)
    assert params.candidates_per_window == 12
    assert qa.QaParams(top_k=3, align_to_words=False).candidates_per_window == 3


@pytest.fixture(scope="module")
def tiny_bert(tiny_checkpoint: Callable[..., Path]) -> TorchModel:
    return TorchModel.load(tiny_checkpoint("bert", "qa"), load_golden("tiny-bert"))


LONG_CONTEXT = " ".join(
    [
        "The committee will meet again in Geneva next week to review the budget and the new rules.",
        "Scientists in Tokyo and Berlin reported faster trains, cheaper batteries and cleaner water.",
        "Marie Curie was the first person to win Nobel prizes in two different sciences.",
    ]
)


def test_stride_and_question_length_are_checked_only_when_windows_are_needed(tiny_bert: TorchModel) -> None:
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


def test_max_question_len_does_not_change_the_windows(tiny_bert: TorchModel) -> None:
    question = "Where will the committee meet again next week?"
    rows = [
        qa.prepare(tiny_bert.tokenizer, question, LONG_CONTEXT, qa.QaParams(max_question_len=length), 64).rows
        for length in (2, 64)
    ]
    assert [row.input_ids.tolist() for row in rows[0]] == [row.input_ids.tolist() for row in rows[1]]


def test_windows_hold_the_whole_question_and_cover_the_context(tiny_bert: TorchModel) -> None:
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


def test_answers_are_always_a_list_and_come_from_the_context(tiny_bert: TorchModel) -> None:
    question, context = "Who met in Brussels?", LONG_CONTEXT
    _, one = tiny_bert.answer(question, context, qa.QaParams())
    assert isinstance(one, list) and len(one) == 1
    _, several = tiny_bert.answer(question, context, qa.QaParams(top_k=5, handle_impossible_answer=True))
    assert 1 < len(several) <= 5
    assert [a["score"] for a in several] == sorted((a["score"] for a in several), reverse=True)
    for answer in several:
        assert set(answer) == {"score", "start", "end", "answer"}
        assert answer["answer"] == context[answer["start"] : answer["end"]]


@pytest.mark.parametrize("context", ["   ", "\u00a0\u00a0\t"])
def test_a_context_of_whitespace_alone_answers_the_empty_span_as_the_pipeline(
    tiny_bert: TorchModel, context: str
) -> None:
    """No context token: the only candidate is the first token, its span's score zeroed after the null score is
    taken, as the pipeline does. Checked against transformers 4.57.6's pipeline on the real SQuAD checkpoint
    (2026-11-29; `[{"score": 0.0, "start": 0, "end": 0, "answer": ""}]` for top_k 1 and 3, the null answer's 1.0
    with handle_impossible_answer): what a server answers for such a request, not an error."""
    empty = {"score": 0.0, "start": 0, "end": 0, "answer": ""}
    for question in ("Who won?", "   "):
        assert tiny_bert.answer(question, context, qa.QaParams())[1] == [empty]
        assert tiny_bert.answer(question, context, qa.QaParams(top_k=3))[1] == [empty]
        impossible = tiny_bert.answer(question, context, qa.QaParams(handle_impossible_answer=True))[1]
        assert impossible == [{**empty, "score": pytest.approx(1.0)}]


def test_postprocess_refuses_logits_that_do_not_fit_the_windows(tiny_bert: TorchModel) -> None:
    params = qa.QaParams()
    features = qa.prepare(tiny_bert.tokenizer, "Who?", LONG_CONTEXT, params, 64)
    starts, ends = tiny_bert.logits(features)
    with pytest.raises(ValueError, match="expected logits for"):
        qa.postprocess("Who?", LONG_CONTEXT, features, starts[:-1], ends[:-1], params)
    with pytest.raises(ValueError, match="logits have shape"):
        qa.postprocess("Who?", LONG_CONTEXT, features, [s[:-1] for s in starts], ends, params)


# --- what a request costs, known before its windows are built ---------------------------------------------------------


@pytest.mark.parametrize("arch", ARCHS)
def test_plan_counts_the_windows_the_tokenizer_makes(
    tiny: Callable[[str], tuple[Checkpoint, Golden]], arch: str
) -> None:
    """The count that admits or refuses a request is exactly the number of windows prepare then builds, for every
    tokenizer family, over the golden texts and window sizes from the smallest that can hold them to the model's."""
    checkpoint, golden = tiny(arch)
    pairs = {golden.texts(case) for case in golden.cases if "answers" in case}
    pairs.add(("Who met in Brussels?", LONG_CONTEXT * 3))
    rng = np.random.default_rng(7)
    counted = several = 0
    for question, context in sorted(pairs):
        for max_seq_len in sorted({*rng.integers(8, 65, size=4).tolist(), 64}):
            for doc_stride in sorted({0, 1, int(rng.integers(0, max_seq_len)), max_seq_len // 2}):
                params = qa.QaParams(max_seq_len=max_seq_len, doc_stride=doc_stride)
                try:
                    plan = qa.plan(checkpoint.tokenizer, question, context, params, checkpoint.max_length)
                except qa.QaInputError as exc:
                    assert exc.field in {"doc_stride", "max_seq_len"}
                    continue
                features = qa.prepare(checkpoint.tokenizer, question, context, params, checkpoint.max_length, plan)
                assert plan.windows == len(features.rows), (question, context, max_seq_len, doc_stride)
                assert plan.windows_at(max_seq_len, doc_stride) == plan.windows
                assert (plan.max_seq_len, plan.doc_stride) == (features.max_seq_len, features.doc_stride)
                # Built from the plan or from scratch: the same windows.
                again = checkpoint.prepare(question, context, params)
                assert [r.input_ids.tolist() for r in again.rows] == [r.input_ids.tolist() for r in features.rows]
                counted += 1
                several += plan.windows > 2
    assert counted > 200 and several > 50, (counted, several)


@pytest.mark.parametrize("arch", ARCHS)
def test_windows_built_first_are_planned_as_counted(
    tiny: Callable[[str], tuple[Checkpoint, Golden]], arch: str
) -> None:
    """A long context's windows built straight away (one encoding, `plan_from_windows`) give the plan that counting
    them first gives (`plan`: an untruncated encoding, then the windows), and the very windows, for every tokenizer
    family (XLNet's context first), at window sizes and strides from the smallest that can advance to the model's."""
    checkpoint, golden = tiny(arch)
    tokenizer = checkpoint.tokenizer
    rng = np.random.default_rng(11)
    words = (LONG_CONTEXT + " Zoë's café, naïve façade: 東京 in 2024 (¿qué?) — «ok» x² ").split()
    questions = [*sorted({golden.texts(case)[0] for case in golden.cases if "answers" in case})[:3], "Who met?"]
    built = several = 0
    for case in range(40):
        context = " ".join(rng.choice(words, size=int(rng.integers(30, 400))).tolist())
        question = questions[case % len(questions)]
        for max_seq_len in (None, 24, 40, int(rng.integers(16, 65))):
            for doc_stride in (None, 0, 1, 4, 12):
                try:
                    params = qa.QaParams(max_seq_len=max_seq_len, doc_stride=doc_stride)
                    counted = qa.plan(tokenizer, question, context, params, checkpoint.max_length)
                except qa.QaInputError:
                    continue
                first = qa.plan_from_windows(tokenizer, question, context, params, checkpoint.max_length)
                if first is None:
                    continue
                assert first.encodings is not None
                assert dataclasses.replace(first, encodings=None) == dataclasses.replace(counted, encodings=None)
                windows = qa.prepare(tokenizer, question, context, params, checkpoint.max_length, counted).encodings
                for mine, theirs in zip(first.encodings, windows, strict=True):
                    for attribute in ("ids", "type_ids", "offsets", "sequence_ids", "word_ids", "special_tokens_mask"):
                        assert getattr(mine, attribute) == getattr(theirs, attribute), (arch, attribute)
                built += 1
                several += first.windows > 2
    assert built > 150 and several > 100, (built, several)


def test_windows_are_built_first_only_where_that_is_cheap(
    tiny_bert: TorchModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    tokenizer, question = tiny_bert.tokenizer, "Who met in Brussels?"  # 5 tokens, 8 with the special tokens
    pairs: list[int | None] = []  # max_length of each encoding of a question with its context
    encode = tokenizer.encode_pair_windows

    def recording(first: str, second: str, max_length: int | None, stride: int = 0) -> Any:
        pairs.append(max_length)
        return encode(first, second, max_length, stride)

    monkeypatch.setattr(tokenizer, "encode_pair_windows", recording)
    long_context = LONG_CONTEXT * 4
    (features,) = qa.prepare_all(tokenizer, [(question, long_context)], qa.QaParams(), 64, 1536)
    assert len(features.rows) > 4 and pairs == [64]  # encoded once, into its windows
    pairs.clear()
    qa.prepare_all(tokenizer, [(question, "Peter met Maria in Brussels.")], qa.QaParams(), 64, 1536)
    assert pairs == [None]  # a short context: its one untruncated encoding is its window
    # Windows advancing 8 of 32 tokens (room 24, stride 16) are built first; advancing 7 of 32, counted first.
    assert qa.plan_from_windows(tokenizer, question, long_context, qa.QaParams(max_seq_len=32, doc_stride=16), 64)
    pairs.clear()
    slow = qa.QaParams(max_seq_len=32, doc_stride=17)
    assert qa.plan_from_windows(tokenizer, question, long_context, slow, 64) is None
    assert pairs == []  # nothing built
    # A request whose characters, a token each, would pass max_qa_windows is counted first, then built.
    windows = len(features.rows)
    pairs.clear()
    qa.prepare_all(tokenizer, [(question, long_context)], qa.QaParams(), 64, windows)
    assert pairs == [None, 64]


def test_errors_name_the_field_to_change(tiny_bert: TorchModel) -> None:
    tokenizer, question = tiny_bert.tokenizer, "Who met in Brussels?"  # 8 tokens with the special tokens

    def field(question: str, context: str, **params: Any) -> str:
        with pytest.raises(qa.QaInputError) as caught:
            qa.plan(tokenizer, question, context, qa.QaParams(**params), 64)
        return caught.value.field

    assert field("", LONG_CONTEXT) == "question"
    assert field(question, "") == "context"
    assert field(question, LONG_CONTEXT, max_seq_len=8) == "max_seq_len"  # no room left for the context
    assert field(question, LONG_CONTEXT, max_seq_len=8, doc_stride=0) == "max_seq_len"
    assert field(question, LONG_CONTEXT, max_seq_len=48, doc_stride=40) == "doc_stride"  # 40 of 40 tokens of room
    assert field(question, LONG_CONTEXT, max_seq_len=16) == "max_seq_len"  # room 8, the default stride 8
    assert field(question * 8, LONG_CONTEXT) == "question"  # no parameter given: the question fills the window
    with pytest.raises(qa.QaInputError) as caught:
        qa.QaParams(doc_stride=128).window(64)
    # a capped max_seq_len is said as such: "max_seq_len (512)" named a value the client never sent
    with pytest.raises(
        ValueError, match=r"doc_stride \(600\) is larger than max_seq_len \(512: the model's limit, 1000 "
    ):
        qa.QaParams(max_seq_len=1000, doc_stride=600).window(512)
    assert caught.value.field == "doc_stride"
    with pytest.raises(qa.QaInputError) as caught:
        qa.QaParams(top_k=0)
    assert caught.value.field == "top_k"


def test_windows_at_other_parameters_is_arithmetic_on_the_token_counts(tiny_bert: TorchModel) -> None:
    plan = qa.plan(tiny_bert.tokenizer, "Who met in Brussels?", LONG_CONTEXT, qa.QaParams(), 64)
    assert plan.fixed == 8 and plan.context_tokens > 56 and plan.encodings is None
    room = 64 - plan.fixed
    assert plan.windows == 1 + -(-(plan.context_tokens - room) // (room - 32))
    assert plan.windows_at(9, 0) == plan.context_tokens  # one context token a window
    assert plan.windows_at(9, 1) is None  # the stride fills the room: the context cannot advance
    assert plan.windows_at(plan.fixed + plan.context_tokens, 5) == 1  # it all fits: no stride needed
    short = qa.plan(tiny_bert.tokenizer, "Who met in Brussels?", "Peter met Maria.", qa.QaParams(), 64)
    assert short.windows == 1 and short.encodings is not None


def test_answers_merge_across_many_windows_as_across_few(tiny_bert: TorchModel) -> None:
    """A context in thousands of one-token windows (what made the merge quadratic): the dict merge gives the
    answers a scan over every answer so far gives, case-folded texts adding their scores."""
    question, context = "Who met in Brussels?", " ".join([LONG_CONTEXT, LONG_CONTEXT.upper()] * 12)
    params = qa.QaParams(max_seq_len=9, doc_stride=0, top_k=50, handle_impossible_answer=True)
    features = qa.prepare(tiny_bert.tokenizer, question, context, params, 64)
    assert len(features.rows) > 1000
    rng = np.random.default_rng(3)
    starts = [rng.standard_normal(len(row)).astype(np.float32) for row in features.rows]
    ends = [rng.standard_normal(len(row)).astype(np.float32) for row in features.rows]
    got = qa.postprocess(question, context, features, starts, ends, params)
    expected: list[dict[str, Any]] = []  # the merge as the pipeline wrote it: a scan of the answers so far
    spans = SpanRecorder()
    for index in range(len(features.rows)):
        qa._collect_window(spans, context, features, index, starts[index], ends[index], params)  # type: ignore[arg-type]
    for score, start, end in spans.spans:
        same = next((a for a in expected if a["answer"].lower() == context[start:end].lower()), None)
        if same is None:
            expected.append({"score": score, "start": start, "end": end, "answer": context[start:end]})
        else:
            same["score"] += score
    expected.append({"score": spans.null_score, "start": 0, "end": 0, "answer": ""})
    expected = sorted(expected, key=lambda answer: answer["score"], reverse=True)[: params.top_k]
    assert got == expected
    texts = {context[start:end].lower() for _, start, end in spans.spans}
    # Thousands of distinct answers to merge into (a scan of them per span made it quadratic), most spans merged.
    assert len(texts) > 1000 and len(spans.spans) > 3 * len(texts) and len(got) == 50


@dataclass
class SpanRecorder:
    """Stands in for qa._Collector: every span of every window, unmerged."""

    spans: list[tuple[float, int, int]] = dataclasses.field(default_factory=list)
    null_score: float = 1_000_000.0

    def add(self, score: float, start: int, end: int, context: str) -> None:
        self.spans.append((score, start, end))


def test_a_request_past_the_window_limit_is_refused_before_any_window_is_built(
    tiny_bert: TorchModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    tokenizer, question, long_context = tiny_bert.tokenizer, "Who met in Brussels?", LONG_CONTEXT * 30
    windowed: list[int] = []  # max_length of each encode call that builds windows
    encode = tokenizer.encode_pair_windows

    def recording(first: str, second: str, max_length: int | None, stride: int = 0) -> Any:
        if max_length is not None:
            windowed.append(max_length)
        return encode(first, second, max_length, stride)

    monkeypatch.setattr(tokenizer, "encode_pair_windows", recording)

    def refused(pairs: list[tuple[str, str]], limit: int, **params: Any) -> qa.QaInputError:
        with pytest.raises(qa.QaInputError) as caught:
            qa.prepare_all(tokenizer, pairs, qa.QaParams(**params), 64, limit)
        return caught.value

    # The request: question "q" (4 tokens with the special tokens) in windows of 9 tokens, the default
    # stride 4: one context token more per window, thousands of windows; the default windows would fit.
    error = refused([("q", long_context)] * 64, 1024, max_seq_len=9)
    assert error.field == "max_seq_len" and "max_qa_windows" in str(error) and "raise max_seq_len" in str(error)
    assert windowed == []  # refused from the counts: not one window built
    error = refused([(question, long_context)], 1024, max_seq_len=32, doc_stride=23)  # room 24, advancing 1
    assert error.field == "doc_stride"
    # At the default windows too many inputs: the inputs are what to change.
    default_windows = qa.plan(tokenizer, question, long_context, qa.QaParams(), 64).windows
    assert default_windows > 20
    error = refused([(question, long_context)] * 64, 20 * default_windows)
    assert error.field == "inputs" and f"at least {21 * default_windows} windows" in str(error)
    assert windowed == []
    # Within the limit: the windows each pair's own prepare builds.
    pairs = [(question, long_context), (question, "Peter met Maria in Brussels.")]
    features = qa.prepare_all(tokenizer, pairs, qa.QaParams(), 64, default_windows + 1)
    assert [len(f.rows) for f in features] == [default_windows, 1]
    assert windowed == [64]  # the long context's windows, built once; the short pair fits in its one encoding
    assert refused(pairs, default_windows).field == "inputs"
    # Errors of one input name it.
    assert refused([pairs[1], (question, "")], 1024).field == "inputs.1.context"
    assert refused([pairs[1], (question * 8, long_context)], 1024).field == "inputs.1.question"


def test_a_context_may_not_need_more_windows_than_the_longest_allowed_at_the_default_windows(
    tiny_bert: TorchModel,
) -> None:
    tokenizer, long_context = tiny_bert.tokenizer, LONG_CONTEXT * 30
    tokens = qa.plan(tokenizer, "q", long_context, qa.QaParams(), 64).context_tokens

    def refused(max_context_tokens: int, **params: Any) -> qa.QaInputError:
        with pytest.raises(qa.QaInputError) as caught:
            qa.prepare_all(tokenizer, [("q", long_context)], qa.QaParams(**params), 64, 10_000, max_context_tokens)
        return caught.value

    # "q" takes 4 tokens with the special tokens: default windows of 64 advance 28 tokens, windows of 9 one.
    bound = 1 + -(-(tokens - 60) // 28)  # what a context of `tokens` tokens needs at the default windows
    error = refused(tokens, max_seq_len=9)
    assert error.field == "max_seq_len" and f"a context may need at most {bound}," in str(error)
    assert refused(tokens, max_seq_len=64, doc_stride=59).field == "doc_stride"  # the default stride 32 fits
    assert refused(tokens, max_seq_len=32, doc_stride=27).field == "max_seq_len"  # 64 with stride 27 fits
    # At the default windows a context longer (in tokens) than the longest allowed is what to change.
    assert refused(tokens // 2).field == "inputs.0.context"
    # Within the bound: served, in more windows than the default ones (windows of 32 advance 12 tokens).
    (features,) = qa.prepare_all(tokenizer, [("q", long_context)], qa.QaParams(max_seq_len=32), 64, 10_000, 4 * tokens)
    assert len(features.rows) == 1 + -(-(tokens - 28) // 12) > bound


# --- the band of spans: the matrix's best spans, scoring only those that can score ------------------------------------


def spans_of_the_whole_matrix(
    p_start: np.ndarray, p_end: np.ndarray, candidates: np.ndarray, params: qa.QaParams
) -> list[tuple[int, int, float]]:
    """The pipeline's way: every (start, end) scored, those outside 0 <= end - start < max_answer_len zeroed."""
    length = len(p_start)
    scores = np.triu(np.tril(np.outer(p_start, p_end), params.max_answer_len - 1))
    flat = scores.ravel()
    allowed = candidates.copy()
    allowed[0] = True
    spans = []
    for flat_index in qa._top_indices(flat, params.candidates_per_window):
        start, end = divmod(int(flat_index), length)
        if allowed[start] and allowed[end]:
            spans.append((start, end, float(flat[flat_index])))
    return spans


def window_probabilities(rng: np.random.Generator, length: int, question: int) -> tuple[np.ndarray, ...]:
    """A window's start and end probabilities as postprocess makes them: the question's tokens masked, then 0 zeroed."""
    candidates = np.ones(length, dtype=bool)
    candidates[1 : 1 + question] = False
    start = qa._masked_softmax(rng.normal(0, 4, length).astype(np.float32), candidates)
    end = qa._masked_softmax(rng.normal(0, 4, length).astype(np.float32), candidates)
    start[0] = end[0] = 0.0
    return start, end, candidates


@pytest.mark.parametrize("align_to_words", [True, False])
@pytest.mark.parametrize("max_answer_len", [1, 2, 15, 30, 1_000])
@pytest.mark.parametrize("top_k", [1, 3, 20])
def test_the_band_finds_the_spans_the_whole_matrix_finds(top_k: int, max_answer_len: int, align_to_words: bool) -> None:
    rng = np.random.default_rng(top_k * 10_007 + max_answer_len * 31 + align_to_words)
    params = qa.QaParams(top_k=top_k, max_answer_len=max_answer_len, align_to_words=align_to_words)
    decided = 0
    for length in (1, 2, 3, 5, 8, 17, 64, 200, 384):
        for question in {0, min(length - 1, 3), length // 2, length - 1}:
            p_start, p_end, candidates = window_probabilities(rng, length, question)
            decided += qa._top_in_band(p_start, p_end, max_answer_len, params.candidates_per_window) is not None
            want = spans_of_the_whole_matrix(p_start, p_end, candidates, params)
            assert qa._best_spans(p_start, p_end, candidates, params) == want, (length, question)
    assert decided > 0, "the band decided no window: this test compares the matrix with itself"


@pytest.mark.parametrize("whole_band_spans", [0, qa.WHOLE_BAND_SPANS], ids=["narrowed", "whole"])
def test_the_best_of_the_band_are_found_without_sorting_the_band(
    monkeypatch: pytest.MonkeyPatch, whole_band_spans: int
) -> None:
    """`_best_of_band` selects over the whole band, or (a band over WHOLE_BAND_SPANS) sorts only the scores above a
    floor taken from the likeliest starts' rows: either way its picks are the whole band's best, best first, also
    where the best spans do not start at the likeliest starts (a flat start distribution, one sharp end) and where
    most of the band scores 0."""
    monkeypatch.setattr(qa, "WHOLE_BAND_SPANS", whole_band_spans)  # 0: every band here is narrowed first
    rng = np.random.default_rng(5)
    width, count = 15, 13
    checked = 0
    for case in range(600):
        length = int(rng.integers(count + 1, 400))
        shape = case % 3
        p_start = rng.dirichlet(np.full(length, 0.3 if shape == 0 else 50.0)).astype(np.float32)
        p_end = rng.dirichlet(np.full(length, 0.3)).astype(np.float32)
        if shape == 1:  # one sharp end, starts nearly even: the best spans' starts are anywhere before it
            p_end = np.full(length, 1e-6, dtype=np.float32)
            p_end[int(rng.integers(0, length))] = 0.9
        if shape == 2:  # few tokens that can score at all
            p_end[rng.random(length) < 0.9] = 0.0
        padded = np.concatenate([p_end, np.zeros(width - 1, dtype=np.float32)])
        rows = p_start[:, None] * np.lib.stride_tricks.sliding_window_view(padded, width)
        band = rows.ravel()
        ranked = np.argsort(-band, kind="stable")
        want = ranked[:count]
        got = qa._best_of_band(p_start, rows, count)
        assert band[got].tolist() == band[want].tolist(), case  # the same scores, best first
        if len(set(band[ranked[: count + 1]].tolist())) == count + 1:
            assert got.tolist() == want.tolist(), case  # distinct, and above the next: the very spans
            checked += 1
    assert checked > 300, checked


def test_ties_and_windows_with_few_scoring_spans_go_through_the_whole_matrix() -> None:
    """Where equal scores meet at the cut, or fewer spans than are taken score above 0, the choice among equal
    scores is numpy's (`_top_indices`, as the pipeline's): the band leaves those windows to the matrix."""
    params = qa.QaParams(top_k=1)  # 12 spans taken per window
    even = np.full(32, 1 / 32, dtype=np.float32)  # every span in the band scores the same
    candidates = np.ones(32, dtype=bool)
    assert qa._top_in_band(even, even, params.max_answer_len, params.candidates_per_window) is None
    assert qa._best_spans(even, even, candidates, params) == spans_of_the_whole_matrix(even, even, candidates, params)
    # Two tokens that can score: 3 spans above 0 (and 9 of score 0, chosen as numpy chooses among them).
    few = np.zeros(32, dtype=np.float32)
    few[[5, 6]] = [0.7, 0.3]
    assert qa._top_in_band(few, few, params.max_answer_len, params.candidates_per_window) is None
    spans = qa._best_spans(few, few, candidates, params)
    assert spans == spans_of_the_whole_matrix(few, few, candidates, params)
    assert [(start, end) for start, end, score in spans if score > 0] == [(5, 5), (5, 6), (6, 6)]
    # A window of distinct scores is decided by the band alone.
    rng = np.random.default_rng(7)
    p_start, p_end, candidates = window_probabilities(rng, 200, 10)
    found = qa._top_in_band(p_start, p_end, params.max_answer_len, params.candidates_per_window)
    assert found is not None and len(found[1]) == params.candidates_per_window  # (starts, ends), scores
