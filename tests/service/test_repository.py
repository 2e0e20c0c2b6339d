"""Entry names and versions (service.repository): the names a load call may carry, and a version that follows the
entry's content."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest

from service.repository import entry_version, name_problem, scan
from service.settings import Settings
from tests.service.lifecycle import publish


@pytest.mark.parametrize("name", ["a", "minilm-bert-sst2", "v1.2_b", "x" * 64])
def test_names_of_entries_are_accepted(name: str) -> None:
    assert name_problem(name) is None


@pytest.mark.parametrize("name", ["", "a/b", "..", "a..b", "../etc", "a\x00b", "Upper", ".hidden", "a.", "x" * 65])
def test_names_that_could_leave_the_repository_are_refused(name: str) -> None:
    problem = name_problem(name)
    assert problem is not None and "not a model name" in problem
    assert "\x00" not in problem  # a NUL is shown escaped


def test_folders_not_named_as_models_are_left_out_and_said_once(tmp_path: Path, caplog) -> None:
    """`none` served "Upper" and "bad name", poll never loaded them without a word, explicit listed them and refused
    to load them: every control mode now leaves them out, with one warning each."""
    for name in ("good", "Upper", "bad name"):
        (tmp_path / name).mkdir()
    settings = Settings(repository=tmp_path)
    with caplog.at_level(logging.WARNING, logger="service.repository"):
        assert list(scan(settings)) == ["good"]
        assert list(scan(settings)) == ["good"]  # the poll's next scan: no second warning
    warned = [r.getMessage() for r in caplog.records if "of the repository not served" in r.getMessage()]
    assert len(warned) == 2 and any("folder Upper " in line for line in warned), warned


def test_a_version_follows_the_content_and_names_the_export_time(tiny_repository: Path, tmp_path: Path) -> None:
    publish(tmp_path, "a", tiny_repository / "bert-classification")
    first = entry_version(tmp_path / "a")
    created = json.loads((tmp_path / "a" / "model.json").read_text())["export"]["created_at"]
    assert first.startswith(created[:10].replace("-", "")) and len(first.split("-")[-1]) == 12
    assert entry_version(tmp_path / "a") == first  # the same files: the same version (from the cache or not)
    shutil.copytree(tmp_path / "a", tmp_path / "copy")
    assert entry_version(tmp_path / "copy") == first  # a copy of one export is the same version
    publish(tmp_path, "a", tiny_repository / "bert-classification")
    assert entry_version(tmp_path / "a") != first  # a new export is a new version
    with (tmp_path / "copy" / "tokenizer.json").open("a") as tokenizer:
        tokenizer.write(" ")
    assert entry_version(tmp_path / "copy") != first


def test_an_embedding_entry_is_served(tmp_path: Path) -> None:
    """The export writes task `embedding` entries, and this server serves them: the entry's config is read with its
    vector's spec, and it loads at start as any other entry (no failure, even under --load-failure fail)."""
    from service.repository import SERVED_TASKS, load_entries, read_config
    from service.settings import Settings
    from tests.export.embedding_models import MINIMAL_ENTRY_CONFIG as config

    entry = tmp_path / "embed"
    entry.mkdir()
    (entry / "model.json").write_text(json.dumps(config))
    read = read_config(entry)
    assert "embedding" in SERVED_TASKS and read.task == "embedding" and not read.per_token
    assert read.embedding is not None and read.embedding.dimension == 384 and read.embedding.normalize
    loaded: list[str] = []
    failed: list[tuple[str, str]] = []
    settings = Settings(repository=tmp_path, load_failure="fail")
    load_entries(
        settings,
        logging.getLogger("tests.repository"),
        lambda path: loaded.append(read_config(path).task),
        lambda name, why: failed.append((name, why)),
    )
    assert loaded == ["embedding"] and failed == []
