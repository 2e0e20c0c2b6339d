"""Request ids, the log format and the access log.

- Every request gets an id: the client's `x-request-id` where it is sane (printable ASCII without spaces, `=`,
  brackets, quotes or backslashes, 1-128 characters), else
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
from typing import Any

from opentelemetry import trace

REQUEST_ID: ContextVar[str | None] = ContextVar("bertserve_request_id", default=None)
REQUEST_ID_HEADER = b"x-request-id"
# Kept in the request's ASGI scope for the HTTP protocol, which may answer a request itself (a body that does not
# arrive): it then uses the request's id and records the status it sent, and the app's line is the only one.
SCOPE_REQUEST_ID = "bertserve.request_id"
SCOPE_STATUS = "bertserve.status"
MAX_REQUEST_ID_CHARS = 128
# Printable ASCII without spaces, "=", brackets, quotes or backslashes: an id "abc trace_id=... span_id=..." wrote a
# trace's ids of the client's choosing into each of its request's text lines, ahead of the real ones
_SANE_ID = re.compile(rb"[!#-<>-Z^-~]+")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s [%(request_id)s]: %(message)s"
# With traces on (--otlp-endpoint): the trace and span the line was logged in ("-" outside a sampled one)
TRACED_TEXT_FORMAT = (
    "%(asctime)s %(levelname)s %(name)s [%(request_id)s trace_id=%(trace_id)s span_id=%(span_id)s]: %(message)s"
)
ACCESS_LOGGER = "service.access"
ACCESS_MESSAGE = "%s %s %d %.2f ms"  # the client, the request line (JSON-quoted), the status, the duration
access_log = logging.getLogger(ACCESS_LOGGER)
INFO = logging.INFO


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
        return self.time_text(record.created, int(record.msecs))

    def time_text(self, created: float, msecs: int) -> str:
        second = int(created)
        if second != self._second:
            self._second_text = time.strftime(self.default_time_format, self.converter(created))
            self._second = second
        return f"{self._second_text},{msecs:03d}"  # logging.Formatter.default_msec_format


class JsonAccessFormatter(logging.Formatter):
    """One JSON object a line: ts, level, request_id, method, path, status, duration_ms, client, model; with traces
    on, trace_id and span_id (null outside a sampled span)."""

    def format(self, record: logging.LogRecord) -> str:
        entry = access_entry(
            record.created, record.levelname.lower(), getattr(record, "request_id", None), getattr(record, "access", {})
        )
        trace_id = getattr(record, "trace_id", None)
        if trace_id is not None:
            entry["trace_id"] = None if trace_id == "-" else trace_id
            span_id = getattr(record, "span_id", "-")
            entry["span_id"] = None if span_id == "-" else span_id
        return json.dumps(entry, ensure_ascii=True)


def access_entry(created: float, level: str, request_id: str | None, fields: dict[str, Any]) -> dict[str, Any]:
    """A JSON access line's object, but for the trace's ids."""
    ts = datetime.fromtimestamp(created, UTC).isoformat(timespec="milliseconds")
    return {"ts": ts, "level": level, "request_id": request_id, **fields}


class DirectAccessLines(logging.StreamHandler):
    """A handler of `configure_logging`'s that writes an access line itself, the very text its formatter would
    write, where the record would reach it and nothing else (`direct_access_handler`): without a `LogRecord`, its
    filter and the handlers' chain, half of a line's ~10 µs in a loop; in a loaded front-end the line cost ~44 µs of
    a 1-input request's ~400 by the record's way, ~15 this way (docs/benchmarks.md)."""

    def __init__(self, traced: bool, formatter: logging.Formatter) -> None:
        super().__init__(sys.stderr)
        self.addFilter(RequestIdFilter(traced))
        self.traced = traced
        self.own_formatter = formatter
        self.setFormatter(formatter)

    def writes_access_lines_directly(self) -> bool:
        """Untraced (a traced line reads the span from the record's context), its own formatter and filter only,
        taking INFO: as `configure_logging` made it."""
        return (
            not self.traced and self.formatter is self.own_formatter and len(self.filters) == 1 and self.level <= INFO
        )

    def access_line(self, request_id: str, args: tuple[Any, ...], fields: dict[str, Any]) -> None:
        """The line of `ACCESS_MESSAGE % args`, `fields` its JSON's."""
        raise NotImplementedError

    def write_line(self, line: str) -> None:
        """As `StreamHandler.emit` writes: under the handler's lock, flushed; a failure to write (a closed or broken
        stderr) reported as logging reports it (`handleError`), never raised into the request."""
        try:
            with self.lock:  # type: ignore[union-attr]
                self.stream.write(line + self.terminator)
                self.flush()
        except RecursionError:
            raise
        except Exception:
            self.handleError(logging.makeLogRecord({"name": ACCESS_LOGGER, "levelno": INFO, "msg": line}))


class LogHandler(DirectAccessLines):
    """The one handler every logger reaches: stderr, `TextFormatter`, `RequestIdFilter`."""

    own_formatter: TextFormatter

    def __init__(self, traced: bool) -> None:
        super().__init__(traced, TextFormatter(traced))
        # TEXT_FORMAT with its fixed fields filled in once: the time, the request id and the message go in per line
        fixed = {"levelname": "INFO", "name": ACCESS_LOGGER, "asctime": "{0}", "request_id": "{1}", "message": "{2}"}
        self._access_format = TEXT_FORMAT % fixed

    def access_line(self, request_id: str, args: tuple[Any, ...], fields: dict[str, Any]) -> None:
        created = time.time()
        moment = self.own_formatter.time_text(created, int((created - int(created)) * 1000))
        self.write_line(self._access_format.format(moment, request_id, ACCESS_MESSAGE % args))


class JsonAccessHandler(DirectAccessLines):
    """The access log's own handler with `--access-log json`: stderr, `JsonAccessFormatter`, `RequestIdFilter`."""

    def __init__(self, traced: bool) -> None:
        super().__init__(traced, JsonAccessFormatter())

    def access_line(self, request_id: str, args: tuple[Any, ...], fields: dict[str, Any]) -> None:
        self.write_line(json.dumps(access_entry(time.time(), "info", request_id, fields), ensure_ascii=True))


def direct_access_handler() -> DirectAccessLines | None:
    """The handler an access record would reach alone, where it is one of `configure_logging`'s that writes the
    line directly; None where anything else would see the record (a filter, another handler: a test's capture, a
    handler added at run time), which then takes logging's own way."""
    logger: logging.Logger | None = access_log
    while logger is not None:
        if logger.filters or logger.disabled:
            return None
        if logger.handlers:
            handler = logger.handlers[0]
            if len(logger.handlers) > 1 or (logger.propagate and logger.parent is not None):
                return None
            if isinstance(handler, DirectAccessLines) and handler.writes_access_lines_directly():
                return handler
            return None
        if not logger.propagate:
            return None
        logger = logger.parent
    return None


def configure_logging(level: str, access: str, traced: bool = False) -> None:
    """One handler (stderr) for every logger, uvicorn's included (it is started with log_config=None); the access
    log through it (text) or through its own JSON handler (json), or off. `traced` (traces on): each line names the
    trace and span it was logged in."""
    _replace_handler(logging.getLogger(), LogHandler(traced))
    logging.getLogger().setLevel(level.upper())
    access_log.disabled = access == "off"
    access_log.setLevel(logging.INFO)
    if access == "json":
        _replace_handler(access_log, JsonAccessHandler(traced))
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
    args = (fields["client"] or "-", json.dumps(f"{method or '-'} {path or '-'}"), status, fields["duration_ms"])
    handler = direct_access_handler()
    if handler is not None:
        handler.access_line(request_id, args, fields)
        return
    # The record made here rather than by `access_log.info`, which would look up the caller's file and line in the
    # stack for every request: the formats show neither.
    record = access_log.makeRecord(
        access_log.name,
        INFO,
        __file__,
        0,
        ACCESS_MESSAGE,
        args,
        None,
        extra={"request_id": request_id, "access": fields},
    )
    access_log.handle(record)
