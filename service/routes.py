"""HTTP endpoints: thin. Parse, call Inference, shape the response and its timing headers."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST

from service import schemas
from service.engine.batcher import Ticket
from service.errors import NotReady
from service.inference import Timings
from service.logs import REQUEST_ID

if TYPE_CHECKING:
    from service.app import ServerState

ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": schemas.ErrorBody} for code in (400, 404, 413, 415, 422, 429, 500, 503, 504)
}
router = APIRouter()


def state(request: Request) -> ServerState:
    return request.app.state.server


@router.get("/livez", tags=["probes"], summary="The process is up")
async def livez() -> dict[str, str]:
    return {"status": "alive"}


@router.get("/readyz", tags=["probes"], summary="Every model loaded and warmed up, and not draining")
async def readyz(request: Request) -> JSONResponse:
    status, body = state(request).readiness()
    return JSONResponse(body, status_code=status)


@router.get("/metrics", tags=["probes"], summary="Prometheus metrics", response_class=PlainTextResponse)
async def metrics(request: Request) -> PlainTextResponse:
    return PlainTextResponse(state(request).metrics.exposition(), media_type=CONTENT_TYPE_LATEST)


@router.get("/v1/models", response_model=schemas.ModelList, tags=["models"], summary="Every served model")
async def list_models(request: Request) -> dict[str, Any]:
    server = state(request)
    return {"models": [server.model_info(model) for model in server.registry.models.values()]}


@router.get(
    "/v1/models/{name}", response_model=schemas.ModelInfo, responses=ERRORS, tags=["models"], summary="One model"
)
async def get_model(name: str, request: Request) -> dict[str, Any]:
    server = state(request)
    return server.model_info(server.registry.lookup(name))


@router.post(
    "/v1/models/{name}/classify",
    response_model=schemas.ClassifyResponse,
    responses=ERRORS,
    tags=["inference"],
    summary="Sequence classification of texts or text pairs",
)
async def classify(name: str, body: schemas.ClassifyRequest, request: Request) -> JSONResponse:
    items = body.inputs if isinstance(body.inputs, list) else [body.inputs]
    inputs = [item if isinstance(item, str) else (item.text, item.text_pair) for item in items]
    async with admitted(request) as ticket:
        results, timings = await state(request).inference.classify(name, inputs, body.top_k, ticket)
    return answer(name, results, timings, ticket)


@router.post(
    "/v1/models/{name}/ner",
    response_model=schemas.NerResponse,
    responses=ERRORS,
    tags=["inference"],
    summary="Named entities (token classification with aggregation)",
)
async def recognize(name: str, body: schemas.NerRequest, request: Request) -> JSONResponse:
    texts = body.inputs if isinstance(body.inputs, list) else [body.inputs]
    async with admitted(request) as ticket:
        results, timings = await state(request).inference.ner(name, texts, body.aggregation_strategy, ticket)
    return answer(name, results, timings, ticket)


@router.post(
    "/v1/models/{name}/qa",
    response_model=schemas.QaResponse,
    responses=ERRORS,
    tags=["inference"],
    summary="Extractive question answering",
)
async def answer_questions(name: str, body: schemas.QaRequest, request: Request) -> JSONResponse:
    items = body.inputs if isinstance(body.inputs, list) else [body.inputs]
    params = body.model_dump(exclude={"inputs"})
    async with admitted(request) as ticket:
        results, timings = await state(request).inference.qa(
            name, [(item.question, item.context) for item in items], params, ticket
        )
    return answer(name, results, timings, ticket)


@contextlib.asynccontextmanager
async def admitted(request: Request) -> AsyncIterator[Ticket]:
    """Refuse work while draining; give the work a deadline; cancel it if the client goes away."""
    server = state(request)
    if server.draining:
        raise NotReady("the server is shutting down")
    ticket = Ticket.with_timeout(server.settings.request_timeout_s, request_id=REQUEST_ID.get())
    ticket.started = time.perf_counter()
    watcher = asyncio.create_task(_watch_disconnect(request, ticket))
    try:
        yield ticket
    finally:
        watcher.cancel()


async def _watch_disconnect(request: Request, ticket: Ticket) -> None:
    """Wait for the ASGI `http.disconnect` message: one sleeping task per request, no polling.

    The body has been read by now, so the next message the server hands over is the disconnect (uvicorn sends
    it when the client closes the connection, or once the response is complete, when this task is cancelled)."""
    message = await request.receive()
    if message["type"] == "http.disconnect":
        ticket.cancel()


def answer(name: str, results: list, timings: Timings, ticket: Ticket) -> JSONResponse:
    headers = {
        "x-total-time-ms": f"{1000 * (time.perf_counter() - ticket.started):.2f}",
        "x-tokenization-time-ms": f"{1000 * timings.tokenization_s:.2f}",
        "x-queue-time-ms": f"{1000 * timings.queue_s:.2f}",
        "x-inference-time-ms": f"{1000 * timings.inference_s:.2f}",
        "x-inference-calls": str(timings.inference_calls),
        "x-rows": str(timings.rows),
    }
    return JSONResponse({"model": name, "results": results}, headers=headers)
