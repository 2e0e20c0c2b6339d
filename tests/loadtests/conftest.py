"""A real server for the load-test checks: three tiny BERT models (classification, NER, QA), fp32 only."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from export.pipeline import export_checkpoint
from tests.service.conftest import Server, server_factory  # noqa: F401 (the fixture, shared)

LOADTEST_CELLS = (("bert", "classification"), ("bert", "ner"), ("bert", "qa"))


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
