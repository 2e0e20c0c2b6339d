"""A real Prometheus server (Debian's `prometheus` package) scrapes a running service; a query returns data."""

from __future__ import annotations

from pathlib import Path

from tests.prometheus_server import log_tail, needs_prometheus, query, running_prometheus, wait_for

pytestmark = needs_prometheus


def test_prometheus_scrapes_the_request_counter(tiny_repository: Path, server_factory, tmp_path: Path) -> None:
    server = server_factory(tiny_repository, "--models", "bert-classification,bert-ner")
    with running_prometheus([server.url.removeprefix("http://")], tmp_path) as prometheus_url:
        with server.client() as client:
            for text in ("one", "two", "three"):
                assert (
                    client.post("/v1/models/bert-classification/classify", json={"inputs": [text]}).status_code == 200
                )
        found = wait_for(prometheus_url, 'bertserve_requests_total{model="bert-classification",status="200"}')
        assert found, log_tail(tmp_path)
        assert float(found[0]["value"][1]) >= 3
        assert found[0]["metric"]["endpoint"] == "classify" and found[0]["metric"]["job"] == "bertserve"
        up = query(prometheus_url, 'up{job="bertserve"}')
        assert up and up[0]["value"][1] == "1"
        info = query(prometheus_url, "bertserve_model_info")
        assert {series["metric"]["model"] for series in info} == {"bert-classification", "bert-ner"}
