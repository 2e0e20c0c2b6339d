"""CoalescingTransport: what uvicorn writes for one response in one turn of the event loop goes out as one write,
in order, and nothing held is lost by closing."""

from __future__ import annotations

import asyncio

from service.frontend.http.httptools_protocol import CoalescingTransport


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
