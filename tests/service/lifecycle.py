"""Helpers for the lifecycle tests (load, reload, unload while serving): entries published as the export publishes
them, a closed loop of requests that records every status, and the series of /metrics."""

from __future__ import annotations

import itertools
import json
import shutil
import threading
import time
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from export.repository import staged_entry

_EXPORTS = itertools.count(1)


def publish(repository: Path, name: str, source: Path, *, corrupt: bool = False, half: bool = False) -> None:
    """A new export of `source` as entry `name`, renamed into place as the export does: a new version (model.json's
    export time differs). `corrupt`: its ONNX file is garbage; `half`: only model.json made it."""
    with staged_entry(repository, name) as staging:
        for path in source.iterdir():
            if half and path.name != "model.json":
                continue
            shutil.copy(path, staging / path.name)
        config = json.loads((source / "model.json").read_text())
        config["export"]["created_at"] = f"2026-01-01T00:00:{next(_EXPORTS) % 60:02d}+00:00"
        config["export"]["seconds"] = next(_EXPORTS)  # the digest changes whatever the clock says
        (staging / "model.json").write_text(json.dumps(config))
        if corrupt:
            (staging / "model.fp32.onnx").write_bytes(b"not an onnx graph")


class Traffic:
    """Requests one after another from `clients` threads until stopped: every status is kept, from the end of a
    warm-up (WARM_S, while the admission gate of a server that just started measures its rate: it may refuse some
    requests then, and that is not what these tests look at)."""

    WARM_S = 1.5

    def __init__(self, url: str, path: str, body: dict, headers: dict | None = None, clients: int = 2) -> None:
        self.statuses: list[int] = []
        self.bodies: list[str] = []
        self._warm = threading.Event()
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._run, args=(url, path, body, headers or {}), daemon=True)
            for _ in range(clients)
        ]

    def _run(self, url: str, path: str, body: dict, headers: dict) -> None:
        with httpx.Client(base_url=url, timeout=30, headers=headers) as client:
            for _ in range(100_000):  # bounded: stopped long before
                if self._stop.is_set():
                    return
                response = client.post(path, json=body)
                if not self._warm.is_set():
                    continue
                self.statuses.append(response.status_code)
                if response.status_code != 200:
                    self.bodies.append(response.text)

    def __enter__(self) -> Traffic:
        for thread in self._threads:
            thread.start()
        time.sleep(self.WARM_S)
        self._warm.set()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(60)


def samples(url: str, name: str, headers: dict | None = None) -> dict[tuple, float]:
    """The samples of one series of /metrics, by their labels' values."""
    text = httpx.get(url + "/metrics", headers=headers or {}).text
    return {
        tuple(sorted(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name
    }


def models(client: httpx.Client) -> dict[str, dict]:
    return {m["name"]: m for m in client.get("/v1/models").json()["models"]}
