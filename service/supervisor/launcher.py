"""Process mode: one engine process per device, then N front-end processes on one port; supervised.

- Devices: one engine, on --device's device; with --devices 0,1, an engine per device, each serving every model on
  its device (BERTSERVE_DEVICES names its one device), and the front-ends shared out between the engines in turn
  (front-end i uses engine i mod n): the kernel spreads the port's connections over the front-ends, and so the
  requests over the devices. Each engine is supervised, and restarted, alone; meanwhile only its front-ends report
  not ready and answer 503.

- Start: the engine first (it loads and warms up every model), then the front-ends once its socket is there.
  Front-ends report ready (/readyz) only when the engine says its models are warmed up.
- An engine that dies is restarted; the front-ends answer its in-flight requests 503 at once, report not ready
  meanwhile, and reconnect by themselves; new requests wait for it up to --max-queue-s. A front-end that dies is
  restarted. A process that is stuck is killed, and so restarted: its event loop silent for --liveness-stall-s (a
  heartbeat file it rewrites says when it last ran), or, in the engine, a batch on the device --liveness-stall-s past
  every request's deadline; or a start that has not come to writing that file in ENGINE_START_S / FRONTEND_START_S.
  (A hung front-end still holds its share of the port's new connections: the kernel keeps handing them to its
  listening socket.)
  A process that exits MAX_FAILED_STARTS times in a row before it began to serve stops the server; one that
  served is restarted however often it dies.
- SIGTERM/SIGINT/SIGHUP: the front-ends drain first (stop admitting, finish in-flight requests), then the engine
  stops. The launcher killed, its children are sent SIGTERM by the kernel (`service.system.parent`).
- Metrics: every process writes to one PROMETHEUS_MULTIPROC_DIR; any front-end's /metrics is the merged view. The
  launcher writes there too: `bertserve_process_restarts_total{process, reason}` (engine or front-end; exited or
  stuck), every series there from the start at 0, so that the first restart is an increase an alert can see.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client import Counter, values

from service.metrics import MULTIPROCESS_DIR, fold_exited_process
from service.probes import HeartbeatFile, liveness
from service.settings import ENV_PREFIX, Settings
from service.system.parent import end_with_parent

log = logging.getLogger("service.supervisor.launcher")
POLL_S = 0.1
ENGINE_START_S = 600.0  # loading every model, before the socket appears (warm-up happens after)
FRONTEND_START_S = 120.0  # imports and the app's start-up, before it writes its heartbeat file (seconds, normally)
# At a stop, after the front-ends': the engine's time to finish the batch on its device and close its sessions, then a
# kill. Its front-ends are gone, so what it still runs has nobody to answer; a hung engine held the stop 30 s here,
# past a pod's grace period (preStop + the drain + this must fit in terminationGracePeriodSeconds).
ENGINE_STOP_S = 10.0
FRONTEND_STOP_EXTRA_S = 5.0  # a front-end's wait past --drain-timeout-s before its kill
MAX_FAILED_STARTS = 3  # exits in a row before a process began to serve: it cannot start, and the server stops


def uses_gpu(settings: Settings) -> bool:
    """The CUDA provider is installed and an NVIDIA device is present (not only listed by onnxruntime-gpu)."""
    if settings.device == "cpu" or not Path("/dev/nvidiactl").exists():
        return False
    import onnxruntime

    return "CUDAExecutionProvider" in onnxruntime.get_available_providers()


def resolve_engine_mode(settings: Settings) -> str:
    if settings.engine_mode != "auto":
        return settings.engine_mode
    several_devices = settings.devices is not None and len(settings.devices) > 1
    return "process" if several_devices or uses_gpu(settings) else "in-process"


def engine_devices(settings: Settings) -> list[int | None]:
    """The device of each engine to start: each of --devices; else one engine, whose settings say (None)."""
    return list(settings.devices) if settings.devices else [None]


def frontend_engines(frontends: int, engines: int) -> list[int]:
    """The engine each front-end uses: in turn, so that every engine has front-ends and they differ by one at most."""
    return [i % engines for i in range(max(frontends, engines))]


@dataclass
class Child:
    name: str
    command: list[str]  # run with --heartbeat PATH added: the heartbeat file it keeps writing once it serves
    heartbeat: HeartbeatFile
    start_s: float  # the longest a start may take before the heartbeat file appears
    process: subprocess.Popen | None = None
    started: float = 0.0
    failed_starts: int = 0  # exits in a row before it began to serve
    served: bool = False  # this start has begun to serve: its heartbeat file has appeared
    pids: list[int] = field(default_factory=list)
    killed_as_stuck: bool = False  # the exit that follows is the launcher's kill: counted as "stuck"
    env: dict[str, str] = field(default_factory=dict)  # its own variables, over those every child gets
    socket: Path | None = None  # an engine's socket: removed before each start, and waited for

    def start(self, env: dict[str, str]) -> None:
        self.heartbeat.path.unlink(missing_ok=True)  # an earlier process's state does not stand for this one
        self.killed_as_stuck = False
        self.served = False
        if self.socket is not None:
            self.socket.unlink(missing_ok=True)
        command = [*self.command, "--heartbeat", str(self.heartbeat.path)]
        # A process group of its own: a terminal's Ctrl-C signals the whole foreground group, and the engine stopped
        # at once beside the launcher while the front-ends still drained (their requests in flight got 503). The
        # launcher alone takes the signal and stops the children in order (`_shutdown`).
        # and it is told to stop (SIGTERM, a drain) when the launcher dies, however it dies (kill -9, an OOM kill):
        # it was left serving with nothing to restart it, holding the port
        self.process = subprocess.Popen(command, env={**env, **self.env}, process_group=0, preexec_fn=end_with_parent)
        self.started = time.monotonic()
        self.pids.append(self.process.pid)
        log.info("%s started (pid %d)", self.name, self.process.pid)

    def exited(self) -> int | None:
        return None if self.process is None else self.process.poll()

    def stuck(self, stall_s: float) -> str | None:
        """Why it counts as stuck, from its heartbeat file: its event loop silent past `stall_s`, or its own verdict
        (a device stuck). Before the file exists (loading holds the event loop; the file comes after), only a start
        longer than `start_s`."""
        state = self.heartbeat.read()
        self.served = self.served or state is not None
        if state is None:
            starting = time.monotonic() - self.started
            return f"it has not begun to serve {starting:.0f} s after its start" if starting > self.start_s else None
        status, body = liveness(state, stall_s)
        return None if status == 200 else str(body["error"])

    def signal(self, sig: int) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(sig)

    def wait(self, timeout: float) -> int:
        assert self.process is not None
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            log.error("%s did not stop in %.0f s; killing it", self.name, timeout)
            self.process.kill()
            return self.process.wait(5)


def port_problem(host: str, port: int) -> str | None:
    """Why the port cannot be listened on (another process holds it), or None."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            return f"cannot listen on {host}:{port}: {exc.strerror}"
    return None


def listen_problem(settings: Settings) -> str | None:
    """Why the server cannot listen where it is told to (HTTP, gRPC and probe ports), or None: asked before
    anything starts, so that a port in use or a host that is no address is one line and exit 2, in either layout,
    rather than a traceback once the models have loaded."""
    for port, what in ((settings.port, ""), (settings.grpc_port, " (gRPC)"), (settings.probe_port, " (probes)")):
        if port and (problem := port_problem(settings.host, port)):
            return f"{problem}{what}"
    return None


def restart_counter(metrics_dir: Path) -> Counter:
    """The launcher's one metric, written to the children's multiprocess directory (a file of this process's own,
    merged into every front-end's /metrics). prometheus_client picks multiprocess values from the environment at
    import, before this process knew the directory: chosen here by hand."""
    os.environ[MULTIPROCESS_DIR] = str(metrics_dir)
    values.ValueClass = values.MultiProcessValue()
    restarts = Counter(
        "bertserve_process_restarts",
        "Processes the process-mode launcher restarted: the engine or a front-end; it exited, or it was stuck and "
        "killed (the launcher's log says why).",
        ["process", "reason"],
        registry=None,
    )
    for process in ("engine", "front-end"):
        for reason in ("exited", "stuck"):
            restarts.labels(process, reason)
    return restarts


class Launcher:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.workdir = Path(tempfile.mkdtemp(prefix="bertserve-"))
        metrics_dir = self.workdir / "metrics"
        metrics_dir.mkdir()
        self.metrics_dir = metrics_dir
        self.restarts = restart_counter(metrics_dir)
        self.unfolded: list[int] = []  # processes that exited, whose metric files are still to fold
        # several front-ends share the cores: the tokenizers library's own thread pool in each would only fight
        self.env = {
            "TOKENIZERS_PARALLELISM": "false",
            **settings.child_env(os.environ),
            MULTIPROCESS_DIR: str(metrics_dir),
        }
        python = sys.executable
        devices = engine_devices(settings)
        self.engines = []
        for device in devices:
            tag = "" if len(devices) == 1 else f"-{device}"
            socket_path = self.workdir / f"engine{tag}.sock"
            self.engines.append(
                Child(
                    "engine" if len(devices) == 1 else f"engine {device}",
                    [
                        *(python, "-m", "service.engine", "--socket", str(socket_path)),
                        *("--loaded-file", str(self.workdir / f"engine{tag}.loaded.json")),
                    ],
                    HeartbeatFile(self.workdir / f"engine{tag}.state"),
                    ENGINE_START_S,
                    env={} if device is None else {f"{ENV_PREFIX}DEVICES": json.dumps([device])},
                    socket=socket_path,
                )
            )
        self.frontends = [
            Child(
                f"front-end {i}",
                [python, "-m", "service.frontend", "--engine-socket", str(self.engines[engine].socket)],
                HeartbeatFile(self.workdir / f"front-end-{i}.state"),
                FRONTEND_START_S,
            )
            for i, engine in enumerate(frontend_engines(settings.frontend_count, len(self.engines)))
        ]
        self.stopping = False

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self._stop)
        signal.signal(signal.SIGINT, self._stop)
        signal.signal(signal.SIGHUP, self._stop)  # its terminal closed (an ssh session dropped): a drain, not a death
        try:
            problem = listen_problem(self.settings)
            if problem:
                print(f"error: {problem}", file=sys.stderr)
                return 2
            code = self._start_engine()
            if code is not None:
                return code
            for frontend in self.frontends:
                frontend.start(self.env)
            devices = ", ".join(str(d) for d in engine_devices(self.settings) if d is not None)
            log.info(
                "process mode: %d engine%s%s, %d front-ends on %s:%d%s",
                len(self.engines),
                "s" if len(self.engines) > 1 else "",
                f" (devices {devices})" if devices else "",
                len(self.frontends),
                self.settings.host,
                self.settings.port,
                f" (gRPC :{self.settings.grpc_port})" if self.settings.grpc_port else "",
            )
            code = self._supervise()
            self._shutdown()
            return code
        finally:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def _stop(self, sig: int, frame: object) -> None:
        self.stopping = True

    def _start_engine(self) -> int | None:
        """Start every engine and wait for their sockets; an exit code where one cannot start (it said why)."""
        for engine in self.engines:
            engine.start(self.env)
        deadline = time.monotonic() + ENGINE_START_S
        while not all(engine.socket is not None and engine.socket.exists() for engine in self.engines):
            for engine in self.engines:
                code = engine.exited()
                if code is not None:
                    self._stop_engines()
                    return code or 1
            if self.stopping or time.monotonic() > deadline:
                self._stop_engines()
                return 1 if not self.stopping else 0
            time.sleep(POLL_S)
        return None

    def _stop_engines(self) -> None:
        for engine in self.engines:
            engine.signal(signal.SIGTERM)
        for engine in self.engines:
            if engine.process is not None:
                engine.wait(ENGINE_STOP_S)

    def _supervise(self) -> int:
        while not self.stopping:
            time.sleep(POLL_S)
            # exited processes' metrics: each folded once no scrape holds the directory (one stopped mid-scrape
            # would hold it until it is killed as stuck, further down this loop)
            self.unfolded = [pid for pid in self.unfolded if not fold_exited_process(pid, str(self.metrics_dir), 0.05)]
            for child in (*self.engines, *self.frontends):
                code = child.exited()
                if code is None and not self.stopping and (why := child.stuck(self.settings.liveness_stall_s)):
                    log.error("%s (pid %d) is stuck: %s; killing it", child.name, child.pids[-1], why)
                    child.heartbeat.path.unlink(missing_ok=True)  # judged once: the kill takes a moment to show
                    child.killed_as_stuck = True
                    child.signal(signal.SIGKILL)  # and the next round restarts it, as one that died
                if code is None or self.stopping:
                    continue
                # a start failed where the process exited before it began to serve; one that served and died (a
                # crash under load, an OOM kill, however soon) is restarted however often it dies (each counted)
                served = child.served or child.heartbeat.read() is not None
                child.failed_starts = 0 if served else child.failed_starts + 1
                if not fold_exited_process(child.pids[-1], str(self.metrics_dir), 0.05):
                    self.unfolded.append(child.pids[-1])
                if child.failed_starts >= MAX_FAILED_STARTS:
                    log.error(
                        "%s (pid %d) exited with %s before it began to serve, %d times in a row: it cannot start; "
                        "stopping the server",
                        *(child.name, child.pids[-1], code, child.failed_starts),
                    )
                    return 1
                log.error("%s (pid %d) exited with %s; restarting it", child.name, child.pids[-1], code)
                role = "engine" if child in self.engines else "front-end"
                self.restarts.labels(role, "stuck" if child.killed_as_stuck else "exited").inc()
                child.start(self.env)
        return 0

    def _shutdown(self) -> None:
        for frontend in self.frontends:
            frontend.signal(signal.SIGTERM)
        for frontend in self.frontends:
            if frontend.process is not None:
                frontend.wait(self.settings.drain_timeout_s + FRONTEND_STOP_EXTRA_S)
        self._stop_engines()
        log.info("stopped")
