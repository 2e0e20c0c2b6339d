"""The model repository as the server sees it: one ServedModel per entry, loaded, warmed up, batched."""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from service.batcher import Batcher
from service.errors import ModelFailed, ModelNotFound, NotReady
from service.metrics import Metrics
from service.runtime import ModelRuntime
from service.settings import Settings
from service.tasks.base import Row
from service.tokenization import TextTokenizer

log = logging.getLogger("service.registry")
MODEL_CONFIG = "model.json"
SUPPORTED_FORMAT = 1
TASKS = ("classification", "ner", "qa")


class StartupError(Exception):
    """The server must not start; the message says why."""


@dataclass
class ServedModel:
    name: str
    entry: Path
    config: dict[str, Any] = field(default_factory=dict)
    status: str = "loading"  # loading -> ready | failed
    error: str | None = None
    note: str | None = None  # e.g. CUDA asked for but not there
    runtime: ModelRuntime | None = None
    tokenizer: TextTokenizer | None = None
    batcher: Batcher | None = None

    @property
    def task(self) -> str | None:
        return self.config.get("task")

    @property
    def labels(self) -> list[str]:
        return list(self.config.get("labels") or [])

    @property
    def max_length(self) -> int:
        return int(self.config["max_length"])


class ModelRegistry:
    def __init__(self, settings: Settings, metrics: Metrics) -> None:
        self.settings = settings
        self.metrics = metrics
        self.models: dict[str, ServedModel] = {}
        self.warmed_up = False

    def discover(self) -> list[Path]:
        """The entries to serve; StartupError where there is nothing sensible to serve."""
        repository = self.settings.repository
        if not repository.is_dir():
            raise StartupError(f"model repository {repository} does not exist (build one: python -m export ...)")
        entries = sorted(p for p in repository.iterdir() if p.is_dir() and not p.name.startswith("."))
        if self.settings.models:
            missing = sorted(set(self.settings.models) - {p.name for p in entries})
            if missing:
                raise StartupError(f"--models names entries that are not in {repository}: {', '.join(missing)}")
            entries = [p for p in entries if p.name in self.settings.models]
        if not entries:
            raise StartupError(f"model repository {repository} has no entries (build one: python -m export ...)")
        for entry in entries:
            self._check_budget(entry)
        return entries

    def _check_budget(self, entry: Path) -> None:
        try:
            max_length = int(json.loads((entry / MODEL_CONFIG).read_text(encoding="utf-8"))["max_length"])
        except (OSError, ValueError, KeyError, TypeError):
            return  # an unreadable entry fails (and is reported) when it loads
        if max_length > self.settings.max_batch_tokens:
            raise StartupError(
                f"max_batch_tokens ({self.settings.max_batch_tokens}) is below model {entry.name}'s max_length "
                f"({max_length}): a full-length input could never be batched"
            )

    def load(self) -> None:
        """Read every entry and open its session and tokenizer. Refuses to start on unsafe input (StartupError)."""
        for entry in self.discover():
            model = ServedModel(entry.name, entry)
            self.models[entry.name] = model
            try:
                self._load(model)
            except Exception as exc:
                # the message names the entry, not where the repository sits on disk
                model.status, model.error = "failed", _one_line(exc).replace(str(self.settings.repository), "")
                log.error("model %s failed to load: %s", model.name, model.error)
                if self.settings.load_failure == "fail":
                    raise StartupError(f"model {model.name} failed to load: {model.error}") from exc
            self._publish_info(model)

    def _load(self, model: ServedModel) -> None:
        config = json.loads((model.entry / MODEL_CONFIG).read_text(encoding="utf-8"))
        if config.get("format_version") != SUPPORTED_FORMAT:
            raise ValueError(
                f"{MODEL_CONFIG} format_version {config.get('format_version')!r} is not {SUPPORTED_FORMAT}"
            )
        if config.get("task") not in TASKS:
            raise ValueError(f"unknown task {config.get('task')!r}")
        model.config = config
        model.runtime = ModelRuntime(model.entry, config, self.settings)
        model.note = model.runtime.placement.note
        if model.note:
            log.warning("model %s: %s", model.name, model.note)
        tokenizer_config = config["tokenizer"]
        model.tokenizer = TextTokenizer(
            model.entry / tokenizer_config["file"], int(tokenizer_config["pad_token_id"] or 0)
        )
        log.info(
            "model %s: %s %s on %s (%s)%s",
            model.name,
            config["architecture"],
            config["task"],
            model.runtime.provider,
            model.runtime.variant,
            " [demo]" if config.get("demo") else "",
        )

    def start(self) -> None:
        for model in self.models.values():
            if model.runtime is None:
                continue
            model.batcher = Batcher(
                model.name,
                model.runtime.run,
                max_batch_size=self.settings.max_batch_size,
                max_batch_tokens=self.settings.max_batch_tokens,
                max_wait_s=self.settings.max_wait_ms / 1000,
                max_queue_rows=self.settings.max_queue_rows,
                max_padding_ratio=self.settings.max_padding_ratio,
                observer=self.metrics.observer(model.name),
            )
            model.batcher.start()

    async def warm_up(self) -> None:
        """Run each model once at a short and a full length (first runs allocate), then mark it ready."""
        loop = asyncio.get_running_loop()
        for model in self.models.values():
            if model.runtime is None:
                continue
            if self.settings.warmup:
                for length in sorted({8, model.max_length}):
                    rows = [_dummy_row(length)] * min(2, self.settings.max_batch_size)
                    await loop.run_in_executor(None, model.runtime.run, rows)
            model.status = "ready"
            self._publish_info(model)
        self.warmed_up = True

    async def stop(self) -> None:
        await asyncio.gather(*(m.batcher.stop() for m in self.models.values() if m.batcher is not None))

    @property
    def ready(self) -> bool:
        """Every model that loaded is warmed up. Models that failed to load are reported, not waited for."""
        return self.warmed_up and any(m.status == "ready" for m in self.models.values())

    @property
    def failed(self) -> list[str]:
        return sorted(m.name for m in self.models.values() if m.status == "failed")

    def get(self, name: str) -> ServedModel:
        model = self.models.get(name)
        if model is None:
            raise ModelNotFound(f"no model named {name!r}; GET /v1/models lists the served models")
        if model.status == "failed":
            raise ModelFailed(f"model {name} failed to load: {model.error}")
        if model.status != "ready":
            raise NotReady(f"model {name} is still loading")
        return model

    def _publish_info(self, model: ServedModel) -> None:
        runtime = model.runtime
        if runtime is not None:
            self.metrics.model_info.labels(
                model.name, model.task or "", model.config.get("architecture", ""), runtime.variant, runtime.provider
            ).set(1)
        self.metrics.model_ready.labels(model.name).set(1 if model.status == "ready" else 0)


def _dummy_row(length: int) -> Row:
    import numpy as np

    return Row(np.full(length, 1, dtype=np.int64), np.zeros(length, dtype=np.int64))


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:300]}" if text else type(exc).__name__
