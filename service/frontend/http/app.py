"""The app factory: `create_app(settings)` builds the whole server;
`uvicorn --factory service.frontend.http.app:create_app` builds it from the environment (BERTSERVE_*)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from starlette.types import ASGIApp

from bertcore.model_config import ModelConfig
from bertcore.version import __version__
from service.errors import NotReady, ServiceError
from service.frontend.engine_client import Engine, LocalEngine, RemoteEngine
from service.frontend.http.admission import AdmissionGate
from service.frontend.http.auth import ApiKeys, AuthMiddleware, open_paths
from service.frontend.http.docs import document_bearer_auth, install_docs
from service.frontend.http.errors import install_error_handlers
from service.frontend.http.middleware import (
    AdmissionMiddleware,
    BodyLimitMiddleware,
    HeadAsGetMiddleware,
    JsonCorsMiddleware,
    JsonOnlyMiddleware,
    MetricsMiddleware,
)
from service.frontend.http.routes import INFERENCE_ROUTES, router
from service.frontend.http.server import shared_port_socket
from service.frontend.pipeline import Inference
from service.frontend.registry import ModelRegistry, ServedModel
from service.logs import REQUEST_ID_HEADER, RequestContextMiddleware
from service.metrics import Metrics
from service.probes import ProbeProcess, StateFile, Verdict, alive_unless, keep_writing, unavailable
from service.repository import one_line
from service.settings import Settings
from service.system import garbage_collector

log = logging.getLogger("service")
TIMING_HEADERS = (
    "x-total-time-ms",
    "x-tokenization-time-ms",
    "x-queue-time-ms",
    "x-inference-time-ms",
    "x-inference-calls",
    "x-rows",
)


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
        self.inference = Inference(settings, self.registry, self.engine, self.executor, self.metrics)
        self.admission = AdmissionGate(settings.max_queue_s, settings.admission_floor)
        self.draining = False
        self._last_verdict: Verdict | None = None
        self.on_readiness_change: Callable[[Verdict], None] = lambda verdict: None

    def load(self) -> None:
        """Read the models and open their sessions (once): what can fail at start-up, before serving starts.
        StartupError where a model fails and --load-failure is fail."""
        if not self.registry.models:
            self.registry.load()
        self.engine.load()

    async def self_test_models(self) -> None:
        """Each model, once the engine reports it warmed up: one real request through the whole path before it is
        reported ready. A failure makes it a failed model (reported, its requests 503) with the reason."""
        while True:
            for model in list(self.registry.models.values()):
                if model.status != "checking":
                    continue
                try:
                    await self.inference.self_test(model)
                except NotReady:  # the engine went away meanwhile (process mode): try again when it is back
                    continue
                except ServiceError as exc:
                    model.error = f"self-test failed: {exc.message}"
                except Exception as exc:
                    model.error = f"self-test failed: {one_line(exc, self.settings)}"
                else:
                    model.self_tested = True
                if model.error:
                    log.error("model %s: %s", model.name, model.error)
                self.registry.sync()
            await asyncio.sleep(0.1)

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
            return unavailable("not ready: the engine is starting or restarting")
        if silent := self.engine.unresponsive():
            return unavailable(f"not ready: {silent}")
        if not registry.ready:
            return unavailable(f"not ready; loading: {', '.join(registry.loading) or 'none'}")
        ready = sorted(m.name for m in list(registry.models.values()) if m.status == "ready")
        return 200, {"status": "ready", "models": ready, "failed": registry.failed}

    def model_info(self, model: ServedModel) -> dict[str, Any]:
        config, engine, s = model.config, model.engine_state, self.settings
        return {
            "name": model.name,
            "status": model.status,
            "error": model.failure,
            "task": config.task if config else None,
            "architecture": config.architecture if config else None,
            "labels": list(config.labels) if config and config.labels else None,
            "problem_type": config.problem_type if config else None,
            "variant": engine.get("variant"),
            "variant_accuracy": _variant_accuracy(config, engine.get("variant")),
            "provider": engine.get("provider"),
            "note": engine.get("note"),
            "demo": bool(config and config.demo),
            "max_length": config.max_length if config else None,
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


class BertServeApp(FastAPI):
    """FastAPI with layers outside all of Starlette's, its 500 handler included: every response, whatever answered
    it, carries the request's id, and every request gets its access line (`service.logs`); HEAD is answered as GET
    without the body."""

    def build_middleware_stack(self) -> ASGIApp:
        return RequestContextMiddleware(HeadAsGetMiddleware(super().build_middleware_stack()))

    def openapi(self) -> dict[str, Any]:
        """FastAPI's schema of the mounted routes and of the inference routes, which are plain Starlette routes
        (`service.frontend.http.routes.InferenceRoute`) that FastAPI would not see."""
        if self.openapi_schema is None:
            self.openapi_schema = get_openapi(
                title=self.title,
                version=self.version,
                openapi_version=self.openapi_version,
                description=self.description,
                routes=[*self.routes, *(route.documentation() for route in INFERENCE_ROUTES)],
            )
        return self.openapi_schema


def create_app(
    settings: Settings | None = None, engine_socket: Path | None = None, heartbeat: Path | None = None
) -> FastAPI:
    """The whole server; with `engine_socket`, a front-end of an engine process listening there; with `heartbeat`,
    a state file kept written while it serves (for the launcher, which restarts a front-end that is stuck).

    Layers, outermost first: request id and access log; FastAPI's 500 handler; CORS (only with
    --cors-allow-origins); API keys (only with keys set); the body limit; metrics; the routes."""
    settings = settings or Settings()
    keys = ApiKeys.from_settings(settings)  # StartupError where the key file cannot be used
    server = ServerState(settings, engine_socket)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        server.load()  # done already where `python -m service` started it; StartupError: uvicorn exits non-zero
        probes = None
        if settings.probe_port:
            sock = shared_port_socket(settings.host, settings.probe_port)
            probes = ProbeProcess(sock, server.liveness, server.readiness, settings.liveness_stall_s)
            probes.start()
            server.on_readiness_change = probes.publish
        await server.engine.start(on_change=server.registry.sync)
        garbage_collector.settle()
        background = [asyncio.create_task(server.self_test_models(), name="self-tests")]
        if heartbeat is not None:  # written from now on: from here on the launcher judges this process
            background.append(keep_writing(StateFile(heartbeat), lambda: {"live": server.liveness()}, name="heartbeat"))
        try:
            yield
        finally:
            server.draining = True
            for task in background:
                task.cancel()
            if probes is not None:
                probes.stop()
            await server.engine.stop()
            server.executor.shutdown(wait=False, cancel_futures=True)

    app = BertServeApp(
        title="bertserve",
        version=__version__,
        description="Sequence classification, NER and extractive QA with fine-tuned BERT-family encoders on "
        "ONNX Runtime, with dynamic batching. Errors share one body: {error, error_type, field}.",
        lifespan=lifespan,
        docs_url=None,  # FastAPI's own pages load their scripts from a CDN: service.frontend.http.docs serves them here
        redoc_url=None,
        openapi_url="/openapi.json" if settings.docs == "on" else None,
    )
    app.state.server = server
    install_error_handlers(app)
    app.router.routes.extend(route.route() for route in INFERENCE_ROUTES)
    app.include_router(router)
    if settings.docs == "on":
        install_docs(app, app.title)
    app.add_middleware(AdmissionMiddleware, gate=server.admission)
    app.add_middleware(JsonOnlyMiddleware)
    app.add_middleware(MetricsMiddleware, metrics=server.metrics, known_models=lambda: set(server.registry.models))
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.max_body_bytes)
    if keys.enabled:
        paths, prefixes = open_paths(settings)
        app.add_middleware(AuthMiddleware, keys=keys, open_paths=paths, open_prefixes=prefixes)
        document_bearer_auth(app, paths)
    if settings.cors_allow_origins:
        app.add_middleware(
            JsonCorsMiddleware,
            allow_origins=settings.cors_allow_origins,
            allow_methods=["GET", "POST"],
            allow_headers=["authorization", "content-type", REQUEST_ID_HEADER.decode()],
            expose_headers=[REQUEST_ID_HEADER.decode(), *TIMING_HEADERS, "retry-after"],
            max_age=600,
        )
    return app


def _variant_accuracy(config: ModelConfig | None, variant: str | None) -> dict[str, Any] | None:
    """The served variant's figures measured at export on labelled data (--eval), where there are any."""
    if config is None or variant is None or variant not in config.variants:
        return None
    return config.variants[variant].get("accuracy")
