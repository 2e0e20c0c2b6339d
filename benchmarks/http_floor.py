"""The HTTP layers' own CPU per request, with no application work (issue 37: would inference served below ASGI pay?).

Three servers answer the same small JSON POST with a small JSON body after one turn of the event loop (a future
resolved by `call_soon`, where the front-end awaits the engine's reply), each in a process of its own on uvloop,
loaded in turn by the same closed-loop keep-alive connections, rounds interleaved. Each figure is the server
process's CPU time (utime + stime) per answered request:

- `raw`: an asyncio protocol on httptools' parser, a task per request, the body parsed, one write per answer: about
  the least a handler below ASGI could cost;
- `uvicorn`: uvicorn's httptools protocol and a minimal ASGI app (the body read through `receive`, the answer sent
  as a start and a body message);
- `bertserve`: that app under this server's protocol (`service.frontend.http.httptools_protocol`: the header and
  body deadlines, the size limits, one write per answer).

The gap between `raw` and `bertserve` is what serving inference below the ASGI cycle could save a request at most,
before the app's own work (the gateway, the pipeline, tokenization, the engine's frames), which `frontend_cost`
measures whole.

    python -m benchmarks.http_floor [--seconds 4] [--rounds 2] [--connections 8]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import httptools

from benchmarks.loadclient import run_fast, run_load
from benchmarks.process_cpu import ProcessTreeCpu
from tests.harness.serving import free_port

SERVERS = ("raw", "uvicorn", "bertserve")
PATH = "/v1/models/m/classify"
REQUEST = {"inputs": ["a fine sentence to classify"]}
ANSWER = {"model": "m", "results": [[{"label": "POSITIVE", "score": 0.9876543}]]}


async def _one_loop_turn() -> None:
    """Where the front-end awaits the engine: a future answered from a callback."""
    loop = asyncio.get_running_loop()
    future = loop.create_future()
    loop.call_soon(future.set_result, None)
    await future


async def asgi_app(scope: dict[str, Any], receive: Callable, send: Callable) -> None:
    if scope["type"] != "http":
        return
    chunks = []
    while True:
        message = await receive()
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    json.loads(b"".join(chunks))
    await _one_loop_turn()
    body = json.dumps(ANSWER, separators=(",", ":")).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class RawProtocol(asyncio.Protocol):
    """HTTP/1.1 on httptools' parser, no framework: a task per request, one write per answer."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport: asyncio.Transport = transport  # type: ignore[assignment]
        self.parser = httptools.HttpRequestParser(self)
        self.url = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.body: list[bytes] = []

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self.transport.close()

    def on_url(self, url: bytes) -> None:
        self.url = url

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name.lower(), value))

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        body, self.body, self.headers = b"".join(self.body), [], []
        asyncio.get_running_loop().create_task(self.answer(body))

    async def answer(self, body: bytes) -> None:
        json.loads(body)
        await _one_loop_turn()
        content = json.dumps(ANSWER, separators=(",", ":")).encode()
        head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n" % len(content)
        self.transport.write(head + content)


def serve(kind: str, port: int) -> None:
    """Answer on 127.0.0.1:port until killed."""
    if kind == "raw":

        async def main() -> None:
            server = await asyncio.get_running_loop().create_server(RawProtocol, "127.0.0.1", port)
            async with server:
                await server.serve_forever()

        run_fast(main())
        return
    import uvicorn

    from service.frontend.http.httptools_protocol import HttpLimits, protocol_class

    http: Any = protocol_class(HttpLimits()) if kind == "bertserve" else "httptools"
    uvicorn.run(
        asgi_app, host="127.0.0.1", port=port, http=http, ws="none", loop="uvloop", lifespan="off",
        log_level="warning", access_log=False,
    )  # fmt: skip


def measure(kind: str, seconds: float, warmup_s: float, connections: int) -> dict[str, float]:
    port = free_port()
    process = subprocess.Popen([sys.executable, "-m", "benchmarks.http_floor", "--serve", kind, "--port", str(port)])
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while True:  # until it answers
            try:
                if run_load(url, PATH, [REQUEST], [1], 1, 0.05).statuses.get(200):
                    break
            except OSError:
                pass
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the {kind} server did not start")
            time.sleep(0.1)
        run_load(url, PATH, [REQUEST], [1], connections, warmup_s)
        with ProcessTreeCpu(process.pid) as cpu:
            result = run_load(url, PATH, [REQUEST], [1], connections, seconds)
        used = sum((cpu.seconds() or {}).values())
        answered = result.statuses.get(200, 0)
        if answered != result.requests:
            raise RuntimeError(f"the {kind} server answered {result.statuses}")
        return {"requests_per_s": answered / result.seconds, "cpu_us_per_request": 1e6 * used / max(answered, 1)}
    finally:
        process.terminate()
        process.wait(10)


def main(argv: list[str] | None = None) -> dict[str, dict[str, float]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=4.0, help="measured load per server and round")
    parser.add_argument("--warmup-seconds", type=float, default=1.0)
    parser.add_argument("--rounds", type=int, default=2, help="rounds of the three in turn; medians reported")
    parser.add_argument("--connections", type=int, default=8, help="closed-loop keep-alive connections")
    parser.add_argument("--serve", choices=SERVERS, help=argparse.SUPPRESS)  # a server's own process
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        serve(args.serve, args.port)
        return {}
    runs: dict[str, list[dict[str, float]]] = {kind: [] for kind in SERVERS}
    for round_index in range(args.rounds):
        order = SERVERS if round_index % 2 == 0 else SERVERS[::-1]
        for kind in order:
            figures = measure(kind, args.seconds, args.warmup_seconds, args.connections)
            runs[kind].append(figures)
            print(f"  round {round_index + 1} {kind}: {figures['requests_per_s']:,.0f} requests/s, "
                  f"{figures['cpu_us_per_request']:.1f} µs of CPU a request", flush=True)  # fmt: skip
    report = {
        kind: {name: statistics.median(run[name] for run in rounds) for name in rounds[0]}
        for kind, rounds in runs.items()
    }
    print("| server | requests/s | CPU µs per request |")
    print("|---|---|---|")
    for kind, figures in report.items():
        print(f"| {kind} | {figures['requests_per_s']:,.0f} | {figures['cpu_us_per_request']:.1f} |")
    return report


if __name__ == "__main__":
    main()
