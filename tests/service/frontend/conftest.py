"""Servers that speak the Open Inference Protocol v2 over REST and gRPC (--grpc-port), shared by the REST tests
(tests/service/frontend/http/test_open_inference.py) and the gRPC ones (tests/service/frontend/grpc/)."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.harness.serving import ServiceProcess, free_port

OIP_MODELS = "bert-classification,bert-ner,bert-qa"
API_KEY = "oip-test-key-0123456789abcdef"


@dataclass
class OipServer:
    http: ServiceProcess
    grpc_port: int

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def http_url(self) -> str:
        return self.http.url.removeprefix("http://")


@pytest.fixture(scope="session")
def oip_repository(tiny_repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One tiny model per task, and an entry that fails to load (`broken`: its requests are UNAVAILABLE)."""
    repository = tmp_path_factory.mktemp("oip-repository")
    for name in OIP_MODELS.split(","):
        shutil.copytree(tiny_repository / name, repository / name)
    shutil.copytree(tiny_repository / "bert-ner", repository / "broken")
    (repository / "broken" / "model.fp32.onnx").write_bytes(b"not an onnx graph")
    return repository


@pytest.fixture(scope="session")
def oip_server(oip_repository: Path, server_factory) -> OipServer:
    port = free_port()
    return OipServer(server_factory(oip_repository, "--grpc-port", str(port)), port)


@pytest.fixture(scope="session")
def strict_oip_server(oip_repository: Path, server_factory) -> OipServer:
    """API keys, an admission bound that little work passes, and messages up to 8 MiB (so that a million empty
    strings reach the server's own count check rather than the size limit)."""
    port = free_port()
    server = server_factory(
        oip_repository,
        "--grpc-port",
        str(port),
        "--max-queue-s",
        "0.02",
        "--max-body-bytes",
        str(8 * 1024 * 1024),
        env={"BERTSERVE_API_KEYS": API_KEY},
    )
    return OipServer(server, port)
