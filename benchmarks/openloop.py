"""An open-loop load: requests leave at a fixed rate whatever the server does, each on its own connection, as
independent clients would send them; and a prober timing `/livez` on its own connections meanwhile.

A closed loop (each client waits for its answer) slows down with the server and never shows overload; this one
keeps sending, so what the server does with more work than it can do (refuse it, or queue it) shows.
Latency is counted from the moment a request was due, so a client that fell behind does not hide time. The
probes run in processes of their own, so the load generator's lag is not in their figures.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
import socket
import time
from collections import Counter
from dataclasses import dataclass, field

NO_ANSWER = -1  # no answer within the timeout
CONNECTION_ERROR = 0  # refused, reset or closed without an answer


@dataclass
class Answer:
    due: float  # perf_counter() when the request was due to leave
    seconds: float  # due -> full answer read
    status: int
    retry_after: bool = False
    queue_ms: float | None = None  # the server's x-queue-time-ms, where it sent one
    server_ms: float | None = None  # the server's x-total-time-ms: its own time, from the request's start


@dataclass
class OpenLoopResult:
    rate: float
    seconds: float
    answers: list[Answer] = field(default_factory=list)
    probe_seconds: dict[str, list[float]] = field(default_factory=dict)  # by probe: "livez", "probe-port livez"
    probe_failures: dict[str, int] = field(default_factory=dict)

    def statuses(self) -> Counter[int]:
        return Counter(a.status for a in self.answers)

    def latency_ms(self, q: float, status: int = 200) -> float:
        return 1000 * quantile([a.seconds for a in self.answers if a.status == status], q)

    def queue_ms(self, q: float) -> float:
        """The server's own queue time (x-queue-time-ms) of the 200s, at quantile q."""
        return quantile([a.queue_ms for a in self.answers if a.status == 200 and a.queue_ms is not None], q)

    def server_ms(self, q: float) -> float:
        """The server's own time (x-total-time-ms) of the 200s, at quantile q: the rest of a client's time went
        before the server read the request (the listen backlog, the event loop) or after it wrote the answer."""
        return quantile([a.server_ms for a in self.answers if a.status == 200 and a.server_ms is not None], q)

    def probe_ms(self, name: str, q: float) -> float:
        return 1000 * quantile(self.probe_seconds.get(name, []), q)

    def summary(self) -> dict:
        statuses = self.statuses()
        refused = [a for a in self.answers if a.status == 429]
        return {
            "offered_per_s": self.rate,
            "seconds": self.seconds,
            "sent": len(self.answers),
            "statuses": dict(sorted(statuses.items())),
            "answered_200_per_s": round(statuses.get(200, 0) / self.seconds, 1),
            "429_with_retry_after": sum(a.retry_after for a in refused),
            "p50_ms_200": round(self.latency_ms(0.50), 1),
            "p90_ms_200": round(self.latency_ms(0.90), 1),
            "p99_ms_200": round(self.latency_ms(0.99), 1),
            "queue_p50_ms_200": round(self.queue_ms(0.50), 1),
            "queue_p99_ms_200": round(self.queue_ms(0.99), 1),
            "server_p50_ms_200": round(self.server_ms(0.50), 1),
            "server_p99_ms_200": round(self.server_ms(0.99), 1),
            "max_ms_200": round(self.latency_ms(1.0), 1),
            "p99_ms_429": round(self.latency_ms(0.99, 429), 1),
            "probes": {
                name: {
                    "count": len(values) + self.probe_failures.get(name, 0),
                    "p50_ms": round(self.probe_ms(name, 0.50), 1),
                    "p99_ms": round(self.probe_ms(name, 0.99), 1),
                    "max_ms": round(self.probe_ms(name, 1.0), 1),
                    "failures": self.probe_failures.get(name, 0),
                }
                for name, values in self.probe_seconds.items()
            },
        }


@dataclass
class Reply:
    status: int
    retry_after: bool = False
    queue_ms: float | None = None
    server_ms: float | None = None


async def _exchange(host: str, port: int, request: bytes) -> Reply:
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(request)
        await writer.drain()
        status_line = await reader.readline()
        if not status_line:
            return Reply(CONNECTION_ERROR)
        reply, length = Reply(int(status_line.split()[1])), 0
        while (line := await reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.decode("latin-1").partition(":")
            name = name.strip().lower()
            if name == "content-length":
                length = int(value)
            elif name == "retry-after":
                reply.retry_after = value.strip().isdigit()
            elif name == "x-queue-time-ms":
                reply.queue_ms = float(value)
            elif name == "x-total-time-ms":
                reply.server_ms = float(value)
        await reader.readexactly(length)
        return reply
    finally:
        writer.close()


def post_request(host: str, path: str, body: bytes) -> bytes:
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode() + body


async def _one(host: str, port: int, request: bytes, due: float, timeout: float, result: OpenLoopResult) -> None:
    try:
        reply = await asyncio.wait_for(_exchange(host, port, request), timeout)
    except TimeoutError:
        reply = Reply(NO_ANSWER)
    except (OSError, asyncio.IncompleteReadError, ValueError, IndexError):
        reply = Reply(CONNECTION_ERROR)
    result.answers.append(
        Answer(due, time.perf_counter() - due, reply.status, reply.retry_after, reply.queue_ms, reply.server_ms)
    )


def _probe_process(host: str, port: int, seconds: float, every_s: float, timeout: float, out) -> None:
    """Time GET /livez every `every_s` for `seconds`, with blocking sockets in a process of its own: the load
    generator's busy event loop would otherwise add its own lag to the probe's figures."""
    # A kubelet runs outside the pod's CPU share; on one shared machine the nearest thing is a higher priority
    # (root only), so that the prober's own wait for a core is not counted as the server's.
    with contextlib.suppress(PermissionError):
        os.setpriority(os.PRIO_PROCESS, 0, -10)
    request = f"GET /livez HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode()
    latencies, failures = [], 0
    until = time.perf_counter() + seconds
    while time.perf_counter() < until:
        started = time.perf_counter()
        try:
            with socket.create_connection((host, port), timeout=timeout) as sock:
                sock.sendall(request)
                answer = b""
                while chunk := sock.recv(4096):
                    answer += chunk
            ok = answer.split(b"\r\n", 1)[0].split(b" ")[1:2] == [b"200"]
        except OSError:
            ok = False
        if ok:
            latencies.append(time.perf_counter() - started)
        else:
            failures += 1
        time.sleep(max(0.0, every_s - (time.perf_counter() - started)))
    out.send((latencies, failures))


async def open_loop(
    host: str,
    port: int,
    requests: list[bytes],
    rate: float,
    seconds: float,
    timeout: float = 60.0,
    probe_every_s: float = 0.1,
    probe_port: int | None = None,
) -> OpenLoopResult:
    """Send `rate` requests a second for `seconds` (cycling through `requests`), each answer awaited up to
    `timeout`; probe /livez every `probe_every_s` meanwhile, on the main port and on `probe_port` if given.
    Returns once every request has ended."""
    result = OpenLoopResult(rate, seconds)
    ports = {"livez": port, **({"probe-port livez": probe_port} if probe_port else {})}
    probes = {}
    for name, p in ports.items():
        receiver, sender = multiprocessing.Pipe(duplex=False)
        process = multiprocessing.Process(target=_probe_process, args=(host, p, seconds, probe_every_s, 5.0, sender))
        process.start()
        probes[name] = (process, receiver)
    start = time.perf_counter()
    tasks = []
    total = int(rate * seconds)
    for i in range(total):
        due = start + i / rate
        delay = due - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(_one(host, port, requests[i % len(requests)], due, timeout, result)))
    await asyncio.gather(*tasks)
    for name, (process, receiver) in probes.items():
        result.probe_seconds[name], result.probe_failures[name] = receiver.recv()
        process.join()
    return result


def quantile(values: list[float], q: float) -> float:
    """The value at quantile q (the nearest rank below it); NaN where there are none."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")
