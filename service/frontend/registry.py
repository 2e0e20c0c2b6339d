"""The served models as the front-end sees them: config and tokenizer of each entry, plus the engine's word on it.

A model is ready when its tokenizer loaded here, the engine reports its session loaded and warmed up, and one
real request went through the whole path (tokenization, batching, the session, post-processing): the self-test.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bertcore.messages import one_line
from bertcore.model_config import ModelConfig
from bertcore.tokenization import TextTokenizer
from service.errors import EngineUnavailable, ModelFailed, ModelNotFound, NotReady
from service.frontend.engine_client import Engine
from service.metrics import Metrics, forget
from service.repository import EntryFailed, entry_version, load_entries, read_config
from service.settings import Settings
from service.wire.model_status import ModelStatus
from service.wire.ticket import Ticket

DEMO_NOTE = " (a random-weight demo: its answers have the right shape, not the right content)"
log = logging.getLogger("service.frontend.registry")
# The model a self-test runs on (a version not serving yet): `ModelRegistry.get` hands it to that task only.
SELF_TEST: ContextVar[ServedModel | None] = ContextVar("self_test", default=None)


@dataclass(eq=False)
class ServedModel:
    """One version of a model as this front-end serves it: its config and tokenizer, and the engine's word on it.
    A request takes the ServedModel once and keeps it to its answer: a swap to a new version never mixes two."""

    name: str
    entry: Path
    version: str | None = None  # None: the engine has not loaded a version yet (or failed to)
    config: ModelConfig | None = None
    tokenizer: TextTokenizer | None = None
    error: str | None = None  # the front-end's own failure (config, tokenizer, self-test)
    engine_report: dict[str, Any] = field(default_factory=dict)
    self_tested: bool = False  # one real request went through the whole path
    offer: int | None = None  # the engine's load of this version that this front-end judged (Generation.offer)
    holders: int = 0  # requests that took this version and are not over
    retired_at: float | None = None  # when a newer version (or an unload) took its place

    @property
    def status(self) -> ModelStatus:
        """loading -> checking (the self-test) -> ready | failed; failed on either side is failed; unloading."""
        if self.error is not None:
            return ModelStatus.FAILED
        engine_status = ModelStatus(self.engine_report.get("status", ModelStatus.LOADING))
        if engine_status == ModelStatus.READY and not self.self_tested:
            return ModelStatus.CHECKING
        return engine_status

    @property
    def target(self) -> str:
        """What the engine is asked to run: this version of the model, even once a newer one serves."""
        return f"{self.name}@{self.version}" if self.version else self.name

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

    def hold(self, ticket: Ticket) -> None:
        """The request of `ticket` uses this version until it is over (`Ticket.done`)."""
        self.holders += 1
        ticket.on_done.append(self._release)

    def _release(self) -> None:
        self.holders -= 1


def _check_vocabulary(config: ModelConfig, tokenizer: TextTokenizer) -> None:
    """A tokenizer with ids the model has no embedding for would fail every batch that meets one of them."""
    if config.vocab_size is not None and tokenizer.max_token_id >= config.vocab_size:
        raise ValueError(
            f"{config.tokenizer.file} has token ids up to {tokenizer.max_token_id}, but the model's vocabulary has "
            f"{config.vocab_size} entries: the tokenizer belongs to another model (export the checkpoint again)"
        )


class ModelRegistry:
    """The models as the engine reports them, each at the version this front-end serves. The engine loads; this
    front-end reads the config and tokenizer of each version the engine offers, self-tests it (ServerState), and
    moves its traffic to it in one step (`swap`); the version before stays open at the engine until the requests
    that hold it are over (`release_retired`)."""

    def __init__(self, settings: Settings, metrics: Metrics, engine: Engine) -> None:
        self.settings = settings
        self.metrics = metrics
        self.engine = engine
        self.models: dict[str, ServedModel] = {}
        self._prepared: dict[tuple[str, str], ServedModel] = {}  # read at start, not serving yet
        self._retiring: dict[str, list[ServedModel]] = {}
        # the loads (model, version, offer) this front-end turned down, and why: a version loaded again is judged again
        self.rejected: dict[tuple[str, str, int | None], str] = {}
        self._settled = False  # the models of the start have loaded (or failed): later loads do not hold /readyz
        self._changed: asyncio.Event | None = None  # set (and dropped) at the engine's next word
        self.changed = asyncio.Event()  # set at the engine's every word (the follow loop waits on it)
        self.on_change: list[Callable[[], None]] = []  # called at the engine's every word (ServerState.watch)

    def load(self) -> None:
        """Read the config and tokenizer of every entry to serve at start (the engine loads the same). StartupError
        where one fails and --load-failure is fail; otherwise its failure shows when the engine offers it."""
        load_entries(self.settings, log, self._open, lambda name, reason: None)
        self.sync()

    def _open(self, entry: Path) -> None:
        # listed (loading) before the engine's first word: a request meanwhile waits for it rather than gets 404
        self.models.setdefault(entry.name, ServedModel(entry.name, entry))
        model = read_model(entry, entry_version(entry), self.settings)
        if model.error is not None:
            raise EntryFailed(model.error)  # already "Type: reason", the repository hidden
        self._prepared[(model.name, str(model.version))] = model

    async def prepare(self, name: str, version: str) -> ServedModel:
        """The config and tokenizer of `version` of the entry (its `error` says why not), off the event loop."""
        model = self._prepared.pop((name, version), None)
        if model is not None:
            return model
        entry = self.settings.repository / name
        return await asyncio.get_running_loop().run_in_executor(None, read_model, entry, version, self.settings)

    def sync(self) -> None:
        """Take the engine's latest word on every model (called whenever it changes)."""
        states = self.engine.model_reports()
        if self.engine.connected:
            for name in [name for name in self.models if name not in states]:  # unloaded, its versions closed
                del self.models[name]
                self._retiring.pop(name, None)
                forget(self.metrics.model_ready, name)
        for name in states:
            if name not in self.models:
                self.models[name] = ServedModel(name, self.settings.repository / name)
        for model in self.models.values():
            model.engine_report = states.get(model.name, {})
            self.metrics.model_ready.labels(model.name).set(1 if model.status == ModelStatus.READY else 0)
        self.changed.set()
        for listener in self.on_change:
            listener()
        if self._changed is not None:
            self._changed.set()
            self._changed = None

    def swap(self, model: ServedModel) -> None:
        """Serve `model` (a version that passed its self-test) from now on; the version before retires."""
        old = self.models.get(model.name)
        model.self_tested = True
        self.models[model.name] = model
        if old is not None and old.version is not None and old.version != model.version and old.error is None:
            old.retired_at = time.monotonic()
            self._retiring.setdefault(model.name, []).append(old)
        # a random-weight demo (the export's offline `demo`) is said in the server's log too, not only /v1/models
        demo = DEMO_NOTE if model.config is not None and model.config.demo else ""
        log.info("model %s: serving version %s%s", model.name, model.version, demo)
        self.announce(model.name)
        self.sync()

    def retire(self, model: ServedModel) -> None:
        """The model is unloading: its version retires once the requests that hold it are over."""
        if model.retired_at is None:
            model.retired_at = time.monotonic()
            self._retiring.setdefault(model.name, []).append(model)
            self.announce(model.name)

    def announce(self, name: str) -> None:
        """Tell the engine which versions of the model this front-end still uses."""
        served = self.models.get(name)
        versions = [m.version for m in self._retiring.get(name, []) if m.version]
        if served is not None and served.version and served.retired_at is None and served.error is None:
            versions.append(served.version)
        self.engine.use(name, list(dict.fromkeys(versions)))

    def release_retired(self) -> None:
        """Versions that no request holds any more (or held past every deadline) are let go of."""
        now = time.monotonic()
        for name, retiring in list(self._retiring.items()):
            keep = [
                m for m in retiring if m.holders > 0 and now - (m.retired_at or now) < self.settings.request_timeout_s
            ]
            if len(keep) != len(retiring):
                self._retiring[name] = keep
                self.announce(name)

    @property
    def ready(self) -> bool:
        """The engine is up and warmed up, the models of the start passed their self-test or failed, and some model
        can answer (under --model-control none; in the other modes an empty server is ready: it takes load calls).
        Failed models are reported, not waited for; models loading after the start do not hold readiness."""
        if not self.engine.ready:
            return False
        if not self._settled:
            if self.loading:
                return False
            self._settled = True
        return self.settings.model_control != "none" or any(m.status == ModelStatus.READY for m in self.models.values())

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
        testing = SELF_TEST.get()
        if testing is not None and testing.name == name:
            return testing
        if name not in self.models and not self.engine.connected:  # its word on the models is still to come
            raise EngineUnavailable("the engine is not connected (starting or restarting); try again shortly")
        model = self.lookup(name)
        status = model.status  # derived from the model's state each time it is read: once a request
        if status == ModelStatus.UNLOADING:
            raise ModelNotFound(f"model {name} is being unloaded; GET /v1/models lists the served models")
        if status == ModelStatus.FAILED:
            raise model.load_failure()
        if not self.engine.connected:
            raise EngineUnavailable("the engine is not connected (starting or restarting); try again shortly")
        if status != ModelStatus.READY:
            raise NotReady.loading(name)
        return model

    async def serving(self, name: str, wait_s: float, ticket: Ticket | None = None) -> ServedModel:
        """`get`, but a model that is not ready yet (the engine restarting, or this front-end reconnecting a moment
        after its siblings did) is waited for, up to wait_s, before the 503: a pod whose /readyz said yes on one
        front-end must not refuse requests on another for the few milliseconds between their reconnections. With
        `ticket`, the version given is held for the request (`ServedModel.hold`)."""
        give_up = time.monotonic() + wait_s
        while True:
            try:
                model = self.get(name)
            except NotReady:  # not ModelNotFound or ModelFailed: waiting cannot change those
                remaining = give_up - time.monotonic()
                if remaining <= 0 or SELF_TEST.get() is not None:
                    raise
            else:
                if ticket is not None:
                    model.hold(ticket)
                return model
            if self._changed is None:
                self._changed = asyncio.Event()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), remaining)


def read_model(entry: Path, version: str, settings: Settings) -> ServedModel:
    """`version` of the entry with its config and tokenizer read (blocking); its `error` says why it cannot be
    served (the entry changed since the engine loaded that version, an unreadable config or tokenizer)."""
    model = ServedModel(entry.name, entry, version)
    try:
        found = entry_version(entry)
        if found != version:
            raise ValueError(
                f"the entry changed since the engine loaded version {version} (now {found}): load it again"
            )
        model.config = read_config(entry)
        spec = model.config.tokenizer
        model.tokenizer = TextTokenizer.load(entry / spec.file, spec.pad_token_id, spec.padding_side)
        _check_vocabulary(model.config, model.tokenizer)
    except Exception as exc:
        model.error = one_line(exc, hide=settings.repository)
    return model
