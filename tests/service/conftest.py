"""A real server for the integration tests: `python -m service` in its own process, on a free loopback port."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from export.pipeline import export_checkpoint
from tests.harness.serving import ServiceProcess, start_service
from tests.tiny_models import CROSS_ENCODER

ROOT = Path(__file__).resolve().parents[2]
TINY_CELLS = [
    (arch, task) for arch in ("bert", "roberta", "albert", "distilbert") for task in ("classification", "ner", "qa")
]
RERANK_MODEL = "bert-rerank"  # the tiny cross-encoder of tiny_repository


Server = ServiceProcess


def wait_for(condition: Callable[[], bool], timeout: float = 60.0, every_s: float = 0.05) -> bool:
    """Poll `condition` until it holds (True) or `timeout` has passed (its last answer)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(every_s)
    return condition()


async def wait_for_async(condition: Callable[[], bool], timeout: float = 60.0, every_s: float = 0.05) -> bool:
    """`wait_for` inside an event loop: polls `condition` between `asyncio.sleep`s, so the loop runs meanwhile."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        await asyncio.sleep(every_s)
    return condition()


def run_service(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """`python -m service ARGS` to its end (start-up refusals, --help), output captured; `env` beside this one's."""
    return subprocess.run(
        [sys.executable, "-m", "service", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
    )


@pytest.fixture(scope="session")
def tiny_repository(tiny_checkpoint, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every architecture x task as a repository entry named ARCH-TASK (fp32 and int8), and a tiny cross-encoder
    (RERANK_MODEL)."""
    repository = tmp_path_factory.mktemp("tiny-repository")
    for arch, task in TINY_CELLS:
        export_checkpoint(str(tiny_checkpoint(arch, task)), f"{arch}-{task}", repository, variants="fp32,int8")
    cross_encoder = tiny_checkpoint("bert", "classification", **CROSS_ENCODER)
    export_checkpoint(str(cross_encoder), RERANK_MODEL, repository, variants="fp32,int8")
    return repository


@pytest.fixture(scope="session")
def real_repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The real MiniLM checkpoints of ../shared that the tests serve, exported once (fp32). Tests using it skip
    where ../shared is absent."""
    from benchmarks.realdata import SHARED

    repository = tmp_path_factory.mktemp("real-repository")
    for name in ("minilm-bert-sst2", "minilm-bert-conll03", "minilm-distilbert-sst2", "minilm-bert-squad"):
        export_checkpoint(str(SHARED / "models" / name), name, repository, variants="fp32")
    return repository


@pytest.fixture(scope="session")
def server_factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., Server]]:
    servers: list[Server] = []
    log_dir = tmp_path_factory.mktemp("server-logs")

    def start(repository: Path, *args: str, wait_ready: bool = True, env: dict[str, str] | None = None) -> Server:
        log_path = log_dir / f"server-{len(servers)}.log"
        server = start_service(repository, "--log-level", "info", *args, log_path=log_path, wait=wait_ready, env=env)
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


@pytest.fixture(scope="session")
def tiny_server(tiny_repository: Path, server_factory) -> Server:
    return server_factory(tiny_repository)
