"""Staged writing: an entry appears whole or not at all, and an existing one survives a failed export."""

from __future__ import annotations

import fcntl
import os
import shutil
import time
from pathlib import Path

import pytest

from export.cli import main
from export.errors import ExportError
from export.repository import STAGING_LOCK, check_name, check_target, staged_entry


def old_entry(path: Path) -> Path:
    """An entry a previous export wrote: a folder with model.json."""
    path.mkdir()
    (path / "model.json").write_text("{}")
    (path / "old.txt").write_text("old")
    return path


def test_success_replaces_the_entry(tmp_path: Path) -> None:
    old_entry(tmp_path / "m")
    with staged_entry(tmp_path, "m") as staging:
        (staging / "new.txt").write_text("new")
        assert not (tmp_path / "m" / "new.txt").exists()  # nothing visible until the end
    assert [p.name for p in (tmp_path / "m").iterdir()] == ["new.txt"]
    assert [p.name for p in tmp_path.iterdir()] == ["m"]
    assert oct((tmp_path / "m").stat().st_mode & 0o777) == "0o755"


def test_failure_keeps_the_old_entry_and_drops_the_staging(tmp_path: Path) -> None:
    old_entry(tmp_path / "m")
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


def snapshot(directory: Path) -> dict[str, bytes | None]:
    return {str(p.relative_to(directory)): p.read_bytes() if p.is_file() else None for p in directory.rglob("*")}


@pytest.mark.parametrize(
    ("checkpoint_at", "repository_at", "relation"),
    [
        ("models/sentiment", "models", "is the checkpoint folder"),  # the default --repository: models/NAME
        ("models/sentiment/inner", "models", "holds the checkpoint folder"),
        ("ckpt", "ckpt", "lies inside the checkpoint folder"),
        ("real/sentiment", "link", "is the checkpoint folder"),  # through a symlink to the checkpoint's parent
    ],
)
def test_the_checkpoint_folder_is_never_the_entry(
    tiny_checkpoint, tmp_path: Path, capsys, checkpoint_at: str, repository_at: str, relation: str
) -> None:
    checkpoint = tmp_path / checkpoint_at
    checkpoint.parent.mkdir(parents=True, exist_ok=True)
    shutil.copytree(tiny_checkpoint("bert", "classification"), checkpoint)
    if repository_at == "link":
        (tmp_path / "link").symlink_to(tmp_path / "real")
    before = snapshot(tmp_path)
    code = main([str(checkpoint), "--name", "sentiment", "--repository", str(tmp_path / repository_at), "--quiet"])
    err = capsys.readouterr().err.strip()
    assert code == 1 and err.startswith("error: ") and "\n" not in err, err
    assert relation in err and "choose another --name or --repository" in err
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("kind", ["file", "folder", "link"])
def test_what_is_not_an_entry_is_not_replaced(tiny_checkpoint, tmp_path: Path, capsys, kind: str) -> None:
    repository = tmp_path / "models"
    repository.mkdir()
    target = repository / "x"
    if kind == "file":
        target.write_text("hi")
    elif kind == "folder":
        target.mkdir()
        (target / "notes.txt").write_text("mine")
    else:
        old_entry(tmp_path / "elsewhere")
        target.symlink_to(tmp_path / "elsewhere")
    before = snapshot(tmp_path)
    code = main([str(tiny_checkpoint("bert", "classification")), "--name", "x", "--repository", str(repository)])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert code == 1
    assert err == f"error: {target} exists and is not an export entry: not replaced"
    assert snapshot(tmp_path) == before
    with pytest.raises(ExportError, match="is not an export entry"), staged_entry(repository, "x"):
        pass  # the staging writer refuses too, whoever calls it
    assert snapshot(tmp_path) == before


def test_an_entry_or_nothing_may_be_replaced(tmp_path: Path) -> None:
    old_entry(tmp_path / "m")
    check_target(tmp_path, "m", str(tmp_path / "elsewhere"))
    check_target(tmp_path, "new", "someone/hub-model")


def test_the_staging_folders_of_killed_exports_are_removed_and_a_running_ones_kept(tmp_path: Path) -> None:
    """An export killed (kill -9, an OOM kill) leaves its staging folder: nothing of it runs to clean up, and they
    piled up (~200 MB each for a real model). The next export of the name removes those whose lock is free."""
    repository = tmp_path / "models"
    repository.mkdir()
    killed = repository / ".m.staging-killed"
    killed.mkdir()
    (killed / STAGING_LOCK).touch()  # its export died: nobody holds the lock
    (killed / "model.fp32.onnx").write_bytes(b"x" * 1000)
    unlocked = repository / ".m.staging-old"  # killed before it locked, long ago
    unlocked.mkdir()
    os.utime(unlocked, (time.time() - 3600, time.time() - 3600))
    young = repository / ".m.staging-young"  # an export that is making its folder right now
    young.mkdir()
    running = repository / ".m.staging-running"
    running.mkdir()
    other = repository / ".other.staging-killed"  # another name's: not this export's to judge
    other.mkdir()
    (other / STAGING_LOCK).touch()
    with (running / STAGING_LOCK).open("w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        with staged_entry(repository, "m") as staging:
            (staging / "model.json").write_text("{}")
        left = sorted(path.name for path in repository.iterdir())
    assert left == [".m.staging-running", ".m.staging-young", ".other.staging-killed", "m"], left
    assert sorted(path.name for path in (repository / "m").iterdir()) == ["model.json"]  # no lock file in the entry
