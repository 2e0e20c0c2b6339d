"""Real servers for the load-test checks: three tiny BERT models (classification, NER, QA), fp32 only; and a tiny
cross-encoder (a regression head: raw scores) behind an API key."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from export.pipeline import export_checkpoint
from tests.service.conftest import Server, server_factory  # noqa: F401 (the fixture, shared)
from tests.tiny_models import CROSS_ENCODER

LOADTEST_CELLS = (("bert", "classification"), ("bert", "ner"), ("bert", "qa"))
LOADTEST_API_KEY = "loadtest-key-0123456789abcdef"
REGRESSION_MODEL = "bert-rerank"


@pytest.fixture(scope="session")
def loadtest_repository(tiny_checkpoint: Callable[..., Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """bert-classification, bert-ner and bert-qa (the names the tiny repository uses), fp32 only."""
    repository = tmp_path_factory.mktemp("loadtest-repository")
    for arch, task in LOADTEST_CELLS:
        export_checkpoint(str(tiny_checkpoint(arch, task)), f"{arch}-{task}", repository, variants="fp32")
    return repository


@pytest.fixture(scope="session")
def loadtest_server(loadtest_repository: Path, server_factory: Callable[..., Server]) -> Server:  # noqa: F811
    return server_factory(loadtest_repository)


@pytest.fixture(scope="session")
def keyed_regression_server(
    tiny_checkpoint: Callable[..., Path],
    tmp_path_factory: pytest.TempPathFactory,
    server_factory: Callable[..., Server],  # noqa: F811
) -> Server:
    """Only a tiny cross-encoder (problem_type regression, one label: classify answers raw logits), and every
    request but /livez and /readyz needs `Authorization: Bearer LOADTEST_API_KEY`."""
    repository = tmp_path_factory.mktemp("loadtest-regression-repository")
    checkpoint = tiny_checkpoint("bert", "classification", **CROSS_ENCODER)
    export_checkpoint(str(checkpoint), REGRESSION_MODEL, repository, variants="fp32")
    return server_factory(repository, env={"BERTSERVE_API_KEYS": LOADTEST_API_KEY})
