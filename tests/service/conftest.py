"""A real server for the integration tests: `python -m service` in its own process, on a free loopback port."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from export.pipeline import export_checkpoint

ROOT = Path(__file__).resolve().parents[2]
TINY_CELLS = [
    (arch, task) for arch in ("bert", "roberta", "albert", "distilbert") for task in ("classification", "ner", "qa")
]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class Server:
    url: str
    process: subprocess.Popen
    log_path: Path

    def client(self, **kwargs) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=kwargs.pop("timeout", 30), **kwargs)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30) -> int:
        if self.process.poll() is None:
            self.process.send_signal(sig)
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait(5)


def start_server(repository: Path, log_dir: Path, *args: str, wait_ready: bool = True) -> Server:
    port = free_port()
    log_path = log_dir / f"server-{port}.log"
    command = [
        sys.executable,
        "-m",
        "service",
        "--repository",
        str(repository),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--log-level",
        "info",
        *args,
    ]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    with log_path.open("w") as log:
        process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    server = Server(f"http://127.0.0.1:{port}", process, log_path)
    if wait_ready:
        wait_until_ready(server)
    return server


def wait_until_ready(server: Server, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(f"server exited with {server.process.returncode}:\n{server.log()}")
        try:
            if httpx.get(server.url + "/readyz", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    server.stop()
    raise RuntimeError(f"server not ready in {timeout} s:\n{server.log()}")


@pytest.fixture(scope="session")
def tiny_repository(tiny_checkpoint, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every architecture x task as a repository entry named ARCH-TASK (fp32 and int8)."""
    repository = tmp_path_factory.mktemp("tiny-repository")
    for arch, task in TINY_CELLS:
        export_checkpoint(str(tiny_checkpoint(arch, task)), f"{arch}-{task}", repository, variants="fp32,int8")
    return repository


@pytest.fixture(scope="session")
def server_factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., Server]]:
    servers: list[Server] = []
    log_dir = tmp_path_factory.mktemp("server-logs")

    def start(repository: Path, *args: str, wait_ready: bool = True) -> Server:
        server = start_server(repository, log_dir, *args, wait_ready=wait_ready)
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


@pytest.fixture(scope="session")
def tiny_server(tiny_repository: Path, server_factory) -> Server:
    return server_factory(tiny_repository)
