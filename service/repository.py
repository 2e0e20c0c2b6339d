"""The model repository on disk: which entries to serve and their `model.json`. Read alike by the front-end
(tokenizer, task, labels) and the engine (sessions), so both sides agree on what is served."""

from __future__ import annotations

import json
from pathlib import Path

from bertcore.model_config import MODEL_CONFIG, ModelConfig
from service.settings import Settings


class StartupError(Exception):
    """The server must not start; the message says why."""


def discover(settings: Settings) -> list[Path]:
    """The entries to serve; StartupError where there is nothing sensible to serve."""
    repository = settings.repository
    if not repository.is_dir():
        raise StartupError(f"model repository {repository} does not exist (build one: python -m export ...)")
    entries = sorted(p for p in repository.iterdir() if p.is_dir() and not p.name.startswith("."))
    if settings.models:
        missing = sorted(set(settings.models) - {p.name for p in entries})
        if missing:
            raise StartupError(f"--models names entries that are not in {repository}: {', '.join(missing)}")
        entries = [p for p in entries if p.name in settings.models]
    if not entries:
        raise StartupError(f"model repository {repository} has no entries (build one: python -m export ...)")
    for entry in entries:
        _check_budget(entry, settings)
    return entries


def _check_budget(entry: Path, settings: Settings) -> None:
    try:
        max_length = int(json.loads((entry / MODEL_CONFIG).read_text(encoding="utf-8"))["max_length"])
    except (OSError, ValueError, KeyError, TypeError):
        return  # an unreadable entry fails (and is reported) when it loads
    if max_length > settings.max_batch_tokens:
        raise StartupError(
            f"max_batch_tokens ({settings.max_batch_tokens}) is below model {entry.name}'s max_length "
            f"({max_length}): a full-length input could never be batched"
        )


def read_config(entry: Path) -> ModelConfig:
    """An entry's model.json, checked for what the server relies on (ValueError/OSError otherwise)."""
    return ModelConfig.read(entry)


def one_line(exc: BaseException, settings: Settings | None = None) -> str:
    """An exception as one line for logs and /v1/models, without where the repository sits on disk."""
    text = str(exc).strip().splitlines()
    line = f"{type(exc).__name__}: {text[0][:300]}" if text else type(exc).__name__
    return line.replace(str(settings.repository), "") if settings is not None else line
