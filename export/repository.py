"""Model-repository entries: one folder per model, written to a staging folder and renamed into place."""

from __future__ import annotations

import json
import re
import shutil
import tempfile
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


@contextmanager
def staged_entry(repository: Path, name: str) -> Iterator[Path]:
    """Yield an empty staging folder; on success it replaces `repository/name`, on any failure it vanishes.

    The staging folder sits inside the repository (same file system) and starts with '.', which the server
    skips. The old entry is moved aside before the new one is renamed in, and put back if that rename fails.
    """
    created_repository = not repository.exists()
    try:
        repository.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{name}.staging-", dir=repository))
        staging.chmod(0o755)  # mkdtemp makes it private; the entry is read by the server, maybe as another user
    except OSError as exc:
        raise ExportError(f"cannot write to the model repository {repository}: {exc.strerror or exc}") from exc
    try:
        yield staging
        _replace(staging, repository / name)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        if created_repository and repository.is_dir() and not any(repository.iterdir()):
            repository.rmdir()
        raise


def _replace(staging: Path, target: Path) -> None:
    retired = None
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
