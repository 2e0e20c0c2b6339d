"""Staged writing: an entry appears whole or not at all, and an existing one survives a failed export."""

from __future__ import annotations

from pathlib import Path

import pytest

from export.errors import ExportError
from export.repository import check_name, staged_entry


def test_success_replaces_the_entry(tmp_path: Path) -> None:
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "old.txt").write_text("old")
    with staged_entry(tmp_path, "m") as staging:
        (staging / "new.txt").write_text("new")
        assert not (tmp_path / "m" / "new.txt").exists()  # nothing visible until the end
    assert [p.name for p in (tmp_path / "m").iterdir()] == ["new.txt"]
    assert [p.name for p in tmp_path.iterdir()] == ["m"]
    assert oct((tmp_path / "m").stat().st_mode & 0o777) == "0o755"


def test_failure_keeps_the_old_entry_and_drops_the_staging(tmp_path: Path) -> None:
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "old.txt").write_text("old")
    with pytest.raises(RuntimeError), staged_entry(tmp_path, "m") as staging:
        (staging / "half.onnx").write_text("half")
        raise RuntimeError("boom")
    assert [p.name for p in tmp_path.iterdir()] == ["m"]
    assert (tmp_path / "m" / "old.txt").read_text() == "old"


def test_failure_in_a_new_repository_removes_it(tmp_path: Path) -> None:
    repository = tmp_path / "fresh"
    with pytest.raises(RuntimeError), staged_entry(repository, "m"):
        raise RuntimeError("boom")
    assert not repository.exists()


@pytest.mark.parametrize("name", ["sst2", "minilm-bert-sst2", "a.b_c-1"])
def test_good_names(name: str) -> None:
    assert check_name(name) == name


@pytest.mark.parametrize("name", ["", "Upper", "with space", "../escape", ".hidden", "a/b", "x" * 65, "end."])
def test_bad_names(name: str) -> None:
    with pytest.raises(ExportError, match="not a valid model name"):
        check_name(name)
