"""`python -m export demo` offline: one small random-weight model per task, real tokenizer, marked as demo, fused and
validated, and one line saying so. The hub path: test_demo_hub.py."""

from __future__ import annotations

import logging
from pathlib import Path

from fastapi.testclient import TestClient
from tokenizers import Tokenizer

from export.cli import main
from export.repository import read_config
from service.frontend.http.app import create_app
from service.frontend.registry import DEMO_NOTE
from service.settings import Settings
from tests.service.conftest import wait_for


def test_demo_repository(tmp_path: Path, capsys, caplog) -> None:
    assert main(["demo", "--repository", str(tmp_path), "--quiet"]) == 0  # offline: tests/conftest.py
    out, err = capsys.readouterr()
    assert "[demo]" in out
    assert err.strip().splitlines() == [
        "note: HF_HUB_OFFLINE and TRANSFORMERS_OFFLINE are set: built the random-weight demo "
        f"(its answers are not meaningful); online, "
        f"`python -m export demo --repository {tmp_path}` fetches real ones from the hub, "
        "or export your own checkpoint: `python -m export CHECKPOINT --name NAME`"
    ]
    configs = {entry.name: read_config(entry) for entry in sorted(tmp_path.iterdir())}
    assert {config["task"] for config in configs.values()} == {"classification", "ner", "qa"}
    assert {config["model_type"] for config in configs.values()} >= {"bert", "distilbert", "albert"}
    for name, config in configs.items():
        assert config["demo"] is True and config["source"]["kind"] == "demo"
        assert config["variants"]["fp32"]["fused_operators"]["Attention"] == config["encoder"]["layers"]
        assert config["variants"]["fp32"]["validation"]["passed"]
        tokenizer = Tokenizer.from_file(str(tmp_path / name / "tokenizer.json"))
        assert tokenizer.get_vocab_size() == 30522  # the real uncased WordPiece vocabulary
        assert tokenizer.encode("unbelievable").tokens == ["[CLS]", "unbelievable", "[SEP]"]

    # served, each is said to be a demo in the server's log too (it was marked only in /v1/models)
    caplog.set_level(logging.INFO, logger="service.frontend.registry")
    with TestClient(create_app(Settings(repository=tmp_path))) as client:
        assert wait_for(lambda: client.get("/readyz").status_code == 200)
    said = [r.getMessage() for r in caplog.records if "serving version" in r.getMessage()]
    assert len(said) == len(configs) and all(message.endswith(DEMO_NOTE) for message in said), said
