"""The engine process: an EngineCore behind a unix socket that front-end processes connect to.

`python -m service.engine --socket PATH` (settings from BERTSERVE_* variables, as the launcher passes them).
Every connection gets the models' state at once and again on every change, and a beat every HEARTBEAT_S (how a
front-end tells an engine that is stuck from one that is busy); requests run concurrently, each answered by id in
whatever order they finish. A connection that closes cancels its requests.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import logging
import signal
import sys
from pathlib import Path
from typing import Any

from bertcore.rows import Row
from service import probes, tracing
from service.engine.core import EngineCore
from service.errors import InferenceFailed, ServiceError, StartupError
from service.logs import REQUEST_ID
from service.metrics import Metrics
from service.settings import Settings
from service.system import garbage_collector
from service.wire import frames
from service.wire.ticket import Ticket

log = logging.getLogger("service.engine.server")
# How long a thread that wants the interpreter lock waits for a busy holder to give it up (Python's default: 5 ms).
# The device thread takes the lock back after every session run and device copy, while the event loop, under load,
# holds it almost without pause for requests' frames: the device thread waits up to this long per hand-back, against
# batches of 3-6 ms on an H100 (Python's default, 5 ms, was measured; 1 ms, then 0.1 ms together with the batcher's
# early take; the threads ask for the lock a few times per batch, so a short interval costs the loop little).
SWITCH_INTERVAL_S = 0.0001


class EngineServer:
    def __init__(self, core: EngineCore, path: Path) -> None:
        self.core = core
        self.path = path
        self._writers: set[frames.FrameWriter] = set()
        self._server: asyncio.AbstractServer | None = None
        self._requests: set[asyncio.Future] = set()  # answered from their done callbacks: no task per request
        self._beat: asyncio.Task | None = None
        self._controls: set[asyncio.Task] = set()  # load, unload and index calls under way
        core.on_change = self._broadcast_state

    async def start(self) -> None:
        self.path.unlink(missing_ok=True)
        self._server = await asyncio.start_unix_server(self._connection, path=str(self.path))
        self._beat = asyncio.create_task(self._keep_beating(), name="beat")

    async def stop(self) -> None:
        """No new connections; requests in flight finish and are answered; then the sessions close."""
        if self._server is not None:
            self._server.close()
        if self._beat is not None:
            self._beat.cancel()
        if self._requests:
            await asyncio.gather(*self._requests, return_exceptions=True)
        await self.core.stop()
        for writer in list(self._writers):
            writer.close()
        self.path.unlink(missing_ok=True)

    def _state(self) -> bytes:
        return frames.encode({"op": "state", "ready": self.core.warmed_up, "models": self.core.model_reports()})

    def _broadcast_state(self) -> None:
        self._broadcast(self._state())

    def _broadcast(self, frame: bytes) -> None:
        for writer in self._writers:
            writer.write(frame)

    async def _keep_beating(self) -> None:
        beat = frames.encode({"op": "beat"})
        while True:
            await asyncio.sleep(probes.HEARTBEAT_S)
            self._broadcast(beat)

    async def _connection(self, reader: asyncio.StreamReader, stream: asyncio.StreamWriter) -> None:
        writer = frames.FrameWriter(stream)
        self._writers.add(writer)
        self.core.connect(writer)
        tickets: dict[int, Ticket] = {}
        writer.write(self._state())
        try:
            while True:
                frame = await frames.read_frame(reader)
                op, request_id = frame.header.get("op"), int(frame.header.get("id", -1))
                if op == "infer":
                    self._start(writer, frame.header, frame.arrays, tickets)
                elif op == "cancel" and request_id in tickets:
                    tickets[request_id].cancel()
                elif op == "use":
                    self.core.use(writer, str(frame.header["model"]), [str(v) for v in frame.header["versions"]])
                elif op == "reject":
                    header = frame.header
                    self.core.reject(str(header["model"]), str(header["version"]), str(header["reason"]))
                elif op == "control":
                    self._control(writer, request_id, str(frame.header["action"]), str(frame.header.get("model", "")))
        except (asyncio.IncompleteReadError, ConnectionError):
            pass  # the front-end went away
        except Exception:
            log.exception("engine: a connection sent a frame that cannot be read; closing it")
        finally:
            self._writers.discard(writer)
            for ticket in tickets.values():
                ticket.cancel()
            self.core.forget(writer)
            writer.close()

    def _control(self, writer: frames.FrameWriter, request_id: int, action: str, model: str) -> None:
        """A load, unload or index call, run as a task of its own (a load takes seconds): answered by id with a
        done frame, or an error frame with the domain error."""

        async def run() -> None:
            try:
                result = await self.core.control(action, model)
            except Exception as exc:
                reply = self._error(request_id, Ticket.with_timeout(0), exc)
            else:
                reply = frames.encode({"op": "done", "id": request_id, "result": result})
            if not writer.is_closing():
                writer.write(reply)

        task = asyncio.get_running_loop().create_task(run(), name=f"control-{action}")
        self._controls.add(task)
        task.add_done_callback(self._controls.discard)

    def _start(
        self, writer: frames.FrameWriter, header: dict[str, Any], arrays: dict[str, Any], tickets: dict[int, Ticket]
    ) -> None:
        """Queue an infer frame's rows; the answer is written from the future's done callback (`_answer`)."""
        request_id = int(header["id"])
        ticket = Ticket.with_timeout(float(header["timeout"]), header.get("request_id"))
        if (trace := header.get("trace")) is not None:
            ticket.trace = tracing.remote_context(*trace)
        try:
            lengths: list[int] = header["lengths"]
            runtime, batcher = self.core.serving(str(header["model"]))
            ids = frames.split_rows(arrays["input_ids"], lengths)
            types = frames.split_rows(arrays["token_type_ids"], lengths)
            rows = [Row(i, t) for i, t in zip(ids, types, strict=True)]
            future = batcher.enqueue(rows, ticket, lengths)
        except Exception as exc:
            writer.write(self._error(request_id, ticket, exc))
            return
        tickets[request_id] = ticket
        self._requests.add(future)
        future.add_done_callback(
            functools.partial(self._answer, writer, request_id, runtime.per_token, ticket, tickets)
        )

    def _answer(
        self,
        writer: frames.FrameWriter,
        request_id: int,
        per_token: bool,
        ticket: Ticket,
        tickets: dict[int, Ticket],
        future: asyncio.Future,
    ) -> None:
        self._requests.discard(future)
        tickets.pop(request_id, None)
        if writer.is_closing():
            return
        exc = InferenceFailed("inference failed") if future.cancelled() else future.exception()
        if exc is not None:
            writer.write(self._error(request_id, ticket, exc))
            return
        try:
            reply = frames.encode_result(
                request_id,
                per_token,
                ticket.queue_seconds,
                ticket.inference_seconds,
                ticket.inference_calls,
                frames.pack_outputs(future.result(), per_token),
            )
        except Exception as error:
            reply = self._error(request_id, ticket, error)
        writer.write(reply)

    @staticmethod
    def _error(request_id: int, ticket: Ticket, exc: BaseException) -> bytes:
        """A domain error as it is; anything else is logged (under the HTTP request's id) and answered as a 500."""
        if not isinstance(exc, ServiceError):
            token = REQUEST_ID.set(ticket.request_id)
            try:
                log.error("engine: frame %d failed", request_id, exc_info=exc)
            finally:
                REQUEST_ID.reset(token)
            exc = InferenceFailed("inference failed")
        return frames.encode(frames.error_header(request_id, exc))


async def serve(settings: Settings, path: Path, heartbeat: Path | None = None, loaded_file: Path | None = None) -> None:
    """Load, listen on `path`, warm up, serve until SIGTERM; with `heartbeat`, keep writing there whether this
    event loop runs and the device is stuck (for the launcher, which restarts a stuck engine); with `loaded_file`
    (explicit model control, in process mode), keep there the models loaded, and load those at a restart."""
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    metrics = Metrics()
    tracing.configure(settings, "engine", metrics.count_dropped_spans)
    if loaded_file is not None and settings.model_control == "explicit":
        settings = loaded_at_restart(settings, loaded_file)
    core = EngineCore(settings, metrics)
    core.loaded_file = loaded_file if settings.model_control == "explicit" else None
    core.load()
    core.start()
    garbage_collector.settle()
    background = []
    if heartbeat is not None:  # from here on the loop runs: loading, which held it, is over

        def verdicts() -> dict[str, probes.Verdict]:
            return {"live": probes.alive_unless(core.stuck())}

        background.append(probes.keep_writing(probes.HeartbeatFile(heartbeat), verdicts, name="heartbeat"))
    server = EngineServer(core, path)
    await server.start()
    log.info("engine: listening on %s", path)
    background.append(asyncio.create_task(_warm_up_then_poll(core), name="warm-up"))
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    await stopping.wait()
    log.info("engine: stopping")
    for task in background:
        task.cancel()
    await asyncio.gather(*background, return_exceptions=True)
    await server.stop()
    tracing.shutdown()


def loaded_at_restart(settings: Settings, loaded_file: Path) -> Settings:
    """The settings a restarted engine starts with: the models the repository API had loaded when the engine before
    it died (`EngineCore._record_loaded`), in place of --model's; those whose entries are gone left out. A first
    start (no file yet) keeps --model's."""
    try:
        names = json.loads(loaded_file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return settings
    kept = [name for name in names if (settings.repository / name).is_dir()]
    log.info("engine: restarted: loading the models loaded before: %s", ", ".join(kept) or "none")
    return settings.model_copy(update={"model": kept})


async def _warm_up_then_poll(core: EngineCore) -> None:
    await core.warm_up()
    if core.settings.model_control == "poll":
        await core.poll_repository()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m service.engine", description=__doc__)
    parser.add_argument("--socket", type=Path, required=True, help="unix socket to listen on")
    parser.add_argument("--heartbeat", type=Path, help="a heartbeat file to keep writing (probes.HeartbeatFile)")
    parser.add_argument(
        "--loaded-file", type=Path, help="where the models loaded through the repository API are kept for a restart"
    )
    args = parser.parse_args(argv)
    settings = Settings()
    settings.configure_logging()
    try:
        _run(serve(settings, args.socket, args.heartbeat, args.loaded_file))
    except StartupError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


def _run(coroutine: Any) -> None:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency; plain asyncio still works
        asyncio.run(coroutine)
    else:
        uvloop.run(coroutine)
