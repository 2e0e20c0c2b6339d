"""An HTTP/1.1 keep-alive server that answers every request at once with a fixed small JSON body.

It measures the load client, not a server: `gpu_benchmark` drives it with the very client set-up of a real run
and prints the rate, so that a reader can see the client was not what limited the served figures.

    python -m benchmarks.null_server --port 8009 [--processes 4]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket

from benchmarks.loadclient import run_fast

BODY = b'[{"label":"POSITIVE","score":0.9876543}]'
RESPONSE = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(BODY), BODY)


class NullProtocol(asyncio.Protocol):
    def __init__(self) -> None:
        self.buffer = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        answers = 0
        while (end := self.buffer.find(b"\r\n\r\n")) >= 0:
            length = 0
            for line in self.buffer[:end].split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            if len(self.buffer) < end + 4 + length:
                break
            self.buffer = self.buffer[end + 4 + length :]
            answers += 1
        if answers:
            self.transport.write(RESPONSE * answers)


def serve(sock: socket.socket) -> None:
    """Answers on `sock` until SIGTERM or SIGINT."""

    async def main() -> None:
        loop = asyncio.get_running_loop()
        stop = loop.create_future()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, lambda: stop.done() or stop.set_result(None))
        server = await loop.create_server(NullProtocol, sock=sock)
        async with server:
            await stop

    run_fast(main())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--processes", type=int, default=1, help="processes accepting on the one socket")
    args = parser.parse_args()
    sock = socket.create_server(("127.0.0.1", args.port), backlog=4096)
    children = []
    for _ in range(args.processes - 1):
        pid = os.fork()  # nothing but this socket exists yet: a plain fork is safe
        if pid == 0:
            serve(sock)
            os._exit(0)
        children.append(pid)
    serve(sock)
    for pid in children:
        os.kill(pid, signal.SIGTERM)
        os.waitpid(pid, 0)


if __name__ == "__main__":
    main()
