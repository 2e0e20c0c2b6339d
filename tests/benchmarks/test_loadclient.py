"""The load client against real loopback servers: the null server, and one that drops every connection."""

from __future__ import annotations

import socket
import threading

from benchmarks.loadclient import CONNECTION_ERROR, classify_cases, run_load, run_load_processes
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


def test_a_dropped_connection_counts_as_an_error_and_the_load_reconnects_until_its_window_ends() -> None:
    port = free_port()
    stop = threading.Event()
    accepted = []

    def drop_every_connection(listener: socket.socket) -> None:
        while not stop.is_set():
            try:
                connection, _ = listener.accept()
            except TimeoutError:
                continue
            accepted.append(1)
            connection.close()

    with socket.create_server(("127.0.0.1", port)) as listener:
        listener.settimeout(0.05)
        thread = threading.Thread(target=drop_every_connection, args=(listener,), daemon=True)
        thread.start()
        try:
            result = run_load(f"http://127.0.0.1:{port}", "/x", [{"inputs": ["a"]}], [1], clients=2, seconds=0.3)
        finally:
            stop.set()
            thread.join(2)
    assert result.requests >= 2
    assert result.statuses == {CONNECTION_ERROR: result.requests}
    assert result.sequences == 0
    assert result.cpu_seconds > 0.0  # measured in-process too
    assert len(accepted) > 2  # it did reconnect
    assert result.seconds < 2
