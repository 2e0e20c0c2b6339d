"""A lean HTTP/1.1 keep-alive load client (asyncio streams), so the client costs the shared cores little.

`run_load` is one process; `run_load_processes` spreads the connections over several client processes that
start and stop at the same instant, for servers that answer more requests than one Python process can send.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import multiprocessing
import queue
import statistics
import time
from collections.abc import Callable, Coroutine, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

T = TypeVar("T")
# Statuses recorded for requests that got no HTTP answer: the connection broke, or nothing came in time.
CONNECTION_ERROR = 0
NO_ANSWER = -1
ANSWER_GRACE_S = 30.0


@dataclass
class LoadResult:
    seconds: float
    requests: int = 0
    sequences: int = 0
    latencies: list[float] = field(default_factory=list)
    statuses: dict[int, int] = field(default_factory=dict)
    # The client's own CPU over the window (user + system, its processes together): where client and server share
    # the cores, a client near one core per process holds the rate, not the server
    cpu_seconds: float = 0.0

    @property
    def client_cores(self) -> float:
        return self.cpu_seconds / self.seconds

    @property
    def sequences_per_s(self) -> float:
        return self.sequences / self.seconds

    @property
    def requests_per_s(self) -> float:
        return self.requests / self.seconds

    def percentile_ms(self, q: float) -> float:
        ordered = sorted(self.latencies)
        return 1000 * ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")

    def summary(self) -> dict:
        return {
            "requests": self.requests,
            "sequences_per_s": round(self.sequences_per_s, 1),
            "p50_ms": round(self.percentile_ms(0.5), 1),
            "p99_ms": round(self.percentile_ms(0.99), 1),
            "mean_ms": round(1000 * statistics.mean(self.latencies), 1) if self.latencies else None,
            "statuses": self.statuses,
        }

    @classmethod
    def merge(cls, parts: list[LoadResult]) -> LoadResult:
        """Results of clients that ran over the same window, as one."""
        merged = cls(seconds=max(p.seconds for p in parts))
        for part in parts:
            merged.requests += part.requests
            merged.sequences += part.sequences
            merged.latencies.extend(part.latencies)
            merged.cpu_seconds += part.cpu_seconds
            for status, count in part.statuses.items():
                merged.statuses[status] = merged.statuses.get(status, 0) + count
        return merged


async def _request(reader, writer, host: str, path: str, body: bytes) -> tuple[int, bytes, bool]:
    """The answer's status and body, and whether the server closes the connection after it (`Connection: close`,
    as this server says after an error answered before the body was read: a 429 from admission, a 413)."""
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    writer.write(head + body)
    await writer.drain()
    status_line = await reader.readline()
    if not status_line:
        raise ConnectionResetError("the server closed the connection")
    status = int(status_line.split()[1])
    closes = status_line.startswith(b"HTTP/1.0")
    length = 0
    while (line := await reader.readline()) not in (b"\r\n", b""):
        name, _, value = line.decode("latin-1").partition(":")
        name = name.lower()
        if name == "content-length":
            length = int(value)
        elif name == "connection":
            closes = value.strip().lower() == "close"
    return status, await reader.readexactly(length), closes


async def _worker(host, port, path, payloads, deadline, result: LoadResult, max_requests: int | None, connection=None):
    """Sends the next payload as soon as the last answer came; a broken connection counts as an error and is
    reopened, one the server closes after its answer (`Connection: close`) is reopened too, the answer counted as its
    status."""
    reader, writer = connection or await asyncio.open_connection(host, port)
    try:
        while time.perf_counter() < deadline and (max_requests is None or result.requests < max_requests):
            payload, size = next(payloads)
            started = time.perf_counter()
            # An answer may take until the deadline and a grace period, no longer: a load always ends.
            timeout = max(deadline - started, 0) + ANSWER_GRACE_S
            try:
                status, _, closes = await asyncio.wait_for(_request(reader, writer, host, path, payload), timeout)
            except (OSError, asyncio.IncompleteReadError, ValueError, IndexError, TimeoutError) as exc:
                status, closes = (NO_ANSWER if isinstance(exc, TimeoutError) else CONNECTION_ERROR), True
            result.latencies.append(time.perf_counter() - started)
            result.statuses[status] = result.statuses.get(status, 0) + 1
            result.requests += 1
            if status == 200:
                result.sequences += size
            if closes:  # broken, or closed by the server after its answer (which counts as that answer): reopened
                writer.close()
                reopened = await _reopen(host, port, deadline)
                if reopened is None:
                    return  # the window is over before a new connection could be opened
                reader, writer = reopened
    finally:
        writer.close()


async def _reopen(host: str, port: int, deadline: float):
    """A new connection, retried until the deadline; None once it has passed."""
    while time.perf_counter() < deadline:
        try:
            return await asyncio.open_connection(host, port)
        except OSError:
            await asyncio.sleep(0.05)
    return None


def _payloads(bodies: Iterable[dict], sizes: Iterable[int], offset: int = 0) -> Iterator[tuple[bytes, int]]:
    encoded = [(json.dumps(body).encode(), size) for body, size in zip(bodies, sizes, strict=True)]
    offset %= max(len(encoded), 1)
    return itertools.cycle(encoded[offset:] + encoded[:offset])


def classify_cases(sentences: list[str], path: str, clients_1: int, clients_16: int) -> dict[str, tuple]:
    """label -> (path, bodies, sequences per body, connections): 1-input and 16-input requests, data order."""
    singles = [{"inputs": [s]} for s in sentences]
    sixteens = [{"inputs": sentences[i : i + 16]} for i in range(0, len(sentences) - 15, 16)]
    return {
        "1 input": (path, singles, [1] * len(singles), clients_1),
        "16 inputs": (path, sixteens, [16] * len(sixteens), clients_16),
    }


def run_fast(coroutine: Coroutine[Any, Any, T]) -> T:
    """asyncio.run on uvloop where it is installed (it is on the GPU machine and in the service's dependencies)."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coroutine)
    return uvloop.run(coroutine)


def _host_port(url: str) -> tuple[str, int]:
    host, port = url.removeprefix("http://").split(":")
    return host, int(port)


def run_load(
    url: str,
    path: str,
    bodies: Iterable[dict],
    sizes: Iterable[int],
    clients: int,
    seconds: float,
    max_requests: int | None = None,
) -> LoadResult:
    """`clients` connections, each sending the next body as soon as its last answer came, for `seconds`."""
    host, port = _host_port(url)
    payloads = _payloads(bodies, sizes)

    def workers(result: LoadResult, deadline: float) -> list[Coroutine[Any, Any, None]]:
        return [_worker(host, port, path, payloads, deadline, result, max_requests) for _ in range(clients)]

    return asyncio.run(_window(seconds, workers))


async def _window(
    seconds: float, workers: Callable[[LoadResult, float], list[Coroutine[Any, Any, None]]]
) -> LoadResult:
    """Run the workers (given the result they fill and the deadline) to the end of a `seconds` window; the result
    gets the window's own wall and CPU seconds."""
    result = LoadResult(seconds=seconds)
    started, cpu = time.perf_counter(), time.process_time()
    await asyncio.gather(*workers(result, started + seconds))
    result.seconds = time.perf_counter() - started
    result.cpu_seconds = time.process_time() - cpu
    return result


def _process_load(url: str, path: str, payloads: list, clients: int, seconds: float, barrier, results) -> None:
    """One client process: opens its connections, waits at the barrier for the others, loads for `seconds`."""
    host, port = _host_port(url)
    cycle = itertools.cycle(payloads)

    async def main() -> LoadResult:
        connections = await asyncio.gather(*(asyncio.open_connection(host, port) for _ in range(clients)))
        barrier.wait(60)  # blocks the loop, which has nothing else to do yet
        return await _window(
            seconds,
            lambda result, deadline: [_worker(host, port, path, cycle, deadline, result, None, c) for c in connections],
        )

    try:
        results.put(run_fast(main()))
    except BaseException as exc:
        barrier.abort()
        results.put(exc)


def run_load_processes(
    url: str, path: str, bodies: list[dict], sizes: list[int], clients: int, seconds: float, processes: int
) -> LoadResult:
    """`clients` connections spread over `processes` client processes (uvloop where installed), one window."""
    processes = max(1, min(processes, clients))
    shares = [clients // processes + (i < clients % processes) for i in range(processes)]
    step = max(1, len(bodies) // processes)
    context = multiprocessing.get_context("spawn")  # the parent may hold threads (onnxruntime, torch): no fork
    barrier = context.Barrier(processes)
    results = context.Queue()
    workers = [
        context.Process(
            target=_process_load,
            args=(url, path, list(itertools.islice(_payloads(bodies, sizes, i * step), len(bodies))), share, seconds),
            kwargs={"barrier": barrier, "results": results},
            daemon=True,
        )
        for i, share in enumerate(shares)
    ]
    for worker in workers:
        worker.start()
    parts: list = []
    deadline = time.monotonic() + seconds + 120
    try:
        while len(parts) < len(workers):
            try:
                parts.append(results.get(timeout=1))
            except queue.Empty:
                if any(w.exitcode not in (None, 0) for w in workers) or time.monotonic() > deadline:
                    raise RuntimeError("a client process died without a result") from None
    finally:
        for worker in workers:
            worker.join(5)
            if worker.is_alive():
                worker.kill()
    failures = [p for p in parts if isinstance(p, BaseException)]
    if failures:
        raise RuntimeError(f"a client process failed: {failures[0]!r}")
    return LoadResult.merge(parts)
