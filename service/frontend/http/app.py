"""The app factory: `create_app(settings)` builds the whole server;
`uvicorn --factory service.frontend.http.app:create_app` builds it from the environment (BERTSERVE_*)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, cast

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from starlette.types import ASGIApp

from bertcore.version import __version__
from service import tracing
from service.frontend.grpc.server import GrpcServer
from service.frontend.http import hf_tasks, open_inference, openai_api, rerank
from service.frontend.http.auth import ApiKeys, AuthMiddleware, open_paths
from service.frontend.http.docs import document_bearer_auth, install_docs
from service.frontend.http.errors import install_error_handlers
from service.frontend.http.gateway import InferenceEndpoints, InferenceGateway
from service.frontend.http.middleware import (
    AdmissionMiddleware,
    BodyLimitMiddleware,
    HeadAsGetMiddleware,
    JsonCorsMiddleware,
    JsonOnlyMiddleware,
    MetricsMiddleware,
    RequestContextMiddleware,
)
from service.frontend.http.repository_api import install_repository_api
from service.frontend.http.routes import INFERENCE_ROUTES, router
from service.frontend.http.server import shared_port_socket
from service.frontend.http.state import ServerState
from service.logs import REQUEST_ID_HEADER
from service.probes import HeartbeatFile, ProbeProcess, keep_writing
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
# Every inference endpoint: the native routes, then the other protocols' adapters (each mounted and documented alike).
ALL_INFERENCE_ROUTES = (*INFERENCE_ROUTES, *hf_tasks.ROUTES, *rerank.ROUTES, *openai_api.ROUTES)


class BertServeApp(FastAPI):
    """FastAPI with layers outside all of Starlette's, its 500 handler included: inference POSTs go through the one
    request pipeline (`gateway.InferenceGateway`), the rest through the middleware stack, where every response,
    whatever answered it, carries the request's id, and every request gets its access line (`service.logs`); HEAD is
    answered as GET without the body."""

    def build_middleware_stack(self) -> ASGIApp:
        slow_lane = RequestContextMiddleware(HeadAsGetMiddleware(super().build_middleware_stack()))
        server: ServerState = self.state.server
        endpoints = InferenceEndpoints(
            native={route.action: route.serve for route in INFERENCE_ROUTES},
            hf_task=hf_tasks.serve,
            v2_infer=open_inference.infer,
            rerank={"/v1/rerank": rerank.serve_v1, "/v2/rerank": rerank.serve_v2},
            openai={route.path: route.endpoint for route in openai_api.ROUTES},
        )
        cors = bool(server.settings.cors_allow_origins)
        return cast(ASGIApp, InferenceGateway(slow_lane, server, endpoints, self.state.api_keys, cors))

    def openapi(self) -> dict[str, Any]:
        """FastAPI's schema of the mounted routes and of the inference routes, which are plain Starlette routes
        (`service.frontend.http.routes.InferenceRoute`) that FastAPI would not see."""
        if self.openapi_schema is None:
            self.openapi_schema = get_openapi(
                title=self.title,
                version=self.version,
                openapi_version=self.openapi_version,
                description=self.description,
                routes=[
                    *self.routes,
                    *(route.documentation() for route in ALL_INFERENCE_ROUTES),
                    open_inference.infer_documentation(),
                ],
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
        tracing.configure(settings, "frontend" if engine_socket else "server", server.metrics.count_dropped_spans)
        probes = None
        if settings.probe_port:
            sock = shared_port_socket(settings.host, settings.probe_port)
            probes = ProbeProcess(sock, server.liveness, server.readiness, settings.liveness_stall_s)
            probes.start()
            server.on_readiness_change = probes.publish
        await server.engine.start(on_change=server.registry.sync)
        grpc_server = None
        if settings.grpc_port:  # every front-end process serves it, on one port, as HTTP
            grpc_server = GrpcServer(settings, server, keys, reuse_port=engine_socket is not None)
            await grpc_server.start()
        garbage_collector.settle()
        background = [
            asyncio.create_task(server.self_test_models(), name="self-tests"),
            asyncio.create_task(server.door.keep_ticking(), name="admission-ticks"),
        ]
        if heartbeat is not None:  # written from now on: from here on the launcher judges this process
            background.append(
                keep_writing(HeartbeatFile(heartbeat), lambda: {"live": server.liveness()}, name="heartbeat")
            )
        try:
            yield
        finally:
            server.draining = True
            if grpc_server is not None:  # new calls refused (UNAVAILABLE) since the drain began; finish the rest
                await grpc_server.stop(settings.drain_timeout_s)
            for task in background:
                task.cancel()
            if probes is not None:
                probes.stop()
            await server.engine.stop()
            server.executor.shutdown(wait=False, cancel_futures=True)
            tracing.shutdown()

    app = BertServeApp(
        title="bertserve",
        version=__version__,
        description="Sequence classification, NER and extractive QA with fine-tuned BERT-family encoders on "
        "ONNX Runtime, with dynamic batching. Errors share one body: {error, error_type, field}.",
        lifespan=lifespan,
        # FastAPI's own OpenTelemetry (on where a global provider is set, e.g. under `opentelemetry-instrument`) off:
        # the server traces itself (--otlp-endpoint; probes untraced), and its check cost ~10 us a request
        telemetry={"tracing": False, "metrics": False, "logs": False},
        docs_url=None,  # FastAPI's own pages load their scripts from a CDN: service.frontend.http.docs serves them here
        redoc_url=None,
        openapi_url="/openapi.json" if settings.docs == "on" else None,
        # a path with a trailing slash is a 404 in the error body: Starlette answered a bare 307 whose Location it
        # built from the client's Host header (a redirect anywhere a client or cache would follow)
        redirect_slashes=False,
    )
    app.state.server = server
    app.state.api_keys = keys
    install_error_handlers(app)
    app.router.routes.extend(route.route() for route in ALL_INFERENCE_ROUTES)
    app.router.routes.append(open_inference.infer_route())
    app.include_router(router)
    app.include_router(open_inference.router)
    install_repository_api(app, settings)
    if settings.docs == "on":
        install_docs(app, app.title)
    app.add_middleware(AdmissionMiddleware, door=server.door)
    app.add_middleware(JsonOnlyMiddleware, max_bytes=settings.max_body_bytes)
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.max_body_bytes)
    if keys.enabled:
        paths, prefixes = open_paths(settings)
        paths |= open_inference.PROBES  # the protocol's probes, open as /livez and /readyz are
        app.add_middleware(AuthMiddleware, keys=keys, open_paths=paths, open_prefixes=prefixes)
        document_bearer_auth(app, paths)
    # outside the key's and the size's checks: their 401s and 413s are counted, as the fast lane's and gRPC's are
    app.add_middleware(MetricsMiddleware, metrics=server.metrics, known_models=lambda: set(server.registry.models))
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
