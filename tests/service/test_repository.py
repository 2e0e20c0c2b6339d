"""Entry names and versions (service.repository): the names a load call may carry, and a version that follows the
entry's content."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from service.repository import entry_version, name_problem
from tests.service.lifecycle import publish


@pytest.mark.parametrize("name", ["a", "minilm-bert-sst2", "v1.2_b", "x" * 64])
def test_names_of_entries_are_accepted(name: str) -> None:
    assert name_problem(name) is None


@pytest.mark.parametrize("name", ["", "a/b", "..", "a..b", "../etc", "a\x00b", "Upper", ".hidden", "a.", "x" * 65])
def test_names_that_could_leave_the_repository_are_refused(name: str) -> None:
    problem = name_problem(name)
    assert problem is not None and "not a model name" in problem
    assert "\x00" not in problem  # a NUL is shown escaped


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


def test_an_embedding_entry_fails_to_load_with_one_clear_line(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The export writes task `embedding` entries that this server does not serve: such an entry fails to load,
    logged with the reason, and the others are served (--load-failure skip) or the start is refused (fail)."""
    import logging

    from service.errors import StartupError
    from service.repository import load_entries, read_config
    from service.settings import Settings
    from tests.export.embedding_models import MINIMAL_ENTRY_CONFIG as config

    entry = tmp_path / "embed"
    entry.mkdir()
    (entry / "model.json").write_text(json.dumps(config))
    reason = "task embedding is exported but not served by this version"
    with pytest.raises(ValueError, match=reason):
        read_config(entry)
    failed: list[tuple[str, str]] = []
    log = logging.getLogger("tests.repository")
    with caplog.at_level(logging.ERROR, logger="tests.repository"):
        load_entries(Settings(repository=tmp_path), log, read_config, lambda name, why: failed.append((name, why)))
    assert failed == [("embed", f"ValueError: {reason}")]
    assert [r.getMessage() for r in caplog.records] == [f"model embed failed to load: ValueError: {reason}"]
    with pytest.raises(StartupError, match=f"model embed failed to load: ValueError: {reason}"):
        load_entries(Settings(repository=tmp_path, load_failure="fail"), log, read_config, lambda *_: None)
