"""`/livez` and `/readyz` on a port of their own (`--probe-port`), answered by a process of its own.

On the main port a probe waits behind everything else the event loop has to do: seconds under overload, and an
orchestrator kills a pod whose liveness probe times out. A thread in the server process was not enough either:
it waits for the GIL (p99 116 ms at 3x overload on 2 cores, where a bare process answered in 9 ms). So a small
child process answers, from a heartbeat file the server's event loop rewrites every HEARTBEAT_S: the time it last
ran, and the /livez and /readyz verdicts. Liveness is "the event loop ran within `--liveness-stall-s`, and no batch
is stuck on the device" (`alive_unless`), so a loop that is stuck (not merely busy) still fails the probe;
readiness is the main port's verdict, at most HEARTBEAT_S old. In process mode every process (the engine, each
front-end) writes such a heartbeat file too, for the launcher (`liveness`), which restarts one that is stuck.

The server opens the listening socket itself (a port in use fails its start, as the main port would) and hands
it to the child, which exits when the server's end of its stdin closes: it never outlives the server.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

log = logging.getLogger("service.probes")
HEARTBEAT_S = 0.2
STATE_DIR_PREFIX = "bertserve-probes-"  # the folder of a probe process's state file, one per server process
Verdict = tuple[int, dict[str, Any]]


def unavailable(message: str) -> Verdict:
    return 503, {"error": message, "error_type": "unavailable", "field": None}


ALIVE: Verdict = (200, {"status": "alive"})


def alive_unless(stuck: str | None) -> Verdict:
    """/livez's verdict from a running event loop: alive, unless the device is stuck (`EngineCore.stuck`)."""
    return ALIVE if stuck is None else unavailable(f"not alive: {stuck}")


class HeartbeatFile:
    """A process's heartbeat file, for whoever watches it (the launcher, the probe port's process):
    {"beat": monotonic seconds, and its verdicts, e.g. "live", "ready"}."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def write(self, **verdicts: Verdict) -> None:
        partial = self.path.with_suffix(".partial")
        partial.write_text(json.dumps({"beat": time.monotonic(), **{k: list(v) for k, v in verdicts.items()}}))
        os.replace(partial, self.path)  # atomic: the reader sees the old state or the new one

    def publish(self, **verdicts: Verdict) -> None:
        """Write, where the disk lets it: a full disk must not stop the server; the reader will find it stale."""
        try:
            self.write(**verdicts)
        except OSError as exc:
            log.warning("could not write the heartbeat file %s: %s", self.path.name, exc)

    def read(self) -> dict[str, Any] | None:
        try:
            return json.loads(self.path.read_text())
        except (OSError, ValueError):
            return None


def keep_writing(state: HeartbeatFile, verdicts: Callable[[], dict[str, Verdict]], name: str) -> asyncio.Task:
    """Write the state now (a file that cannot be written fails the start), then every HEARTBEAT_S from this event
    loop, in the task returned: each write is a beat, the proof that the loop runs."""
    state.write(**verdicts())

    async def beat() -> None:
        while True:
            await asyncio.sleep(HEARTBEAT_S)
            state.publish(**verdicts())

    return asyncio.get_running_loop().create_task(beat(), name=name)


def _silence(state: dict[str, Any] | None, stall_s: float) -> Verdict | None:
    """Dead where the writer has not written, or its event loop has not run for `stall_s`; None where it beats."""
    if state is None:
        return unavailable("the server has not reported yet")
    silent = time.monotonic() - float(state["beat"])
    if silent > stall_s:
        return unavailable(f"the event loop has not run for {silent:.1f} s (--liveness-stall-s {stall_s:g})")
    return None


def _verdict(written: list[Any]) -> Verdict:
    status, body = written
    return int(status), body


def liveness(state: dict[str, Any] | None, stall_s: float) -> Verdict:
    """/livez from the state a process last wrote: its own verdict while its event loop beats."""
    return verdicts(state, stall_s)[0]


def verdicts(state: dict[str, Any] | None, stall_s: float) -> tuple[Verdict, Verdict]:
    """(/livez, /readyz) from the state a process last wrote; a writer with no readiness is ready where alive."""
    dead = _silence(state, stall_s)
    if dead is not None:
        return dead, dead
    assert state is not None  # _silence says so of a missing state
    live = _verdict(state["live"])
    return live, _verdict(state["ready"]) if "ready" in state else live


class ProbeProcess:
    """The server's side: writes the heartbeat file from the event loop, and runs the child that answers."""

    def __init__(
        self, sock: socket.socket, liveness: Callable[[], Verdict], readiness: Callable[[], Verdict], stall_s: float
    ) -> None:
        self._sock = sock
        self._liveness = liveness
        self._readiness = readiness
        self._dir = Path(tempfile.mkdtemp(prefix=STATE_DIR_PREFIX))
        self.state = HeartbeatFile(self._dir / "state.json")
        self._stall_s = stall_s
        self._child: subprocess.Popen | None = None
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = keep_writing(self.state, self._verdicts, name="probe-heartbeat")
        self._child = probe_child(self._sock, self.state, self._stall_s)
        host, port = self._sock.getsockname()[:2]
        log.info("probes on http://%s:%d (/livez, /readyz), answered by process %d", host, port, self._child.pid)

    def _verdicts(self) -> dict[str, Verdict]:
        return {"live": self._liveness(), "ready": self._readiness()}

    def publish(self, ready: Verdict) -> None:
        """Write the state now: a readiness verdict that just changed."""
        self.state.publish(live=self._liveness(), ready=ready)

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
        if self._child is not None:
            with contextlib.suppress(OSError):
                self._child.stdin.close()  # type: ignore[union-attr]
            try:
                self._child.wait(5)
            except subprocess.TimeoutExpired:
                self._child.kill()
        self._sock.close()
        remove_state(self.state.path)


def probe_child(sock: socket.socket, state: HeartbeatFile, stall_s: float) -> subprocess.Popen:
    """Start the process that answers on `sock`; it exits when its stdin closes."""
    fd = sock.fileno()
    flags = ["--fd", str(fd), "--state", str(state.path), "--stall-s", str(stall_s)]
    return subprocess.Popen([sys.executable, "-m", "service.probes", *flags], stdin=subprocess.PIPE, pass_fds=(fd,))


def serve_probes(sock: socket.socket, state: HeartbeatFile, stall_s: float) -> ThreadingHTTPServer:
    """The child's HTTP server on `sock` (not started)."""

    class Handler(BaseHTTPRequestHandler):
        timeout = 5  # a probe that sends nothing holds its thread no longer than this

        def do_HEAD(self) -> None:
            self.do_GET()

        def do_GET(self) -> None:
            live, ready = verdicts(state.read(), stall_s)
            path = self.path.split("?", 1)[0]
            if path == "/livez":
                status, body = live
            elif path == "/readyz":
                status, body = ready
            else:
                status, body = 404, {"error": "this port serves /livez and /readyz", "error_type": "not_found"}
                body["field"] = None
            data = json.dumps(body, separators=(",", ":")).encode()  # compact, as the app writes it
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    httpd = ThreadingHTTPServer(sock.getsockname()[:2], Handler, bind_and_activate=False)
    httpd.socket.close()
    httpd.socket = sock
    httpd.daemon_threads = True
    return httpd


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m service.probes", description=__doc__.split("\n\n")[0])
    parser.add_argument("--fd", type=int, required=True, help="the listening socket, opened by the server")
    parser.add_argument("--state", type=Path, required=True, help="the heartbeat file the server rewrites")
    parser.add_argument("--stall-s", type=float, required=True, help="liveness fails past this much silence")
    args = parser.parse_args(argv)
    # A terminal's Ctrl-C reaches this process with its server's (one process group): the server drains and then
    # closes our stdin; a KeyboardInterrupt here was a traceback in the server's log.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    httpd = serve_probes(socket.socket(fileno=args.fd), HeartbeatFile(args.state), args.stall_s)
    threading.Thread(target=httpd.serve_forever, name="probes", daemon=True).start()
    sys.stdin.buffer.read()  # returns when the server closes its end, or dies
    remove_state(args.state)  # a server killed outright (kill -9, an OOM kill) left its folder behind, one a death
    return 0


def remove_state(state: Path) -> None:
    """The state file, and its folder where `ProbeProcess` made it for that file alone."""
    state.unlink(missing_ok=True)
    if state.parent.name.startswith(STATE_DIR_PREFIX):
        for path in state.parent.glob("*"):
            path.unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            state.parent.rmdir()


if __name__ == "__main__":
    sys.exit(main())
