"""CoalescingTransport: what uvicorn writes for one response in one turn of the event loop goes out as one write,
in order, and nothing held is lost by closing. The protocol tells the app when a client leaves before its answer."""

from __future__ import annotations

import asyncio

import uvicorn
import uvicorn.server

from service.frontend.http.httptools_protocol import (
    SCOPE_ON_DISCONNECT,
    CoalescingTransport,
    HttpLimits,
    HttpProtocol,
    protocol_class,
)


class RecordingTransport(asyncio.Transport):
    """A transport that keeps what reaches it: the socket's side of CoalescingTransport."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []
        self.closed = False
        self.eof = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        assert not self.closed, "written after close"
        self.writes.append(bytes(data))

    def write_eof(self) -> None:
        self.eof = True

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def get_write_buffer_size(self) -> int:
        return 0  # every write was sent at once

    def get_extra_info(self, name: str, default: object = None) -> object:
        return ("127.0.0.1", 8000) if name == "sockname" else default


def test_a_response_head_and_body_leave_in_one_write_at_the_end_of_the_turn() -> None:
    async def scenario() -> list[list[bytes]]:
        raw = RecordingTransport()
        transport = CoalescingTransport(raw, asyncio.get_running_loop())
        transport.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n")
        transport.write(memoryview(b"ok"))
        seen = [list(raw.writes)]  # nothing yet: the turn has not ended
        await asyncio.sleep(0)
        seen.append(list(raw.writes))
        transport.writelines([b"HTTP/1.1 204 No Content\r\n\r\n"])  # the next response, a turn later
        await asyncio.sleep(0)
        seen.append(list(raw.writes))
        return seen

    before_turn, after_turn, later = asyncio.run(scenario())
    assert before_turn == []
    assert after_turn == [b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"]
    assert later == [*after_turn, b"HTTP/1.1 204 No Content\r\n\r\n"]


def test_closing_sends_what_is_held_first_and_drops_later_writes() -> None:
    async def scenario() -> RecordingTransport:
        raw = RecordingTransport()
        transport = CoalescingTransport(raw, asyncio.get_running_loop())
        transport.write(b"HTTP/1.1 400 Bad Request\r\n\r\n")
        transport.write(b"{}")
        assert transport.get_write_buffer_size() == len(b"HTTP/1.1 400 Bad Request\r\n\r\n{}")
        transport.close()
        transport.write(b"too late")  # a write after close reaches nothing, as on a closed socket
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert transport.is_closing()
        assert transport.get_extra_info("sockname") == ("127.0.0.1", 8000)  # the rest is the socket's own
        return raw

    raw = asyncio.run(scenario())
    assert raw.writes == [b"HTTP/1.1 400 Bad Request\r\n\r\n{}"]
    assert raw.closed


def test_end_of_file_follows_what_is_held() -> None:
    async def scenario() -> RecordingTransport:
        raw = RecordingTransport()
        transport = CoalescingTransport(raw, asyncio.get_running_loop())
        transport.write(b"last")
        transport.write_eof()
        assert raw.writes == [b"last"] and raw.eof
        return raw

    asyncio.run(scenario())


def _protocol(app: object, loop: asyncio.AbstractEventLoop) -> tuple[HttpProtocol, RecordingTransport]:
    """The server's HTTP protocol on a recording transport, serving `app`."""
    config = uvicorn.Config(app, http=protocol_class(HttpLimits()), ws="none", log_config=None, lifespan="off")
    protocol = protocol_class(HttpLimits())(config, uvicorn.server.ServerState(), {}, _loop=loop)
    transport = RecordingTransport()
    protocol.connection_made(transport)
    return protocol, transport


REQUEST = b"POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}"


def test_a_client_that_leaves_before_its_answer_is_told_to_the_app_at_once() -> None:
    """The app puts a callback in the scope's SCOPE_ON_DISCONNECT (routes.admitted: the ticket's cancel, which drops
    the request's rows not run yet); the protocol calls it when the connection is lost before the answer is
    complete, with no task per request waiting for `http.disconnect`."""

    async def scenario() -> tuple[list[str], list[str]]:
        told: list[str] = []
        in_app = asyncio.Event()

        async def app(scope: dict, receive: object, send: object) -> None:
            scope[SCOPE_ON_DISCONNECT].append(lambda: told.append(scope["path"]))
            in_app.set()
            await asyncio.sleep(30)  # the work the client does not wait for

        loop = asyncio.get_running_loop()
        protocol, _ = _protocol(app, loop)
        protocol.data_received(REQUEST)
        await asyncio.wait_for(in_app.wait(), 5)
        before = list(told)
        protocol.connection_lost(None)
        for task in list(protocol.server_state.tasks):
            task.cancel()
        return before, told

    before, after = asyncio.run(scenario())
    assert before == []
    assert after == ["/x"]


def test_a_client_that_leaves_after_its_answer_cancels_nothing() -> None:
    async def scenario() -> list[str]:
        told: list[str] = []

        async def app(scope: dict, receive: object, send: object) -> None:
            scope[SCOPE_ON_DISCONNECT].append(lambda: told.append("cancelled"))
            await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
            await send({"type": "http.response.body", "body": b"ok"})

        protocol, transport = _protocol(app, asyncio.get_running_loop())
        protocol.data_received(REQUEST)
        for _ in range(100):  # bounded: the answer is a few turns of the loop away
            if any(b"ok" in write for write in transport.writes):
                break
            await asyncio.sleep(0.01)
        assert any(write.startswith(b"HTTP/1.1 200") for write in transport.writes)
        protocol.connection_lost(None)
        return told

    assert asyncio.run(scenario()) == []
