"""The Open Inference Protocol v2 over gRPC: KServe's GRPCInferenceService (ServerLive, ServerReady, ModelReady,
ServerMetadata, ModelMetadata, ModelInfer) on --grpc-port, served by grpcio's asyncio server in the front-end's own
event loop, beside its HTTP server (every front-end process in process mode, on one port: SO_REUSEPORT), with
grpc.health.v1.Health beside it (`service.frontend.grpc.health`).

A thin adapter over the one RequestPipeline, as the REST routes are: what the tensors mean is
`service.frontend.open_inference`; here, the messages in and out, and what the HTTP layers do for a REST request:
- the API key: `authorization: Bearer KEY` metadata (ServerLive and ServerReady are open, as the probes are, and
  so is grpc.health.v1.Health: it is served outside these Calls);
- the size limit: --max-body-bytes is the largest message (grpc answers RESOURCE_EXHAUSTED past it, in its own
  words, and ends the call before its message is read: the server is not told why, and counts it as a call its
  client ended, 499, as it counts a call whose compression grpc could not read);
- admission: the same gate as REST (RESOURCE_EXHAUSTED where REST answers 429, with retry-after metadata);
- the deadline: the call's own, where it is shorter than --request-timeout-s, bounds the request's Ticket; a call
  that the client cancels (or whose deadline passes) cancels its rows;
- the request id (`x-request-id` metadata, or a new one; sent back in the initial metadata), the access line and
  the request metrics (endpoint `grpc-infer`, and `grpc-info` for ModelMetadata and ModelReady; the status as
  its HTTP equivalent), for every call: the methods are served as stream-unary ones, which grpc runs before it has
  read the message (a unary method's handler is skipped where the call ends first: under load, most calls ended by
  a deadline of a few ms were neither counted nor logged), and the message is read by the handler (`Call._message`).
Errors are the domain errors, as gRPC codes by `service.frontend.grpc.status`; a method not served is UNIMPLEMENTED
with a message that names those served (`NotServed`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
import numpy as np
from google.protobuf.message import DecodeError, Message
from opentelemetry.trace import SpanKind

from bertcore.messages import cut, shown
from service import tracing
from service.errors import (
    CLIENT_CLOSED,
    BadRequest,
    DeadlineExceeded,
    ModelNotFound,
    NotReady,
    ServiceError,
    StartupError,
    Unauthorized,
)
from service.frontend import open_inference as oip
from service.frontend.grpc import health
from service.frontend.grpc import inference_pb2 as pb
from service.frontend.grpc.status import code_for_status, code_of
from service.frontend.http.auth import ApiKeys
from service.frontend.http.state import ServerState
from service.logs import REQUEST_ID, access_log, log_access, request_id_from
from service.settings import Settings
from service.wire.ticket import Ticket

log = logging.getLogger("service.frontend.grpc")


class ClientMetadataNoise(logging.Filter):
    """Drops grpc's "Invalid encoding on b'...'" ERROR and its traceback: a client's metadata value that is not
    UTF-8 (grpc hands it over as bytes, and this server reads it as such: a key that is not valid is a 401, a
    request id is replaced), which any client could otherwise write into the log at will, a traceback a call."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (isinstance(record.msg, str) and record.msg.startswith("Invalid encoding on"))


logging.getLogger("grpc._cython.cygrpc").addFilter(ClientMetadataNoise())
SERVICE = "inference.GRPCInferenceService"
OPEN_METHODS = frozenset({"ServerLive", "ServerReady"})  # the probes: open as /livez and /readyz are
INFER_ENDPOINT = "grpc-infer"  # the request metrics' endpoint label
INFO_ENDPOINT = "grpc-info"  # ... of ModelMetadata and ModelReady, the calls about one model (REST's "info")
# The longest error message sent: it travels in a trailer, and clients refuse trailers past 8-16 KB (tritonclient
# then reports RESOURCE_EXHAUSTED instead of the error); the messages quote clients' values cut short already
MAX_MESSAGE_CHARS = 2000
# A call cancelled this close to its deadline (or past it) is the deadline's doing (504), not the client's (499):
# the client's own timer starts before the server's and cancels first
DEADLINE_SLACK_S = tracing.DEADLINE_SLACK_S
FIRST_MESSAGE_WAIT_S = 1.0  # how long a call to a method not served is read before its refusal (`NotServed`)
# How long a call that read no message waits for grpc's cancel: none came, its client ended its stream without a
# message (400); one came, grpc ended the call (its client cancelled it, or grpc refused its message: its size, its
# compression), which grpc does not say: 499, and 504 where its deadline had passed
NO_MESSAGE_WAIT_S = 1.0


class InferenceService:
    """The service's methods: each takes a request message and the call's context, and returns the response."""

    def __init__(self, state: ServerState, keys: ApiKeys) -> None:
        self.state = state
        self.keys = keys

    async def server_live(self, request: pb.ServerLiveRequest, context: grpc.aio.ServicerContext) -> Any:
        status, _ = self.state.liveness()
        return pb.ServerLiveResponse(live=status == 200)

    async def server_ready(self, request: pb.ServerReadyRequest, context: grpc.aio.ServicerContext) -> Any:
        status, _ = self.state.readiness()
        return pb.ServerReadyResponse(ready=status == 200)

    async def model_ready(self, request: pb.ModelReadyRequest, context: grpc.aio.ServicerContext) -> Any:
        """Triton's contract, which tritonclient's is_model_ready relies on: a name (or version) not served is not
        ready, an answer and not an error (NOT_FOUND made is_model_ready raise instead of saying False)."""
        try:
            model = self.state.registry.lookup(_unversioned(request.name, request.version))
        except ModelNotFound:
            return pb.ModelReadyResponse(ready=False)
        return pb.ModelReadyResponse(ready=self.state.model_ready(model))

    async def server_metadata(self, request: pb.ServerMetadataRequest, context: grpc.aio.ServicerContext) -> Any:
        return pb.ServerMetadataResponse(**oip.server_metadata())

    async def model_metadata(self, request: pb.ModelMetadataRequest, context: grpc.aio.ServicerContext) -> Any:
        model = self.state.registry.lookup(_unversioned(request.name, request.version))
        return pb.ModelMetadataResponse(**oip.model_metadata(model))

    async def model_infer(self, request: pb.ModelInferRequest, context: grpc.aio.ServicerContext) -> Any:
        state = self.state
        if state.draining:
            raise NotReady("the server is shutting down")
        model = state.registry.lookup(_unversioned(request.model_name, request.model_version))
        raw = request.raw_input_contents
        if raw and len(raw) != len(request.inputs):
            raise BadRequest(f"{len(raw)} raw_input_contents for {len(request.inputs)} inputs: one each is needed")
        for tensor in request.inputs if raw else ():  # two payloads for a tensor: which was meant is not ours to guess
            if tensor.HasField("contents"):
                raise BadRequest(f"input {shown(tensor.name, 102)}: both contents and raw_input_contents; send one")
        for tensor in () if raw else request.inputs:
            if tensor.datatype == "BYTES" and not tensor.contents.bytes_contents and tensor.HasField("contents"):
                # texts in int_contents read as none ("shape [2] says 2 elements, the data holds 0")
                field = tensor.contents.ListFields()[0][0].name
                raise BadRequest(
                    f"input {shown(tensor.name, 102)}: datatype BYTES, its data in {field}: BYTES data "
                    "goes in bytes_contents"
                )
        inputs = [
            oip.InputTensor(
                tensor.name,
                tensor.datatype,
                list(tensor.shape),
                values=None if raw else tensor.contents.bytes_contents,
                raw=raw[i] if raw else None,
            )
            for i, tensor in enumerate(request.inputs)
        ]
        parameters = {name: _value(parameter) for name, parameter in request.parameters.items()}
        requested = [output.name for output in request.outputs] or None
        for output in request.outputs:
            oip.check_output_parameters(output.name, {key: _value(value) for key, value in output.parameters.items()})
        # Before the door: a call whose deadline had passed raised here after it had entered, never left, and held
        # its work in flight for good (every later request of the server a 429, "1 requests in flight, 77.6 s")
        ticket = _ticket(state.settings, context)
        door = state.door
        admission = door.try_enter(request.ByteSize(), model.name)
        if admission is None:
            raise door.overloaded()
        completed = False
        try:
            ticket.on_charge.append(admission.charge)
            ticket.admitted_model = admission.model_name
            ticket.admitted_at = admission.door.admitted_at
            try:
                result = await oip.infer(state.pipeline, model, inputs, parameters, requested, ticket)
            except asyncio.CancelledError:  # the client cancelled, or the call's deadline passed
                ticket.cancel()
                raise
            completed = True
        finally:
            ticket.done()  # the version it used is free to retire
            admission.leave(completed=completed)
        response = pb.ModelInferResponse(model_name=model.name, id=request.id)
        for output in result.outputs:
            tensor = response.outputs.add(name=output.name, datatype=output.datatype, shape=output.shape)
            if raw:
                response.raw_output_contents.append(output.raw())
            elif output.datatype == "BYTES":
                tensor.contents.bytes_contents.extend(text.encode("utf-8") for text in output.data)
            else:
                # an array's values as Python floats first: protobuf takes a list ~10x faster than numpy's scalars
                values = output.data.tolist() if isinstance(output.data, np.ndarray) else output.data
                tensor.contents.fp32_contents.extend(values)
        return response


def _unversioned(name: str, version: str) -> str:
    """The model's name; a version is refused (NOT_FOUND): the served models have none."""
    if version:
        raise oip.unversioned(name, version)
    return name


def _value(parameter: pb.InferParameter) -> Any:
    choice = parameter.WhichOneof("parameter_choice")
    return None if choice is None else getattr(parameter, choice)


def _ticket(settings: Settings, context: grpc.aio.ServicerContext) -> Ticket:
    """The request's Ticket: --request-timeout-s, or the call's own deadline where it comes sooner."""
    timeout = settings.request_timeout_s
    remaining = context.time_remaining()
    if remaining is not None:
        if remaining <= 0:
            raise DeadlineExceeded("the call's deadline passed before it was served")
        timeout = min(timeout, remaining)
    ticket = Ticket.with_timeout(timeout, request_id=REQUEST_ID.get())
    ticket.started = time.perf_counter()
    if tracing.ENABLED and remaining is not None:  # grpc cancels the call's task at its deadline
        tracing.CALL_DEADLINE.set(ticket.deadline)
    return ticket


Method = Callable[[Any, grpc.aio.ServicerContext], Awaitable[Any]]


class Call:
    """One method as grpc calls it: the key, the request id, the error codes, the access line and the metrics around
    the service's own method."""

    def __init__(self, name: str, method: Method, request_type: type[Message], keys: ApiKeys, state: ServerState):
        self.name = name
        self.path = f"/{SERVICE}/{name}"
        self.method = method
        self.request_type = request_type
        self.keys = keys
        self.state = state
        self.needs_key = keys.enabled and name not in OPEN_METHODS

    async def __call__(self, messages: Any, context: grpc.aio.ServicerContext) -> Any:
        """`messages`: grpc's iterator of the call's messages, unused: the one message is read by `_message`, and
        parsed here, so that bytes that are no such message are the client's error (INVALID_ARGUMENT), counted and
        logged as any other, not grpc's UNKNOWN and a traceback."""
        started = time.perf_counter()
        # Read at the start: once grpc has cancelled a call, its peer reads empty and its time remaining None (a call
        # past its deadline was logged as a client's cancel, 499, from "-"); one ended before its handler ran, "-"
        peer, remaining = context.peer(), context.time_remaining()
        request: Any = None
        pairs = tuple(context.invocation_metadata() or ())  # read once: grpc decodes the values at each read
        raw_id = next((value for key, value in pairs if key == "x-request-id"), None)
        request_id = request_id_from(raw_id.encode("latin-1", "replace") if isinstance(raw_id, str) else raw_id)
        REQUEST_ID.set(request_id)  # the call has a task of its own
        span = self._span(context, pairs) if tracing.ENABLED and self.name not in OPEN_METHODS else None
        initial: tuple[tuple[str, str], ...] = (("x-request-id", request_id),)
        if span is not None:
            initial += (("traceparent", tracing.traceparent(span.span.get_span_context())),)
        status = 500
        error_type: str | None = None
        try:
            await context.send_initial_metadata(initial)
            if self.needs_key:  # before the message is read: an anonymous client's bytes are not parsed
                self._authorize([value for key, value in pairs if key == "authorization"])
            request = self._read(await self._message(context))
            response = await self.method(request, context)
            status = 200
            return response
        except ServiceError as exc:
            status, error_type = exc.status_code, type(exc).__name__
            trailing = tuple((name.lower(), value) for name, value in exc.headers.items() if name == "Retry-After")
            await _abort(context, code_of(exc), cut(exc.message, MAX_MESSAGE_CHARS), trailing)
        except (asyncio.CancelledError, grpc.aio.InternalError) as exc:
            # the client cancelled or the call's deadline passed; or the call had ended before an operation on it
            # could run (grpc's ExecuteBatchError, at the initial metadata of a call of a few ms); or grpc ended it
            # before its message was read (`_message`): as a cancel, which grpc ends quietly (it logged a traceback)
            past_deadline = remaining is not None and time.perf_counter() - started >= remaining - DEADLINE_SLACK_S
            status = 504 if past_deadline else CLIENT_CLOSED
            error_type = "DeadlineExceeded" if status == 504 else "Cancelled"
            if isinstance(exc, grpc.aio.InternalError):
                raise asyncio.CancelledError from None
            raise
        except Exception as exc:
            if isinstance(exc, grpc.aio.AbortError):
                raise
            status, error_type = 500, type(exc).__name__
            log.error("unexpected error in %s", self.path, exc_info=exc)
            await _abort(context, grpc.StatusCode.INTERNAL, "internal server error")
        finally:
            self._record(request, peer, status, time.perf_counter() - started, request_id)
            if span is not None:
                self._end(span, status, error_type)

    @staticmethod
    async def _message(context: grpc.aio.ServicerContext) -> bytes:
        """The call's message, as bytes (the handlers' request_deserializer is None). None came: grpc ended the call
        (its cancel follows: a client's cancel, a message refused for its size or compression), or the client's
        stream ended without a whole message, which a unary client does not do."""
        message = await context.read()
        if message is not grpc.aio.EOF:
            return message
        await asyncio.sleep(NO_MESSAGE_WAIT_S)  # grpc's cancel, where it ended the call, raises CancelledError here
        raise BadRequest("the call's stream ended without a whole request message: a unary call sends one")

    def _read(self, message: bytes) -> Any:
        try:
            return self.request_type.FromString(message)
        except DecodeError:
            name = self.request_type.DESCRIPTOR.full_name
            raise BadRequest(f"the request's bytes do not read as a protobuf {name}") from None

    def _span(self, context: grpc.aio.ServicerContext, pairs: tuple[Any, ...]) -> tracing.CurrentSpan | None:
        """The call's server span (the RPC conventions' name and attributes), child of the client's traceparent
        metadata where it sends one; None where not sampled."""
        attributes: dict[str, Any] = {"rpc.system": "grpc", "rpc.service": SERVICE, "rpc.method": self.name}
        if (client := _client(context.peer())) is not None:
            attributes["client.address"], attributes["client.port"] = client
        parents = [value for key, value in pairs if key == "traceparent"]
        states = [value for key, value in pairs if key == "tracestate"]
        parent = tracing.client_parent(parents, states)
        span = tracing.start_span(f"{SERVICE}/{self.name}", parent, SpanKind.SERVER, attributes)
        return tracing.CurrentSpan(span) if span.is_recording() else None

    @staticmethod
    def _end(span: tracing.CurrentSpan, status: int, error_type: str | None) -> None:
        span.span.set_attribute("rpc.grpc.status_code", code_for_status(status).value[0])
        if error_type is not None:
            tracing.set_error(span.span, error_type, status)  # ERROR where the server is at fault (5xx)
        span.end()

    def _authorize(self, values: list[str | bytes]) -> None:
        """The call's `authorization` metadata: one, a bearer token that is a key (two are none, as over HTTP)."""
        if not values:
            raise Unauthorized("this server needs an API key: send the metadata authorization: Bearer KEY")
        header = values[0]
        text = header.decode("latin-1") if isinstance(header, bytes) else header
        scheme, _, token = text.strip().partition(" ")
        # utf-8: a value grpc read as text may hold any character (latin-1 raised on "€": INTERNAL, a traceback)
        valid = len(values) == 1 and scheme.lower() == "bearer" and token.strip()
        if not valid or not self.keys.verify(token.strip().encode("utf-8", "surrogatepass")):
            raise Unauthorized("the API key is not valid")

    def _record(self, request: Any, peer: str, status: int, seconds: float, rid: str) -> None:
        """The access line, and the request metrics for the calls about a model, as REST counts its /v2/models/
        paths (a 401 or a 404 too); the server's own calls (live, ready, metadata) are not counted, as REST's are
        not."""
        model = endpoint = None
        if self.name == "ModelInfer":  # one whose message could not be read (None) is the unknown model's
            model, endpoint = ("" if request is None else request.model_name), INFER_ENDPOINT
        elif self.name in ("ModelMetadata", "ModelReady"):
            model, endpoint = ("" if request is None else request.name), INFO_ENDPOINT
        if model is not None and endpoint is not None:
            metrics = self.state.metrics
            label = model if model in self.state.registry.models else "unknown"  # bounded label values
            metrics.requests.labels(label, endpoint, str(status)).inc()
            metrics.request_duration.labels(label, endpoint).observe(seconds)
        if access_log.isEnabledFor(logging.INFO):
            log_access(rid, "POST", self.path, status, seconds, _client(peer), model=model or None)


async def _abort(
    context: grpc.aio.ServicerContext, code: grpc.StatusCode, message: str, trailing: tuple[Any, ...] = ()
) -> None:
    """The call's error status; a call already ended (the client's deadline passed as the server's own did, or it
    cancelled) is cancelled instead, as grpc ends one quietly: its status could not be sent (ExecuteBatchError),
    and grpc logged that error's traceback (a QA call at 50 ms, in the deadline test)."""
    try:
        await context.abort(code, message, trailing_metadata=trailing)
    except grpc.aio.InternalError:
        raise asyncio.CancelledError from None


def _client(peer: str) -> tuple[str, int] | None:
    """grpc's peer ("ipv4:127.0.0.1:5000", "ipv6:[::1]:5000") as (host, port)."""
    _, _, address = peer.partition(":")
    host, _, port = address.rpartition(":")
    return (host.strip("[]"), int(port)) if port.isdigit() else None


def handlers(state: ServerState, keys: ApiKeys) -> tuple[grpc.GenericRpcHandler, NotServed]:
    """The service's methods; and the handler to consult last, for any other call, which names these."""
    service = InferenceService(state, keys)
    methods: dict[str, tuple[Method, Any, Any]] = {
        "ServerLive": (service.server_live, pb.ServerLiveRequest, pb.ServerLiveResponse),
        "ServerReady": (service.server_ready, pb.ServerReadyRequest, pb.ServerReadyResponse),
        "ModelReady": (service.model_ready, pb.ModelReadyRequest, pb.ModelReadyResponse),
        "ServerMetadata": (service.server_metadata, pb.ServerMetadataRequest, pb.ServerMetadataResponse),
        "ModelMetadata": (service.model_metadata, pb.ModelMetadataRequest, pb.ModelMetadataResponse),
        "ModelInfer": (service.model_infer, pb.ModelInferRequest, pb.ModelInferResponse),
    }
    served = grpc.method_handlers_generic_handler(
        SERVICE,
        {
            # stream-unary, which grpc runs before the message is read: a call always reaches Call (a unary one's
            # handler is skipped where the call ends first), and the wire is the same as a unary method's
            name: grpc.stream_unary_rpc_method_handler(
                Call(name, method, request_type, keys, state).__call__,  # a coroutine function, as grpc.aio wants
                request_deserializer=None,  # the bytes: Call reads them
                response_serializer=response_type.SerializeToString,
            )
            for name, (method, request_type, response_type) in methods.items()
        },
    )
    return served, NotServed(list(methods))


class NotServed(grpc.GenericRpcHandler):
    """Consulted last: a method no other handler serves is UNIMPLEMENTED with a message that says what is served
    (grpcio's own is "Method not found!"), as REST's 404 for a path says why. Triton's other methods (streaming,
    ModelConfig, statistics, repository, shared memory) and other services end here. Its handler is
    stream-to-stream, which takes a call of any shape."""

    def __init__(self, served: list[str]) -> None:
        self.served = served

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        method = handler_call_details.method  # "/package.Service/Method", as the client sent it
        message = _not_served(method, self.served)

        async def refuse(requests: Any, context: grpc.aio.ServicerContext) -> None:
            # the call's first message awaited (a second at most): a streaming client (tritonclient's stream_infer)
            # then reads the refusal as the answer to its first request, not as a stream broken before it
            with contextlib.suppress(Exception):
                await asyncio.wait_for(anext(aiter(requests)), FIRST_MESSAGE_WAIT_S)
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, message)

        return grpc.stream_stream_rpc_method_handler(refuse)


def _not_served(method: str, served: list[str]) -> str:
    service, _, name = cut(method, 200).lstrip("/").partition("/")
    if service == SERVICE:
        return (
            f"{name} is not served here: of {SERVICE} this server serves {', '.join(served)} "
            "(docs/serving.md says which extensions are left out, and why)"
        )
    return f"the service {service or method!r} is not served here: {SERVICE} and grpc.health.v1.Health are"


MAX_CONCURRENT_STREAMS = 256
CONNECTION_AGE_S = 600.0


class GrpcServer:
    """grpcio's asyncio server on --grpc-port, in the running event loop; `reuse_port`: several processes share
    the port (process mode's front-ends), else a port already taken fails the start."""

    def __init__(self, settings: Settings, state: ServerState, keys: ApiKeys, reuse_port: bool) -> None:
        self.settings = settings
        self.state = state
        self.keys = keys
        self.reuse_port = reuse_port
        self.server: grpc.aio.Server | None = None
        self.health: health.HealthService | None = None

    async def start(self) -> None:
        s = self.settings
        options = [
            ("grpc.max_receive_message_length", s.max_body_bytes),
            ("grpc.so_reuseport", 1 if self.reuse_port else 0),
            # calls at once on one connection: grpcio advertised no bound, and a client that opens streams and never
            # ends their messages held them all (20 connections x 200 streams: +58 MB, never answered)
            ("grpc.max_concurrent_streams", MAX_CONCURRENT_STREAMS),
            # a connection lives CONNECTION_AGE_S at most, then GOAWAY and the calls in flight get the request
            # deadline to finish: a call whose message never ends is cut then, and long-lived channels move over
            # to the other front-ends (SO_REUSEPORT spreads connections, not calls)
            ("grpc.max_connection_age_ms", int(CONNECTION_AGE_S * 1000)),
            ("grpc.max_connection_age_grace_ms", int((s.request_timeout_s + 5) * 1000)),
        ]
        server = grpc.aio.server(options=options)
        served, not_served = handlers(self.state, self.keys)
        server.add_generic_rpc_handlers((served,))
        self.health = health.add_to(server, self.state)
        server.add_generic_rpc_handlers((not_served,))  # after every handler that serves
        host = f"[{s.host}]" if ":" in s.host else s.host
        try:
            server.add_insecure_port(f"{host}:{s.grpc_port}")
        except RuntimeError as exc:
            raise StartupError(f"cannot listen on {s.host}:{s.grpc_port} (gRPC): {exc}") from None
        await server.start()
        self.server = server
        log.info("gRPC (Open Inference Protocol v2) on %s:%d", s.host, s.grpc_port)

    async def stop(self, grace_s: float) -> None:
        """Refuse new calls; finish those in flight, for up to `grace_s` (health's Watch streams end at once)."""
        if self.health is not None:
            self.health.close()
        if self.server is not None:
            await self.server.stop(grace_s)
