"""Issue 31's encoder families served over HTTP: classification and NER equal transformers' pipelines run with
PyTorch on the same tiny checkpoints; QA equals our QA pre/post-processing (held to transformers 4.57's pipeline by
tests/service/tasks/test_qa.py) around the PyTorch model. Several inputs a request, so rows of different lengths
share a padded batch: XLNet's on the left, its classifier token last."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import AutoModelForQuestionAnswering

from bertcore.model_config import ModelConfig
from bertcore.tasks import qa
from bertcore.tokenization import TextTokenizer
from tests.service.conftest import Server
from tests.service.test_parity import CLASSIFY_TEXTS, assert_ner_equals_the_pipeline, assert_same_labels, classifier
from tests.tiny_models import FAMILIES

QA_INPUTS = [
    {"question": "Who met in Brussels?", "context": "Peter Blackburn met Maria Lopez in Brussels on Tuesday."},
    {"question": "Where is the museum?", "context": "Nobody expected the small museum in Oslo to draw such crowds."},
    {
        "question": "What did they report?",
        # longer than the 64-token model: several windows
        "context": " ".join(["Scientists in Tokyo and Berlin reported faster trains and cleaner water."] * 8),
    },
]


@pytest.fixture(scope="module")
def family_server(family_repository, server_factory) -> Server:
    repository, _ = family_repository
    return server_factory(repository)


def test_models_lists_every_family(family_server: Server) -> None:
    with family_server.client() as client:
        models = {m["name"]: m for m in client.get("/v1/models").json()["models"]}
    assert sorted(models) == sorted(f"{arch}-{task}" for arch in FAMILIES for task in ("classification", "ner", "qa"))
    for name, info in models.items():
        assert info["status"] == "ready" and info["task"] == name.rsplit("-", 1)[1], info
    assert models["xlnet-qa"]["architecture"] == "XLNetForQuestionAnsweringSimple"
    assert models["deberta-v2-ner"]["architecture"] == "DebertaV2ForTokenClassification"


@pytest.mark.parametrize("arch", FAMILIES)
def test_family_classification_equals_the_pipeline(family_server: Server, tiny_checkpoint, arch: str) -> None:
    reference = classifier(str(tiny_checkpoint(arch, "classification")))
    with family_server.client() as client:
        response = client.post(
            f"/v1/models/{arch}-classification/classify", json={"inputs": CLASSIFY_TEXTS, "top_k": None}
        )
    assert response.status_code == 200, response.text
    for text, got in zip(CLASSIFY_TEXTS, response.json()["results"], strict=True):
        assert_same_labels(got, reference(text, top_k=None), ("label",))


@pytest.mark.parametrize("strategy", ["none", "simple", "first"])
@pytest.mark.parametrize("arch", FAMILIES)
def test_family_ner_equals_the_pipeline(family_server: Server, tiny_checkpoint, arch: str, strategy: str) -> None:
    assert_ner_equals_the_pipeline(family_server, tiny_checkpoint(arch, "ner"), f"{arch}-ner", strategy)


@pytest.mark.parametrize("arch", FAMILIES)
def test_family_qa_equals_pytorch_through_our_windows(
    family_repository, family_server: Server, tiny_checkpoint, arch: str
) -> None:
    checkpoint = tiny_checkpoint(arch, "qa")
    config = ModelConfig.read(family_repository[0] / f"{arch}-qa")
    # XLNet's pads on the left: the context goes first in its windows, as transformers 4.57's pipeline had it
    tokenizer = TextTokenizer.load(
        family_repository[0] / f"{arch}-qa" / "tokenizer.json", 0, config.tokenizer.padding_side
    )
    model = AutoModelForQuestionAnswering.from_pretrained(
        str(checkpoint), attn_implementation="eager", dtype=torch.float32
    ).eval()
    params = qa.QaParams(top_k=3)
    with family_server.client() as client:
        response = client.post(f"/v1/models/{arch}-qa/qa", json={"inputs": QA_INPUTS, "top_k": 3})
    assert response.status_code == 200, response.text
    windows = 0
    for pair, served in zip(QA_INPUTS, response.json()["results"], strict=True):
        features = qa.prepare(tokenizer, pair["question"], pair["context"], params, 64)
        windows += len(features.rows)
        starts, ends = [], []
        with torch.no_grad():
            for row in features.rows:
                rows = {"input_ids": row.input_ids, "token_type_ids": row.token_type_ids}
                out = model(**{name: torch.from_numpy(rows[name])[None] for name in config.inputs if name in rows})
                starts.append(out.start_logits[0].numpy())
                ends.append(out.end_logits[0].numpy())
        expected = qa.postprocess(pair["question"], pair["context"], features, starts, ends, params)
        assert [(a["start"], a["end"], a["answer"]) for a in served] == [
            (a["start"], a["end"], a["answer"]) for a in expected
        ]
        np.testing.assert_allclose([a["score"] for a in served], [a["score"] for a in expected], atol=1e-4)
    assert windows > len(QA_INPUTS), "the long context should need several windows"
