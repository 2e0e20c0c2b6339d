"""The load client against real loopback servers: the null server, one that drops every connection, one that closes
some after answering."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable

from benchmarks.loadclient import CONNECTION_ERROR, LoadResult, classify_cases, run_load, run_load_processes
from tests.harness.serving import free_port, start


def test_client_processes_share_one_window_and_merge_their_counts() -> None:
    server = start(["-m", "benchmarks.null_server", "--processes", "2"])
    try:
        server.wait_ready(timeout=30)
        path, bodies, sizes, _ = classify_cases(["a b", "c"] * 16, "/classify", 4, 2)["16 inputs"]
        result = run_load_processes(server.url, path, bodies, sizes, clients=6, seconds=0.5, processes=3)
    finally:
        assert server.stop() == 0  # SIGTERM stops the null server and its second process cleanly
    assert result.requests > 10
    assert result.statuses == {200: result.requests}
    assert result.sequences == 16 * result.requests
    assert len(result.latencies) == result.requests
    assert 0.5 <= result.seconds < 2.0  # one common window, not three back to back
    # Each process's own CPU over the window, summed: some, and no more than three single-threaded loops can use
    assert 0.0 < result.cpu_seconds <= 3 * result.seconds
    assert result.client_cores == result.cpu_seconds / result.seconds


def load_against(handle: Callable[[socket.socket, int], None], seconds: float) -> tuple[LoadResult, int]:
    """`run_load` (2 clients, 1-input bodies) against a loopback socket server that hands each connection it accepts,
    with its number (1, 2, ...), to `handle` on a thread of its own; the result and the connections accepted."""
    port = free_port()
    stop = threading.Event()
    accepted = []

    def serve(listener: socket.socket) -> None:
        while not stop.is_set():
            try:
                connection, _ = listener.accept()
            except TimeoutError:
                continue
            accepted.append(1)
            threading.Thread(target=handle, args=(connection, len(accepted)), daemon=True).start()

    with socket.create_server(("127.0.0.1", port)) as listener:
        listener.settimeout(0.05)
        thread = threading.Thread(target=serve, args=(listener,), daemon=True)
        thread.start()
        try:
            result = run_load(f"http://127.0.0.1:{port}", "/x", [{"inputs": ["a"]}], [1], clients=2, seconds=seconds)
        finally:
            stop.set()
            thread.join(2)
    return result, len(accepted)


def test_a_dropped_connection_counts_as_an_error_and_the_load_reconnects_until_its_window_ends() -> None:
    result, accepted = load_against(lambda connection, _: connection.close(), seconds=0.3)
    assert result.requests >= 2
    assert result.statuses == {CONNECTION_ERROR: result.requests}
    assert result.sequences == 0
    assert result.cpu_seconds > 0.0  # measured in-process too
    assert accepted > 2  # it did reconnect
    assert result.seconds < 2


def test_an_answer_that_closes_its_connection_counts_as_itself_and_the_load_goes_on_on_a_new_one() -> None:
    """A server that closes the connection after an answer it says so for (`Connection: close`, as bertserve does
    after a 429 from admission or a 413, the body unread): that answer counts as its status, never as a connection
    error, and the next request goes on a new connection (was: sent on the closed one, counted as an error)."""

    def answer(connection: socket.socket, index: int) -> None:
        with connection, connection.makefile("rb") as stream:
            while True:  # every third connection keeps alive; the others answer one 429 and close
                length = 0
                while (line := stream.readline()) not in (b"\r\n", b""):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                if not line:
                    return
                stream.read(length)
                if index % 3 == 0:
                    connection.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")
                    continue
                connection.sendall(
                    b"HTTP/1.1 429 Too Many Requests\r\nConnection: close\r\nContent-Length: 2\r\n\r\n{}"
                )
                return

    result, connections = load_against(answer, seconds=0.5)
    assert set(result.statuses) == {200, 429}, result.statuses  # no CONNECTION_ERROR among them
    assert result.statuses[429] >= 2
    assert connections >= result.statuses[429]  # a new connection after each 429
    assert result.sequences == result.statuses[200]
