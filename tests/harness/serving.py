"""Start `python -m service` in its own process on a free loopback port, and wait until it is ready.

Used by the integration tests, the benchmarks and the load-test checks alike: it lives with the tests, and the
benchmarks import it from here.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from tests.harness.environment import offline_env

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


READY_STREAK = 8  # new connections in a row that must say ready (each may reach another front-end)


@dataclass
class ServiceProcess:
    url: str
    process: subprocess.Popen
    log_path: Path | None = None

    def client(self, **kwargs) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=kwargs.pop("timeout", 30), **kwargs)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path else ""

    def wait_ready(self, timeout: float = 120, path: str = "/readyz", body: dict | None = None) -> None:
        """Until READY_STREAK new connections in a row answer 200: in process mode each connection reaches one of
        the front-ends (one port, SO_REUSEPORT), and one may say ready while another still self-tests its models
        (run 10 of 2026-11-27 read "checking" from the second front-end right after the first said ready)."""
        deadline = time.monotonic() + timeout
        streak = 0
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"server exited with {self.process.returncode}:\n{self.log()}")
            try:
                response = httpx.post(self.url + path, json=body) if body else httpx.get(self.url + path, timeout=2)
                streak = streak + 1 if response.status_code == 200 else 0
                if streak >= READY_STREAK:
                    return
            except httpx.TransportError:
                streak = 0
            time.sleep(0.01 if streak else 0.1)
        self.stop()
        raise RuntimeError(f"server not ready in {timeout} s:\n{self.log()}")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30) -> int:
        if self.process.poll() is None:
            self.process.send_signal(sig)
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait(5)


def sigint_by_default() -> None:
    """In a child before it runs (Popen's preexec_fn): SIGINT at its default, as a terminal's foreground job has it."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start(
    command: list[str],
    log_path: Path | None = None,
    port: int | None = None,
    env: dict[str, str] | None = None,
    source: Path = ROOT,
    own_group: bool = False,
) -> ServiceProcess:
    """Run `python COMMAND... --port PORT` (the port is added) in `source` (a checkout of this project: this one,
    or another's for a before/after comparison), output to log_path (or inherited); `env` is added to this
    process's environment. `own_group`: in a process group of its own, as a shell's foreground job is (a terminal's
    Ctrl-C signals the whole group: `os.killpg(process.pid, SIGINT)`)."""
    port = port or free_port()
    env = offline_env({**(env or {}), "PYTHONUNBUFFERED": "1"})
    full = [sys.executable, *command, "--port", str(port)]
    # As a shell starts a foreground job: in a group of its own, SIGINT at its default (a background runner, CI's
    # included, hands its children SIGINT ignored, and Python then takes no KeyboardInterrupt)
    group, reset = (0, sigint_by_default) if own_group else (None, None)
    if log_path is None:
        process = subprocess.Popen(full, cwd=source, env=env, process_group=group, preexec_fn=reset)
    else:
        with log_path.open("w") as log:
            process = subprocess.Popen(
                full, cwd=source, env=env, stdout=log, stderr=subprocess.STDOUT, process_group=group, preexec_fn=reset
            )
    return ServiceProcess(f"http://127.0.0.1:{port}", process, log_path)


def start_service(
    repository: Path,
    *args: str,
    log_path: Path | None = None,
    wait: bool = True,
    env: dict[str, str] | None = None,
    source: Path = ROOT,
    own_group: bool = False,
) -> ServiceProcess:
    command = ["-m", "service", "--repository", str(repository), "--host", "127.0.0.1", *args]
    server = start(command, log_path, env=env, source=source, own_group=own_group)
    if wait:
        server.wait_ready()
    return server
