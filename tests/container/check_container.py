"""Container test: builds the images from the Dockerfile and checks them end to end, for real.

    make test-container                  (runs ../shared/container/setup.sh first where `docker` does not work)
    python3 tests/container/check_container.py [--skip-gpu] [--skip-export] [--skip-compose]

Not part of `make test`: this file is not a `test_*.py` module, so pytest never collects it. Standard library only
(it needs `docker`, not the project's environment). Phases, each timed:

  build      the cpu, demo (cpu + demo repository), gpu and export targets
  start      the demo image, port published on 127.0.0.1 only; /readyz, then the image's own HEALTHCHECK
  endpoints  every endpoint (probes, /v1/models, classify, ner, qa, errors, /docs), demo flag, no torch in the image
  metrics    /metrics: every metric the Grafana dashboard queries is exported, with the requests just made counted
  prometheus where a `prometheus` binary is on PATH: it scrapes the container with deploy/prometheus/prometheus.yml
             (target rewritten to the loopback port) and every query of the Grafana dashboard returns data
  non-root   the server process (PID 1) runs as a non-root user
  telemetry  a bare onnxruntime session in the image (not through the project's packages) leaves no telemetry
             cache: the image sets ORT_DISABLE_TELEMETRY=1; with it at 0 the same session writes a device id
  sigterm    SIGTERM during a burst of concurrent requests: every request admitted before it is answered 200,
             every answer is 200 or 503 (draining), the container exits by itself within the drain timeout
  export     the export image turns a real checkpoint (../shared/models/minilm-bert-sst2, mounted read-only) into a
             mounted repository entry; model.json checked
  gpu        the gpu image without a GPU serves that repository on the CPU and says so (log, /v1/models note)
  compose    `docker compose up -d` starts the service alone (demo repository; then a host repository through
             BERTSERVE_MODELS_DIR), `docker compose down` stops it

Build logs go to reports/container/. TORCH_WHEELS=DIR hands the export stage a local torch wheel (otherwise one is
looked for in pip's find-links; without one the stage uses the PyTorch CPU index).
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import http.client
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DEMO_MODELS = ["demo-ner", "demo-qa", "demo-sentiment"]
TIMINGS: list[tuple[str, float, str]] = []
RUN_ID = f"{os.getpid()}"


class Failure(AssertionError):
    pass


def check(condition: object, message: str) -> None:
    if not condition:
        raise Failure(message)


@contextlib.contextmanager
def phase(name: str) -> Iterator[dict[str, str]]:
    """Times a phase; the body may put a one-line result in info['note']."""
    info: dict[str, str] = {}
    print(f"\n=== {name}", flush=True)
    start = time.perf_counter()
    try:
        yield info
    except BaseException:
        TIMINGS.append((name, time.perf_counter() - start, "FAILED"))
        raise
    elapsed = time.perf_counter() - start
    TIMINGS.append((name, elapsed, info.get("note", "ok")))
    print(f"--- {name}: {elapsed:.1f} s  {info.get('note', 'ok')}", flush=True)


# ---------------------------------------------------------------------------------------------------------------
# docker


def docker(*args: str, check_rc: bool = True, timeout: float = 600, quiet: bool = False) -> subprocess.CompletedProcess:
    cmd = ["docker", *args]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    if check_rc and result.returncode != 0:
        raise Failure(f"{' '.join(cmd)} -> exit {result.returncode}\n{result.stdout[-3000:]}{result.stderr[-3000:]}")
    if not quiet and result.stderr.strip() and result.returncode != 0:
        print(result.stderr.strip()[-2000:], file=sys.stderr)
    return result


def is_podman() -> bool:
    out = subprocess.run(["docker", "--version"], capture_output=True, text=True).stdout.lower()
    return "podman" in out


def image_size(tag: str) -> int:
    return int(docker("image", "inspect", "--format", "{{.Size}}", tag).stdout.strip())


def image_store() -> Path | None:
    """Where the engine keeps image layers (podman's graph root, Docker's root dir), if it says."""
    fmt = "{{.Store.GraphRoot}}" if is_podman() else "{{.DockerRootDir}}"
    out = docker("info", "--format", fmt, check_rc=False, quiet=True).stdout.strip()
    return Path(out) if out and Path(out).exists() else None


# Free space a build needs under the image store, by target: measured on podman's vfs driver, where every build
# step copies the whole image (the gpu image is 3.1 GB, and its last steps each copy it once more).
NEEDED_FREE_GB = {"cpu": 4, "demo": 6, "gpu": 14, "export": 9}

# The stages that install each image's dependencies, built first under tags of their own. Untagged, a stage that no
# later stage is built FROM (they are copied from) is a dangling image once its target is built, so --prune threw
# the environments away and every run installed them again: the CUDA wheels of the gpu image and the export image's
# torch (minutes, and each install's layers copied whole on vfs while they were made). Tagged, they stay cached
# until the lock or a requirements file changes; then the tag moves and the stale one is pruned.
DEPENDENCY_STAGES = {
    "cpu": ("build-cpu",),
    "demo": ("build-cpu", "build-export"),
    "gpu": ("build-gpu",),
    "export": ("build-export",),
}


def check_free_space(target: str) -> None:
    store = image_store()
    if store is None:
        return
    free_gb = shutil.disk_usage(store).free / 1e9
    need = NEEDED_FREE_GB[target]
    check(
        free_gb >= need,
        f"{free_gb:.1f} GB free under {store}; building {target} needs about {need} GB. "
        "Remove images you no longer need (`docker images`, `docker rmi`), or run with --prune",
    )


def prune_dangling() -> None:
    docker("image", "prune", "--force", timeout=1800)


def mb(size: int) -> str:
    return f"{size / 1e6:,.0f} MB"


def lock_pins() -> dict[str, str]:
    """{name: version} of constraints.txt, the lock every image installs from (names as written there)."""
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, version = line.partition("==")
            pins[name.strip()] = version.strip()
    return pins


def torch_version() -> str:
    version = lock_pins().get("torch")
    check(version, "constraints.txt pins no torch")
    return version


def local_torch_wheel_dir(workdir: Path) -> tuple[Path | None, str]:
    """A directory holding only the CPU build of the torch the lock pins (X+cpu for the lock's torch==X), when this
    machine has one.

    TORCH_WHEELS (a directory) wins; TORCH_WHEELS= (empty) means "use the index". Otherwise the directories pip is
    configured to find links in (pip config, PIP_FIND_LINKS) are searched: that is where a machine that cannot
    reach the PyTorch CPU index keeps the CPU wheel.
    """
    version = torch_version()
    pattern = f"torch-{version}+cpu-cp311-cp311-*.whl"
    if "TORCH_WHEELS" in os.environ:
        dirs = [os.environ["TORCH_WHEELS"]] if os.environ["TORCH_WHEELS"] else []
        origin = "TORCH_WHEELS"
    else:
        dirs = os.environ.get("PIP_FIND_LINKS", "").split()
        with contextlib.suppress(Exception):
            listing = subprocess.run(
                [sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True, timeout=60
            ).stdout
            for line in listing.splitlines():
                key, _, value = line.partition("=")
                if key.endswith("find-links"):
                    dirs += value.strip().strip("'\"").split()
        origin = "pip find-links"
    for directory in dict.fromkeys(dirs):
        directory = directory.removeprefix("file://")
        wheels = sorted(glob.glob(os.path.join(directory, pattern)))
        if wheels:
            target = workdir / "torch-wheels"
            target.mkdir()
            wheel = Path(wheels[-1])
            try:
                os.link(wheel, target / wheel.name)  # same filesystem: no copy
            except OSError:
                shutil.copy2(wheel, target / wheel.name)
            return target, f"{wheel} (from {origin})"
    return None, f"none found for {version}+cpu: the export stage installs torch from TORCH_INDEX_URL"


def build(target: str, tag: str, log_dir: Path, extra: list[str] | None = None) -> None:
    cmd = ["build", "--target", target, "-t", tag]
    if is_podman():
        cmd += ["--format", "docker"]  # OCI image metadata has no HEALTHCHECK
    cmd += [*(extra or []), "."]
    log = log_dir / f"build-{target}.log"
    print(f"docker {' '.join(cmd)}  (log: {log})", flush=True)
    with log.open("w") as out:
        rc = subprocess.run(["docker", *cmd], stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, timeout=3600).returncode
    if rc != 0:
        print(log.read_text()[-4000:], file=sys.stderr)
        raise Failure(f"docker build --target {target} failed (exit {rc}); log: {log}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def logs(name: str) -> str:
    result = docker("logs", name, check_rc=False, quiet=True)
    return result.stdout + result.stderr


def remove(name: str) -> None:
    docker("rm", "-f", name, check_rc=False, quiet=True, timeout=120)


# ---------------------------------------------------------------------------------------------------------------
# HTTP (one connection per request: the burst must not depend on keep-alive)


def request(port: int, method: str, path: str, body: object = None, timeout: float = 60) -> tuple[int, dict, object]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        payload = None if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
        headers = {"content-type": "application/json", "connection": "close"} if payload is not None else {}
        conn.request(method, path, body=payload, headers=headers)
        response = conn.getresponse()
        data = response.read()
        kind = response.getheader("content-type", "")
        parsed: object = json.loads(data) if kind.startswith("application/json") else data.decode()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, parsed
    finally:
        conn.close()


def wait_ready(port: int, name: str, timeout: float = 240) -> float:
    start = time.perf_counter()
    last = "no answer"
    while time.perf_counter() - start < timeout:
        try:
            status, _, body = request(port, "GET", "/readyz", timeout=5)
            if status == 200:
                return time.perf_counter() - start
            last = f"{status} {body}"
        except OSError as exc:
            last = repr(exc)
        state = docker("inspect", "--format", "{{.State.Status}}", name, check_rc=False, quiet=True).stdout.strip()
        if state in ("exited", "dead", "stopped"):
            raise Failure(f"{name} exited before it was ready:\n{logs(name)[-3000:]}")
        time.sleep(0.25)
    raise Failure(f"{name} not ready after {timeout:.0f} s (last: {last}):\n{logs(name)[-3000:]}")


def image_healthcheck(name: str, timeout: float = 90) -> str:
    """The image's own HEALTHCHECK: podman runs it on demand; Docker runs it on its schedule (watched here)."""
    if is_podman():
        result = docker("healthcheck", "run", name, check_rc=False, quiet=True)
        check(result.returncode == 0, f"HEALTHCHECK failed: {result.stdout}{result.stderr}")
        return "healthy (podman healthcheck run)"
    start = time.perf_counter()
    status = ""
    while time.perf_counter() - start < timeout:
        status = docker("inspect", "--format", "{{.State.Health.Status}}", name).stdout.strip()
        if status == "healthy":
            return f"healthy after {time.perf_counter() - start:.1f} s"
        time.sleep(1)
    raise Failure(f"HEALTHCHECK status {status!r} after {timeout:.0f} s")


# ---------------------------------------------------------------------------------------------------------------
# phases

CLASSIFY = {
    "inputs": ["a gorgeous, witty, seductive movie.", {"text": "is it good?", "text_pair": "yes"}],
    "top_k": None,  # every label, sorted
}
NER = {"inputs": ["EU rejects German call to boycott British lamb."], "aggregation_strategy": "simple"}
QA = {
    "inputs": [{"question": "Who rejects the call?", "context": "EU rejects German call to boycott lamb."}],
    "top_k": 2,
}


def check_endpoints(port: int, expect_demo: bool = True) -> str:
    status, _, body = request(port, "GET", "/livez")
    check(status == 200 and body == {"status": "alive"}, f"/livez: {status} {body}")
    status, _, body = request(port, "GET", "/readyz")
    check(status == 200 and sorted(body["models"]) == DEMO_MODELS, f"/readyz: {status} {body}")

    status, _, body = request(port, "GET", "/v1/models")
    check(status == 200, f"/v1/models: {status} {body}")
    models = {m["name"]: m for m in body["models"]}
    check(sorted(models) == DEMO_MODELS, f"/v1/models names: {sorted(models)}")
    for m in models.values():
        check(m["demo"] is expect_demo, f"{m['name']}: demo flag {m['demo']}")
        check(m["status"] == "ready" and m["provider"] == "CPUExecutionProvider", f"{m['name']}: {m}")
    status, _, one = request(port, "GET", "/v1/models/demo-qa")
    check(status == 200 and one["task"] == "qa", f"/v1/models/demo-qa: {status} {one}")

    status, headers, body = request(port, "POST", "/v1/models/demo-sentiment/classify", CLASSIFY)
    check(status == 200, f"classify: {status} {body}")
    check(len(body["results"]) == 2, f"classify results: {body}")
    check({r["label"] for r in body["results"][0]} == {"NEGATIVE", "POSITIVE"}, f"classify labels: {body}")
    check("x-total-time-ms" in headers and "x-inference-time-ms" in headers, f"timing headers: {headers}")
    status, _, body = request(port, "POST", "/v1/models/demo-ner/ner", NER)
    check(status == 200 and isinstance(body["results"][0], list), f"ner: {status} {body}")
    for entity in body["results"][0]:
        text = NER["inputs"][0][entity["start"] : entity["end"]]
        word = entity["word"].replace("##", "").replace(" ", "").lower()
        check(text.replace(" ", "").lower() == word, f"ner offsets: {entity}")
    status, _, body = request(port, "POST", "/v1/models/demo-qa/qa", QA)
    check(status == 200 and len(body["results"][0]) == 2, f"qa: {status} {body}")
    for answer in body["results"][0]:
        check(QA["inputs"][0]["context"][answer["start"] : answer["end"]] == answer["answer"], f"qa span: {answer}")

    status, _, body = request(port, "POST", "/v1/models/nope/classify", CLASSIFY)
    check(status == 404 and body["error_type"], f"unknown model: {status} {body}")
    status, _, body = request(port, "POST", "/v1/models/demo-sentiment/classify", {"inputs": []})
    check(status == 422 and body["error_type"], f"empty inputs: {status} {body}")
    status, _, body = request(port, "POST", "/v1/models/demo-sentiment/classify", b"{not json")
    check(status == 400, f"malformed JSON: {status} {body}")
    status, _, body = request(port, "POST", "/v1/models/demo-sentiment/ner", NER)
    check(status == 400, f"wrong task: {status} {body}")
    status, _, body = request(port, "GET", "/openapi.json")
    check(status == 200 and "/v1/models/{name}/classify" in body["paths"], "openapi.json")
    status, _, _ = request(port, "GET", "/docs")
    check(status == 200, f"/docs: {status}")

    return "probes, models, classify/ner/qa, 400/404/422, openapi, docs"


# Run inside an image: every installed package is the lock's version (argv[1]: the pins as JSON; PEP 440's `==`, so
# the export image's torch 2.13.0+cpu meets the lock's torch==2.13.0), bertserve's own requirements (base + the
# extras in argv[2:]) are installed at matching versions, and whether torch is there.
REQUIREMENTS_CHECK = """
import importlib.util, json, sys
from importlib.metadata import PackageNotFoundError, distributions, requires, version
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
bad = []
pins = {canonicalize_name(name): pinned for name, pinned in json.loads(sys.argv[1]).items()}
for dist in distributions():
    name = canonicalize_name(dist.metadata["Name"])
    if name != "bertserve" and (name not in pins or not SpecifierSet("==" + pins[name]).contains(dist.version, True)):
        bad.append(f"{name}=={dist.version} (the lock: {pins.get(name, 'not pinned')})")
for line in requires("bertserve"):
    req = Requirement(line)
    if req.marker and not any(req.marker.evaluate({"extra": extra}) for extra in sys.argv[2:]):
        continue
    try:
        if not req.specifier.contains(version(req.name), prereleases=True):
            bad.append(f"{req} (installed {version(req.name)})")
    except PackageNotFoundError:
        bad.append(f"{req} (missing)")
print("torch" if importlib.util.find_spec("torch") else "no torch", "; ".join(bad) or "requirements ok", sep=", ")
sys.exit(1 if bad else 0)
"""


def check_image_contents(container: str | None, image: str, extras: list[str], torch: bool) -> str:
    """In a running container (docker exec) or a fresh one (docker run --rm --entrypoint python)."""
    if container:
        cmd = ["exec", container, "python", "-c", REQUIREMENTS_CHECK, json.dumps(lock_pins()), *extras]
    else:
        cmd = [
            "run",
            "--rm",
            "--entrypoint",
            "python",
            image,
            "-c",
            REQUIREMENTS_CHECK,
            json.dumps(lock_pins()),
            *extras,
        ]
    result = docker(*cmd, check_rc=False)
    out = result.stdout.strip()
    check(result.returncode == 0, f"{image}: bertserve's requirements [{','.join(extras)}] not met: {out}")
    check(out.startswith("torch") == torch, f"{image}: {out} (torch expected: {torch})")
    return f"{image}: {out} ({', '.join(extras)})"


def metric_names_in_dashboard() -> set[str]:
    dashboard = json.loads((ROOT / "deploy/grafana/dashboards/bertserve.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    exprs.append(dashboard["templating"]["list"][0]["definition"])
    return {name for expr in exprs for name in re.findall(r"\bbertserve_[a-z_]+", expr)}


def check_metrics(port: int) -> str:
    status, headers, text = request(port, "GET", "/metrics")
    check(status == 200 and headers["content-type"].startswith("text/plain"), f"/metrics: {status} {headers}")
    exported = set(re.findall(r"^(bertserve_[a-z_]+)", text, re.MULTILINE))
    missing = metric_names_in_dashboard() - exported
    check(not missing, f"the dashboard queries metrics /metrics does not export: {sorted(missing)}")
    line = 'bertserve_requests_total{endpoint="classify",model="demo-sentiment",status="200"}'
    check(line in text, f"{line} not in /metrics")
    for model in DEMO_MODELS:
        check(re.search(rf'bertserve_model_info{{[^}}]*model="{model}"[^}}]*}} 1\.0', text), f"model_info {model}")
        check(f'bertserve_model_ready{{model="{model}"}} 1.0' in text, f"model_ready {model}")
        check(f'bertserve_queue_depth{{model="{model}"}}' in text, f"queue_depth {model}")
    check(re.search(r'bertserve_batch_size_count{model="demo-sentiment"} [1-9]', text), "no batch counted")
    return f"{len(exported)} bertserve metric names; all {len(metric_names_in_dashboard())} dashboard metrics present"


TELEMETRY_CHECK = """
import glob, os, pathlib, onnxruntime
model = sorted(glob.glob("/models/**/*.onnx", recursive=True))[0]
onnxruntime.InferenceSession(model, providers=["CPUExecutionProvider"])
cache = pathlib.Path.home() / ".cache" / "Microsoft"
left = sorted(str(p.relative_to(cache)) for p in cache.rglob("*") if p.is_file()) if cache.exists() else []
print(os.environ.get("ORT_DISABLE_TELEMETRY"), left)
"""


def check_no_telemetry(image: str) -> str:
    """A bare `import onnxruntime` in the image, not through this project's packages, sends no telemetry either:
    the image's environment carries onnxruntime's opt-out. With it at 0, the same session writes onnxruntime's
    device id into the user's home (so the check can fail)."""
    run = ["run", "--rm", "--entrypoint", "python"]
    quiet = docker(*run, image, "-c", TELEMETRY_CHECK).stdout.strip()
    check(quiet == "1 []", f"{image}: a bare onnxruntime session left telemetry behind: {quiet}")
    loud = docker(*run, "-e", "ORT_DISABLE_TELEMETRY=0", image, "-c", TELEMETRY_CHECK).stdout.strip()
    check("deviceid" in loud, f"{image}: with ORT_DISABLE_TELEMETRY=0, no device id was written: {loud}")
    return f"ORT_DISABLE_TELEMETRY={quiet}; at 0 the session wrote {loud.split(' ', 1)[1]}"


def check_non_root(name: str, image: str) -> str:
    uid = docker("exec", name, "id", "-u").stdout.strip()
    check(uid != "0", f"exec user is root ({uid})")
    status = docker("exec", name, "cat", "/proc/1/status").stdout
    uids = re.search(r"^Uid:\s+(\d+)\s+(\d+)", status, re.MULTILINE)
    check(uids and uids.group(1) != "0" and uids.group(2) != "0", f"PID 1 runs as root: {uids and uids.group(0)}")
    cmdline = docker("exec", name, "cat", "/proc/1/cmdline").stdout.replace("\0", " ").strip()
    user = docker("image", "inspect", "--format", "{{.Config.User}}", image).stdout.strip()
    return f"PID 1 ({cmdline}) uid {uids.group(1)}; image USER {user}"


@dataclass
class Outcome:
    endpoint: str
    started: float
    sent: float | None = None
    ended: float = 0.0
    status: int | None = None
    error: str | None = None
    extra: dict = field(default_factory=dict)


def burst_payloads() -> list[tuple[str, dict]]:
    """Requests heavy enough (hundreds of tokens, many rows) that a burst keeps work queued and in flight."""
    review = "an intelligent, moving and often very funny film about people who are hard to like at first . "
    sentence = "EU rejects German call to boycott British lamb, Peter Blackburn reported from Brussels."
    context = " ".join(["The European Commission said on Thursday it disagreed with German advice."] * 60)
    question = {"question": "Who disagreed with German advice?", "context": context}
    return [
        ("/v1/models/demo-sentiment/classify", {"inputs": [review * (8 + i % 8) for i in range(48)]}),
        ("/v1/models/demo-ner/ner", {"inputs": [" ".join([sentence] * 40)] * 4}),
        ("/v1/models/demo-qa/qa", {"inputs": [question] * 4}),
    ]


def check_sigterm(port: int, name: str, drain_timeout: float, workers: int = 16) -> str:
    """SIGTERM while `workers` clients keep requests in flight; every request admitted before it must get a 200."""
    payloads = burst_payloads()
    outcomes: list[Outcome] = []
    lock = threading.Lock()
    stop = threading.Event()
    signalled = threading.Event()

    def client(index: int) -> None:
        i = index
        while not stop.is_set():
            path, body = payloads[i % len(payloads)]
            i += 1
            outcome = Outcome(path.rsplit("/", 1)[-1], time.monotonic(), extra={"id": f"sigterm-{index}-{i}"})
            with lock:
                outcomes.append(outcome)
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=drain_timeout + 30)
            headers = {"content-type": "application/json", "x-request-id": outcome.extra["id"]}
            try:
                conn.request("POST", path, json.dumps(body).encode(), headers)
                outcome.sent = time.monotonic()
                response = conn.getresponse()
                answer = response.read()
                outcome.status = response.status
                if response.status != 200:
                    outcome.extra["body"] = answer[:300].decode(errors="replace")
            except Exception as exc:  # refused, reset, closed: judged below by when it was sent
                outcome.error = f"{type(exc).__name__}: {exc}"
            finally:
                outcome.ended = time.monotonic()
                conn.close()
            if signalled.is_set() and (outcome.error or outcome.status not in (200, 429)):
                return  # the server is going away: this client is done
            if outcome.status == 429:
                time.sleep(0.05)  # refused at the door (admission): back off a moment, as a client should

    threads = [threading.Thread(target=client, args=(k,), daemon=True) for k in range(workers)]
    for thread in threads:
        thread.start()
    # Let the burst build up: answers flowing and most clients waiting on a request.
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        time.sleep(0.1)
        with lock:
            answered = sum(1 for o in outcomes if o.status == 200)
            waiting = sum(1 for o in outcomes if o.sent is not None and o.status is None and o.error is None)
        if answered >= 2 * workers and waiting >= 2:  # admission holds what it finishes within --max-queue-s
            break
    t_signal = time.monotonic()
    docker("kill", "--signal", "TERM", name)
    signalled.set()
    exit_code = docker("wait", name, timeout=drain_timeout + 60).stdout.strip().splitlines()[-1]
    t_exit = time.monotonic()
    stop.set()
    for thread in threads:
        thread.join(timeout=drain_timeout + 30)
    check(not any(t.is_alive() for t in threads), "a client never got an answer")

    log = logs(name)  # the container is removed after the phase: what its end said goes with a failure
    # What the server admitted is judged by the server's own record, not by when the client sent it: on a loaded
    # machine a request can sit unread in the socket for a while, and one the server reads only after SIGTERM is
    # refused at the door (tests/service/test_scheduling.py judges its SIGTERM burst the same way).
    # - 200, or 429 (admission: a burst of heavy requests is refused past what the server finishes within
    #   --max-queue-s): fine;
    # - 503 only as the drain's refusal ("shutting down"), never a request dropped after it was admitted;
    # - no answer (reset, closed) only for a request the server never read: no access line with its id.
    refused = [o for o in outcomes if o.status == 503 and "shutting down" not in o.extra.get("body", "")]
    check(not refused, f"503 answers that are not the drain's refusal: {refused[:5]}")
    lost = [o for o in outcomes if o.status is None and f"[{o.extra['id']}]" in log]
    check(not lost, f"requests the server read and never answered: {lost[:5]}\nthe log's end:\n{log[-1500:]}")
    # A gross lag is still a fault: a request sent this long before the signal must have been read and answered.
    long_before = [o for o in outcomes if o.sent is not None and o.sent < t_signal - 1.0 and o.status not in (200, 429)]
    check(not long_before, f"sent over a second before SIGTERM but not answered 200: {long_before[:5]}")
    admitted = [o for o in outcomes if o.sent is not None and o.sent < t_signal and o.status == 200]
    in_flight = [o for o in admitted if o.ended > t_signal]
    after = [o for o in outcomes if o not in admitted]
    wrong_status = [o for o in outcomes if o.status is not None and o.status not in (200, 429, 503)]
    check(not wrong_status, f"answers other than 200/429/503: {wrong_status[:5]}")
    timeouts = [o for o in outcomes if o.error and "timed out" in o.error.lower()]
    check(not timeouts, f"requests that timed out: {timeouts[:5]}")
    check(len(in_flight) >= 2, f"only {len(in_flight)} requests were in flight at SIGTERM: the burst proved nothing")
    check(
        exit_code in ("0", "143"),
        f"exit status {exit_code} (0, or 143 = SIGTERM re-raised, expected); the log's end:\n{log[-1500:]}",
    )
    state = docker("inspect", "--format", "{{.State.Status}}", name).stdout.strip()
    check(state in ("exited", "stopped"), f"container state after wait: {state}")
    check(t_exit - t_signal < drain_timeout + 5, f"exit took {t_exit - t_signal:.1f} s")
    check("Finished server process" in log or "Shutting down" in log, f"no shutdown in the log:\n{log[-2000:]}")

    drained = max((o.ended for o in in_flight), default=t_signal) - t_signal
    late: dict[str, int] = {}
    for o in after:
        key = str(o.status) if o.status else (o.error or "?").split(":")[0]
        late[key] = late.get(key, 0) + 1
    return (
        f"{len(outcomes)} requests from {workers} clients; {len(admitted)} sent before SIGTERM and answered 200, "
        f"{len(in_flight)} of them in flight at SIGTERM (finished {drained:.2f} s after it); after SIGTERM: {late}; "
        f"exit {exit_code} {t_exit - t_signal:.2f} s after SIGTERM"
    )


def check_export(checkpoint: Path, out: Path, image: str) -> str:
    user = [] if os.getuid() == 0 else ["--user", f"{os.getuid()}:{os.getgid()}"]
    result = docker(
        "run", "--rm", *user, "-v", f"{checkpoint}:/checkpoint:ro", "-v", f"{out}:/models", image,
        "/checkpoint", "--name", "sst2", "--repository", "/models", "--quiet",
        timeout=900,
    )  # fmt: skip
    print(result.stdout.strip())
    config = json.loads((out / "sst2" / "model.json").read_text())
    check(config["name"] == "sst2" and config["task"] == "classification", f"model.json: {config['name']}")
    check(config["architecture"] == "BertForSequenceClassification", f"architecture {config['architecture']}")
    check(config["labels"] == ["NEGATIVE", "POSITIVE"], f"labels {config['labels']}")
    check(sorted(config["variants"]) == ["fp16", "fp32", "int8"], f"variants {sorted(config['variants'])}")
    fp32 = config["variants"]["fp32"]["validation"]
    check(fp32["validated"] and fp32["passed"] and fp32["max_abs_diff"] <= 1e-4, f"fp32 validation {fp32}")
    for variant in config["variants"].values():
        check((out / "sst2" / variant["file"]).is_file(), f"missing {variant['file']}")
    check(config["variants"]["fp32"]["fused_operators"].get("Attention") == 6, "attention not fused in 6 layers")
    owner = (out / "sst2" / "model.json").stat().st_uid
    check(owner != 0, "the export ran as root")
    return (
        f"{checkpoint.name} -> sst2 (fp32 max|diff| {fp32['max_abs_diff']:.1e}, "
        f"int8 agreement {config['variants']['int8']['validation']['agreement']:.2f}); files owned by uid {owner}"
    )


def check_gpu_fallback(image: str, repository: Path, expected_models: list[str]) -> str:
    name = f"bertserve-test-gpu-{RUN_ID}"
    port = free_port()
    remove(name)
    try:
        # --cpus 1: the server sizes its threads by the container's CPU quota, not the host's cores (service/cpus.py)
        docker(
            "run", "-d", "--name", name, "--cpus", "1", "-p", f"127.0.0.1:{port}:8000",
            "-v", f"{repository}:/models:ro", image,
        )  # fmt: skip
        ready = wait_ready(port, name)
        status, _, body = request(port, "GET", "/v1/models")
        check(status == 200, f"/v1/models: {status}")
        models = {m["name"]: m for m in body["models"]}
        check(sorted(models) == sorted(expected_models), f"models {sorted(models)}")
        for m in models.values():
            check(m["provider"] == "CPUExecutionProvider", f"{m['name']} provider {m['provider']}")
            check(m["note"] and "CPU" in m["note"], f"{m['name']}: no fallback note: {m}")
            limits = m["limits"]  # the image's GPU batch settings (Dockerfile ENV) are what the server took
            check((limits["max_batch_size"], limits["max_batch_tokens"]) == (256, 16384), f"gpu limits {limits}")
        note = next(iter(models.values()))["note"]
        log = logs(name)
        check("WARNING" in log and "running on the CPU" in log, f"no fallback warning in the log:\n{log[-2000:]}")
        threads = re.findall(r"; (\d+) stream\(s\) of (\d+) intra-op thread\(s\)", log)
        check(threads and set(threads) == {("1", "1")}, f"under --cpus 1 the sessions took {threads}:\n{log[-2000:]}")
        first = sorted(models)[0]
        if models[first]["task"] == "classification":
            status, _, body = request(port, "POST", f"/v1/models/{first}/classify", CLASSIFY)
            check(status == 200, f"classify on the gpu image: {status} {body}")
            label = body["results"][0][0]["label"]
        else:
            label = "-"
        contents = check_image_contents(name, image, ["gpu"], torch=False)
        docker("stop", "-t", "30", name, timeout=120)
        return (
            f"ready in {ready:.1f} s on the CPU, top label {label!r}; under --cpus 1, 1 stream of 1 intra-op thread "
            f"per model; note: {note}; {contents}"
        )
    finally:
        remove(name)


# The compose services of the `monitoring` and `tracing` profiles: a plain `docker compose up` starts none of them.
PROFILED_SERVICES = ("prometheus", "grafana", "jaeger")


def check_compose(repository: Path, served: list[str]) -> str:
    """`docker compose up -d`: the demo repository by default; BERTSERVE_MODELS_DIR serves a host directory."""
    notes = []
    for models_dir in (None, repository):
        port = free_port()
        project = f"bertserve-test-{RUN_ID}"
        env = {k: v for k, v in os.environ.items() if not k.startswith("BERTSERVE_")}
        env["BERTSERVE_PUBLISH"] = f"127.0.0.1:{port}"
        if models_dir:
            env["BERTSERVE_MODELS_DIR"] = str(models_dir)
        expected, demo = (served, served == DEMO_MODELS) if models_dir else (DEMO_MODELS, True)

        def compose(*args: str, env: dict[str, str] = env, project: str = project) -> None:
            cmd = ["docker", "compose", "-p", project, *args]
            result = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
            if result.returncode != 0:
                output = result.stdout[-2000:] + result.stderr[-2000:]
                raise Failure(f"{' '.join(cmd)} -> exit {result.returncode}\n{output}")

        try:
            compose("up", "-d", "--no-build")
            names = docker("ps", "--format", "{{.Names}}").stdout.split()
            container = next(n for n in names if n.startswith(project) and "bertserve" in n)
            ready = wait_ready(port, container)
            status, _, body = request(port, "GET", "/v1/models")
            check(status == 200, f"/v1/models: {status}")
            check(sorted(m["name"] for m in body["models"]) == sorted(expected), f"compose models: {body}")
            check(all(m["demo"] is demo for m in body["models"]), f"compose demo flags: {body}")
            names = docker("ps", "--format", "{{.Names}}").stdout.split()
            check(
                not any(n.startswith(project) and any(s in n for s in PROFILED_SERVICES) for n in names),
                "the monitoring or tracing profile started without --profile",
            )
            what = f"BERTSERVE_MODELS_DIR ({', '.join(expected)})" if models_dir else "default (demo repository)"
            notes.append(f"{what} ready in {ready:.1f} s")
        finally:
            compose("down", "-v", "-t", "40")
    return "; ".join(notes) + "; monitoring and tracing profiles not started"


def check_prometheus(port: int, work: Path) -> str:
    """A real Prometheus (the host's binary) scrapes the container with deploy/prometheus/prometheus.yml (target
    rewritten to the published loopback port); every query of the Grafana dashboard must be valid and non-empty."""
    binary = shutil.which("prometheus")
    config = (ROOT / "deploy/prometheus/prometheus.yml").read_text()
    check("bertserve:8000" in config, "deploy/prometheus/prometheus.yml does not scrape bertserve:8000")
    config = config.replace("bertserve:8000", f"127.0.0.1:{port}")
    config = re.sub(r"scrape_interval: \S+", "scrape_interval: 1s", config)
    (work / "prometheus.yml").write_text(config)
    prom_port = free_port()
    log = (work / "prometheus.log").open("w")
    process = subprocess.Popen(
        [
            binary,
            f"--config.file={work / 'prometheus.yml'}",
            f"--web.listen-address=127.0.0.1:{prom_port}",
            f"--storage.tsdb.path={work / 'prometheus-data'}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    dashboard = json.loads((ROOT / "deploy/grafana/dashboards/bertserve.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]

    def query(expr: str) -> dict:
        url = f"/api/v1/query?{urllib.parse.urlencode({'query': expr})}"
        status, _, body = request(prom_port, "GET", url, timeout=10)
        if status == 503:
            raise ConnectionError("prometheus is starting")
        check(status in (200, 400, 422) and isinstance(body, dict), f"prometheus: {status} {body}")
        return body

    try:
        empty: list[str] = exprs
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            for path, body in (
                ("/v1/models/demo-sentiment/classify", CLASSIFY),
                ("/v1/models/demo-ner/ner", NER),
                ("/v1/models/demo-qa/qa", QA),
            ):
                request(port, "POST", path, body)
            time.sleep(0.5)
            with contextlib.suppress(OSError):
                results = {}
                for expr in exprs:
                    answer = query(expr.replace("$__rate_interval", "1m").replace("$model", ".*"))
                    check(answer["status"] == "success", f"dashboard query rejected: {expr}: {answer}")
                    results[expr] = answer["data"]["result"]
                empty = [expr for expr, result in results.items() if not result]
                if not empty:
                    break
        check(process.poll() is None, f"prometheus exited:\n{(work / 'prometheus.log').read_text()[-2000:]}")
        check(not empty, f"dashboard queries with no data after 60 s: {empty}")
        _, _, labels = request(prom_port, "GET", "/api/v1/label/model/values?match[]=bertserve_model_info")
        check(sorted(labels["data"]) == DEMO_MODELS, f"the dashboard's model variable: {labels}")
        version = subprocess.run([binary, "--version"], capture_output=True, text=True).stdout.split("\n")[0]
        return f"{version.split(' (')[0]} scraped /metrics; all {len(exprs)} dashboard queries valid and non-empty"
    finally:
        process.terminate()
        process.wait(timeout=30)
        log.close()


# ---------------------------------------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tag", default="bertserve", help="image name; targets become tags (bertserve:cpu, ...)")
    parser.add_argument("--shared", type=Path, default=ROOT.parent / "shared", help="the shared folder (checkpoints)")
    parser.add_argument("--skip-build", action="store_true", help="use the images already built")
    parser.add_argument("--skip-gpu", action="store_true")
    parser.add_argument("--skip-export", action="store_true")
    parser.add_argument("--skip-compose", action="store_true")
    parser.add_argument("--drain-timeout", type=float, default=30.0, help="BERTSERVE_DRAIN_TIMEOUT_S for the run")
    parser.add_argument(
        "--prune",
        action="store_true",
        help="remove dangling images (stale layers of earlier builds) first, after each build and at the end: for "
        "storage drivers that copy every layer whole (podman's vfs), where a few rebuilds fill the disk. The "
        "dependency stages stay cached: they are tagged (TAG-stage:build-cpu, ...)",
    )
    args = parser.parse_args()

    check(shutil.which("docker"), "no docker on PATH (make test-container runs ../shared/container/setup.sh)")
    tags = {target: f"{args.tag}:{target}" for target in ("cpu", "demo", "gpu", "export")}
    work = Path(tempfile.mkdtemp(prefix="bertserve-container-test-"))
    log_dir = ROOT / "reports" / "container"
    log_dir.mkdir(parents=True, exist_ok=True)
    name = f"bertserve-test-demo-{RUN_ID}"
    started = time.perf_counter()
    print(f"docker: {subprocess.run(['docker', '--version'], capture_output=True, text=True).stdout.strip()}")
    print(f"build logs: {log_dir}")
    try:
        wheel_dir, wheel_note = local_torch_wheel_dir(work)
        print(f"torch wheel for the export stage: {wheel_note}")
        torch_context = ["--build-context", f"torch-wheels={wheel_dir}"] if wheel_dir else []
        if args.prune:
            with phase("prune dangling images") as info:
                prune_dangling()
                info["note"] = "docker image prune --force"
        if not args.skip_build:
            built_stages: set[str] = set()  # demo needs build-cpu, which the cpu phase has built (and tagged) already
            for target in ("cpu", "demo", "gpu", "export"):
                if (target == "gpu" and args.skip_gpu) or (target == "export" and args.skip_export):
                    continue
                with phase(f"build {target}") as info:
                    check_free_space(target)
                    extra = torch_context if target in ("demo", "export") else None
                    for stage in DEPENDENCY_STAGES[target]:
                        if stage not in built_stages:
                            build(stage, f"{args.tag}-stage:{stage}", log_dir, extra)
                            built_stages.add(stage)
                    build(target, tags[target], log_dir, extra)
                    if args.prune:  # the image this build replaced is dangling now: free its layers at once
                        prune_dangling()
                    info["note"] = f"{tags[target]} {mb(image_size(tags[target]))}"

        port = free_port()
        remove(name)
        with phase("start demo image") as info:
            docker(
                "run", "-d", "--name", name, "-p", f"127.0.0.1:{port}:8000",
                "-e", f"BERTSERVE_DRAIN_TIMEOUT_S={args.drain_timeout}",
                # The SIGTERM phase checks the drain: every request admitted is answered. A burst of 16 clients
                # on 2 cores can be more than the default 2 s of queued work, which admission refuses (429, by
                # design); a bound near the deadline admits the whole burst, so only the drain is judged.
                "-e", "BERTSERVE_MAX_QUEUE_S=25", tags["demo"],
            )  # fmt: skip
            ready = wait_ready(port, name)
            health = image_healthcheck(name)
            info["note"] = f"/readyz 200 after {ready:.1f} s; HEALTHCHECK {health}; published on 127.0.0.1:{port}"
        with phase("endpoints") as info:
            info["note"] = check_endpoints(port)
            info["note"] += "; " + check_image_contents(name, tags["demo"], ["cpu"], torch=False)
        with phase("metrics") as info:
            info["note"] = check_metrics(port)
        if shutil.which("prometheus"):
            with phase("prometheus + dashboard queries") as info:
                info["note"] = check_prometheus(port, work)
        else:
            print("\n=== prometheus + dashboard queries: skipped (no prometheus binary on PATH)")
        with phase("non-root") as info:
            info["note"] = check_non_root(name, tags["demo"])
        with phase("no telemetry from a bare onnxruntime") as info:
            info["note"] = check_no_telemetry(tags["demo"])
        with phase("sigterm during a burst") as info:
            info["note"] = check_sigterm(port, name, args.drain_timeout)
        remove(name)

        repository = work / "repository"
        repository.mkdir()
        repository.chmod(0o777)  # the export image writes as its own non-root user
        checkpoint = args.shared / "models" / "minilm-bert-sst2"
        served = DEMO_MODELS
        if args.skip_export:
            print("\n=== export: skipped (--skip-export)")
        elif not checkpoint.is_dir():
            print(f"\n=== export: skipped ({checkpoint} is absent)")
        else:
            with phase("export a real checkpoint") as info:
                info["note"] = check_export(checkpoint.resolve(), repository, tags["export"])
                info["note"] += "; " + check_image_contents(None, tags["export"], ["cpu", "export"], torch=True)
                served = ["sst2"]
        if served == DEMO_MODELS and not (args.skip_gpu and args.skip_compose):
            # No exported entry: mount the demo repository, copied out of the demo image, instead.
            holder = f"bertserve-test-copy-{RUN_ID}"
            docker("create", "--name", holder, tags["demo"])
            try:
                for model in DEMO_MODELS:
                    docker("cp", f"{holder}:/models/{model}", str(repository / model))
            finally:
                remove(holder)
        if not args.skip_gpu:
            with phase("gpu image without a GPU") as info:
                info["note"] = check_gpu_fallback(tags["gpu"], repository, served)
        if not args.skip_compose:
            with phase("docker compose up") as info:
                info["note"] = check_compose(repository, served)
    except Failure as exc:
        print(f"\nFAILED: {exc}", file=sys.stderr)
        report(started, ok=False)
        return 1
    finally:
        remove(name)
        shutil.rmtree(work, ignore_errors=True)
        if args.prune:
            docker("image", "prune", "--force", check_rc=False, quiet=True, timeout=1800)
    report(started, ok=True, sizes={t: image_size(tags[t]) for t in tags if image_exists(tags[t])})
    return 0


def image_exists(tag: str) -> bool:
    return docker("image", "inspect", tag, check_rc=False, quiet=True).returncode == 0


def report(started: float, ok: bool, sizes: dict[str, int] | None = None) -> None:
    print("\n=== container test", "passed" if ok else "FAILED")
    for name, seconds, note in TIMINGS:
        print(f"  {name:<31} {seconds:7.1f} s  {note}")
    print(f"  {'total':<31} {time.perf_counter() - started:7.1f} s")
    if sizes:
        base = image_size("python:3.11-slim") if image_exists("python:3.11-slim") else 0
        print("image sizes (docker image inspect .Size):")
        for target, size in sizes.items():
            print(f"  {target:<8} {mb(size):>10}   {mb(size - base):>10} on top of python:3.11-slim ({mb(base)} here)")


if __name__ == "__main__":
    sys.exit(main())
