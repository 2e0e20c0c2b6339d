"""The model repository on disk: which entries to serve, their `model.json` and their version. Read alike by the
front-end (tokenizer, task, labels) and the engine (sessions), so both sides agree on what is served.

A version names one export of an entry: the export's time (model.json's export.created_at) and a digest of the
entry's files (model.json included), e.g. `20261126T101500Z-3fa9c1d2e4b5`. The export renames a complete entry
into place, so a new export is a new version; a copy of the same export is the same version. No versioned folders:
the export writes one folder per model, and a rollout replaces it (or points the server at a new volume).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import threading
from collections.abc import Callable
from pathlib import Path

from bertcore.messages import one_line
from bertcore.model_config import MODEL_CONFIG, ModelConfig
from service.errors import StartupError
from service.settings import Settings

# What the export accepts as an entry's name (export.repository.check_name): names travel in URLs and on the wire.
NAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")
CHUNK = 1 << 20
# The tasks this version serves: every task the export writes (an entry of a task not listed here would fail to
# load with that reason, like any unloadable entry).
SERVED_TASKS = ("classification", "ner", "qa", "embedding")


def name_problem(name: str) -> str | None:
    """Why `name` cannot name an entry (a path separator, '..', a NUL, ...), or None."""
    if NAME.fullmatch(name) and not name.endswith(".") and ".." not in name:
        return None
    shown = name[:100].encode("unicode_escape").decode()
    return (
        f"{shown!r} is not a model name: 1 to 64 lower-case letters, digits, '.', '_' or '-', starting with a "
        "letter or digit (no '/', '..' or control characters)"
    )


_MISNAMED: set[str] = set()  # folders whose name is no model's, said once each


def scan(settings: Settings) -> dict[str, Path]:
    """The repository's entries by name (folders not starting with '.'; only --models where it is set); OSError
    where the repository cannot be listed."""
    entries = {p.name: p for p in settings.repository.iterdir() if p.is_dir() and not p.name.startswith(".")}
    misnamed = {name: problem for name in entries if (problem := name_problem(name))}
    for name, problem in misnamed.items():
        # left out under every model control, said once: `none` served "Upper" and "bad name", poll never loaded
        # them without a word, explicit listed them and refused to load them
        del entries[name]
        if name not in _MISNAMED:
            _MISNAMED.add(name)
            logging.getLogger("service.repository").warning("folder %s of the repository not served: %s", name, problem)
    if settings.models:
        entries = {name: path for name, path in entries.items() if name in settings.models}
    return dict(sorted(entries.items()))


def discover(settings: Settings) -> list[Path]:
    """The entries to load at start; StartupError where there is nothing sensible to serve. Under --model-control
    explicit, the --model entries (maybe none); under poll, an empty repository is fine (entries come later)."""
    repository = settings.repository
    if not repository.is_dir():
        what = "is not a folder" if repository.exists() else "does not exist"
        raise StartupError(f"model repository {repository} {what} (build one: python -m export ...)")
    found = scan(settings)
    wanted = settings.model if settings.model_control == "explicit" else settings.models
    if wanted:
        flag = "--model" if settings.model_control == "explicit" else "--models"
        for name in wanted:
            if problem := name_problem(name):
                raise StartupError(f"{flag} {problem}")
        missing = sorted(set(wanted) - set(found))
        if missing:
            raise StartupError(f"{flag} names entries that are not in {repository}: {', '.join(missing)}")
    entries = [found[name] for name in found if settings.model_control != "explicit" or name in (wanted or ())]
    if not entries and settings.model_control == "none":
        if (repository / "model.json").is_file():  # the entry itself, not the folder of entries
            raise StartupError(
                f"model repository {repository} is one model's entry (it holds model.json): pass the folder that "
                f"holds it, --repository {repository.parent}"
            )
        raise StartupError(f"model repository {repository} has no entries (build one: python -m export ...)")
    for entry in entries:
        if problem := budget_problem(entry, settings):
            raise StartupError(problem)
    return entries


def budget_problem(entry: Path, settings: Settings) -> str | None:
    """Why --max-batch-tokens cannot serve the entry, if it cannot: at start, and at each later load (a model
    loaded through the API or found by the poll had been served past the budget)."""
    try:
        max_length = int(json.loads((entry / MODEL_CONFIG).read_text(encoding="utf-8"))["max_length"])
    except (OSError, ValueError, KeyError, TypeError):
        return None  # an unreadable entry fails (and is reported) when it loads
    if max_length > settings.max_batch_tokens:
        return (
            f"max_batch_tokens ({settings.max_batch_tokens}) is below model {entry.name}'s max_length "
            f"({max_length}): a full-length input could never be batched"
        )
    return None


class _VersionCache:
    """Versions by the entry's file signature (each file's name, inode, size and times): a scan every few seconds
    stats the files and hashes only an entry whose files changed."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._known: dict[Path, tuple[tuple, str]] = {}

    def version(self, entry: Path) -> str:
        signature = file_signature(entry)
        with self._lock:
            known = self._known.get(entry)
        if known is not None and known[0] == signature:
            return known[1]
        version = _hash_version(entry)
        if file_signature(entry) != signature:
            raise ValueError(f"entry {entry.name} changed while it was read (an export still writing it?)")
        with self._lock:
            self._known[entry] = (signature, version)
        return version


def file_signature(entry: Path) -> tuple:
    """Every file of the entry with its inode, size and times; OSError where the entry cannot be listed."""
    files = []
    for root, _, names in os.walk(entry):
        for name in names:
            path = Path(root, name)
            info = path.stat()
            files.append((str(path.relative_to(entry)), info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns))
    return tuple(sorted(files))


def _hash_version(entry: Path) -> str:
    digest = hashlib.sha256()
    for relative, *_ in file_signature(entry):
        digest.update(relative.encode() + b"\0")
        with (entry / relative).open("rb") as file:
            while chunk := file.read(CHUNK):
                digest.update(chunk)
    created = ""
    try:
        export = json.loads((entry / MODEL_CONFIG).read_text(encoding="utf-8")).get("export") or {}
        created = str(export.get("created_at") or "")
    except (OSError, ValueError, AttributeError):
        pass
    stamp = re.sub(r"[^0-9TZ]", "", created.replace("+00:00", "Z"))
    return f"{stamp}-{digest.hexdigest()[:12]}" if stamp else digest.hexdigest()[:12]


_VERSIONS = _VersionCache()


def entry_version(entry: Path) -> str:
    """The entry's version (see the module's doc); ValueError or OSError where it cannot be read whole."""
    return _VERSIONS.version(entry)


def read_config(entry: Path) -> ModelConfig:
    """An entry's model.json, checked for what the server relies on (ValueError/OSError otherwise), of a task this
    version serves."""
    config = ModelConfig.read(entry)
    if config.task not in SERVED_TASKS:
        raise ValueError(f"task {config.task} is exported but not served by this version")
    return config


class EntryFailed(Exception):
    """An entry that failed to load, its reason already one line (`one_line`'s "Type: message"): said as it is."""


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
            reason = str(exc) if isinstance(exc, EntryFailed) else one_line(exc, hide=settings.repository)
            log.error("model %s failed to load: %s", entry.name, reason)
            failed(entry.name, reason)
            if settings.load_failure == "fail":
                raise StartupError(f"model {entry.name} failed to load: {reason}") from exc
