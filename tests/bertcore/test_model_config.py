"""The model.json contract: what the export writes is exactly what the server's one reader accepts."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from bertcore.model_config import FORMAT_VERSION, ModelConfig
from export.pipeline import export_checkpoint
from export.repository import write_config


@pytest.fixture(scope="module")
def entry(tiny_checkpoint, tmp_path_factory: pytest.TempPathFactory) -> Path:
    repository = tmp_path_factory.mktemp("model-config")
    export_checkpoint(str(tiny_checkpoint("roberta", "ner")), "roberta-ner", repository, variants="fp32,int8")
    return repository / "roberta-ner"


@pytest.fixture(scope="module")
def written(entry: Path) -> dict:
    return json.loads((entry / "model.json").read_text())


def test_an_exported_entry_reads_back_typed(entry: Path, written: dict) -> None:
    config = ModelConfig.read(entry)
    assert (config.task, config.per_token, config.inputs) == ("ner", True, ("input_ids", "attention_mask"))
    assert config.labels == tuple(written["labels"]) and config.max_length == written["max_length"]
    assert (
        config.tokenizer.file == "tokenizer.json"
        and config.tokenizer.pad_token_id == written["tokenizer"]["pad_token_id"]
    )
    assert (entry / config.variant_file("int8")).is_file()
    assert config.tokenizer.padding_side == "right"
    older = copy.deepcopy(written)
    del older["tokenizer"]["padding_side"]  # entries written before the server read it pad on the right
    assert ModelConfig.parse(older).tokenizer.padding_side == "right"
    assert config.rerank is False and written["rerank"] is False


def test_an_entry_written_before_rerank_was_recorded_is_not_a_reranker(written: dict) -> None:
    older = {key: value for key, value in written.items() if key != "rerank"}
    assert ModelConfig.parse(older).rerank is False


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda c: c.update(format_version=FORMAT_VERSION + 1), "format_version"),
        (lambda c: c.update(task="summarization"), "unknown task"),
        (lambda c: c.pop("max_length"), "'max_length' is missing"),
        (lambda c: c.update(max_length="512"), "'max_length' is missing or not a int"),
        (lambda c: c["tokenizer"].pop("file"), "'file' is missing"),
        (lambda c: c["variants"].pop("fp32"), "must include fp32"),
        (lambda c: c.update(outputs="logits"), "'outputs' is missing or not a list"),
        (lambda c: c["encoder"].update(vocab_size="30522"), "'vocab_size' is missing or not a int"),
        (lambda c: c["encoder"].update(vocab_size=0), "encoder.vocab_size 0 is not a vocabulary size"),
        (lambda c: c["tokenizer"].update(padding_side="top"), "padding_side 'top' is neither"),
        (lambda c: c.update(rerank=True), "marks a rerank entry that is not a classification entry with one label"),
        (lambda c: c.update(rerank="yes"), "'rerank' is not true or false"),
    ],
)
def test_what_the_server_relies_on_is_checked_by_name(written: dict, change, message: str, tmp_path: Path) -> None:
    broken = copy.deepcopy(written)
    change(broken)
    with pytest.raises(ValueError, match=message):
        ModelConfig.parse(broken)
    with pytest.raises(ValueError, match=message):  # the export refuses to write it in the first place
        write_config(tmp_path, broken)
    assert not (tmp_path / "model.json").exists()


@pytest.mark.parametrize("data", [[], "model", 3, None])
def test_a_model_json_that_is_not_an_object_says_so(data: object) -> None:
    """`[]` failed the load with "AttributeError: 'list' object has no attribute 'get'"."""
    with pytest.raises(ValueError, match=r"model\.json is not a JSON object"):
        ModelConfig.parse(data)  # type: ignore[arg-type]
