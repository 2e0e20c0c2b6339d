"""Model-repository entries: one folder per model, written to a staging folder and renamed into place."""

from __future__ import annotations

import fcntl
import json
import re
import shutil
import signal
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bertcore.model_config import MODEL_CONFIG, ModelConfig
from export.errors import ExportError

NAME_PATTERN = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")


def check_name(name: str) -> str:
    """Entry names appear in URLs (/v1/models/NAME): lower case letters, digits, '.', '_' and '-'."""
    if not NAME_PATTERN.match(name) or name.endswith(".") or ".." in name:
        raise ExportError(
            f"--name {name!r} is not a valid model name: use 1 to 64 lower-case letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )
    return name


def check_target(repository: Path, name: str, checkpoint: str | None = None) -> None:
    """Before any work: REPOSITORY/NAME may be replaced only where it is absent or an export entry (a folder with
    model.json), and never where it is, holds or lies inside the checkpoint folder (symlinks resolved)."""
    target = repository / name
    existing = next((folder for folder in (repository, *repository.parents) if folder.exists()), None)
    if existing is not None and not existing.is_dir():  # found before the checkpoint is loaded, not at the write
        raise ExportError(f"cannot write to the model repository {repository}: {existing} is not a folder")
    if checkpoint is not None and Path(checkpoint).expanduser().exists():
        source, where = Path(checkpoint).expanduser().resolve(), target.resolve()
        if where == source or source in where.parents or where in source.parents:
            relation = "is" if where == source else "lies inside" if source in where.parents else "holds"
            raise ExportError(
                f"{target} {relation} the checkpoint folder {checkpoint}: the entry is not written over or into "
                "its checkpoint; choose another --name or --repository"
            )
    if (target.exists() or target.is_symlink()) and not is_entry(target):
        raise ExportError(f"{target} exists and is not an export entry: not replaced")


def is_entry(path: Path) -> bool:
    """A repository entry an export wrote: a folder (not a link to one) with model.json."""
    return path.is_dir() and not path.is_symlink() and (path / MODEL_CONFIG).is_file()


@contextmanager
def staged_entry(repository: Path, name: str) -> Iterator[Path]:
    """Yield an empty staging folder; on success it replaces `repository/name`, on any failure it vanishes.

    The staging folder sits inside the repository (same file system) and starts with '.', which the server
    skips. The old entry is moved aside before the new one is renamed in, and put back if that rename fails.
    While the export runs it holds a lock on a file in the folder: an export of the same name finds the folders of
    exports that were killed (kill -9, an OOM kill: nothing of theirs could clean up; a real model's left ~200 MB
    each) by their lock, free, and removes them (`_remove_abandoned`).
    """
    created_repository = not repository.exists()
    staging: Path | None = None
    lock = None
    try:
        # Ctrl-C and SIGTERM wait while the folder is made and named, so that the clean-up below always knows it
        masked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
        try:
            repository.mkdir(parents=True, exist_ok=True)
            _remove_abandoned(repository, name)
            staging = Path(tempfile.mkdtemp(prefix=f".{name}.staging-", dir=repository))
            staging.chmod(0o755)  # mkdtemp makes it private; the entry is read by the server, maybe as another user
            lock = (staging / STAGING_LOCK).open("w")
            fcntl.flock(lock, fcntl.LOCK_EX)
        except OSError as exc:
            raise ExportError(f"cannot write to the model repository {repository}: {exc.strerror or exc}") from exc
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, masked)
        yield staging
        (staging / STAGING_LOCK).unlink()  # not part of the entry (the lock stays held until the file closes)
        _replace(staging, repository / name)
    except BaseException:
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)
        if created_repository and repository.is_dir() and not any(repository.iterdir()):
            repository.rmdir()
        raise
    finally:
        if lock is not None:
            lock.close()


STAGING_LOCK = ".export.lock"  # held (flock) by the export that writes the staging folder, for its whole run
ABANDONED_UNLOCKED_S = 600.0  # a staging folder with no lock file at all, untouched this long: an export killed


def _remove_abandoned(repository: Path, name: str) -> None:
    """The staging folders of `name` whose export is gone: their lock free (its process died), or, with no lock
    file (an export killed between making the folder and locking it), untouched for ABANDONED_UNLOCKED_S."""
    for folder in repository.glob(f".{name}.staging-*"):
        try:
            with (folder / STAGING_LOCK).open("r") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # taken: nobody holds it
        except FileNotFoundError:
            try:
                if time.time() - folder.stat().st_mtime < ABANDONED_UNLOCKED_S:
                    continue
            except OSError:
                continue
        except (BlockingIOError, OSError):
            continue  # an export at work (or a folder this user cannot read)
        shutil.rmtree(folder, ignore_errors=True)


def _replace(staging: Path, target: Path) -> None:
    retired = None
    if (target.exists() or target.is_symlink()) and not is_entry(target):
        raise ExportError(f"{target} exists and is not an export entry: not replaced")
    if target.exists():
        retired = Path(tempfile.mkdtemp(prefix=f".{target.name}.retired-", dir=target.parent))
        retired.rmdir()
        target.rename(retired)
    try:
        staging.rename(target)
    except OSError as exc:
        if retired is not None:
            retired.rename(target)
        raise ExportError(f"could not move the new entry into place at {target}: {exc.strerror or exc}") from exc
    if retired is not None:
        shutil.rmtree(retired, ignore_errors=True)


def write_config(entry: Path, config: dict[str, Any]) -> None:
    ModelConfig.parse(config)  # what is written is what the server can read
    (entry / MODEL_CONFIG).write_text(json.dumps(config, indent=2, sort_keys=False) + "\n", encoding="utf-8")


def read_config(entry: Path) -> dict[str, Any]:
    return json.loads((entry / MODEL_CONFIG).read_text(encoding="utf-8"))
