"""uvicorn's httptools protocol with the deadlines and limits it lacks, and the JSON error body on its own errors.

uvicorn closes a connection idle between requests (`timeout_keep_alive`) but has no deadline for a request's
headers: a client that connects and sends nothing, or a partial request a byte at a time (slowloris), holds the
connection for ever; nor any limit on the request line or the headers. Per connection, here:

- header timeout: a request's line and headers must arrive within `header_timeout_s` of their first byte, and the
  first request's within `header_timeout_s` of the connection's opening. Past it the connection is closed: with a
  408 body where part of a request had come, silently where nothing had (a client's idle pooled connection must
  not read an unsolicited 408 as the answer to its next request). A request still being answered is finished
  first, then the connection closes.
- body timeout: a request that declares a body must deliver it within `body_timeout_s` of its headers; past it a
  408 and the connection is closed (the app sees the client gone).
- send timeout: an answer whose write waits on a client that reads none of it (the socket's buffers full, the
  transport's writing paused) for `send_timeout_s` is cut: the connection is closed, as nginx's `send_timeout`
  does. uvicorn waits for such a client for ever, with its next pipelined request unread behind it.
- keep-alive: uvicorn's own timer (`keepalive_timeout_s`).
- version: a request line of another HTTP version than 1.1 or 1.0 (httptools reads "HTTP/2.0" and "HTTP/0.9") is a
  505 (RFC 9110 15.6.6); it was served as HTTP/1.1.
- Host: an HTTP/1.1 request without a Host header, or any with two, is a 400 (RFC 9112 §3.2; both were served), and
  so is one with two Content-Type headers (the last had been read).
- limits: a request target over `max_url_bytes` is a 414, headers over `max_header_bytes` a 431, anything
  httptools cannot parse a 400; each with the one error body (`service.frontend.http.errors`), `x-request-id`, a warning
  and an access line, and the connection closed.
- lingering close (RFC 9112 §9.6): an answer given before its request's body has all arrived (a 429 or a 401 at
  the door, which reads no body it refuses; a 413) closes the connection, and a socket closed with bytes unread
  answers the client's next segment with a reset, which drops what the client had not read yet: a client still
  writing its body got a reset in place of its 429 (57 of 578 raw-socket requests beside an embeddings flood;
  `requests` and urllib3 raise on the failed write and never read the answer). Here the answer is followed by the
  end of our side (a FIN), and what the client still sends is read and dropped, unparsed, until it closes, for at
  most `LINGER_S` and `LINGER_BYTES`; then the connection is closed.

And one write per response where uvicorn makes two (`CoalescingTransport`); and the app told at once when a client
leaves (`SCOPE_ON_DISCONNECT`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import struct
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import httptools
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from service.errors import (
    BadRequest,
    HeadersTooLarge,
    HttpVersionNotSupported,
    RequestTimeout,
    ServiceError,
    UnknownTransferCoding,
    UriTooLong,
)
from service.frontend.http.errors import error_body, shaped_status
from service.logs import REQUEST_ID_HEADER, SCOPE_REQUEST_ID, SCOPE_STATUS, access_log, log_access

log = logging.getLogger("service.http")
NO_LINGER = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() resets the connection and drops what is unsent
# A lingering close's bounds: the time and bytes read (and dropped) after an answer given before its body arrived.
# nginx lingers up to 30 s, 5 s between reads; 2 s is a 4 MiB body's write many times over on a slow link, and a
# client sending more than LINGER_BYTES is reset as before (no memory is held for them: they are dropped as read).
LINGER_S = 2.0
LINGER_BYTES = 16 * 1024 * 1024
REQUEST_LINE_SLACK = 64  # "METHOD ", " HTTP/1.1\r\n" and the CRLFs that may come before a request
# Where a request's scope holds what to call if its client leaves before its answer is complete: a callback for the
# app to add, in place of a task per request that waits for the ASGI `http.disconnect` message.
SCOPE_ON_DISCONNECT = "bertserve.on_disconnect"


@dataclass(frozen=True)
class HttpLimits:
    header_timeout_s: float = 10.0
    body_timeout_s: float = 60.0
    send_timeout_s: float = 60.0
    max_url_bytes: int = 8192
    max_header_bytes: int = 16384


class CoalescingTransport:
    """A connection's transport whose writes within one turn of the event loop go out as one write.

    uvicorn writes a response's head and its body separately, and each write to a socket is a send() and a TCP
    segment: on a loopback connection the head's send alone was 8% of a front-end's time under 1-input load, and
    the client has two segments to read. Held until the loop's current turn ends, head and body leave together;
    order is kept, and closing (or a write's end of file) sends what is held first."""

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._held: list[bytes] = []
        # Asked once, at the first close: True where the protocol keeps the connection open a while instead (a
        # lingering close, `HttpProtocol._linger`); a later close closes.
        self.linger: Callable[[], bool] | None = None

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not self._held:
            self._loop.call_soon(self.flush)
        self._held.append(bytes(data))

    def writelines(self, lines: Any) -> None:
        for data in lines:
            self.write(data)

    def flush(self) -> None:
        if not self._held:
            return
        data = b"".join(self._held)  # one held write: the very object, not a copy
        self._held = []
        if not self._transport.is_closing():
            self._transport.write(data)

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size() + sum(len(data) for data in self._held)

    def write_eof(self) -> None:
        self.flush()
        self._transport.write_eof()

    def close(self) -> None:
        self.flush()
        linger, self.linger = self.linger, None
        if linger is not None and linger():
            return
        self._transport.close()

    def abort(self) -> None:
        self._held = []
        self._transport.abort()

    def __getattr__(self, name: str) -> Any:  # is_closing, get_extra_info, pause_reading, ...
        return getattr(self._transport, name)


class _Refused(Exception):
    """Raised from a parser callback to stop parsing; the error to answer is in `HttpProtocol._refusal`."""


class HttpProtocol(HttpToolsProtocol):
    limits: HttpLimits = HttpLimits()  # each server's own, set by protocol_class()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._timer: asyncio.TimerHandle | None = None
        self._send_timer: asyncio.TimerHandle | None = None  # armed while the transport's writing is paused
        self._in_head = True  # the next bytes are a request's line and headers
        self._head_bytes = 0  # bytes received for the current head (an upper bound: whole chunks)
        self._url_bytes = 0
        self._header_bytes = 0
        self._refusal: ServiceError | None = None
        self._head_started = time.perf_counter()
        self._linger_left: int | None = None  # lingering (`_linger`): the bytes it may still read and drop

    # --- connection and data -------------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        coalescing = CoalescingTransport(transport, self.loop)
        coalescing.linger = self._linger
        self.transport = cast(asyncio.Transport, coalescing)
        self._head_started = time.perf_counter()
        self._arm(self.limits.header_timeout_s, self._head_timeout)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self._stop_send_timer()
        cycle = self.cycle
        super().connection_lost(exc)
        if cycle is not None and cycle.disconnected:  # the client left before its answer was complete
            for callback in cycle.scope.get(SCOPE_ON_DISCONNECT, ()):  # type: ignore[attr-defined]
                callback()

    def pause_writing(self) -> None:
        super().pause_writing()
        if self._send_timer is None:
            self._send_timer = self.loop.call_later(self.limits.send_timeout_s, self._send_timeout)

    def resume_writing(self) -> None:
        self._stop_send_timer()
        super().resume_writing()

    def _stop_send_timer(self) -> None:
        if self._send_timer is not None:
            self._send_timer.cancel()
            self._send_timer = None

    def _send_timeout(self) -> None:
        self._send_timer = None
        log.info(
            "closed the connection of %s: it read nothing of its answer for %g s",
            self._peer(),
            self.limits.send_timeout_s,
        )
        # a reset, not a close: the kernel would otherwise go on offering the unread answer to nobody, for minutes
        with contextlib.suppress(OSError, AttributeError):
            self.transport.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, NO_LINGER)
        self.transport.abort()

    def data_received(self, data: bytes) -> None:
        if self._linger_left is not None:  # answered and half-closed: the rest of the body, dropped unparsed
            self._linger_left -= len(data)
            if self._linger_left < 0:
                self.transport.close()
            return
        self._unset_keepalive_if_required()
        if self._in_head:
            self._head_bytes += len(data)
            if self._timer is None:
                self._head_started = time.perf_counter()
                self._arm(self.limits.header_timeout_s, self._head_timeout)
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            # websockets are off (ws="none"): an Upgrade request (websocket, h2c) is answered as plain HTTP/1.1,
            # without uvicorn's warning about installing a websocket library
            return
        except httptools.HttpParserError:
            self._refuse(self._refusal or BadRequest("the request is not valid HTTP/1.1"))
            return
        # headers still incomplete: the bytes so far (less the target, plus the method and version) over the limit
        if self._in_head and self._head_bytes - self._url_bytes > self.limits.max_header_bytes + REQUEST_LINE_SLACK:
            self._refuse(HeadersTooLarge(f"the request headers are larger than {self.limits.max_header_bytes} bytes"))

    # --- parser callbacks ------------------------------------------------------------------------------------
    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._url_bytes = 0
        self._header_bytes = 0

    def on_url(self, url: bytes) -> None:
        self._url_bytes += len(url)
        super().on_url(url)  # kept even past the limit (by one read at most): the refusal's shape is the path's
        if self._url_bytes > self.limits.max_url_bytes:
            self._refusal = UriTooLong(f"the request target is longer than {self.limits.max_url_bytes} bytes")
            raise _Refused

    def on_header(self, name: bytes, value: bytes) -> None:
        self._header_bytes += len(name) + len(value) + 4  # "name: value\r\n"
        if self._header_bytes > self.limits.max_header_bytes:
            self._refusal = HeadersTooLarge(f"the request headers are larger than {self.limits.max_header_bytes} bytes")
            raise _Refused
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._head_bytes = 0
        self._disarm()
        if self.parser.should_upgrade() and self._declares_body():
            # The parser ends the message at the headers of an Upgrade request (h2c, websocket) and reads no body:
            # served, such a POST had an empty body. Upgrades are ignored here (a GET is answered as HTTP/1.1), but
            # this body cannot be read: refused, saying why, rather than answered for a body it never saw.
            self._refusal = BadRequest(
                "a request that asks to Upgrade (h2c, websocket) cannot carry a body here: send it without Upgrade"
            )
            raise _Refused
        version = self.parser.get_http_version()
        if version not in ("1.1", "1.0"):  # httptools reads "HTTP/2.0" and "HTTP/0.9" lines; both were answered
            self._refusal = HttpVersionNotSupported(
                f"HTTP/{version} in a request line: this port speaks HTTP/1.1 and 1.0 (gRPC is on --grpc-port)"
            )
            raise _Refused
        hosts = types = 0
        codings: list[bytes] | None = None  # the transfer codings in order, every Transfer-Encoding header's list
        framed = False  # a Content-Length or Transfer-Encoding header: a body to wait for
        for name, value in self.headers:  # one pass over the headers for every check below
            if name == b"host":
                hosts += 1
            elif name == b"content-type":
                types += 1
            elif name == b"content-length":
                framed = True
            elif name == b"transfer-encoding":
                framed = True
                codings = (codings or []) + [part.strip().lower() for part in value.split(b",")]
        if types > 1:  # a field of one value (RFC 9110 8.3): the last had been read, a proxy may read the first
            self._refusal = BadRequest("the request has two Content-Type headers: send one")
            raise _Refused
        if hosts > 1 or (hosts == 0 and version == "1.1"):
            # RFC 9112 §3.2: a server MUST answer 400 to an HTTP/1.1 request without a Host header and to any with
            # two (which one names the target? a proxy in front may have read the other)
            self._refusal = BadRequest(
                f"an HTTP/1.1 request has one Host header (RFC 9112 3.2): this one has {hosts or 'none'}"
            )
            raise _Refused
        if codings is not None and codings != [b"chunked"]:
            # httptools frames a "gzip, chunked" body by its chunks and passes the gzip on as the body
            shown = b", ".join(codings).decode("latin-1")[:60]
            self._refusal = UnknownTransferCoding(
                f"Transfer-Encoding {shown} is not one this server takes: chunked only (Content-Encoding for gzip)"
            )
            raise _Refused
        super().on_headers_complete()
        self.scope[SCOPE_ON_DISCONNECT] = []  # type: ignore[literal-required]
        queued = bool(self.pipeline)  # behind a request still being answered: its body is not read yet
        if not queued and framed:
            self._arm(self.limits.body_timeout_s, self._body_timeout)

    def _declares_body(self) -> bool:
        for name, value in self.headers:
            if name == b"transfer-encoding" or (name == b"content-length" and value.strip() not in (b"0", b"")):
                return True
        return False

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._in_head = True
        self._head_bytes = 0
        self._disarm()

    def send_400_response(self, msg: str) -> None:
        self._refuse(BadRequest("the request is not valid HTTP/1.1"))

    # --- deadlines ------------------------------------------------------------------------------------------
    def _arm(self, seconds: float, callback: Any) -> None:
        self._disarm()
        self._timer = self.loop.call_later(seconds, callback)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _head_timeout(self) -> None:
        self._timer = None
        if self.transport.is_closing():
            return
        if self.cycle is not None and not self.cycle.response_complete:
            self.cycle.keep_alive = False  # answer the request in flight, then close
            return
        if self._head_bytes:
            self._refuse(RequestTimeout(f"the request headers did not arrive in {self.limits.header_timeout_s:g} s"))
        else:
            self.transport.close()

    def _body_timeout(self) -> None:
        self._timer = None
        if self.cycle is not None and self.cycle.more_body:
            self._refuse(RequestTimeout(f"the request body did not arrive in {self.limits.body_timeout_s:g} s"))

    def on_response_complete(self) -> None:
        if self._linger_left is not None:  # lingering: no next request here, nor uvicorn's keep-alive timer to close
            self.server_state.total_requests += 1
            return
        super().on_response_complete()

    def _linger(self) -> bool:
        """At the close after an answer: where the request's body has not all arrived, end our side after the answer
        (FIN) and read what the client still sends, dropping it, until it closes or for `LINGER_S` and
        `LINGER_BYTES` at most (the module's docstring says why); True where it does."""
        cycle = self.cycle
        if cycle is None or not cycle.more_body or self.transport.is_closing() or not self.transport.can_write_eof():
            return False
        self._disarm()
        self._linger_left = LINGER_BYTES
        self.transport.write_eof()  # what is held first, then our end
        self.flow.resume_reading()  # a body over uvicorn's high-water mark paused reading
        self._arm(LINGER_S, self.transport.close)
        return True

    # --- refusals -------------------------------------------------------------------------------------------
    def _refuse(self, error: ServiceError) -> None:
        """Answer `error` with the JSON body and close (lingering where its body is still coming: `_linger`)."""
        self._disarm()
        cycle = self.cycle
        if self.transport.is_closing():
            return
        in_app: dict[str, Any] | None = None  # the request the app is reading, where the error is about its body
        if cycle is not None and not cycle.response_complete:
            if not cycle.more_body:  # about a pipelined request behind one still being answered: answer that one
                cycle.keep_alive = False
                self.flow.pause_reading()
                log.warning(  # the refused request gets no answer of its own: said here (it left no trace at all)
                    "%d from %s: %s (a pipelined request behind one being answered: the connection closes after "
                    "that answer)",
                    error.status_code,
                    self._peer(),
                    error.message,
                )
                return
            if cycle.response_started:  # the app answers already, a body of ours cannot come first
                self.transport.close()
                return
            # the app has (or will have, its task is created) this request: its id and one access line are the
            # app's, saying what the client got
            in_app = cast(dict[str, Any], cycle.scope)  # an ASGI scope: ours to annotate, as logs.py does
        request_id = uuid.uuid4().hex if in_app is None else in_app.setdefault(SCOPE_REQUEST_ID, uuid.uuid4().hex)
        # in the path's error shape (OpenAI's on /v1/embeddings), as the app's own errors are
        target = getattr(self, "url", b"")  # uvicorn's, from the first message's begin on
        path = in_app["path"] if in_app is not None else target.split(b"?", 1)[0].decode("latin-1")
        body = error_body(error, path)
        status = shaped_status(error.status_code, path)
        if in_app is not None:
            in_app[SCOPE_STATUS] = status
        head = [
            STATUS_LINE[status],
            *(name + b": " + value + b"\r\n" for name, value in self.server_state.default_headers),
            b"content-type: application/json\r\n",
            b"content-length: " + str(len(body)).encode() + b"\r\n",
            REQUEST_ID_HEADER + b": " + request_id.encode() + b"\r\n",
            b"connection: close\r\n\r\n",
        ]
        self.transport.write(b"".join(head) + body)
        self.transport.close()
        log.log(
            logging.INFO if status == 408 else logging.WARNING,
            "%d from %s: %s",
            status,
            self._peer(),
            error.message,
            extra={"request_id": request_id},
        )
        if access_log.isEnabledFor(logging.INFO) and in_app is None:
            duration = time.perf_counter() - self._head_started
            log_access(request_id, None, None, status, duration, self.client)

    def _peer(self) -> str:
        """The client's address as the log lines give it."""
        return f"{self.client[0]}:{self.client[1]}" if self.client else "-"


def protocol_class(limits: HttpLimits) -> type[HttpProtocol]:
    """The protocol class for one server's uvicorn.Config(http=...), with its limits."""
    return type("BertserveHttpProtocol", (HttpProtocol,), {"limits": limits})
