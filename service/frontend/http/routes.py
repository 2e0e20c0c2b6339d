"""HTTP endpoints: thin. Parse, call the request pipeline, shape the response and its timing headers.

The probes and model information are FastAPI routes (`router`); the inference endpoints are `INFERENCE_ROUTES`."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import inspect
import json
import math
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse
from fastapi.routing import APIRoute
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import BaseModel, ValidationError
from starlette.responses import Response
from starlette.routing import Route

from service.errors import BadRequest, ClientClosed, InvalidInput, NotReady
from service.frontend.admission import SCOPE_ADMISSION
from service.frontend.http import schemas
from service.frontend.http.content_coding import accepts_gzip
from service.frontend.http.errors import EMPTY_BODY, INVALID_JSON
from service.frontend.http.httptools_protocol import SCOPE_ON_DISCONNECT
from service.frontend.http.json_answer import JsonAnswer
from service.frontend.http.state import ServerState
from service.frontend.pipeline import RequestPipeline, Timings
from service.logs import REQUEST_ID
from service.wire.ticket import Ticket

ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": schemas.ErrorBody} for code in (400, 404, 413, 415, 422, 429, 500, 503, 504)
}
router = APIRouter()


def server_state(request: Request) -> ServerState:
    return request.app.state.server


PROBE_ERRORS: dict[int | str, dict[str, Any]] = {503: {"model": schemas.ErrorBody}}


@router.get(
    "/livez",
    tags=["probes"],
    summary="The process is up, and no batch is stuck on the device",
    responses=PROBE_ERRORS,
)
async def livez(request: Request) -> JSONResponse:
    status, body = server_state(request).liveness()
    return JSONResponse(body, status_code=status)


@router.get(
    "/readyz",
    tags=["probes"],
    summary="Every model loaded and warmed up, and not draining",
    responses={503: {"model": schemas.NotReadyBody}},
)
async def readyz(request: Request) -> JSONResponse:
    status, body = server_state(request).readiness()
    return JSONResponse(body, status_code=status)


# gzip's fastest level: an exposition's lines repeat their names and labels, so it takes most of level 9's gain at a
# fraction of its time
METRICS_GZIP_LEVEL = 1


@router.get("/metrics", tags=["probes"], summary="Prometheus metrics", response_class=PlainTextResponse)
async def metrics(request: Request) -> Response:
    exposition = server_state(request).metrics.exposition()
    if not accepts_gzip(request.headers.get("accept-encoding", "")):
        return Response(exposition, media_type=CONTENT_TYPE_LATEST, headers={"Vary": "Accept-Encoding"})
    return Response(
        gzip.compress(exposition, compresslevel=METRICS_GZIP_LEVEL),
        media_type=CONTENT_TYPE_LATEST,
        headers={"Content-Encoding": "gzip", "Vary": "Accept-Encoding"},
    )


@router.get("/v1/models", response_model=schemas.ModelList, tags=["models"], summary="Every served model")
async def list_models(request: Request) -> dict[str, Any]:
    server = server_state(request)
    models = [server.model_info(model) for model in server.registry.models.values()]
    # OpenAI's models API beside (the openai SDK's models.list() reads `data`)
    openai = [{key: model[key] for key in ("id", "object", "created", "owned_by")} for model in models]
    return {"models": models, "object": "list", "data": openai}


@router.get(
    "/v1/models/{name}", response_model=schemas.ModelInfo, responses=ERRORS, tags=["models"], summary="One model"
)
async def get_model(name: str, request: Request) -> dict[str, Any]:
    server = server_state(request)
    return server.model_info(server.registry.lookup(name))


@dataclass(frozen=True)
class InferenceRoute:
    """One inference endpoint, served as a plain Starlette route and documented as a FastAPI one.

    FastAPI's per-request machinery (dependency solving, its body handling, the included router's matching) was a
    fifth of a front-end's time under 1-input load; here the body is parsed and validated once against the same
    request schema, and a body FastAPI would refuse gets the same error. The schema and the docs are built from
    `documentation()`, an APIRoute that is never mounted."""

    action: str  # the path's last part
    name: str  # the operation's name in the schema
    summary: str
    request: type[BaseModel]
    response: type[BaseModel]
    run: Callable[[RequestPipeline, str, Any, Ticket], Awaitable[tuple[list, Timings]]]

    @property
    def path(self) -> str:
        return f"/v1/models/{{name}}/{self.action}"

    def route(self) -> Route:
        return Route(self.path, self.serve, methods=["POST"], name=self.name)

    async def serve(self, request: Request) -> Response:
        body = parse_body(self.request, await json_body(request))
        name = request.path_params["name"]
        async with admitted(request) as ticket:
            results, timings = await self.run(server_state(request).pipeline, name, body, ticket)
        return answer(name, results, timings, ticket)

    def documentation(self) -> APIRoute:
        return documented(self.path, self.name, self.summary, self.request, self.response)


@dataclass(frozen=True)
class AdapterRoute:
    """An endpoint of another protocol's adapter (`hf_tasks`, `rerank`): a plain Starlette route documented as a
    FastAPI one, as InferenceRoute; the endpoint parses its body with `parse_body` and opens its Ticket with
    `admitted`, as the native routes do."""

    path: str
    name: str
    summary: str
    request: Any  # the body's type, for the schema
    response: Any
    endpoint: Callable[[Request], Awaitable[Response]]
    errors: dict[int | str, dict[str, Any]] | None = None  # its error answers, where not ERRORS' (the one body)

    def route(self) -> Route:
        return Route(self.path, self.endpoint, methods=["POST"], name=self.name)

    def documentation(self) -> APIRoute:
        return documented(self.path, self.name, self.summary, self.request, self.response, self.errors)


def documented(
    path: str,
    name: str,
    summary: str,
    request: Any,
    response: Any,
    errors: dict[int | str, dict[str, Any]] | None = None,
) -> APIRoute:
    """An APIRoute that documents a POST operation whose requests go elsewhere (it is never mounted); `errors`: its
    error answers (None: ERRORS, the one error body)."""

    def endpoint(name: str, body: BaseModel) -> None:  # documents the operation; requests go to the real route
        raise NotImplementedError

    parameters = inspect.signature(endpoint).parameters
    kept = [parameters["name"].replace(annotation=str)] if "{name}" in path else []
    endpoint.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [*kept, parameters["body"].replace(annotation=request)]
    )
    return APIRoute(
        path,
        endpoint,
        methods=["POST"],
        name=name,
        response_model=response,
        responses=ERRORS if errors is None else errors,
        tags=["inference"],
        summary=summary,
    )


def parse_body(schema: type[BaseModel], data: Any) -> Any:
    """The body validated against `schema`; its errors reported as FastAPI reports a body's errors
    (service.frontend.http.errors)."""
    try:
        return schema.model_validate(data)
    except ValidationError as exc:
        raise RequestValidationError([{**e, "loc": ("body", *e["loc"])} for e in exc.errors()]) from None


async def json_body(request: Request) -> Any:
    """The request's JSON, as FastAPI reads a body: none is a missing body, and bytes that are not JSON in UTF-8
    a 400. (A body that says it is something else was refused before: JsonOnlyMiddleware.)"""
    raw = await request.body()
    if not raw:
        raise InvalidInput(EMPTY_BODY, field="body")
    try:
        return strict_json(raw)
    except (ValueError, RecursionError) as exc:  # not JSON, not UTF-8, nested past the parser's depth
        raise BadRequest(f"{INVALID_JSON}: {why_not_json(exc)}") from None


class NotAJsonNumber(ValueError):
    pass


def _refused_constant(name: str) -> Any:
    raise NotAJsonNumber(f"{name} is not a JSON number")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise NotAJsonNumber(f"the number {text[:20]} is past the largest a double holds")
    return value


_STRICT = json.JSONDecoder(parse_constant=_refused_constant, parse_float=_finite)  # made once: loads() makes one a call


def strict_json(raw: bytes) -> Any:
    """JSON as RFC 8259 has it: Python's parser also takes NaN and Infinity, and reads 1e999 as infinity, none of
    which an answer can carry back (a request that had its value echoed, a rerank document's or an OIP id, got a
    500 as the answer was written). Bytes are read as `json.loads` reads them (UTF-8, -16 or -32 by their start)."""
    return _STRICT.decode(raw.decode(json.detect_encoding(raw), "surrogatepass"))


def why_not_json(exc: Exception) -> str:
    """What the parser found wrong, and where, so that a client can find the fault in what it sent."""
    if isinstance(exc, NotAJsonNumber):
        return str(exc)
    if isinstance(exc, json.JSONDecodeError):
        what = exc.msg.removesuffix(" at")  # "Invalid control character at" said "at at line"
        return f"{what} at line {exc.lineno}, column {exc.colno}"
    if isinstance(exc, UnicodeDecodeError):
        return f"byte {exc.start} is not UTF-8"
    if isinstance(exc, RecursionError):
        return "it is nested too deeply"
    if "integer string conversion" in str(exc):
        return f"a number has more digits than the parser takes ({sys.get_int_max_str_digits()})"
    return "it cannot be parsed"


async def _classify(pipeline: RequestPipeline, name: str, body: Any, ticket: Ticket) -> tuple[list, Timings]:
    items = body.inputs if isinstance(body.inputs, list) else [body.inputs]
    inputs = [item if isinstance(item, str) else item.as_input() for item in items]
    return await pipeline.classify(name, inputs, body.top_k, ticket)


SPLIT_WORDS_NEED_LISTS = (
    "with is_split_into_words, inputs is one text's words (a list of strings) or a list of such lists, not a mix"
)
WORD_LISTS_NEED_SPLIT = "inputs holds lists of words: send is_split_into_words: true with them, or texts"


async def _recognize(pipeline: RequestPipeline, name: str, body: Any, ticket: Ticket) -> tuple[list, Timings]:
    inputs = body.inputs if isinstance(body.inputs, list) else [body.inputs]
    lists = sum(isinstance(item, list) for item in inputs)
    if body.is_split_into_words:
        if isinstance(body.inputs, str) or 0 < lists < len(inputs):
            raise InvalidInput(SPLIT_WORDS_NEED_LISTS, field="inputs")
        return await pipeline.ner(name, inputs if lists else [inputs], body.aggregation_strategy, ticket)
    if lists:
        raise InvalidInput(WORD_LISTS_NEED_SPLIT, field="inputs")
    return await pipeline.ner(name, inputs, body.aggregation_strategy, ticket)


async def _answer_questions(pipeline: RequestPipeline, name: str, body: Any, ticket: Ticket) -> tuple[list, Timings]:
    items = body.inputs if isinstance(body.inputs, list) else [body.inputs]
    params = body.model_dump(exclude={"inputs"})
    return await pipeline.qa(name, [(item.question, item.context) for item in items], params, ticket)


async def _embed(pipeline: RequestPipeline, name: str, body: Any, ticket: Ticket) -> tuple[list, Timings]:
    texts = body.inputs if isinstance(body.inputs, list) else [body.inputs]
    return await pipeline.embed(
        name, texts, ticket, body.normalize, body.dimensions, body.truncate, prompt_name=body.prompt_name
    )


INFERENCE_ROUTES = (
    InferenceRoute(
        "classify",
        "classify",
        "Sequence classification of texts or text pairs",
        schemas.ClassifyRequest,
        schemas.ClassifyResponse,
        _classify,
    ),
    InferenceRoute(
        "ner",
        "recognize",
        "Named entities (token classification with aggregation)",
        schemas.NerRequest,
        schemas.NerResponse,
        _recognize,
    ),
    InferenceRoute(
        "qa",
        "answer_questions",
        "Extractive question answering",
        schemas.QaRequest,
        schemas.QaResponse,
        _answer_questions,
    ),
    InferenceRoute(
        "embed",
        "embed",
        "Sentence embeddings: a vector per text",
        schemas.EmbedRequest,
        schemas.EmbedResponse,
        _embed,
    ),
)


@contextlib.asynccontextmanager
async def admitted(request: Request) -> AsyncIterator[Ticket]:
    """Refuse work while draining; give the work a deadline; cancel it if the client goes away."""
    server = server_state(request)
    if server.draining:
        raise NotReady("the server is shutting down")
    ticket = Ticket.with_timeout(server.settings.request_timeout_s, request_id=REQUEST_ID.get())
    ticket.started = time.perf_counter()
    if (admission := request.scope.get(SCOPE_ADMISSION)) is not None:
        ticket.on_charge.append(admission.charge)
        ticket.admitted_model = admission.model_name
        ticket.admitted_at = admission.door.admitted_at
    on_disconnect: list | None = request.scope.get(SCOPE_ON_DISCONNECT)  # this server's HTTP protocol calls them
    watcher = None
    if on_disconnect is not None:
        on_disconnect.append(ticket.cancel)
    else:  # another ASGI server
        watcher = asyncio.create_task(_watch_disconnect(request, ticket))
    try:
        yield ticket
        if ticket.cancelled:  # answered after its client left: nobody reads it (a 200 counted success for nobody)
            raise ClientClosed("the client went away before the answer")
    finally:
        if watcher is not None:
            watcher.cancel()
        else:
            on_disconnect.remove(ticket.cancel)  # type: ignore[union-attr]
        ticket.done()


async def _watch_disconnect(request: Request, ticket: Ticket) -> None:
    """Wait for the ASGI `http.disconnect` message: one sleeping task per request, no polling.

    The body has been read by now, so the next message the server hands over is the disconnect (uvicorn sends
    it when the client closes the connection, or once the response is complete, when this task is cancelled)."""
    message = await request.receive()
    if message["type"] == "http.disconnect":
        ticket.cancel()


def answer(name: str, results: list, timings: Timings, ticket: Ticket) -> JsonAnswer:
    return JsonAnswer({"model": name, "results": results}, headers=timing_headers(timings, ticket))


def timing_headers(timings: Timings, ticket: Ticket) -> dict[str, str]:
    """Where the request's time went: every inference answer carries them, whatever its protocol."""
    return {
        "x-total-time-ms": f"{1000 * (time.perf_counter() - ticket.started):.2f}",
        "x-tokenization-time-ms": f"{1000 * timings.tokenization_s:.2f}",
        "x-queue-time-ms": f"{1000 * timings.queue_s:.2f}",
        "x-inference-time-ms": f"{1000 * timings.inference_s:.2f}",
        "x-inference-calls": str(timings.inference_calls),
        "x-rows": str(timings.rows),
    }
