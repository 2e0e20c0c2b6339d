"""One domain error hierarchy. Each class carries its HTTP status and error type; `service.frontend.http.errors` maps
them (and FastAPI's own errors) to one body shape in one place. The messages about a model's state are written once,
here, for the front-end and the engine alike."""

from __future__ import annotations

from bertcore.messages import shown

# The status counted and logged for a request whose client left before its answer (nginx's 499): nothing failed at
# the server, so not a 500, which an operator's 5xx alerts would take for one
CLIENT_CLOSED = 499


class StartupError(Exception):
    """The server must not start; the message says why."""


class ServiceError(Exception):
    status_code = 500
    error_type = "internal"

    def __init__(self, message: str, *, field: str | None = None, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.field = field
        self.headers = headers or {}


class BadRequest(ServiceError):
    status_code = 400
    error_type = "bad_request"


class Unauthorized(ServiceError):
    """No API key, or not one of the server's (`service.frontend.http.auth`)."""

    status_code = 401
    error_type = "unauthorized"


class RequestTimeout(ServiceError):
    """The request's line and headers (or its body) did not arrive in time (the httptools protocol,
    `service.frontend.http.httptools_protocol`)."""

    status_code = 408
    error_type = "request_timeout"


class UriTooLong(ServiceError):
    status_code = 414
    error_type = "uri_too_long"


class HeadersTooLarge(ServiceError):
    status_code = 431
    error_type = "headers_too_large"


class WrongTask(ServiceError):
    status_code = 400
    error_type = "wrong_task"


class ModelNotFound(ServiceError):
    status_code = 404
    error_type = "not_found"

    @classmethod
    def named(cls, name: str) -> ModelNotFound:
        return cls(f"no model named {shown(name, 102)}; GET /v1/models lists the served models")


class PayloadTooLarge(ServiceError):
    status_code = 413
    error_type = "payload_too_large"


class UnsupportedMediaType(ServiceError):
    status_code = 415
    error_type = "unsupported_media_type"


class HttpVersionNotSupported(ServiceError):
    """A request line naming another major version than HTTP/1 (RFC 9110 15.6.6)."""

    status_code = 505
    error_type = "http_version_not_supported"


class UnknownTransferCoding(ServiceError):
    """A Transfer-Encoding other than chunked (RFC 9112 6.1: 501 for a transfer coding the server does not know)."""

    status_code = 501
    error_type = "not_implemented"


class InvalidInput(ServiceError):
    """The request is well-formed JSON of the right shape, but an input cannot be served (422)."""

    status_code = 422
    error_type = "validation"


def unpaired_surrogate(where: str, text: str) -> InvalidInput | None:
    """JSON can carry a lone surrogate (\\ud800) that is no Unicode character: no tokenizer can take it."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return InvalidInput(
            f"{where} holds an unpaired surrogate (\\u{ord(text[exc.start]):04x}) at character {exc.start}: "
            "not a Unicode character",
            field=where,
        )
    return None


class Overloaded(ServiceError):
    status_code = 429
    error_type = "overloaded"

    def __init__(self, message: str, retry_after_s: int = 1) -> None:
        super().__init__(message, headers={"Retry-After": str(retry_after_s)})


class ModelFailed(ServiceError):
    """The model failed to load: nothing will answer for it until the server is restarted."""

    status_code = 503
    error_type = "unavailable"

    @classmethod
    def because(cls, name: str, reason: str | None) -> ModelFailed:
        return cls(f"model {name} failed to load: {reason}")


class Forbidden(ServiceError):
    """A valid key, but not one that may do this (an inference key on the admin routes)."""

    status_code = 403
    error_type = "forbidden"


class LoadFailed(ServiceError):
    """A load of a model (a new version of one) failed: the entry cannot be read, its session cannot open, its
    warm-up or self-test failed. The version served before, if any, keeps serving."""

    status_code = 422
    error_type = "load_failed"

    @classmethod
    def unloaded(cls, name: str, version: str) -> LoadFailed:
        """A load call whose model an unload call took away before it served."""
        return cls(f"model {name} version {version} was unloaded before it served: an unload call came while it loaded")


class NotReady(ServiceError):
    status_code = 503
    error_type = "unavailable"

    def __init__(self, message: str) -> None:
        super().__init__(message, headers={"Retry-After": "1"})

    @classmethod
    def loading(cls, name: str) -> NotReady:
        return cls(f"model {name} is still loading")


class EngineUnavailable(NotReady):
    """The engine process is restarting (or not up yet): requests in flight with it are lost, retrying helps."""


class DeadlineExceeded(ServiceError):
    status_code = 504
    error_type = "timeout"


class ClientClosed(ServiceError):
    """The client went away before its answer: the rows of its request not run yet are dropped and the request is
    over at once, counted and logged 499 (nothing failed here), not held to its deadline and counted a 504."""

    status_code = CLIENT_CLOSED
    error_type = "client_closed"


class InferenceFailed(ServiceError):
    """A batch failed in the runtime. The message is generic; the cause is logged, never sent."""

    status_code = 500
    error_type = "inference"


class NonFiniteOutput(InferenceFailed):
    """The model answered NaN or an infinity for a row: it fails on that input (an fp16 variant can overflow where
    fp32 does not). The row's request is refused, the same on every protocol, rather than answered with values JSON
    cannot carry and that base64, a tensor or a vector index would take in unseen; the batch's other rows are
    answered."""

    error_type = "non_finite_output"
    MESSAGE = (
        "the model's output for this request holds NaN or an infinity: the model fails on this input (an fp16 "
        "variant can overflow where fp32 does not)"
    )
