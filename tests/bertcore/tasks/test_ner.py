"""NER pre- and post-processing against transformers' token-classification pipeline on the same checkpoints.

Our logits come from the PyTorch model on our rows, and the pipeline post-processes those very logits: its own
tokenization and windows (checked to be ours), with the model call left out. The tests thus check the
tokenization, windows, aggregation and entity text only (labels, words and offsets equal, scores within 1e-4), and
no label can flip between the two sides on a near-tie: two computations of the logits (the pipeline pads its last
window, and loads its model with another attention implementation) differ by float rounding that depends on the
CPU. That the pipeline's model gives our logits is a test of its own (LOGIT_TOLERANCE).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from transformers import AutoModelForTokenClassification, AutoTokenizer, pipeline

from bertcore.tasks import ner
from bertcore.tokenization import TextTokenizer

# The pipeline warns on every word strategy call for tokenizers without continuation marks (RoBERTa, ALBERT).
pytestmark = pytest.mark.filterwarnings("ignore:Tokenizer does not support real words:UserWarning")

ARCHS = ("bert", "roberta", "albert", "distilbert")
MAX_LENGTH = 64  # the tiny checkpoints' window
SCORE_TOLERANCE = 1e-4
LOGIT_TOLERANCE = 1e-3  # the pipeline's model on its (padded) windows vs ours on our rows
SHARED = Path(__file__).resolve().parents[3].parent / "shared"
REAL_CHECKPOINT = SHARED / "models" / "minilm-bert-conll03"
CONLL_TEST = SHARED / "data" / "conll2003" / "test.txt"

TEXTS = (
    "My name is Wolfgang and I live in Berlin.",
    "Angela Merkel met Emmanuel Macron in Paris on 14 June 2019, then flew to New York.",
    "São Paulo, Zürich and Kraków are cities; Ñandú is not.",
    "Order #4521 costs $1,299.99 (tax incl.) - call 555-0172!",
    "Multiple   spaces\tand\ttabs\nand new lines between   Tokyo and   Geneva.",
    "   leading and trailing spaces around Geneva   ",
    "Unbelievable: the antidisestablishmentarianism board met in Reykjavík.",
    "hello [MASK] <mask> emoji 😀 and CJK 東京 text",
    "",
    "   ",
    ".",
)
LONG_TEXT = " ".join(
    [
        "The committee will meet again in Geneva next week to review the budget and the new rules.",
        "Scientists in Tokyo and Berlin reported faster trains, cheaper batteries and cleaner water.",
        "Maria Gonzalez flew from São Paulo to Zürich with Wolfgang Amadeus, then drove to Kraków.",
        "I loved every minute of it; the music, the actors and the city all shine.",
        "What a dull, clumsy and forgettable waste of two hours, said John Smith in New York City.",
        "Unbelievable: 1,299 delegates reconvened in Reykjavík   on 14 June 2019.",
    ]
)


@dataclass
class Checkpoint:
    tokenizer: TextTokenizer
    model: Any  # eager PyTorch token classification model
    labels: list[str]
    uses_token_type_ids: bool
    reference: Any  # transformers token-classification pipeline

    def logits(self, features: ner.NerFeatures) -> list[np.ndarray]:
        """The PyTorch model's logits for each of our rows, one row at a time."""
        outputs = []
        with torch.no_grad():
            for row in features.rows:
                # The tiny WordPiece vocabularies number "##s" and "##ly" past vocab_size (duplicate pieces in
                # tests/tiny_models.py): texts must avoid those pieces, or the embedding lookup fails.
                assert row.input_ids.max() < self.model.config.vocab_size, "a token id past the model's vocabulary"
                inputs = {"input_ids": torch.from_numpy(row.input_ids)[None]}
                inputs["attention_mask"] = torch.ones_like(inputs["input_ids"])
                if self.uses_token_type_ids:
                    inputs["token_type_ids"] = torch.from_numpy(row.token_type_ids)[None]
                outputs.append(self.model(**inputs).logits[0].numpy())
        return outputs

    def entities(
        self, text: str, strategy: str, stride: int, max_length: int = MAX_LENGTH, **options: Any
    ) -> list[dict[str, Any]]:
        features = ner.prepare(self.tokenizer, text, max_length, stride)
        return ner.postprocess(text, features, self.logits(features), self.labels, strategy, **options)

    def compare(
        self, text: str, strategy: str, stride: int | None, max_length: int = MAX_LENGTH, **options: Any
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """(the pipeline's entities, ours) from the same logits; stride None: the pipeline's one window, no stride."""
        features = ner.prepare(self.tokenizer, text, max_length, 8 if stride is None else stride)
        logits = self.logits(features)
        got = ner.postprocess(text, features, logits, self.labels, strategy, **options)
        pipeline_options = {"aggregation_strategy": strategy, **options}
        if stride is not None:
            pipeline_options["stride"] = stride
        if "ignore_labels" in options:
            pipeline_options["ignore_labels"] = list(options["ignore_labels"])
        return pipeline_entities(self.reference, text, features.rows, logits, **pipeline_options), got


def pipeline_chunks(reference: Any, text: str, rows: list[Any], **options: Any) -> tuple[list[dict[str, Any]], dict]:
    """The pipeline's windows for `text` (each checked to hold our row's ids) and its post-processing options."""
    preprocess_options, _, postprocess_options = reference._sanitize_parameters(**options)
    chunks = list(reference.preprocess(text, **preprocess_options))
    for chunk, row in zip(chunks, rows, strict=False):
        length = int(chunk["attention_mask"][0].sum())  # the pipeline pads the last window; we do not
        assert chunk["input_ids"][0, :length].tolist() == row.input_ids.tolist(), "the pipeline's window differs"
    return chunks, postprocess_options


def pipeline_entities(reference: Any, text: str, rows: list[Any], logits: list[np.ndarray], **options: Any) -> Any:
    """The pipeline's entities with our logits in place of its model's: its own pre- and post-processing."""
    chunks, postprocess_options = pipeline_chunks(reference, text, rows, **options)
    if len(chunks) == 1:  # without stride the pipeline tags its first window only
        rows, logits = rows[:1], logits[:1]
    assert len(chunks) == len(rows), f"the pipeline made {len(chunks)} windows, we made {len(rows)}"
    outputs = []
    for chunk, row_logits in zip(chunks, logits, strict=True):
        padded = np.zeros((chunk["input_ids"].shape[1], row_logits.shape[1]), dtype=np.float32)
        padded[: len(row_logits)] = row_logits
        outputs.append({**chunk, "logits": torch.from_numpy(padded)[None]})  # what the pipeline's _forward returns
    return reference.postprocess(outputs, **postprocess_options)


def check_pipeline_logits(checkpoint: Checkpoint, text: str, stride: int, max_length: int = MAX_LENGTH) -> float:
    """The pipeline's model on its windows gives our logits on our rows (padding aside); returns the largest gap."""
    features = ner.prepare(checkpoint.tokenizer, text, max_length, stride)
    chunks, _ = pipeline_chunks(checkpoint.reference, text, features.rows, stride=stride)
    assert len(chunks) == len(features.rows)
    worst = 0.0
    for chunk, ours in zip(chunks, checkpoint.logits(features), strict=True):
        theirs = checkpoint.reference.forward(chunk)["logits"][0, : len(ours)].float().numpy()
        worst = max(worst, float(np.abs(theirs - ours).max()))
    assert worst <= LOGIT_TOLERANCE, f"the pipeline's model differs from ours by up to {worst:.3g} on {text[:40]!r}"
    return worst


def load_checkpoint(directory: Path, model: Any | None = None, reference: Any | None = None) -> Checkpoint:
    if model is None:
        model = AutoModelForTokenClassification.from_pretrained(str(directory), attn_implementation="eager").eval()
    if reference is None:
        reference = pipeline("token-classification", model=str(directory))
    return Checkpoint(
        tokenizer=TextTokenizer.load(directory / "tokenizer.json", model.config.pad_token_id),
        model=model,
        labels=[model.config.id2label[i] for i in range(model.config.num_labels)],
        uses_token_type_ids="token_type_ids" in AutoTokenizer.from_pretrained(str(directory)).model_input_names,
        reference=reference,
    )


@pytest.fixture(scope="module")
def checkpoint(tiny_checkpoint: Callable[..., Path]) -> Callable[[str], Checkpoint]:
    """checkpoint(arch): the tiny NER checkpoint with its model, tokenizer and pipeline, loaded once per module."""
    cache: dict[str, Checkpoint] = {}

    def get(arch: str) -> Checkpoint:
        if arch not in cache:
            cache[arch] = load_checkpoint(tiny_checkpoint(arch, "ner"))
        return cache[arch]

    return get


def assert_same_entities(expected: list[dict[str, Any]], got: list[dict[str, Any]], context: str) -> None:
    assert len(got) == len(expected), f"{context}: {len(got)} entities, the pipeline has {len(expected)}"
    for number, (want, have) in enumerate(zip(expected, got, strict=True)):
        assert set(have) == set(want), f"{context} #{number}: keys {sorted(have)} != {sorted(want)}"
        exact = {key: value for key, value in want.items() if key != "score"}
        assert {key: have[key] for key in exact} == exact, f"{context} #{number}"
        assert isinstance(have["score"], float)
        assert abs(have["score"] - float(want["score"])) <= SCORE_TOLERANCE, f"{context} #{number}: score"


def labelled(entities: list[dict[str, Any]]) -> int:
    return sum(entity.get("entity", entity.get("entity_group")) != "O" for entity in entities)


@pytest.mark.parametrize("strategy", ner.AGGREGATION_STRATEGIES)
@pytest.mark.parametrize("arch", ARCHS)
def test_short_texts_match_the_pipeline(checkpoint: Callable[[str], Checkpoint], arch: str, strategy: str) -> None:
    model = checkpoint(arch)
    compared = 0
    for text in TEXTS:
        assert model.tokenizer.count_tokens(text) <= MAX_LENGTH, "the pipeline without stride would truncate"
        expected, got = model.compare(text, strategy, stride=None)
        assert_same_entities(expected, got, f"{arch}/{strategy} {text!r}")
        for entity in got:
            assert text[entity["start"] : entity["end"]] or entity["start"] == entity["end"]
        compared += labelled(got)
    assert model.entities("", strategy, stride=8) == []
    assert compared > 0, "no labelled entities were compared: the test would pass vacuously"


@pytest.mark.parametrize("stride", [0, 8, None])  # None: the default stride
@pytest.mark.parametrize("strategy", ["simple", "first", "average", "max"])
@pytest.mark.parametrize("arch", ARCHS)
def test_long_text_windows_match_the_pipeline_with_stride(
    checkpoint: Callable[[str], Checkpoint], arch: str, strategy: str, stride: int | None
) -> None:
    model = checkpoint(arch)
    stride = ner.default_stride(model.tokenizer, MAX_LENGTH) if stride is None else stride
    features = ner.prepare(model.tokenizer, LONG_TEXT, MAX_LENGTH, stride)
    assert len(features.rows) >= 3 and all(len(row) <= MAX_LENGTH for row in features.rows)
    expected, got = model.compare(LONG_TEXT, strategy, stride)
    assert_same_entities(expected, got, f"{arch}/{strategy} stride {stride}")
    assert labelled(got) > 0
    assert max(entity["end"] for entity in got) > len(LONG_TEXT) // 2, "the end of the text was not covered"


def test_words_join_with_one_space_and_find_the_words_a_span_reaches() -> None:
    words = ner.Words.join(["S.", "Fleming", "", "New York", "."])
    assert words.text == "S. Fleming  New York ."
    assert (words.starts, words.ends) == ([0, 3, 11, 12, 21], [2, 10, 11, 20, 22])
    assert words.span(0, 1) == (0, 0)  # "S"
    assert words.span(1, 2) == (0, 0)  # "." of "S."
    assert words.span(2, 10) == (1, 1)  # " Fleming": a space before a word counts for that word
    assert words.span(0, 10) == (0, 1)
    assert words.span(16, 20) == (3, 3)  # "York", inside a word that holds a space
    assert words.span(12, 22) == (3, 4)
    assert words.span(22, 22) == (4, 4)  # an empty span at the end


@pytest.mark.parametrize("strategy", ["none", "simple", "first", "average", "max"])
@pytest.mark.parametrize("arch", ARCHS)
def test_words_over_several_windows_stay_whole(
    checkpoint: Callable[[str], Checkpoint], arch: str, strategy: str
) -> None:
    """Given as words, a text of several windows: the token strategies give the text's entities (and the words
    they reach), the word strategies label whole words only, each word once."""
    model = checkpoint(arch)
    given = LONG_TEXT.split()
    words = ner.Words.join(given)
    features = ner.prepare(model.tokenizer, words, MAX_LENGTH, 8)
    assert len(features.rows) >= 3
    got = ner.postprocess(words.text, features, model.logits(features), model.labels, strategy)
    assert labelled(got) > 0
    as_text = model.entities(words.text, strategy, 8)
    for entity in got:
        first, last = entity.pop("first_word"), entity.pop("last_word")
        covered = words.text[entity["start"] : entity["end"]].strip()
        if strategy in ("first", "average", "max"):
            assert covered == " ".join(given[first : last + 1]), entity
        else:
            assert covered in " ".join(given[first : last + 1]), entity
    if strategy in ("none", "simple"):
        assert got == as_text
    else:
        spans = [words.span(entity["start"], entity["end"]) for entity in got]
        reached = [i for first, last in spans for i in range(first, last + 1)]
        assert len(reached) == len(set(reached)), "a word in two entities"


@pytest.mark.parametrize("arch", ARCHS)
def test_the_pipelines_model_gives_our_logits(checkpoint: Callable[[str], Checkpoint], arch: str) -> None:
    model = checkpoint(arch)
    for text in [*TEXTS, LONG_TEXT]:
        if text.strip():
            check_pipeline_logits(model, text, stride=8)


@pytest.mark.parametrize("arch", ARCHS)
def test_windows_are_the_pipeline_tokenizers_windows(arch: str, tiny_checkpoint: Callable[..., Path]) -> None:
    directory = tiny_checkpoint(arch, "ner")
    tokenizer = AutoTokenizer.from_pretrained(str(directory))
    reference = tokenizer(
        LONG_TEXT,
        truncation=True,
        return_overflowing_tokens=True,
        stride=8,
        padding=True,
        return_offsets_mapping=True,
        return_special_tokens_mask=True,
    )
    ours = TextTokenizer.load(directory / "tokenizer.json", tokenizer.pad_token_id)
    features = ner.prepare(ours, LONG_TEXT, MAX_LENGTH, 8)
    assert len(features.rows) == len(reference["input_ids"])
    for window, row in enumerate(features.rows):
        length = sum(reference["attention_mask"][window])  # the pipeline pads the last window; we do not
        assert row.input_ids.tolist() == reference["input_ids"][window][:length]
        kept = [position for position in range(length) if not reference["special_tokens_mask"][window][position]]
        assert [token.position for token in features.tokens[window]] == kept
        assert [(token.start, token.end) for token in features.tokens[window]] == [
            tuple(reference["offset_mapping"][window][position]) for position in kept
        ]


@pytest.mark.parametrize("arch", ARCHS)
def test_tokens_made_when_asked_are_the_tokens_made_at_once(checkpoint: Callable[[str], Checkpoint], arch: str) -> None:
    """A window's tokens made one by one when asked (`_Spans`, for a text that came whole) are the ones the loop over
    every token makes (`_token_spans`): by index, by slice, all at once, and by index again once all are made;
    unknown characters, word marks and spaces included."""
    tokenizer = checkpoint(arch).tokenizer
    word_aware, unk_id = tokenizer.continuing_subword_prefix is not None, tokenizer.unk_token_id
    for text in (LONG_TEXT, "Zoë's ☃ café in 東京 costs x² ,  ¿ok?  \t tabs", "a"):
        encodings = tokenizer.encode(text, max_length=MAX_LENGTH, stride=8)
        for window, encoding in enumerate(encodings):
            shift = window * (ner.window_capacity(tokenizer, MAX_LENGTH) - 8)
            every = ner._token_spans(text, encoding, shift, word_aware, unk_id, None)
            spans = ner._Spans(text, encoding, shift, word_aware, unk_id)
            assert len(spans) == len(every) and spans.positions == [token.position for token in every]
            assert [spans[index] for index in range(len(spans))] == every
            assert spans[1:4] == every[1:4] and spans[-1] == every[-1]
            assert list(spans) == every and [spans[index] for index in range(len(spans))] == every
            assert all(type(token) is ner.TokenSpan and token.given_word == -1 for token in spans)
    snowman = ner.prepare(tokenizer, "a ☃ b", MAX_LENGTH, 8).tokens[0]
    assert unk_id is None or any(token.word == "☃" for token in snowman)  # an unknown token's word: its text


def same_span(whole: tuple[int, int], start: int, end: int, text: str) -> bool:
    """The token's offsets in the whole text's encoding and in a window agree, up to a window's leading space.

    RoBERTa's post-processor (trim_offsets) keeps the leading space in the offsets of a sequence's first token,
    and every overflowing window is a sequence of its own: "ĠC" at a window's start covers " C", not "C".
    """
    return whole[1] == end and (whole[0] == start or text[start : whole[0]].isspace())


@pytest.mark.parametrize("arch", ARCHS)
def test_token_indices_count_over_the_whole_text(checkpoint: Callable[[str], Checkpoint], arch: str) -> None:
    model = checkpoint(arch)
    whole = model.tokenizer.encode(LONG_TEXT)[0]
    features = ner.prepare(model.tokenizer, LONG_TEXT, MAX_LENGTH, 8)
    for window_tokens, row in zip(features.tokens, features.rows, strict=True):
        for token in window_tokens:
            assert whole.ids[token.text_index] == row.input_ids[token.position]
            assert same_span(whole.offsets[token.text_index], token.start, token.end, LONG_TEXT)


@pytest.mark.parametrize("arch", ARCHS)
def test_strategy_none_over_windows_reports_each_token_once(checkpoint: Callable[[str], Checkpoint], arch: str) -> None:
    # The pipeline refuses `stride` with "none"; without it, it tags the first window only.
    model = checkpoint(arch)
    stride = 8
    got = model.entities(LONG_TEXT, "none", stride)
    indices = [entity["index"] for entity in got]
    assert indices == sorted(set(indices)), "tokens repeated or out of order"
    whole = model.tokenizer.encode(LONG_TEXT)[0]
    assert all(same_span(whole.offsets[e["index"]], e["start"], e["end"], LONG_TEXT) for e in got)
    assert max(indices) > MAX_LENGTH, "tokens past the first window are missing"
    # Tokens only the first window holds (before the second window's start) are the pipeline's.
    second_window_start = 1 + ner.window_capacity(model.tokenizer, MAX_LENGTH) - stride
    first_only = [entity for entity in got if entity["index"] < second_window_start]
    reference, _ = model.compare(LONG_TEXT, "none", stride=None)  # the pipeline: the first window only
    expected = [entity for entity in reference if entity["index"] < second_window_start]
    assert_same_entities(expected, first_only, f"{arch}/none first window")


@pytest.mark.parametrize("strategy", ner.AGGREGATION_STRATEGIES)
def test_a_requests_texts_post_processed_together_are_each_alone(
    checkpoint: Callable[[str], Checkpoint], strategy: str
) -> None:
    # One request's texts (one window and several) have their windows' scores found in one block: each text's
    # entities must be those of the text post-processed alone.
    model = checkpoint("bert")
    texts = [LONG_TEXT, "Ada Lovelace met Charles Babbage in London.", LONG_TEXT[:90], "Paris"]
    features = [ner.prepare(model.tokenizer, text, MAX_LENGTH, 8) for text in texts]
    logits = [model.logits(text_features) for text_features in features]
    assert len(features[0].rows) >= 3
    alone = [
        ner.postprocess(text, text_features, text_logits, model.labels, strategy)
        for text, text_features, text_logits in zip(texts, features, logits, strict=True)
    ]
    assert ner.postprocess_all(texts, features, logits, model.labels, strategy) == alone
    assert sum(len(entities) for entities in alone) > 0


@pytest.mark.parametrize("strategy", ["none", "simple", "average"])
def test_ignore_labels_pass_through(checkpoint: Callable[[str], Checkpoint], strategy: str) -> None:
    model = checkpoint("bert")
    text = TEXTS[1]
    for ignore in ((), ("O", "PER", "B-PER")):
        expected, got = model.compare(text, strategy, stride=None, ignore_labels=ignore)
        assert_same_entities(expected, got, f"{strategy} ignore {ignore}")
    if strategy != "none":
        assert any(entity["entity_group"] == "O" for entity in model.entities(text, strategy, 8, ignore_labels=()))


def test_unknown_strategy_is_refused(checkpoint: Callable[[str], Checkpoint]) -> None:
    model = checkpoint("bert")
    features = ner.prepare(model.tokenizer, "Berlin", MAX_LENGTH, 8)
    with pytest.raises(ValueError, match="unknown aggregation strategy 'longest'"):
        ner.postprocess("Berlin", features, model.logits(features), model.labels, "longest")
    with pytest.raises(ValueError, match="unknown aggregation strategy"):
        ner.check_strategy("SIMPLE")


def test_logits_must_fit_the_rows(checkpoint: Callable[[str], Checkpoint]) -> None:
    model = checkpoint("bert")
    features = ner.prepare(model.tokenizer, "Berlin", MAX_LENGTH, 8)
    logits = model.logits(features)
    with pytest.raises(ValueError, match="expected logits for 1 windows"):
        ner.postprocess("Berlin", features, [*logits, *logits], model.labels, "simple")
    with pytest.raises(ValueError, match="shape"):
        ner.postprocess("Berlin", features, [logits[0][:, :2]], model.labels, "simple")


@pytest.mark.parametrize("arch", ARCHS)
def test_stride_limits(checkpoint: Callable[[str], Checkpoint], arch: str) -> None:
    tokenizer = checkpoint(arch).tokenizer
    assert ner.window_capacity(tokenizer, MAX_LENGTH) == MAX_LENGTH - 2
    assert ner.default_stride(tokenizer, MAX_LENGTH) == MAX_LENGTH // 4
    assert ner.default_stride(tokenizer, 4) == 1  # two text tokens a window: one of overlap
    assert ner.default_stride(tokenizer, 512) == ner.DEFAULT_STRIDE
    top = ner.max_stride(tokenizer, MAX_LENGTH)
    ner.prepare(tokenizer, LONG_TEXT, MAX_LENGTH, top)  # windows advance by one token: slow, but valid
    for bad in (top + 1, MAX_LENGTH, -1):
        with pytest.raises(ValueError, match="stride must be between 0 and"):
            ner.prepare(tokenizer, "Berlin", MAX_LENGTH, bad)
    with pytest.raises(ValueError, match="no room"):
        ner.prepare(tokenizer, "Berlin", 2, 0)


@pytest.mark.parametrize(
    ("arch", "prefix", "unk_id"),
    [("bert", "##", 1), ("distilbert", "##", 1), ("roberta", None, None), ("albert", None, 1)],
)
def test_tokenizer_word_marks(
    checkpoint: Callable[[str], Checkpoint], arch: str, prefix: str | None, unk_id: int | None
) -> None:
    """What decides `is_subword` and unknown words, read from tokenizer.json as the pipeline reads its tokenizer."""
    model = checkpoint(arch)
    assert model.tokenizer.continuing_subword_prefix == prefix
    assert model.tokenizer.unk_token_id == unk_id
    backend = model.reference.tokenizer
    assert (getattr(backend.backend_tokenizer.model, "continuing_subword_prefix", None) or None) == prefix
    if unk_id is not None:
        assert backend.unk_token_id == unk_id


def test_words_are_token_strings_not_decoded_ids(checkpoint: Callable[[str], Checkpoint]) -> None:
    """The pipeline's words: token strings ("none"), decoder-joined tokens, unknown tokens as their text."""
    model = checkpoint("bert")
    text = "Reykjavík 😀 visitors"
    features = ner.prepare(model.tokenizer, text, MAX_LENGTH, 8)
    words = [token.word for token in features.tokens[0]]
    encoding = model.tokenizer.encode(text)[0]
    assert "😀" in words and "[UNK]" in encoding.tokens  # unknown: the text it covers, not "[UNK]"
    assert any(word.startswith("##") for word in words)  # continuation pieces keep their mark
    assert features.join_tokens(["visit", "##ors"]) == "visitors"


def conll_sentences(limit: int) -> list[str]:
    sentences: list[str] = []
    words: list[str] = []
    for line in [*CONLL_TEST.read_text(encoding="utf-8").splitlines(), ""]:
        if line.strip():
            words.append(line.split(" ")[0])
        elif words:
            sentences.append(" ".join(words))
            words = []
        if len(sentences) == limit:
            break
    return sentences


@pytest.mark.shared
@pytest.mark.skipif(
    not (REAL_CHECKPOINT.is_dir() and CONLL_TEST.is_file()),
    reason=f"the real CoNLL-2003 checkpoint or data is absent ({REAL_CHECKPOINT}, {CONLL_TEST})",
)
def test_real_conll03_checkpoint_matches_the_pipeline() -> None:
    # Stored in fp16: compute in fp32, the pipeline with the very same model object.
    model = AutoModelForTokenClassification.from_pretrained(
        str(REAL_CHECKPOINT), attn_implementation="eager", dtype=torch.float32
    ).eval()
    reference = pipeline("token-classification", model=model, tokenizer=str(REAL_CHECKPOINT))
    real = load_checkpoint(REAL_CHECKPOINT, model, reference)
    max_length = int(reference.tokenizer.model_max_length)
    sentences = conll_sentences(40)
    texts = [*sentences[:30], " ".join(sentences)]  # the joined text needs two windows at 512 with stride 128
    compared = 0
    for text in texts:
        features = ner.prepare(real.tokenizer, text, max_length, 128)
        logits = real.logits(features)
        for strategy in ("simple", "first"):
            expected = pipeline_entities(
                reference, text, features.rows, logits, aggregation_strategy=strategy, stride=128
            )
            got = ner.postprocess(text, features, logits, real.labels, strategy)
            assert_same_entities(expected, got, f"{strategy} {text[:40]!r}")
            compared += labelled(got)
    assert len(features.rows) >= 2
    assert compared > 50
    check_pipeline_logits(real, texts[-1], 128, max_length)


def test_entity_scores_are_the_float32_nanmean_the_pipeline_takes() -> None:
    # Group scores skip np.nanmean where they can (one score; no NaN among several): the result must not move.
    rng = np.random.default_rng(7)
    for size in (1, 2, 3, 5, 8, 13):
        for _ in range(200):
            scores = (rng.random(size, dtype=np.float32) ** rng.integers(1, 6)).astype(np.float32)
            as_floats = [float(score) for score in scores]  # the tagged items hold float32 values as floats
            expected = float(np.nanmean(scores))
            got = ner._mean_score(as_floats)
            assert got == expected, (scores, got, expected)
    assert ner._mean_score([0.5, float("nan"), 0.25]) == pytest.approx(0.375)
    with pytest.warns(RuntimeWarning, match="empty slice"):  # as np.nanmean over all-NaN scores warns
        assert np.isnan(ner._mean_score([float("nan"), float("nan")]))


# The plain way, as the pipeline goes: an item (token or word) per label, grouped, then filtered; what the window
# functions of ner.py do without an object per token and without the text of ignored words.
def plain_groups(tagged: list, ignore: tuple[str, ...], join) -> list[dict]:
    groups: list[list] = []
    last_tag = None
    for item in tagged:
        prefix, tag = (item.label[0], item.label[2:]) if item.label.startswith(("B-", "I-")) else ("I", item.label)
        if groups and prefix != "B" and tag == last_tag:
            groups[-1].append(item)
        else:
            groups.append([item])
        last_tag = tag
    return [
        {
            "entity_group": group[0].label.split("-", 1)[-1],
            "score": ner._mean_score([item.score for item in group]),
            "word": join([item.word for item in group]),
            "start": group[0].start,
            "end": group[-1].end,
        }
        for group in groups
        if group[0].label.split("-", 1)[-1] not in ignore
    ]


def plain_words(tokens: list, scores: np.ndarray, labels: list[str], strategy: str, join) -> list:
    tagged = []
    for word in ner._split_words(tokens):
        word_scores = ner._word_scores(word, scores, strategy)
        best = int(word_scores.argmax())
        text = join([token.word for token in word])
        tagged.append(
            ner._Tagged(labels[best], float(word_scores[best]), text, word[0].start, word[-1].end, word[0].text_index)
        )
    return tagged


def plain_tags(tokens: list, scores: np.ndarray, labels: list[str]) -> list:
    tagged = []
    for token in tokens:
        row = scores[token.position]
        best = int(row.argmax())
        tagged.append(ner._Tagged(labels[best], float(row[best]), token.word, token.start, token.end, token.text_index))
    return tagged


@pytest.mark.parametrize("strategy", ["none", "simple", *ner.WORD_STRATEGIES])
@pytest.mark.parametrize(
    "labels",
    [
        ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"],
        ["O", "PER", "LOC", "B-LOC"],  # labels without a prefix continue as I- tags do
        ["O", "B-X-Y", "I-X-Y", "E-X-Y", "S-Z"],  # BIOES: E- and S- are tags of their own for grouping
        ["LABEL_0", "LABEL_1"],
    ],
)
def test_groups_as_tagging_each_item_then_grouping_does(labels: list[str], strategy: str) -> None:
    # The entities must be those of tagging every token (or word), grouping the tagged items and filtering the
    # groups, bit for bit, scores included; with the window's text tokens in a row (sliced) and not (an index per
    # token), and words of one and of several tokens.
    rng = np.random.default_rng(11)

    def join(words) -> str:
        return "+".join(words)

    for trial in range(300):
        length = int(rng.integers(0, 40))
        logits = rng.normal(0, 2, (length + 2, len(labels))).astype(np.float32)
        logits[:, 0] += rng.uniform(0, 4)  # runs of the first label, as "O" runs in a text
        if trial % 7 == 0:
            logits[: length // 2] = logits[0]  # equal rows: equal scores inside a group
        positions = list(range(1, length + 1))
        if trial % 3 == 0 and length > 2:  # a gap: not every row is a text token
            positions = sorted(rng.choice(np.arange(1, length + 1), size=length - 2, replace=False).tolist())
        subword = rng.random(len(positions)) < 0.4
        tokens = [
            ner.TokenSpan(p, p + 5, f"w{p}", 3 * p, 3 * p + 2, bool(sub))
            for p, sub in zip(positions, subword.tolist(), strict=True)
        ]
        ignore = tuple(labels[:1]) if trial % 2 else ()
        scores = ner._softmax(logits)  # of the window alone
        if strategy == "none":  # every token its own entity, less the ignored labels
            tagged = plain_tags(tokens, scores, labels)
            expected = [ner._token_entity(item) for item in tagged if item.label not in ignore]
        else:
            tagged = (
                plain_tags(tokens, scores, labels)
                if strategy == "simple"
                else plain_words(tokens, scores, labels, strategy, join)
            )
            expected = plain_groups(tagged, ignore, join)
        # scored as a request's windows are: the window's rows between other windows' rows, in one block
        before, after = (rng.normal(0, 2, (int(rng.integers(0, 9)), len(labels))).astype(np.float32) for _ in "ab")
        scored = ner.score_windows([before, logits, after])[1]
        assert ner._window_entities(tokens, scored, labels, strategy, join, ignore) == expected


def test_the_row_max_is_numpys_max_over_labels() -> None:
    # The softmax's shift and each row's best score: the very values of max(axis=-1), NaN and -inf rows included.
    rng = np.random.default_rng(5)
    for rows, labels in [(1, 9), (31, 9), (480, 9), (3, 2), (7, 17), (0, 9)]:
        values = rng.normal(0, 3, (rows, labels)).astype(np.float32)
        if rows > 2:
            values[1, labels // 2] = np.nan
            values[2] = -np.inf
        assert np.array_equal(ner._row_max(values), values.max(axis=-1), equal_nan=True)
        with np.errstate(invalid="ignore"):  # a row of -inf shifted by its own max: NaN, in both
            assert np.array_equal(ner._softmax(values), plain_softmax(values), equal_nan=True)


def plain_softmax(logits: np.ndarray) -> np.ndarray:
    """transformers' token-classification softmax, row by row."""
    shifted = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return shifted / shifted.sum(axis=-1, keepdims=True)
