"""The app factory: `create_app(settings)` builds the whole server; `uvicorn --factory service.app:create_app`
builds it from the environment (BERTSERVE_*)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from fastapi import FastAPI

from export import __version__
from service.http_errors import install_error_handlers
from service.inference import Inference
from service.metrics import Metrics
from service.middleware import BodyLimitMiddleware, MetricsMiddleware
from service.registry import ModelRegistry, ServedModel
from service.routes import router
from service.settings import Settings

log = logging.getLogger("service")


class ServerState:
    """What the routes reach through `request.app.state.server`."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.metrics = Metrics()
        self.registry = ModelRegistry(settings, self.metrics)
        self.executor = ThreadPoolExecutor(settings.tokenizer_threads, thread_name_prefix="tokenize")
        self.inference = Inference(settings, self.registry, self.executor, self.metrics)
        self.draining = False

    def model_info(self, model: ServedModel) -> dict[str, Any]:
        config, runtime, s = model.config, model.runtime, self.settings
        return {
            "name": model.name,
            "status": model.status,
            "error": model.error,
            "task": config.get("task"),
            "architecture": config.get("architecture"),
            "labels": config.get("labels"),
            "problem_type": config.get("problem_type"),
            "variant": runtime.variant if runtime else None,
            "variant_accuracy": config["variants"][runtime.variant].get("accuracy") if runtime else None,
            "provider": runtime.provider if runtime else None,
            "note": model.note,
            "demo": bool(config.get("demo", False)),
            "max_length": config.get("max_length"),
            "limits": {
                "max_inputs_per_request": s.max_inputs_per_request,
                "max_chars_per_input": s.max_chars_per_input,
                "max_body_bytes": s.max_body_bytes,
                "max_batch_size": s.max_batch_size,
                "max_batch_tokens": s.max_batch_tokens,
                "request_timeout_s": s.request_timeout_s,
                "token_overflow": s.token_overflow,
            },
        }


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or Settings()
    server = ServerState(settings)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        server.registry.load()  # raises StartupError: uvicorn reports it and exits non-zero
        server.registry.start()
        warm_up = asyncio.create_task(server.registry.warm_up(), name="warm-up")
        try:
            yield
        finally:
            server.draining = True
            warm_up.cancel()
            await server.registry.stop()
            server.executor.shutdown(wait=False, cancel_futures=True)

    app = FastAPI(
        title="bertserve",
        version=__version__,
        description="Sequence classification, NER and extractive QA with fine-tuned BERT-family encoders on "
        "ONNX Runtime, with dynamic batching. Errors share one body: {error, error_type, field}.",
        lifespan=lifespan,
    )
    app.state.server = server
    install_error_handlers(app)
    app.include_router(router)
    app.add_middleware(MetricsMiddleware, metrics=server.metrics, known_models=lambda: set(server.registry.models))
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.max_body_bytes)
    return app
