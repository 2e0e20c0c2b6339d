"""`python -m export demo` offline: one small random-weight model per task, real tokenizer, marked as demo, fused and
validated, and one line saying so. The hub path: test_demo_hub.py."""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer

from export.cli import main
from export.repository import read_config


def test_demo_repository(tmp_path: Path, capsys) -> None:
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
