"""A real Prometheus server (Debian's `prometheus` package) scrapes a running service; a query returns data."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from benchmarks.serving import free_port

PROMETHEUS = shutil.which("prometheus")
pytestmark = pytest.mark.skipif(
    PROMETHEUS is None, reason="the prometheus binary is absent (apt-get install prometheus; .ci/run installs it)"
)


def query(url: str, expression: str) -> list[dict]:
    response = httpx.get(f"{url}/api/v1/query", params={"query": expression}, timeout=5)
    response.raise_for_status()
    return response.json()["data"]["result"]


def test_prometheus_scrapes_the_request_counter(tiny_repository: Path, server_factory, tmp_path: Path) -> None:
    server = server_factory(tiny_repository, "--models", "bert-classification,bert-ner")
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        "scrape_configs:\n"
        "  - job_name: bertserve\n"
        f"    static_configs: [{{targets: ['{server.url.removeprefix('http://')}']}}]\n"
    )
    port = free_port()
    prometheus_url = f"http://127.0.0.1:{port}"
    log = (tmp_path / "prometheus.log").open("w")
    prometheus = subprocess.Popen(
        [
            PROMETHEUS,
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        with server.client() as client:
            for text in ("one", "two", "three"):
                assert (
                    client.post("/v1/models/bert-classification/classify", json={"inputs": [text]}).status_code == 200
                )
        deadline = time.monotonic() + 60
        found: list[dict] = []
        while time.monotonic() < deadline and not found:
            time.sleep(1)
            try:
                found = query(prometheus_url, 'bertserve_requests_total{model="bert-classification",status="200"}')
            except httpx.TransportError:
                continue
        assert found, (tmp_path / "prometheus.log").read_text()[-2000:]
        assert float(found[0]["value"][1]) >= 3
        assert found[0]["metric"]["endpoint"] == "classify" and found[0]["metric"]["job"] == "bertserve"
        up = query(prometheus_url, 'up{job="bertserve"}')
        assert up and up[0]["value"][1] == "1"
        info = query(prometheus_url, "bertserve_model_info")
        assert {series["metric"]["model"] for series in info} == {"bert-classification", "bert-ner"}
    finally:
        prometheus.terminate()
        prometheus.wait(30)
        log.close()
