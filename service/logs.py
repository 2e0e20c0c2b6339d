"""Request ids, the log format and the access log.

- Every request gets an id: the client's `x-request-id` where it is sane (printable ASCII, 1-128 characters), else
  a new uuid4 hex. It is returned on every response (errors included: 401, 413, 500, and the protocol's own 400,
  408, 414 and 431) and set in a context variable for the request's task, so every line logged while handling it
  carries it: `RequestIdFilter` on the one handler every logger reaches writes it into each record.
- The access log (`--access-log text|json|off`): one line per response, from `RequestContextMiddleware` (the
  outermost layer of the app, outside even FastAPI's 500 handler) or from the HTTP protocol for requests refused
  before they reach the app. uvicorn's own access log is always off: no line twice.
"""

from __future__ import annotations

import json
import logging
import re
import sys
import time
import uuid
from contextvars import ContextVar
from datetime import UTC, datetime

from opentelemetry import trace

REQUEST_ID: ContextVar[str | None] = ContextVar("bertserve_request_id", default=None)
REQUEST_ID_HEADER = b"x-request-id"
# Kept in the request's ASGI scope for the HTTP protocol, which may answer a request itself (a body that does not
# arrive): it then uses the request's id and records the status it sent, and the app's line is the only one.
SCOPE_REQUEST_ID = "bertserve.request_id"
SCOPE_STATUS = "bertserve.status"
MAX_REQUEST_ID_CHARS = 128
_SANE_ID = re.compile(rb"[\x21-\x7e]([\x20-\x7e]*[\x21-\x7e])?")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s [%(request_id)s]: %(message)s"
# With traces on (--otlp-endpoint): the trace and span the line was logged in ("-" outside a sampled one)
TRACED_TEXT_FORMAT = (
    "%(asctime)s %(levelname)s %(name)s [%(request_id)s trace_id=%(trace_id)s span_id=%(span_id)s]: %(message)s"
)
access_log = logging.getLogger("service.access")


def request_id_from(raw: bytes | None) -> str:
    """The client's id where it is sane, else a new one."""
    if raw is not None:
        raw = raw.strip()
        if len(raw) <= MAX_REQUEST_ID_CHARS and _SANE_ID.fullmatch(raw):
            return raw.decode("ascii")
    return uuid.uuid4().hex


class RequestIdFilter(logging.Filter):
    """Gives every record the id of the request it was logged for ("-" outside a request); with `traced`, the ids of
    the trace and span it was logged in too ("-" outside a sampled span), as OpenTelemetry's log records name them."""

    def __init__(self, traced: bool = False) -> None:
        super().__init__()
        self.traced = traced

    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "request_id"):
            record.request_id = REQUEST_ID.get() or "-"
        if self.traced and not hasattr(record, "trace_id"):
            context = trace.get_current_span().get_span_context()
            if context.is_valid and context.trace_flags.sampled:
                record.trace_id, record.span_id = f"{context.trace_id:032x}", f"{context.span_id:016x}"
            else:
                record.trace_id = record.span_id = "-"
        return True


class TextFormatter(logging.Formatter):
    """TEXT_FORMAT, its time as logging's default writes it ("2026-11-26 22:36:13,123"), the seconds' part made once
    a second rather than by `time.strftime` for every line (a line a request, under load)."""

    def __init__(self, traced: bool = False) -> None:
        super().__init__(TRACED_TEXT_FORMAT if traced else TEXT_FORMAT)
        self._second: int | None = None
        self._second_text = ""

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        second = int(record.created)
        if second != self._second:
            self._second_text = time.strftime(self.default_time_format, self.converter(record.created))
            self._second = second
        return f"{self._second_text},{int(record.msecs):03d}"  # logging.Formatter.default_msec_format


class JsonAccessFormatter(logging.Formatter):
    """One JSON object a line: ts, level, request_id, method, path, status, duration_ms, client, model; with traces
    on, trace_id and span_id (null outside a sampled span)."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "request_id": getattr(record, "request_id", None),
            **getattr(record, "access", {}),
        }
        trace_id = getattr(record, "trace_id", None)
        if trace_id is not None:
            entry["trace_id"] = None if trace_id == "-" else trace_id
            span_id = getattr(record, "span_id", "-")
            entry["span_id"] = None if span_id == "-" else span_id
        return json.dumps(entry, ensure_ascii=True)


def configure_logging(level: str, access: str, traced: bool = False) -> None:
    """One handler (stderr) for every logger, uvicorn's included (it is started with log_config=None); the access
    log through it (text) or through its own JSON handler (json), or off. `traced` (traces on): each line names the
    trace and span it was logged in."""
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(RequestIdFilter(traced))
    handler.setFormatter(TextFormatter(traced))
    _replace_handler(logging.getLogger(), handler)
    logging.getLogger().setLevel(level.upper())
    access_log.disabled = access == "off"
    access_log.setLevel(logging.INFO)
    if access == "json":
        json_handler = logging.StreamHandler(sys.stderr)
        json_handler.addFilter(RequestIdFilter(traced))
        json_handler.setFormatter(JsonAccessFormatter())
        _replace_handler(access_log, json_handler)
        access_log.propagate = False
    else:
        _replace_handler(access_log, None)
        access_log.propagate = True


def _replace_handler(logger: logging.Logger, handler: logging.Handler | None) -> None:
    """Swap the handler this module installed before (if any) for `handler`; others are left alone."""
    for old in [h for h in logger.handlers if getattr(h, "bertserve", False)]:
        logger.removeHandler(old)
    if handler is not None:
        handler.bertserve = True  # type: ignore[attr-defined]
        logger.addHandler(handler)


def log_access(
    request_id: str,
    method: str | None,
    path: str | None,
    status: int,
    duration_s: float,
    client: tuple[str, int] | None,
    model: str | None = None,
) -> None:
    """One access line (the caller checks `access_log.isEnabledFor(logging.INFO)` first, to skip the work); the
    model is the path's (/v1/models/NAME/..., /v2/models/NAME/...) unless given (a gRPC call's)."""
    parts = path.split("/") if path and path.startswith(("/v1/models/", "/v2/models/")) else []
    fields = {
        "method": method,
        "path": path,
        "status": status,
        "duration_ms": round(duration_s * 1000, 2),
        "client": f"{client[0]}:{client[1]}" if client else None,
        "model": model or (parts[3] if len(parts) > 3 and parts[3] else None),
    }
    # text: the request line JSON-quoted, so that no path can forge a line of its own
    text = json.dumps(f"{method or '-'} {path or '-'}")
    # The record made here rather than by `access_log.info`, which would look up the caller's file and line in the
    # stack for every request: the formats show neither.
    record = access_log.makeRecord(
        access_log.name,
        logging.INFO,
        __file__,
        0,
        "%s %s %d %.2f ms",
        (fields["client"] or "-", text, status, fields["duration_ms"]),
        None,
        extra={"request_id": request_id, "access": fields},
    )
    access_log.handle(record)
