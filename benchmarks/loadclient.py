"""A lean HTTP/1.1 keep-alive load client (asyncio streams), so the client costs the shared cores little."""

from __future__ import annotations

import asyncio
import itertools
import json
import statistics
import time
from collections.abc import Iterable
from dataclasses import dataclass, field


@dataclass
class LoadResult:
    seconds: float
    requests: int = 0
    sequences: int = 0
    latencies: list[float] = field(default_factory=list)
    statuses: dict[int, int] = field(default_factory=dict)

    @property
    def sequences_per_s(self) -> float:
        return self.sequences / self.seconds

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


async def _request(reader, writer, host: str, path: str, body: bytes) -> tuple[int, bytes]:
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    writer.write(head + body)
    await writer.drain()
    status_line = await reader.readline()
    status = int(status_line.split()[1])
    length = 0
    while (line := await reader.readline()) not in (b"\r\n", b""):
        name, _, value = line.decode("latin-1").partition(":")
        if name.lower() == "content-length":
            length = int(value)
    return status, await reader.readexactly(length)


async def _worker(host, port, path, payloads, deadline, result: LoadResult, max_requests: int | None) -> None:
    reader, writer = await asyncio.open_connection(host, port)
    try:
        while time.perf_counter() < deadline and (max_requests is None or result.requests < max_requests):
            payload, size = next(payloads)
            started = time.perf_counter()
            status, _ = await _request(reader, writer, host, path, payload)
            result.latencies.append(time.perf_counter() - started)
            result.statuses[status] = result.statuses.get(status, 0) + 1
            result.requests += 1
            if status == 200:
                result.sequences += size
    finally:
        writer.close()


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
    host, port = url.removeprefix("http://").split(":")
    encoded = [(json.dumps(body).encode(), size) for body, size in zip(bodies, sizes, strict=True)]
    payloads = itertools.cycle(encoded)

    async def main() -> LoadResult:
        result = LoadResult(seconds=seconds)
        started = time.perf_counter()
        deadline = started + seconds
        await asyncio.gather(
            *(_worker(host, int(port), path, payloads, deadline, result, max_requests) for _ in range(clients))
        )
        result.seconds = time.perf_counter() - started
        return result

    return asyncio.run(main())
