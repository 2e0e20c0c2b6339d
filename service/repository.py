"""The model repository on disk: which entries to serve and their `model.json`. Read alike by the front-end
(tokenizer, task, labels) and the engine (sessions), so both sides agree on what is served."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path

from bertcore.messages import one_line
from bertcore.model_config import MODEL_CONFIG, ModelConfig
from service.errors import StartupError
from service.settings import Settings


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


def load_entries(
    settings: Settings, log: logging.Logger, load: Callable[[Path], None], failed: Callable[[str, str], None]
) -> None:
    """Run `load` on every entry to serve: the loop the front-end (configs, tokenizers) and the engine (sessions) both
    run at start. A failure is logged and handed to `failed(name, reason)`, or raised as StartupError where
    --load-failure is fail."""
    for entry in discover(settings):
        try:
            load(entry)
        except Exception as exc:
            reason = one_line(exc, hide=settings.repository)
            log.error("model %s failed to load: %s", entry.name, reason)
            failed(entry.name, reason)
            if settings.load_failure == "fail":
                raise StartupError(f"model {entry.name} failed to load: {reason}") from exc
