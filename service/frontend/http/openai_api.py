"""OpenAI's embeddings API: `POST /v1/embeddings` ({input, model, encoding_format, dimensions, user}), as the openai
SDK and the OpenAI-compatible clients built on it (LangChain's, LlamaIndex's) send it, for an embedding entry.

Answers `{object: "list", data: [{object: "embedding", index, embedding}], model, usage: {prompt_tokens,
total_tokens}}`: each vector of unit length (OpenAI's are), cut to its first `dimensions` values and normalized
again where asked; with `encoding_format` base64, the vector's little-endian float32 bytes in base64 (what the SDK
asks for by default, and decodes). `prompt_tokens` counts the rows' tokens, special tokens included. Errors have
OpenAI's shape, `{"error": {message, type, param, code}}`, with the statuses of the rest of the server but
OpenAI's 400 for the server's 422 (`errors.ERROR_SHAPES`). An adapter only: the texts are one request's rows in
the batcher, and the request is admitted, limited, timed and counted as the native routes' are."""

from __future__ import annotations

import base64
from typing import Any

import numpy as np
from starlette.requests import Request
from starlette.responses import Response

from service.errors import InvalidInput
from service.frontend.http import schemas
from service.frontend.http.errors import OPENAI_SHAPE
from service.frontend.http.json_answer import JsonAnswer
from service.frontend.http.middleware import OPENAI_EMBEDDINGS_PATH, SCOPE_MODEL, note_body_model
from service.frontend.http.routes import (
    ERRORS,
    AdapterRoute,
    admitted,
    json_body,
    parse_body,
    server_state,
    timing_headers,
)
from service.frontend.open_inference import FLOAT32_LE


def base64_vector(vector: np.ndarray) -> str:
    """The vector as OpenAI's base64 encoding carries it: its little-endian float32 bytes (exact: the values are
    float32 already)."""
    return base64.b64encode(np.asarray(vector, dtype=FLOAT32_LE).tobytes()).decode("ascii")


def envelope(name: str, vectors: list[np.ndarray], encoding_format: str | None, tokens: int) -> dict[str, Any]:
    encode = base64_vector if encoding_format == "base64" else None
    data = [
        {"object": "embedding", "index": index, "embedding": encode(vector) if encode else vector}
        for index, vector in enumerate(vectors)
    ]
    return {
        "object": "list",
        "data": data,
        "model": name,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }


# What a token-array request is told: OpenAI's API also takes `input` as token ids (tiktoken's), which LangChain's
# OpenAIEmbeddings sends by default; another tokenizer's ids mean nothing to this model's
TOKEN_IDS_REFUSED = (
    "input holds token ids (lists of integers): this server takes text and tokenizes it with the model's own "
    "tokenizer; send the strings (LangChain's OpenAIEmbeddings: check_embedding_ctx_length=False)"
)


def token_arrays(data: Any) -> bool:
    """Whether the body's `input` is a token array or a list of them (integers; JSON's true and false are not)."""
    value = data.get("input") if isinstance(data, dict) else None
    if not isinstance(value, list) or not value:
        return False
    first = value[0][0] if isinstance(value[0], list) and value[0] else value[0]
    return isinstance(first, int) and not isinstance(first, bool)


async def serve(request: Request) -> Response:
    data = await json_body(request)
    note_body_model(request.scope, data)
    if token_arrays(data):
        raise InvalidInput(TOKEN_IDS_REFUSED, field="input")
    body = parse_body(schemas.OpenAIEmbeddingRequest, data)
    server = server_state(request)
    request.scope[SCOPE_MODEL] = body.model
    texts = [body.input] if isinstance(body.input, str) else body.input
    async with admitted(request) as ticket:
        vectors, timings = await server.pipeline.embed(
            body.model, texts, ticket, normalize=True, dimensions=body.dimensions, field="input"
        )
    content = envelope(body.model, vectors, body.encoding_format, timings.tokens)
    return JsonAnswer(content, headers=timing_headers(timings, ticket))


# Its errors are OpenAI's body, at the statuses the rest of the server answers but OpenAI's 400 for its 422
OPENAI_ERRORS: dict[int | str, dict[str, Any]] = {
    OPENAI_SHAPE.status(int(code)): {"model": schemas.OpenAIErrorBody} for code in ERRORS
}
# (and FastAPI, seeing no 422 and no 4XX, would document a 422 of its own body, which this route never answers)
OPENAI_ERRORS["4XX"] = {"model": schemas.OpenAIErrorBody, "description": "Any client error, in OpenAI's body"}

ROUTES = (
    AdapterRoute(
        OPENAI_EMBEDDINGS_PATH,
        "openai_embeddings",
        "Embeddings (OpenAI's API): a vector per text, as floats or base64",
        schemas.OpenAIEmbeddingRequest,
        schemas.OpenAIEmbeddingResponse,
        serve,
        OPENAI_ERRORS,
    ),
)
