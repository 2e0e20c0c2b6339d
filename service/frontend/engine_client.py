"""How the front-end reaches the engine: in this process (`LocalEngine`) or an engine process (`RemoteEngine`).

Both take unpadded rows and a ticket and give back per-row outputs, raise the same domain errors, and report
the models' state (status, provider, variant) for `/readyz` and `/v1/models`.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from bertcore.rows import Row
from service import probes
from service.errors import DeadlineExceeded, EngineUnavailable
from service.metrics import Metrics
from service.settings import Settings
from service.wire import frames
from service.wire.ticket import Ticket

if TYPE_CHECKING:  # a front-end process of an engine process never loads onnxruntime
    from service.engine.core import EngineCore

log = logging.getLogger("service.frontend.engine_client")
RECONNECT_S = 0.1
REPLY_GRACE_S = 1.0  # the engine answers a deadline itself; this only covers a reply still on its way


class _ReplyLate(Exception):
    """No reply came within the request's deadline and the grace after it."""


def _expire(future: asyncio.Future) -> None:
    if not future.done():
        future.set_exception(_ReplyLate())


class Engine(Protocol):
    @property
    def connected(self) -> bool: ...
    @property
    def ready(self) -> bool: ...
    def model_reports(self) -> dict[str, dict[str, Any]]: ...
    def stuck(self) -> str | None: ...
    def unresponsive(self) -> str | None: ...
    def load(self) -> None: ...
    async def start(self, on_change: Callable[[], None]) -> None: ...
    async def infer(self, model: str, rows: list[Row], ticket: Ticket) -> list[dict[str, Any]]: ...
    async def stop(self) -> None: ...
    def use(self, model: str, versions: list[str]) -> None: ...
    def reject(self, model: str, version: str, reason: str) -> None: ...
    async def control(self, action: str, model: str) -> dict[str, Any]: ...


class LocalEngine:
    """The engine runs in this process and event loop (in-process mode: a 2-core CPU, tests)."""

    def __init__(self, settings: Settings, metrics: Metrics) -> None:
        from service.engine.core import EngineCore

        self.core: EngineCore = EngineCore(settings, metrics)
        self._warm_up: asyncio.Task | None = None
        self._front_end = "local"  # the one front-end of this engine, for its word on the versions it uses

    @property
    def connected(self) -> bool:
        return True

    @property
    def ready(self) -> bool:
        return self.core.warmed_up

    def model_reports(self) -> dict[str, dict[str, Any]]:
        return self.core.model_reports()

    def stuck(self) -> str | None:
        return self.core.stuck()

    def unresponsive(self) -> str | None:
        """Never: this process's event loop is the engine's."""
        return None

    def load(self) -> None:
        """Open the sessions (once). StartupError where a model fails and --load-failure is fail."""
        if not self.core.models:
            self.core.load()

    async def start(self, on_change: Callable[[], None]) -> None:
        self.core.on_change = on_change
        self.load()
        self.core.connect(self._front_end)
        self.core.start()
        on_change()
        self._warm_up = asyncio.create_task(self._warm_up_then_poll(), name="warm-up")

    async def _warm_up_then_poll(self) -> None:
        await self.core.warm_up()
        if self.core.settings.model_control == "poll":
            await self.core.poll_repository()

    async def infer(self, model: str, rows: list[Row], ticket: Ticket) -> list[dict[str, Any]]:
        return await self.core.infer(model, rows, ticket)

    def use(self, model: str, versions: list[str]) -> None:
        self.core.use(self._front_end, model, versions)

    def reject(self, model: str, version: str, reason: str) -> None:
        self.core.reject(model, version, reason)

    async def control(self, action: str, model: str) -> dict[str, Any]:
        return await self.core.control(action, model)

    async def stop(self) -> None:
        if self._warm_up is not None:
            self._warm_up.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._warm_up
        await self.core.stop()


class RemoteEngine:
    """An engine process behind a unix socket. Reconnects when it restarts; requests in flight meanwhile fail
    with EngineUnavailable (503), and the models read as not ready until the new engine says they are.

    An engine that is connected but silent (stopped, deadlocked, its event loop held) is not ready either: after
    `silence_s` without a frame, not even its beat, its requests in flight fail with EngineUnavailable, and new
    ones at once rather than queue behind it (and fill the admission gate, which would refuse the rest with 429),
    until it speaks again or the launcher restarts it (--liveness-stall-s, 10 s by default)."""

    def __init__(self, path: Path, silence_s: float) -> None:
        self.path = path
        self.silence_s = silence_s
        self._frames = 0  # frames read: the watch compares counts, not clocks, on the hot path
        self._heard_at = time.monotonic()
        self._silent = False
        self._writer: frames.FrameWriter | None = None
        self._states: dict[str, dict[str, Any]] = {}
        self._ready = False
        self._pending: dict[int, asyncio.Future] = {}
        self._ids = itertools.count()
        self._tasks: list[asyncio.Task] = []
        self._on_change: Callable[[], None] = lambda: None
        self._uses: dict[str, list[str]] = {}  # said again to an engine that restarted

    @property
    def connected(self) -> bool:
        return self._writer is not None

    @property
    def ready(self) -> bool:
        return self.connected and self._ready

    def model_reports(self) -> dict[str, dict[str, Any]]:
        return self._states

    def stuck(self) -> str | None:
        """Not judged here: the launcher watches the engine process's own verdict and restarts a stuck one."""
        return None

    def unresponsive(self) -> str | None:
        if not self._silent:
            return None
        silent = time.monotonic() - self._heard_at
        return f"the engine has not been heard from for {silent:.1f} s (--engine-silence-s {self.silence_s:g})"

    def load(self) -> None:
        """Nothing to load here: the engine process opens the sessions."""

    async def start(self, on_change: Callable[[], None]) -> None:
        self._on_change = on_change
        self._tasks = [
            asyncio.create_task(self._stay_connected(), name="engine-connection"),
            asyncio.create_task(self._watch_silence(), name="engine-silence"),
        ]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def infer(self, model: str, rows: list[Row], ticket: Ticket) -> list[dict[str, Any]]:
        writer = self._writer
        if writer is None:
            raise EngineUnavailable("the engine is not connected (starting or restarting); try again shortly")
        if self._silent:
            raise EngineUnavailable(f"{self.unresponsive()}; try again shortly")
        # The frame made before the request is pending: a request that cannot be framed leaves nothing behind
        lengths = [len(row) for row in rows]
        arrays = frames.pack_rows([row.input_ids for row in rows], [row.token_type_ids for row in rows])
        request_id = next(self._ids)
        timeout = ticket.deadline - time.monotonic()
        trace = ticket.trace
        carried = None if trace is None else (trace.trace_id, trace.span_id, int(trace.trace_flags))
        frame_bytes = frames.encode_infer(request_id, model, timeout, lengths, ticket.request_id, arrays, carried)
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._pending[request_id] = future
        writer.write(frame_bytes)
        ticket.on_cancel.append(lambda: self._cancel(request_id))
        # A timer on the future itself, not asyncio.wait_for (a second future and its callbacks per request)
        timer = loop.call_later(timeout + REPLY_GRACE_S, _expire, future)
        try:
            frame: frames.Frame = await future
        except _ReplyLate:
            self._cancel(request_id)
            raise DeadlineExceeded(f"the request was not answered within its deadline (model {model})") from None
        except asyncio.CancelledError:
            # the caller's task cancelled (a gRPC call the client cancelled): the engine drops its rows not run yet.
            # The ticket's own cancel comes after this returns, when the request is no longer pending here: its
            # rows ran all the same (HTTP's disconnect cancels the ticket while this still waits)
            self._cancel(request_id)
            raise
        finally:
            timer.cancel()
            self._pending.pop(request_id, None)
        if frame.header["op"] == "error":
            frames.raise_error(frame.header)
        timings = frame.header.get("timings", {})
        ticket.queue_seconds = float(timings.get("queue_s", 0.0))
        ticket.inference_seconds = float(timings.get("inference_s", 0.0))
        ticket.inference_calls = int(timings.get("inference_calls", 0))
        return frames.unpack_outputs(frame.arrays, lengths, bool(frame.header.get("per_token")))

    def use(self, model: str, versions: list[str]) -> None:
        if versions:
            self._uses[model] = versions
        else:
            self._uses.pop(model, None)
        if self._writer is not None:
            self._writer.write(frames.encode({"op": "use", "model": model, "versions": versions}))

    def reject(self, model: str, version: str, reason: str) -> None:
        if self._writer is not None:
            self._writer.write(frames.encode({"op": "reject", "model": model, "version": version, "reason": reason}))

    async def control(self, action: str, model: str) -> dict[str, Any]:
        """An admin call, answered when the engine has done it (a load: once the version is warmed up)."""
        writer = self._writer
        if writer is None:
            raise EngineUnavailable("the engine is not connected (starting or restarting); try again shortly")
        request_id = next(self._ids)
        future = asyncio.get_running_loop().create_future()
        self._pending[request_id] = future
        writer.write(frames.encode({"op": "control", "id": request_id, "action": action, "model": model}))
        try:
            frame: frames.Frame = await future
        finally:
            self._pending.pop(request_id, None)
        if frame.header["op"] == "error":
            frames.raise_error(frame.header)
        return dict(frame.header.get("result") or {})

    def _cancel(self, request_id: int) -> None:
        if self._writer is not None and request_id in self._pending:
            self._writer.write(frames.encode({"op": "cancel", "id": request_id}))

    async def _stay_connected(self) -> None:
        announced = False
        while True:
            try:
                reader, writer = await asyncio.open_unix_connection(str(self.path))
            except OSError:
                await asyncio.sleep(RECONNECT_S)
                continue
            self._writer = frames.FrameWriter(writer)
            log.info("connected to the engine at %s", self.path)
            for model, versions in self._uses.items():
                self._writer.write(frames.encode({"op": "use", "model": model, "versions": versions}))
            announced = False
            try:
                await self._read(reader)
            except (asyncio.IncompleteReadError, ConnectionError):
                pass
            except Exception:
                log.exception("the engine sent a frame that cannot be read")
            finally:
                self._writer = None
                self._ready = False
                self._silent = False  # not connected says itself
                self._states = {}
                writer.close()
                self._fail_pending("the engine stopped while this request was in flight; try again shortly")
                self._on_change()
            if not announced:
                log.error("lost the engine; requests in flight answered 503; reconnecting")
                announced = True
            await asyncio.sleep(RECONNECT_S)

    async def _read(self, reader: asyncio.StreamReader) -> None:
        while True:
            frame = await frames.read_frame(reader)
            self._frames += 1
            op = frame.header.get("op")
            if op == "state":
                self._states = frame.header["models"]
                self._ready = bool(frame.header["ready"])
                self._on_change()
            elif op in ("result", "error", "done"):
                future = self._pending.get(int(frame.header["id"]))
                if future is not None and not future.done():
                    future.set_result(frame)

    async def _watch_silence(self) -> None:
        """Every beat of this process's own loop: silent once no frame came for `silence_s` of ticks. Counted in
        ticks, so a front-end whose own loop was held (frames unread in the socket) does not blame the engine."""
        quiet_ticks, frames = 0, self._frames
        while True:
            await asyncio.sleep(probes.HEARTBEAT_S)
            if self._frames != frames or self._writer is None:
                frames, quiet_ticks, self._heard_at = self._frames, 0, time.monotonic()
                if self._silent:
                    log.warning("the engine is heard from again")
                self._silent = False
                continue
            quiet_ticks += 1
            silent = quiet_ticks * probes.HEARTBEAT_S >= self.silence_s
            if silent and not self._silent:
                self._silent = True
                why = self.unresponsive()
                log.error("%s; its %d requests in flight and new ones get 503 until it is", why, len(self._pending))
                for request_id in self._pending:  # where it wakes up, it drops what it has not run
                    self._cancel(request_id)
                self._fail_pending(f"{why} while this request was in flight; try again shortly")

    def _fail_pending(self, message: str) -> None:
        for future in self._pending.values():
            if not future.done():
                future.set_exception(EngineUnavailable(message))
        self._pending.clear()
