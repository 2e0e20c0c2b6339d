"""What a front-end process holds while it serves: its engine (in this process or over a socket), the registry of
models, the request pipeline, admission, and the verdicts of its probes. The routes reach it through
`request.app.state.server`."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bertcore.messages import one_line
from bertcore.model_config import ModelConfig
from service.errors import NotReady, ServiceError
from service.frontend.admission import AdmissionGate, Door
from service.frontend.engine_client import Engine, LocalEngine, RemoteEngine
from service.frontend.pipeline import RequestPipeline
from service.frontend.registry import ModelRegistry, ServedModel
from service.metrics import Metrics
from service.probes import Verdict, alive_unless, unavailable
from service.settings import Settings
from service.wire.model_status import ModelStatus

log = logging.getLogger("service")


class ServerState:
    """What the routes reach through `request.app.state.server`."""

    def __init__(self, settings: Settings, engine_socket: Path | None = None) -> None:
        self.settings = settings
        self.metrics = Metrics()
        self.engine: Engine = (
            RemoteEngine(engine_socket, settings.engine_silence_s)
            if engine_socket
            else LocalEngine(settings, self.metrics)
        )
        self.registry = ModelRegistry(settings, self.metrics, self.engine)
        self.executor = ThreadPoolExecutor(settings.tokenizer_threads, thread_name_prefix="tokenize")
        self.pipeline = RequestPipeline(settings, self.registry, self.engine, self.executor, self.metrics)
        self.admission = AdmissionGate(
            settings.max_queue_s,
            settings.admission_floor_tokens,
            cold_requests=settings.admission_cold_requests,
        )
        self.door = Door(self.admission, self.pipeline.model_gates, serves=lambda name: name in self.registry.models)
        self._draining = False
        self._watchers: list[Callable[[], None]] = []
        self._last_verdict: Verdict | None = None
        self.on_readiness_change: Callable[[Verdict], None] = lambda verdict: None

    @property
    def draining(self) -> bool:
        """Set on SIGTERM (`DrainingServer`) and at shutdown: /readyz and gRPC health say not ready, new work 503."""
        return self._draining

    @draining.setter
    def draining(self, draining: bool) -> None:
        changed = draining != self._draining
        self._draining = draining
        if changed:
            for listener in self._watchers:
                listener()

    def watch(self, listener: Callable[[], None]) -> None:
        """Call `listener()` whenever a probe's verdict may have moved: at the engine's every word on the models (a
        model loaded, failed, self-tested or unloaded; the engine connected or gone: `ModelRegistry.sync`) and when
        the drain begins (from the signal handler: `listener` only notes it). The verdicts that time moves (a batch
        stuck on the device, a silent engine) come with no event: a watcher also looks again every so often."""
        self._watchers.append(listener)
        self.registry.on_change.append(listener)

    def model_ready(self, model: ServedModel) -> bool:
        """The model answers requests: ready, and the server is not draining (ModelReady, gRPC health)."""
        return model.status == ModelStatus.READY and not self.draining

    def load(self) -> None:
        """Read the models and open their sessions (once): what can fail at start-up, before serving starts.
        StartupError where a model fails and --load-failure is fail."""
        if not self.registry.models:
            self.registry.load()
        self.engine.load()

    async def self_test_models(self) -> None:
        """Follow the engine's word on every model: each version it offers (at start, after a load or a reload),
        once warmed up, gets its config and tokenizer read here and one real request through the whole path; then
        this front-end's traffic moves to it in one step. A version that fails is turned down (the engine offers
        the one before again, which kept serving here meanwhile); a first version that fails is a failed model
        (reported, its requests 503) with the reason."""
        registry = self.registry
        while True:
            registry.changed.clear()
            for name in list(registry.models):
                try:
                    await self._follow(name)
                except Exception:  # never let the loop die: the model keeps the version it has
                    log.exception("model %s: following the engine failed", name)
            registry.release_retired()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(registry.changed.wait(), 0.1)

    async def _follow(self, name: str) -> None:
        registry = self.registry
        served = registry.models.get(name)
        if served is None:
            return
        report = served.engine_report
        if report.get("status") == ModelStatus.UNLOADING:
            registry.retire(served)
            return
        version, offer = report.get("version"), report.get("offer")
        if report.get("status") != ModelStatus.READY or not version or (name, version, offer) in registry.rejected:
            return
        if served.version == version and served.retired_at is None:  # not unloaded meanwhile: judged here already
            if served.self_tested and served.error is None:
                if served.offer != offer:  # loaded again by the engine (a restart): served as it was, and said so
                    # (this front-end's word at reconnection came before the new engine had it loaded: the engine
                    # counts a version's load when a front-end uses it, and the failure gauge stayed 1 for good)
                    served.offer = offer
                    registry.announce(name)
                return
            if served.error is not None and served.offer == offer:
                return  # this very load failed here (loaded again, it is judged again)
        model = await registry.prepare(name, version)
        model.engine_report, model.offer = report, offer
        if model.error is None:
            try:
                await self.pipeline.self_test(model)
            except NotReady:  # the engine went away meanwhile (process mode): try again when it is back
                return
            except ServiceError as exc:
                model.error = f"self-test failed: {exc.message}"
            except Exception as exc:
                model.error = f"self-test failed: {one_line(exc, hide=self.settings.repository)}"
        if model.error is None:
            registry.swap(model)
            return
        log.error("model %s: %s (version %s)", name, model.error, version)
        registry.rejected[(name, version, offer)] = model.error
        self.engine.reject(name, version, model.error)
        if served.version is None or served.error is not None:
            registry.models[name] = model  # a failed model, with the reason
        registry.sync()

    def readiness(self) -> Verdict:
        """/readyz's verdict (status, body), for the main port and the probe port's process alike. A verdict that
        differs from the last one goes to `on_readiness_change` before it is returned: the probe port never says
        "not ready" after the main port said "ready"."""
        verdict = self._verdict()
        if verdict != self._last_verdict:
            self._last_verdict = verdict
            self.on_readiness_change(verdict)
        return verdict

    def liveness(self) -> Verdict:
        """/livez's verdict: the event loop answers it, so it runs; alive unless a batch is stuck on the device."""
        return alive_unless(self.engine.stuck())

    def _verdict(self) -> Verdict:
        registry = self.registry
        if self.draining:
            return unavailable("the server is shutting down")
        if stuck := self.engine.stuck():
            return unavailable(f"not ready: {stuck}")
        if not self.engine.connected:
            return unavailable("not ready: not connected to the engine (this front-end or the engine is starting)")
        if silent := self.engine.unresponsive():
            return unavailable(f"not ready: {silent}")
        if not registry.ready:
            return _models_not_ready(list(registry.models.values()))
        ready = sorted(m.name for m in list(registry.models.values()) if m.status == ModelStatus.READY)
        return 200, {"status": "ready", "models": ready, "failed": registry.failed}

    def model_info(self, model: ServedModel) -> dict[str, Any]:
        config, engine, s = model.config, model.engine_report, self.settings
        return {
            **openai_model(model.name, model.version),
            "name": model.name,
            "status": model.status,
            "error": model.failure,
            "version": model.version,
            "loading_version": engine.get("loading"),
            "load_error": engine.get("load_error"),
            "task": config.task if config else None,
            "architecture": config.architecture if config else None,
            "labels": list(config.labels) if config and config.labels else None,
            "problem_type": config.problem_type if config else None,
            "variant": engine.get("variant"),
            "variant_accuracy": _variant_accuracy(config, engine.get("variant")),
            "provider": engine.get("provider"),
            "note": engine.get("note"),
            "placement": engine.get("placement"),
            "cpu_variant_trial": engine.get("cpu_variant_trial"),
            "demo": bool(config and config.demo),
            "rerank": bool(config and config.rerank),
            "embedding": _embedding(config),
            "max_length": config.max_length if config else None,
            "shapes": _shapes(engine),
            "limits": {
                "max_inputs_per_request": s.max_inputs_per_request,
                "max_chars_per_input": s.max_chars_per_input,
                "max_body_bytes": s.max_body_bytes,
                "max_batch_size": s.max_batch_size,
                "max_batch_tokens": s.max_batch_tokens,
                "request_timeout_s": s.request_timeout_s,
                "max_queue_s": s.max_queue_s,
                "max_qa_windows": s.max_qa_windows,
                "token_overflow": s.token_overflow,
            },
        }


# The order /readyz names the models that are not ready in: what an operator must act on first.
NOT_READY_ORDER = (ModelStatus.FAILED, ModelStatus.LOADING, ModelStatus.CHECKING, ModelStatus.UNLOADING)


def _models_not_ready(models: list[ServedModel]) -> Verdict:
    """/readyz's 503 while the models hold the server back (those of the start still loading or checking, or none
    left that can answer): each model that is not ready, by status, a failed one with its reason, in the message
    ("not ready; failed: m1 (REASON), loading: m2") and under "not_ready" ({name: {status, error}}). It said
    "not ready; loading: none" with every model failed, which left the operator to find out why."""
    waiting = sorted((m for m in models if m.status != ModelStatus.READY), key=lambda m: m.name)
    groups = []
    for kind in NOT_READY_ORDER:
        named = [f"{m.name} ({m.failure})" if m.failure else m.name for m in waiting if m.status == kind]
        if named:
            groups.append(f"{kind}: {', '.join(named)}")
    if not groups:
        groups.append("no model is served" if not models else "the engine is warming up")
    status, body = unavailable(f"not ready; {', '.join(groups)}")
    body["not_ready"] = {m.name: {"status": str(m.status), "error": m.failure} for m in waiting}
    return status, body


def _variant_accuracy(config: ModelConfig | None, variant: str | None) -> dict[str, Any] | None:
    """The served variant's figures measured at export on labelled data (--eval), where there are any."""
    if config is None or variant is None or variant not in config.variants:
        return None
    return config.variants[variant].get("accuracy")


def openai_model(name: str, version: str | None) -> dict[str, Any]:
    """A model as OpenAI's models API gives it (`GET /v1/models`' `data`, `GET /v1/models/{name}`): the openai SDK's
    `models.list()` and `models.retrieve()`, and the OpenAI-compatible gateways that list a server's models, read
    these fields. `created`: the version's export time (epoch seconds), 0 where it has none."""
    try:
        created = int(datetime.strptime((version or "")[:16], "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC).timestamp())
    except ValueError:
        created = 0
    return {"id": name, "object": "model", "created": created, "owned_by": "bertserve"}


def _embedding(config: ModelConfig | None) -> dict[str, Any] | None:
    """An embedding entry's vector: its size, what the graph does to make it, and how its vectors compare."""
    spec = config.embedding if config else None
    if spec is None:
        return None
    return {
        "dimension": spec.dimension,
        "pooling": spec.pooling,
        "normalize": spec.normalize,
        "dense_layers": spec.dense_layers,
        "similarity": spec.similarity,
        "prompts": dict(spec.prompts),
        "default_prompt": spec.prompts.get(spec.default_prompt_name) if spec.default_prompt_name else None,
    }


def _shapes(engine: dict[str, Any]) -> dict[str, Any] | None:
    """The engine's shape buckets as it reported them; None before it has."""
    if "shape_buckets" not in engine:
        return None
    return {
        "buckets": engine["shape_buckets"],
        "warmed": engine.get("warmed_shapes", 0),
        "cuda_graphs": bool(engine.get("cuda_graphs")),
    }
