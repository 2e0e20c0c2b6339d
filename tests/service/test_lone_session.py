"""--cpu-lone-session through a real server in process mode: the setting reaches the engine process, /v1/models says
each model has its lone session, and requests alone and side by side are answered as without it."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

MODEL = "bert-classification"
TEXTS = ["a fine and moving film", "dull", "the plot falls apart in the second half, sadly", "yes"]


def classify(url: str, texts: list[str]) -> list:
    response = httpx.post(f"{url}/v1/models/{MODEL}/classify", json={"inputs": texts}, timeout=30)
    assert response.status_code == 200, response.text
    return response.json()["results"]


def assert_same(got: list, want: list) -> None:
    """Answers of `classify` (per input, labels with scores): the same labels in the same order, scores within
    1e-5, since the sessions run on 1 and 2 threads, which may sum in another order on another CPU."""
    got_pairs = [(r["label"], r["score"]) for answer in got for labels in answer for r in labels]
    want_pairs = [(r["label"], r["score"]) for answer in want for labels in answer for r in labels]
    assert got_pairs and [label for label, _ in got_pairs] == [label for label, _ in want_pairs]
    assert [score for _, score in got_pairs] == pytest.approx([score for _, score in want_pairs], abs=1e-5)


def test_a_server_with_lone_sessions_answers_as_one_without(tiny_repository: Path, server_factory) -> None:
    common = ("--models", MODEL, "--engine-mode", "process", "--threads", "2", "--cpu-streams", "2")
    lone = server_factory(tiny_repository, *common, "--cpu-lone-session", "on")
    plain = server_factory(tiny_repository, *common)
    placements = {
        name: {m["name"]: m["placement"] for m in httpx.get(f"{server.url}/v1/models", timeout=30).json()["models"]}
        for name, server in (("lone", lone), ("plain", plain))
    }
    assert placements["lone"][MODEL]["lone_session_threads"] == 2
    assert "lone_session_threads" not in placements["plain"][MODEL]
    want = [classify(plain.url, [text]) for text in TEXTS]
    assert_same([classify(lone.url, [text]) for text in TEXTS], want)  # one at a time: the lone session
    with ThreadPoolExecutor(8) as pool:  # side by side: batches beside each other, on the streams' session too
        got = list(pool.map(lambda i: classify(lone.url, [TEXTS[i % len(TEXTS)]]), range(64)))
    assert_same(got, [want[i % len(TEXTS)] for i in range(64)])
