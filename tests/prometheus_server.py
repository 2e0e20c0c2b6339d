"""A real Prometheus server (Debian's `prometheus` package) scraping running services, for the tests."""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from tests.harness.serving import free_port

PROMETHEUS = shutil.which("prometheus")
needs_prometheus = pytest.mark.skipif(
    PROMETHEUS is None, reason="the prometheus binary is absent (apt-get install prometheus; .ci/run installs it)"
)


def query(url: str, expression: str) -> list[dict]:
    response = httpx.get(f"{url}/api/v1/query", params={"query": expression}, timeout=5)
    response.raise_for_status()
    return response.json()["data"]["result"]


def wait_for(url: str, expression: str, timeout: float = 60) -> list[dict]:
    """The query's result as soon as it is not empty (Prometheus starting up, scrapes to come); [] at timeout."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        time.sleep(1)
        try:
            found = query(url, expression)
        except httpx.TransportError:
            continue
        if found:
            return found
    return []


@contextmanager
def running_prometheus(
    targets: list[str],
    workdir: Path,
    labels: dict[str, str] | None = None,
    job: str = "bertserve",
    rule_files: list[Path] | None = None,
) -> Iterator[str]:
    """Prometheus scraping `targets` (host:port) every second, their series carrying `labels`, evaluating
    `rule_files` every second; yields its URL."""
    assert PROMETHEUS is not None
    static = {"targets": targets, **({"labels": labels} if labels else {})}
    config = workdir / "prometheus.yml"
    rules = f"rule_files: {_flow([str(path) for path in rule_files])}\n" if rule_files else ""
    config.write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        + rules
        + f"scrape_configs:\n  - job_name: {job}\n    static_configs: [{_flow(static)}]\n"
    )
    port = free_port()
    log_path = workdir / "prometheus.log"
    with log_path.open("w") as log:
        process = subprocess.Popen(
            [
                PROMETHEUS,
                f"--config.file={config}",
                f"--storage.tsdb.path={workdir / 'prometheus-data'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            yield f"http://127.0.0.1:{port}"
        finally:
            process.terminate()
            process.wait(30)


def firing(url: str) -> list[dict]:
    """The alerts firing now: their labels."""
    response = httpx.get(f"{url}/api/v1/alerts", timeout=5)
    response.raise_for_status()
    return [alert["labels"] for alert in response.json()["data"]["alerts"] if alert["state"] == "firing"]


def log_tail(workdir: Path) -> str:
    return (workdir / "prometheus.log").read_text()[-2000:]


def _flow(value: object) -> str:
    """YAML flow style for a small dict/list of strings."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_flow(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(_flow(v) for v in value) + "]"
    return f"'{value}'"
