"""Served answers equal transformers pipelines run with PyTorch on the same checkpoints (tiny and real)."""

from __future__ import annotations

from functools import cache
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForTokenClassification, AutoTokenizer, pipeline

from benchmarks.realdata import SHARED, conll03, shared_available, sst2
from export.evaluation import entity_spans, iob_tags
from tests.service.conftest import Server

ARCHS = ("bert", "roberta", "albert", "distilbert")
CLASSIFY_TEXTS = [
    "A gorgeous, witty, seductive movie.",
    "The plot is thin and the jokes fall flat.",
    "São Paulo's   museum -- 1,200 visitors!",
    "",
]
NER_TEXTS = [
    "Peter Blackburn met Maria Lopez in Brussels on Tuesday.",
    "EU rejects German call to boycott British lamb.",
    "Nadim Ladki scored twice as Japan beat Syria 2-1 in the Asian Cup in Al-Ain.",
    "no entities here at all",
    "José Mourinho\u2019s side beat Zürich in São Paulo \u2014 again, said Ελένη.",  # beyond ASCII, no library
]


@cache
def classifier(checkpoint: str):
    return pipeline(
        "text-classification", model=checkpoint, model_kwargs={"attn_implementation": "eager", "dtype": torch.float32}
    )


@cache
def tagger(checkpoint: str, strategy: str):
    return pipeline(
        "token-classification",
        model=checkpoint,
        aggregation_strategy=strategy,
        model_kwargs={"attn_implementation": "eager", "dtype": torch.float32},
    )


def assert_same_labels(served: list[dict], expected: list[dict], keys: tuple[str, ...]) -> None:
    assert len(served) == len(expected), (served, expected)
    for got, want in zip(served, expected, strict=True):
        for key in keys:
            assert got[key] == want[key], (key, got, want)
        assert abs(got["score"] - float(want["score"])) <= 1e-4, (got, want)


@pytest.mark.parametrize("arch", ARCHS)
def test_classification_equals_the_pipeline(tiny_server: Server, tiny_checkpoint, arch: str) -> None:
    reference = classifier(str(tiny_checkpoint(arch, "classification")))
    with tiny_server.client() as client:
        served = client.post(
            f"/v1/models/{arch}-classification/classify", json={"inputs": CLASSIFY_TEXTS, "top_k": None}
        ).json()["results"]
    for text, got in zip(CLASSIFY_TEXTS, served, strict=True):
        assert_same_labels(got, reference(text, top_k=None), ("label",))


def test_text_pairs_equal_the_pipeline_an_empty_or_absent_second_text_too(tiny_server: Server, tiny_checkpoint):
    """The pipeline's tokenizer call encodes `text_pair: ""` as no second segment: it was served as an empty one
    ([CLS] a [SEP] [SEP], scores up to 0.056 apart on MiniLM SST-2); and a pair object without text_pair (or null)
    was a 422 where the pipeline answers it as the text alone."""
    reference = classifier(str(tiny_checkpoint("bert", "classification")))
    pairs = [
        {"text": "a gorgeous movie", "text_pair": "the best of the year"},
        {"text": "The plot is thin and the jokes fall flat.", "text_pair": ""},
        {"text": "", "text_pair": ""},
        {"text": "dull", "text_pair": " "},  # a space is a second segment to the pipeline (no tokens in it)
        {"text": "great movie"},
        {"text": "great movie", "text_pair": None},
    ]
    with tiny_server.client() as client:
        response = client.post("/v1/models/bert-classification/classify", json={"inputs": pairs, "top_k": None})
        hf = client.post("/v1/models/bert-classification", json={"inputs": pairs[1], "parameters": {"top_k": None}})
    assert response.status_code == 200, response.text
    for pair, got in zip(pairs, response.json()["results"], strict=True):
        assert_same_labels(got, reference({k: v for k, v in pair.items() if v is not None}, top_k=None), ("label",))
    assert hf.status_code == 200, hf.text
    assert_same_labels(hf.json()[0], reference(pairs[1], top_k=None), ("label",))
    tensors = [
        {"name": name, "shape": [1], "datatype": "BYTES", "data": [pairs[1][name]]} for name in ("text", "text_pair")
    ]
    with tiny_server.client() as client:
        oip = client.post("/v2/models/bert-classification/infer", json={"inputs": tensors, "parameters": {"top_k": 3}})
    assert oip.status_code == 200, oip.text
    scores = {o["name"]: o["data"] for o in oip.json()["outputs"]}
    want = reference(pairs[1], top_k=None)
    assert scores["label"] == [item["label"] for item in want]
    assert all(abs(got - item["score"]) <= 1e-4 for got, item in zip(scores["score"], want, strict=True))


@pytest.mark.parametrize("strategy", ["none", "simple", "first", "average", "max"])
@pytest.mark.parametrize("arch", ARCHS)
def test_ner_equals_the_pipeline(tiny_server: Server, tiny_checkpoint, arch: str, strategy: str) -> None:
    assert_ner_equals_the_pipeline(tiny_server, tiny_checkpoint(arch, "ner"), f"{arch}-ner", strategy)


def assert_ner_equals_the_pipeline(server: Server, checkpoint: Path, name: str, strategy: str) -> None:
    """The served entities of NER_TEXTS equal transformers' token-classification pipeline on the checkpoint."""
    reference = tagger(str(checkpoint), strategy)
    with server.client() as client:
        response = client.post(f"/v1/models/{name}/ner", json={"inputs": NER_TEXTS, "aggregation_strategy": strategy})
    assert response.status_code == 200, response.text
    keys = (
        ("entity", "index", "word", "start", "end") if strategy == "none" else ("entity_group", "word", "start", "end")
    )
    compared = 0
    for text, got in zip(NER_TEXTS, response.json()["results"], strict=True):
        got = [{k: v for k, v in entity.items() if v is not None} for entity in got]
        want = reference(text)
        assert_same_labels(got, want, keys)
        compared += len(want)
    assert compared > 0, "the tiny model found no entity at all: nothing was compared"


# ---- real checkpoints -------------------------------------------------------------------------------------

needs_shared = pytest.mark.skipif(not shared_available(), reason="../shared (real checkpoints and data) is absent")


@pytest.fixture(scope="module")
def real_server(real_repository: Path, server_factory) -> Server:
    return server_factory(real_repository)


@needs_shared
@pytest.mark.parametrize("name", ["minilm-bert-sst2", "minilm-distilbert-sst2"])
def test_real_sst2_equals_the_pipeline(real_server: Server, name: str) -> None:
    sentences = [sentence for sentence, _ in sst2(96)]
    reference = classifier(str(SHARED / "models" / name))
    served = []
    with real_server.client() as client:
        for start in range(0, len(sentences), 32):  # within the 64-inputs-per-request limit
            chunk = sentences[start : start + 32]
            served += client.post(f"/v1/models/{name}/classify", json={"inputs": chunk, "top_k": None}).json()[
                "results"
            ]
    for sentence, got in zip(sentences, served, strict=True):
        assert_same_labels(got, reference(sentence, top_k=None), ("label",))


@needs_shared
@pytest.mark.parametrize("strategy", ["simple", "first", "max"])
def test_real_conll_equals_the_pipeline(real_server: Server, strategy: str) -> None:
    texts = [" ".join(words) for words, _ in conll03(40)]
    reference = tagger(str(SHARED / "models" / "minilm-bert-conll03"), strategy)
    with real_server.client() as client:
        response = client.post(
            "/v1/models/minilm-bert-conll03/ner", json={"inputs": texts, "aggregation_strategy": strategy}
        )
    total = 0
    for text, got in zip(texts, response.json()["results"], strict=True):
        want = reference(text)
        got = [{k: v for k, v in entity.items() if v is not None} for entity in got]
        assert_same_labels(got, want, ("entity_group", "word", "start", "end"))
        total += len(want)
    assert total > 20


@needs_shared
def test_real_conll_words_are_tagged_as_the_checkpoint_was_scored(real_server: Server) -> None:
    """Sent as its words (is_split_into_words, strategy first), each CoNLL word gets the label of its first piece,
    as PyTorch gives it over the words tokenized as words: how the checkpoint's entity F1 is measured. The
    pipeline's words differ (its "." of "S." is a word): its tags differ from these in 4 of the 60 sentences."""
    path = SHARED / "models" / "minilm-bert-conll03"
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForTokenClassification.from_pretrained(path, dtype=torch.float32).eval()
    sentences = [words for words, _ in conll03(60)]
    expected = []
    with torch.no_grad():
        for words in sentences:
            encoding = tokenizer(words, is_split_into_words=True, return_tensors="pt")
            predicted = model(**encoding).logits[0].argmax(-1).tolist()
            tags = ["O"] * len(words)
            for position, word in reversed(list(enumerate(encoding.word_ids()))):  # the first piece's label wins
                if word is not None:
                    tags[word] = model.config.id2label[predicted[position]]
            expected.append(tags)
    with real_server.client() as client:
        response = client.post(
            "/v1/models/minilm-bert-conll03/ner",
            json={"inputs": sentences, "is_split_into_words": True, "aggregation_strategy": "first"},
        )
    assert response.status_code == 200, response.text
    served = [
        iob_tags(len(words), [(e["first_word"], e["last_word"], e["entity_group"]) for e in entities])
        for words, entities in zip(sentences, response.json()["results"], strict=True)
    ]
    # IOB tags compared as entities: "I-PER" after "O" opens an entity as "B-PER" does
    assert [entity_spans(tags) for tags in served] == [entity_spans(tags) for tags in expected]
    assert sum(len(entity_spans(tags)) for tags in expected) > 50
