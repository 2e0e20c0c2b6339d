"""The front-end's side of the engine socket (`RemoteEngine`) against a real unix socket: when an engine that is
connected but says nothing counts as silent, and when a silence is the front-end's own."""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path

import numpy as np
import pytest

from bertcore.rows import Row
from service.errors import DeadlineExceeded, EngineUnavailable
from service.frontend.engine_client import REPLY_GRACE_S, RemoteEngine
from service.probes import HEARTBEAT_S
from service.wire import frames
from service.wire.ticket import Ticket
from tests.service.conftest import wait_for_async

STATE = frames.encode({"op": "state", "ready": True, "models": {}})
BEAT = frames.encode({"op": "beat"})


class FakeEngineSocket:
    """A unix socket server that sends the state and then beats, as an engine process does, while `beating`; it
    answers nothing, and keeps the ops of the frames it reads."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.beating = True
        self.closed = False
        self.received: list[str] = []
        self.connections = 0  # open now
        self._server: asyncio.AbstractServer | None = None

    async def __aenter__(self) -> FakeEngineSocket:
        self._server = await asyncio.start_unix_server(self._connection, path=str(self.path))
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self.closed = True
        self._server.close()
        # its connections see `closed` within a beat and end
        assert await wait_for_async(lambda: self.connections == 0, timeout=5, every_s=0.02), "connections left open"

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            writer.write(STATE)
            reading = asyncio.create_task(self._read(reader))
            while not self.closed:
                if self.beating:
                    writer.write(BEAT)
                await asyncio.sleep(HEARTBEAT_S)
            writer.close()
            reading.cancel()
        finally:
            self.connections -= 1

    async def _read(self, reader: asyncio.StreamReader) -> None:
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            while True:
                self.received.append((await frames.read_frame(reader)).header["op"])


async def connected(engine: RemoteEngine) -> None:
    await engine.start(on_change=lambda: None)
    for _ in range(100):
        if engine.ready:
            return
        await asyncio.sleep(0.02)
    raise AssertionError("never connected")


def test_an_engine_that_stops_beating_is_silent_and_refused_at_once(tmp_path: Path) -> None:
    asyncio.run(stops_beating(tmp_path))


async def stops_beating(tmp_path: Path) -> None:
    engine = RemoteEngine(tmp_path / "engine.sock", silence_s=1.0)
    async with FakeEngineSocket(engine.path) as fake:
        await connected(engine)
        await asyncio.sleep(1.5)
        assert engine.unresponsive() is None and engine.ready  # beating: heard
        fake.beating = False
        started = time.monotonic()
        row = Row(np.array([101, 102], np.int64), np.zeros(2, np.int64))
        with pytest.raises(EngineUnavailable, match="while this request was in flight; try again shortly"):
            await engine.infer("m", [row], Ticket.with_timeout(60.0))  # the fake engine never answers it
        took = time.monotonic() - started
        assert 0.9 < took < 1.8, took
        # where it wakes up, it drops the rows not run: the cancel is on its way, at once
        await wait_for_async(lambda: len(fake.received) >= 2, timeout=5, every_s=0.02)
        assert fake.received == ["infer", "cancel"]
        assert "has not been heard from for" in str(engine.unresponsive())
        with pytest.raises(EngineUnavailable, match=r"\(--engine-silence-s 1\); try again shortly"):
            await engine.infer("m", [], ticket=None)  # type: ignore[arg-type]  # refused before the ticket is read
        fake.beating = True
        # heard again at its next beat, seen at the next tick of the watch (each every HEARTBEAT_S)
        assert await wait_for_async(lambda: engine.unresponsive() is None, timeout=5, every_s=0.02), (
            engine.unresponsive()
        )
        await engine.stop()


def test_a_front_end_whose_own_loop_was_held_does_not_blame_the_engine(tmp_path: Path) -> None:
    """Frames wait unread in the socket while this process's loop is held: that is not the engine's silence."""
    asyncio.run(loop_held(tmp_path))


async def loop_held(tmp_path: Path) -> None:
    engine = RemoteEngine(tmp_path / "engine.sock", silence_s=1.0)
    async with FakeEngineSocket(engine.path):
        await connected(engine)
        await asyncio.sleep(0.5)
        for _ in range(3):
            time.sleep(1.5)  # the front-end's event loop held (a long GIL holder, a paused VM) past the bound
            for _ in range(4):
                await asyncio.sleep(HEARTBEAT_S / 2)
                assert engine.unresponsive() is None
        await engine.stop()


def test_a_request_the_engine_never_answers_fails_at_its_deadline_and_is_cancelled_there(tmp_path: Path) -> None:
    """The engine answers a deadline itself; where its reply does not come even REPLY_GRACE_S after it (lost, or an
    engine that beats but never answers), the request gets DeadlineExceeded (504) and the engine is told to drop
    it."""

    async def scenario() -> tuple[float, list[str]]:
        async with FakeEngineSocket(tmp_path / "engine.sock") as fake:
            engine = RemoteEngine(fake.path, silence_s=30)
            await connected(engine)
            rows = [Row(np.array([101, 7, 102]), np.zeros(3, dtype=np.int64))]
            started = time.monotonic()
            with pytest.raises(DeadlineExceeded, match="not answered within its deadline"):
                await engine.infer("m", rows, Ticket.with_timeout(0.2))
            took = time.monotonic() - started
            assert await wait_for_async(lambda: "cancel" in fake.received, timeout=5, every_s=0.02)
            await engine.stop()
            return took, fake.received

    took, received = asyncio.run(scenario())
    assert 0.2 + REPLY_GRACE_S - 0.05 <= took < 0.2 + REPLY_GRACE_S + 2.0
    assert received.count("infer") == 1 and received.index("cancel") > received.index("infer")


def test_a_request_whose_task_is_cancelled_is_cancelled_at_the_engine(tmp_path: Path) -> None:
    """A gRPC call the client cancels cancels its handler's task; the ticket is cancelled after the engine client
    has given the request up, so the engine was never told, and ran every row still queued (a probe cancelled 7
    calls of 16 rows: all 112 rows ran after the cancel, and held the model's queue meanwhile)."""

    async def scenario() -> list[str]:
        async with FakeEngineSocket(tmp_path / "engine.sock") as fake:
            engine = RemoteEngine(fake.path, silence_s=30)
            await connected(engine)
            rows = [Row(np.array([101, 7, 102]), np.zeros(3, dtype=np.int64))]
            call = asyncio.create_task(engine.infer("m", rows, Ticket.with_timeout(30)))
            assert await wait_for_async(lambda: "infer" in fake.received, timeout=5, every_s=0.02)
            call.cancel()
            with pytest.raises(asyncio.CancelledError):
                await call
            assert await wait_for_async(lambda: "cancel" in fake.received, timeout=5, every_s=0.02)
            await engine.stop()
            return fake.received

    received = asyncio.run(scenario())
    assert received.count("cancel") == 1 and received.index("cancel") > received.index("infer")


def test_a_request_that_cannot_be_framed_leaves_nothing_in_flight(tmp_path: Path) -> None:
    """No rows make no frame (an adapter that let an empty tensor through once got a 500 here): the error is
    raised before the request counts as in flight, so nothing waits for a reply that cannot come, and the engine
    is sent nothing."""

    async def scenario() -> tuple[int, list[str]]:
        async with FakeEngineSocket(tmp_path / "engine.sock") as fake:
            engine = RemoteEngine(fake.path, silence_s=30)
            await connected(engine)
            with pytest.raises(ValueError):
                await engine.infer("m", [], Ticket.with_timeout(5))
            await asyncio.sleep(0.1)
            in_flight = len(engine._pending)
            await engine.stop()
            return in_flight, fake.received

    in_flight, received = asyncio.run(scenario())
    assert in_flight == 0
    assert "infer" not in received
