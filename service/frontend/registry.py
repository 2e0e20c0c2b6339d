"""The served models as the front-end sees them: config and tokenizer of each entry, plus the engine's word on it.

A model is ready when its tokenizer loaded here, the engine reports its session loaded and warmed up, and one
real request went through the whole path (tokenization, batching, the session, post-processing): the self-test.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bertcore.model_config import ModelConfig
from bertcore.tokenization import TextTokenizer
from service.errors import EngineUnavailable, ModelFailed, ModelNotFound, NotReady
from service.frontend.engine_client import Engine
from service.metrics import Metrics
from service.repository import load_entries, read_config
from service.settings import Settings
from service.wire.model_status import ModelStatus

log = logging.getLogger("service.frontend.registry")
SELF_TEST: ContextVar[bool] = ContextVar("self_test", default=False)  # this task is a model's self-test


@dataclass
class ServedModel:
    name: str
    entry: Path
    config: ModelConfig | None = None
    tokenizer: TextTokenizer | None = None
    error: str | None = None  # the front-end's own failure (config, tokenizer, self-test)
    engine_report: dict[str, Any] = field(default_factory=dict)
    self_tested: bool = False  # one real request went through the whole path

    @property
    def status(self) -> ModelStatus:
        """loading -> checking (the self-test) -> ready | failed; failed on either side is failed."""
        if self.error is not None:
            return ModelStatus.FAILED
        engine_status = ModelStatus(self.engine_report.get("status", ModelStatus.LOADING))
        if engine_status == ModelStatus.READY and not self.self_tested:
            return ModelStatus.CHECKING
        return engine_status

    @property
    def failure(self) -> str | None:
        return self.error or self.engine_report.get("error")

    def load_failure(self) -> ModelFailed:
        """The error a request to this model gets while it is failed."""
        return ModelFailed.because(self.name, self.failure)

    @property
    def task(self) -> str | None:
        return self.config.task if self.config else None

    @property
    def loaded_tokenizer(self) -> TextTokenizer:
        """The tokenizer of a model that loaded (any model `ModelRegistry.get` returns)."""
        if self.tokenizer is None:
            raise self.load_failure()
        return self.tokenizer

    @property
    def labels(self) -> list[str]:
        return list(self.config.labels) if self.config else []

    @property
    def max_length(self) -> int:
        if self.config is None:
            raise self.load_failure()
        return self.config.max_length


def _check_vocabulary(config: ModelConfig, tokenizer: TextTokenizer) -> None:
    """A tokenizer with ids the model has no embedding for would fail every batch that meets one of them."""
    if config.vocab_size is not None and tokenizer.max_token_id >= config.vocab_size:
        raise ValueError(
            f"{config.tokenizer.file} has token ids up to {tokenizer.max_token_id}, but the model's vocabulary has "
            f"{config.vocab_size} entries: the tokenizer belongs to another model (export the checkpoint again)"
        )


class ModelRegistry:
    def __init__(self, settings: Settings, metrics: Metrics, engine: Engine) -> None:
        self.settings = settings
        self.metrics = metrics
        self.engine = engine
        self.models: dict[str, ServedModel] = {}
        self._changed: asyncio.Event | None = None  # set (and dropped) at the engine's next word

    def load(self) -> None:
        """Read every entry's config and tokenizer. StartupError where one fails and --load-failure is fail."""
        load_entries(self.settings, log, self._open, self._failed)
        self.sync()

    def _open(self, entry: Path) -> None:
        model = self.models[entry.name] = ServedModel(entry.name, entry)
        model.config = read_config(entry)
        spec = model.config.tokenizer
        model.tokenizer = TextTokenizer.load(entry / spec.file, spec.pad_token_id, spec.padding_side)
        _check_vocabulary(model.config, model.tokenizer)

    def _failed(self, name: str, reason: str) -> None:
        self.models[name].error = reason

    def sync(self) -> None:
        """Take the engine's latest word on every model (called whenever it changes)."""
        states = self.engine.model_reports()
        for model in self.models.values():
            model.engine_report = states.get(model.name, {})
            self.metrics.model_ready.labels(model.name).set(1 if model.status == ModelStatus.READY else 0)
        if self._changed is not None:
            self._changed.set()
            self._changed = None

    @property
    def ready(self) -> bool:
        """The engine is up and warmed up, every model passed its self-test or failed, and some model can answer.
        Failed models are reported, not waited for."""
        return (
            self.engine.ready and not self.loading and any(m.status == ModelStatus.READY for m in self.models.values())
        )

    @property
    def failed(self) -> list[str]:
        return sorted(m.name for m in self.models.values() if m.status == ModelStatus.FAILED)

    @property
    def loading(self) -> list[str]:
        return sorted(m.name for m in self.models.values() if m.status in (ModelStatus.LOADING, ModelStatus.CHECKING))

    def lookup(self, name: str) -> ServedModel:
        """The model named `name`, whatever its status; ModelNotFound where there is none."""
        model = self.models.get(name)
        if model is None:
            raise ModelNotFound.named(name)
        return model

    def get(self, name: str) -> ServedModel:
        """The model, ready to answer: ModelFailed, EngineUnavailable or NotReady otherwise."""
        model = self.lookup(name)
        if model.status == ModelStatus.FAILED:
            raise model.load_failure()
        if not self.engine.connected:
            raise EngineUnavailable("the engine is not connected (starting or restarting); try again shortly")
        if model.status != ModelStatus.READY and not (model.status == ModelStatus.CHECKING and SELF_TEST.get()):
            raise NotReady.loading(name)
        return model

    async def serving(self, name: str, wait_s: float) -> ServedModel:
        """`get`, but a model that is not ready yet (the engine restarting, or this front-end reconnecting a moment
        after its siblings did) is waited for, up to wait_s, before the 503: a pod whose /readyz said yes on one
        front-end must not refuse requests on another for the few milliseconds between their reconnections."""
        give_up = time.monotonic() + wait_s
        while True:
            try:
                return self.get(name)
            except NotReady:  # not ModelNotFound or ModelFailed: waiting cannot change those
                remaining = give_up - time.monotonic()
                if remaining <= 0 or SELF_TEST.get():
                    raise
            if self._changed is None:
                self._changed = asyncio.Event()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), remaining)
