"""The Open Inference Protocol v2 over REST (KServe's v2 protocol, tritonclient.http): a thin adapter over the one
RequestPipeline. What the tensors mean is `service.frontend.open_inference` (shared with gRPC); here, only JSON
(and Triton's binary tensor data: JSON, then raw bytes) in and out.

GET /v2, /v2/health/live, /v2/health/ready, /v2/models/{name}, /v2/models/{name}/ready; POST
/v2/models/{name}/infer. The infer route goes through the same layers as the native inference routes (API key,
body limit, JSON only, admission, metrics, request id, deadline: `middleware.is_inference` names it); its errors are
the server's one error body, whose `error` is the protocol's error response.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from pydantic import BaseModel, ConfigDict, Field, StrictInt, ValidationError
from starlette.responses import Response
from starlette.routing import Route

from bertcore.messages import shown
from service.errors import BadRequest, ModelNotFound
from service.frontend import open_inference as oip
from service.frontend.http import schemas
from service.frontend.http.json_answer import JsonAnswer, stdlib_json
from service.frontend.http.routes import (
    admitted,
    json_body,
    server_state,
    strict_json,
    timing_headers,
    why_not_json,
)
from service.wire.ticket import Ticket

INFER_PATH = "/v2/models/{name}/infer"
PROBES = frozenset({"/v2/health/live", "/v2/health/ready"})
HEADER_LENGTH = "inference-header-content-length"  # Triton's binary extension: the JSON part's length
ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": schemas.ErrorBody} for code in (400, 401, 404, 413, 415, 422, 429, 500, 503, 504)
}
router = APIRouter(tags=["open inference protocol v2"])
# 503 from a health or ready route: its own body, saying false
NOT_READY_BODY: dict[int | str, dict[str, Any]] = {503: {"description": "Not (yet, or no longer)"}}
BINARY_ANSWER: dict[int | str, dict[str, Any]] = {
    200: {
        "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
        "description": "JSON, or with binary outputs (Triton's binary tensor data) the JSON then the outputs' bytes; "
        "Inference-Header-Content-Length gives the JSON's length",
    }
}


class Parameters(BaseModel):
    """Request parameters: the task's (classification: top_k; ner: aggregation_strategy; qa: top_k,
    max_answer_len, doc_stride, max_seq_len, max_question_len, handle_impossible_answer, align_to_words; embedding:
    normalize, dimensions)."""

    model_config = ConfigDict(extra="allow")


class InferInputTensor(BaseModel):
    name: str = Field(description="text, text_pair (classification); text (ner, embedding); question, context (qa)")
    shape: list[StrictInt] = Field(description="[N] or [N, 1]: N texts")  # "1", 1.0, true: not int64s
    datatype: str = Field(description="BYTES")
    parameters: dict[str, Any] | None = Field(None, description="binary_data_size: the data follows the JSON")
    data: list[Any] | None = Field(None, description="the texts, row-major (flat or nested)")


class InferRequestedOutput(BaseModel):
    name: str
    parameters: dict[str, Any] | None = Field(None, description="binary_data: true for the raw form")


class InferRequest(BaseModel):
    id: str | None = None
    parameters: Parameters | None = None
    inputs: list[InferInputTensor] = Field(min_length=1, max_length=16)  # a model takes two at most
    outputs: list[InferRequestedOutput] | None = None


class InferOutputTensor(BaseModel):
    name: str
    shape: list[int]
    datatype: str
    parameters: dict[str, Any] | None = None
    data: list[Any] | None = None


class InferResponse(BaseModel):
    model_name: str
    model_version: str | None = None
    id: str | None = None
    parameters: dict[str, Any] | None = None
    outputs: list[InferOutputTensor]


class TensorMetadata(BaseModel):
    name: str
    datatype: str
    shape: list[int]


class ModelMetadata(BaseModel):
    name: str
    versions: list[str]
    platform: str
    inputs: list[TensorMetadata]
    outputs: list[TensorMetadata]


class ServerMetadata(BaseModel):
    name: str
    version: str
    extensions: list[str]


class Live(BaseModel):
    live: bool


class Ready(BaseModel):
    ready: bool


class ModelReady(BaseModel):
    name: str
    ready: bool


@router.get("/v2", response_model=ServerMetadata, summary="Server metadata")
async def metadata() -> dict[str, Any]:
    return oip.server_metadata()


@router.get("/v2/health/live", response_model=Live, summary="The server is live", responses=NOT_READY_BODY)
async def live(request: Request) -> JSONResponse:
    status, _ = server_state(request).liveness()
    return JSONResponse({"live": status == 200}, status_code=status)


@router.get(
    "/v2/health/ready", response_model=Ready, summary="Every model is ready (503 while not)", responses=NOT_READY_BODY
)
async def ready(request: Request) -> JSONResponse:
    status, _ = server_state(request).readiness()
    return JSONResponse({"ready": status == 200}, status_code=status)


@router.get("/v2/models/{name}", response_model=ModelMetadata, summary="A model's tensors", responses=ERRORS)
async def model_metadata(name: str, request: Request) -> dict[str, Any]:
    registry = server_state(request).registry
    if name == "stats" and name not in registry.models:  # Triton's GET /v2/models/stats (tritonclient's)
        raise ModelNotFound(oip.NOT_SERVED["stats"])
    return oip.model_metadata(registry.lookup(name))


@router.get("/v2/models/{name}/stats", include_in_schema=False)
@router.get("/v2/models/{name}/config", include_in_schema=False)
async def not_served(name: str, request: Request) -> None:
    """Triton's statistics and model configuration, as tritonclient asks them: a 404 that says what to use."""
    raise ModelNotFound(oip.NOT_SERVED[request.url.path.rsplit("/", 1)[-1]])


@router.api_route("/v2/models/{name}/versions/{version}", methods=["GET", "POST"], include_in_schema=False)
@router.api_route("/v2/models/{name}/versions/{version}/{rest:path}", methods=["GET", "POST"], include_in_schema=False)
async def versioned(name: str, version: str) -> None:
    """A model's version named (tritonclient's model_version): what gRPC says of it, not "no such endpoint"."""
    raise oip.unversioned(name, version)


@router.get(
    "/v2/models/{name}/ready",
    response_model=ModelReady,
    summary="The model is ready (503 while not)",
    responses={**ERRORS, **NOT_READY_BODY},
)
async def model_ready(name: str, request: Request) -> JSONResponse:
    model = server_state(request).registry.lookup(name)
    ready = model.status == "ready" and not server_state(request).draining
    return JSONResponse({"name": name, "ready": ready}, status_code=200 if ready else 503)


async def infer(request: Request) -> Response:
    """POST /v2/models/{name}/infer: served as a plain Starlette route, as the native inference routes are."""
    body, binary = await _split_body(request)
    try:
        parsed = InferRequest.model_validate(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        raise BadRequest(f"{where}: {first['msg']}" if where else first["msg"], field=where or None) from None
    name = request.path_params["name"]
    server = server_state(request)
    model = server.registry.lookup(name)
    inputs, offset = [], 0
    for tensor in parsed.inputs:
        size = (tensor.parameters or {}).get("binary_data_size")
        raw = None
        if size is not None:
            if not isinstance(size, int) or isinstance(size, bool) or size < 0:
                raise BadRequest(f"input {tensor.name}: binary_data_size {shown(size, 22)} is not a size in bytes")
            if binary is None:
                raise BadRequest(f"input {tensor.name}: binary_data_size needs the {HEADER_LENGTH} header")
            raw, offset = binary[offset : offset + size], offset + size
            if len(raw) != size:
                raise BadRequest(f"input {tensor.name}: binary_data_size {size} runs past the end of the body")
            if tensor.data is not None:  # two payloads for one tensor: which was meant is not for us to guess
                raise BadRequest(f"input {tensor.name}: both data and binary_data_size; send its texts one way")
        values = None if raw is not None else _flat(tensor.data or [])
        inputs.append(oip.InputTensor(tensor.name, tensor.datatype, tensor.shape, values=values, raw=raw))
    if binary is not None and offset != len(binary):
        raise BadRequest(f"the body holds {len(binary) - offset} bytes after the inputs' binary data")
    parameters = parsed.parameters.model_dump() if parsed.parameters else {}
    requested = [output.name for output in parsed.outputs] if parsed.outputs else None
    for output in parsed.outputs or ():
        oip.check_output_parameters(output.name, output.parameters or {})
    async with admitted(request) as ticket:
        result = await oip.infer(server.pipeline, model, inputs, parameters, requested, ticket)
    binary_out = {
        output.name for output in parsed.outputs or () if (output.parameters or {}).get("binary_data") is True
    }
    if parameters.get("binary_data_output") is True:
        binary_out = {output.name for output in result.outputs}
    return _answer(name, parsed.id, result, binary_out, ticket)


async def _split_body(request: Request) -> tuple[Any, bytes | None]:
    """The JSON part and, with Triton's binary extension (its header), the bytes after it."""
    given = request.headers.getlist(HEADER_LENGTH)
    if not given:
        return await json_body(request), None
    if len(given) > 1:  # which one splits the body is not for us to guess (the first had been taken)
        raise BadRequest(f"{len(given)} {HEADER_LENGTH} headers: send one")
    declared = given[0]
    raw = await request.body()
    # "²" is a digit to isdigit; past 19 digits no body is that long (and int() refuses 4,300 with a ValueError)
    if not (declared.isascii() and declared.isdigit()) or len(declared) > 19 or int(declared) > len(raw):
        raise BadRequest(f"{HEADER_LENGTH} {shown(declared, 22)} is not a length within the body ({len(raw)} bytes)")
    length = int(declared)
    try:
        return strict_json(raw[:length]), raw[length:]
    except (ValueError, RecursionError) as exc:
        why = why_not_json(exc)  # as a plain JSON body's 400 says it
        raise BadRequest(f"the first {length} bytes ({HEADER_LENGTH}) are not JSON (UTF-8): {why}") from None


def _flat(data: list[Any]) -> list[Any]:
    """A tensor's data, flat: the protocol allows nested lists (row-major) as well as a flat one."""
    if not any(isinstance(item, list) for item in data):
        return data
    flat: list[Any] = []
    for item in data:
        if isinstance(item, list):
            if any(isinstance(inner, list) for inner in item):
                raise BadRequest("tensor data nested deeper than the shape [N, 1] this server takes")
            flat.extend(item)
        else:
            flat.append(item)
    return flat


def _answer(name: str, request_id: str | None, result: oip.InferResult, binary: set[str], ticket: Ticket) -> Response:
    outputs: list[dict[str, Any]] = []
    chunks: list[bytes] = []
    for output in result.outputs:
        tensor: dict[str, Any] = {"name": output.name, "datatype": output.datatype, "shape": output.shape}
        if output.name in binary:
            raw = output.raw()
            chunks.append(raw)
            tensor["parameters"] = {"binary_data_size": len(raw)}
        else:
            tensor["data"] = output.data
        outputs.append(tensor)
    content: dict[str, Any] = {"model_name": name, "outputs": outputs}
    if request_id is not None:
        content["id"] = request_id
    headers = timing_headers(result.timings, ticket)
    if not chunks:
        return JsonAnswer(content, headers=headers)
    header = stdlib_json(content, allow_nan=True)
    headers[HEADER_LENGTH] = str(len(header))
    return Response(b"".join([header, *chunks]), media_type="application/octet-stream", headers=headers)


def infer_route() -> Route:
    return Route(INFER_PATH, infer, methods=["POST"], name="v2_infer")


def infer_documentation() -> APIRoute:
    """The infer route as FastAPI would document it (never mounted: requests go to `infer`)."""

    def endpoint(name: str, body: InferRequest) -> None:
        raise NotImplementedError

    return APIRoute(
        INFER_PATH,
        endpoint,
        methods=["POST"],
        name="v2_infer",
        response_model=InferResponse,
        responses={**ERRORS, **BINARY_ANSWER},
        tags=["open inference protocol v2"],
        summary="Inference: text in BYTES tensors, the model's outputs back",
    )
