"""Rerank: `POST /v1/rerank` (Cohere v1 and Jina: {model, query, documents, top_n, return_documents}) and
`POST /v2/rerank` (Cohere v2: {model, query, documents, top_n, max_tokens_per_doc}), for a cross-encoder (a
classification entry with one label, marked rerank by the export).

Answers `{id, model, results: [{index, relevance_score, document?}], meta, usage}`, best first: `id` is the
request's id, `meta` what Cohere's clients parse, `usage` what Jina's do. The score is the sigmoid of the
cross-encoder's logit (`RequestPipeline.rerank`). An adapter only: the pairs are one request's rows in the
batcher, and the request is admitted, limited, timed and counted as the native routes' are."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from service.errors import InvalidInput
from service.frontend.http import schemas
from service.frontend.http.json_answer import JsonAnswer
from service.frontend.http.middleware import SCOPE_MODEL, note_body_model
from service.frontend.http.routes import AdapterRoute, admitted, json_body, parse_body, server_state, timing_headers
from service.frontend.http.state import ServerState
from service.frontend.pipeline import Timings
from service.wire.ticket import Ticket


def only_rerank_model(server: ServerState) -> str:
    """The model a request that names none goes to: the one rerank model served, where there is exactly one."""
    names = sorted(m.name for m in server.registry.models.values() if m.config is not None and m.config.rerank)
    if len(names) == 1:
        return names[0]
    served = f"the rerank models served: {', '.join(names)}" if names else "this server serves no rerank model"
    raise InvalidInput(f"name the model ({served})", field="model")


def ranked(scores: list[float], order: list[int], top_n: int | None) -> list[dict[str, Any]]:
    """Results best first, in the logits' order (equal logits in the documents' order)."""
    return [{"index": index, "relevance_score": scores[index]} for index in order[:top_n]]


DOCUMENTS_PER_SEARCH_UNIT = 100


def search_units(documents: int) -> int:
    """Cohere bills a search unit per query of up to 100 documents. A document past the model's window is cut or
    refused here (`--token-overflow`), never split into chunks, so each counts once."""
    return max(1, -(-documents // DOCUMENTS_PER_SEARCH_UNIT))


def envelope(
    name: str, results: list[dict[str, Any]], documents: int, version: str, timings: Timings, ticket: Ticket
) -> dict[str, Any]:
    return {
        "id": ticket.request_id or "",
        "model": name,
        "results": results,
        "meta": {"api_version": {"version": version}, "billed_units": {"search_units": search_units(documents)}},
        "usage": {"total_tokens": timings.tokens},
    }


async def serve_v1(request: Request) -> Response:
    data = await json_body(request)
    note_body_model(request.scope, data)
    body = parse_body(schemas.RerankRequest, data)
    server = server_state(request)
    name = body.model if body.model is not None else only_rerank_model(server)
    request.scope[SCOPE_MODEL] = name
    texts = [document if isinstance(document, str) else document.text for document in body.documents]
    async with admitted(request) as ticket:
        scores, order, timings = await server.pipeline.rerank(name, body.query, texts, ticket)
    results = ranked(scores, order, body.top_n)
    if body.return_documents:
        for result in results:
            document = body.documents[result["index"]]
            result["document"] = {"text": document} if isinstance(document, str) else document.model_dump()
    return JsonAnswer(
        envelope(name, results, len(texts), "1", timings, ticket), headers=timing_headers(timings, ticket)
    )


async def serve_v2(request: Request) -> Response:
    data = await json_body(request)
    note_body_model(request.scope, data)
    body = parse_body(schemas.RerankV2Request, data)
    server = server_state(request)
    request.scope[SCOPE_MODEL] = body.model
    async with admitted(request) as ticket:
        scores, order, timings = await server.pipeline.rerank(
            body.model, body.query, body.documents, ticket, max_tokens_per_doc=body.max_tokens_per_doc
        )
    results = ranked(scores, order, body.top_n)
    return JsonAnswer(
        envelope(body.model, results, len(body.documents), "2", timings, ticket),
        headers=timing_headers(timings, ticket),
    )


ROUTES = (
    AdapterRoute(
        "/v1/rerank",
        "rerank_v1",
        "Rerank documents by a cross-encoder (Cohere v1, Jina)",
        schemas.RerankRequest,
        schemas.RerankResponse,
        serve_v1,
    ),
    AdapterRoute(
        "/v2/rerank",
        "rerank_v2",
        "Rerank documents by a cross-encoder (Cohere v2)",
        schemas.RerankV2Request,
        schemas.RerankResponse,
        serve_v2,
    ),
)
