"""Process mode through real processes: a launcher, an engine process and front-end processes on one port.

The same answers as the in-process server, one /metrics view over every process, an engine that dies is
restarted while its in-flight requests get a clear 503, and SIGTERM drains the front-ends before the engine.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from service.metrics import MULTIPROCESS_DIR
from service.supervisor.launcher import ENGINE_STOP_S, FRONTEND_STOP_EXTRA_S
from tests.harness.serving import free_port, start_service
from tests.service.conftest import wait_for
from tests.service.lifecycle import publish
from tests.service.test_scheduling import assert_admitted_work_finished, metric, sigterm_during_burst

MODELS = "bert-classification,distilbert-ner,albert-qa"
PROCESS = ("--engine-mode", "process", "--frontends", "2", "--models", MODELS)
SENTENCES = ["a gorgeous, witty, seductive movie.", "the plot is nothing but boilerplate clichés", "ok"]
CONTEXT = "Peter Blackburn met Maria Lopez in Brussels on Tuesday to talk about trade and lamb. "


def ask_everything(url: str) -> list[dict]:
    with httpx.Client(base_url=url, timeout=30) as client:
        return [
            client.post("/v1/models/bert-classification/classify", json={"inputs": SENTENCES, "top_k": None}).json(),
            client.post("/v1/models/distilbert-ner/ner", json={"inputs": [CONTEXT * 3]}).json(),
            client.post(
                "/v1/models/albert-qa/qa", json={"inputs": [{"question": "Who met?", "context": CONTEXT * 4}]}
            ).json(),
        ]


def scores_close(got: object, want: object) -> bool:
    """Equal structure and text; floats within 1e-5."""
    if isinstance(got, dict) and isinstance(want, dict):
        return got.keys() == want.keys() and all(scores_close(got[k], want[k]) for k in got)
    if isinstance(got, list) and isinstance(want, list):
        return len(got) == len(want) and all(scores_close(a, b) for a, b in zip(got, want, strict=True))
    if isinstance(got, float) and isinstance(want, float):
        return abs(got - want) < 1e-5
    return got == want


def restarts(server) -> dict[tuple[str, str], float]:
    """bertserve_process_restarts_total by (process, reason), as a front-end's /metrics shows them."""
    families = text_string_to_metric_families(httpx.get(server.url + "/metrics").text)
    return {
        (sample.labels["process"], sample.labels["reason"]): sample.value
        for family in families
        for sample in family.samples
        if sample.name == "bertserve_process_restarts_total"
    }


NO_RESTARTS = {(process, reason): 0.0 for process in ("engine", "front-end") for reason in ("exited", "stuck")}


def process_environment(pid: int) -> dict[str, str]:
    entries = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(entry.decode().split("=", 1) for entry in entries if b"=" in entry)


def engine_pids(log: str) -> list[int]:
    return [int(pid) for pid in re.findall(r"engine started \(pid (\d+)\)", log)]


@pytest.fixture(scope="module")
def process_server(tiny_repository: Path, server_factory):
    return server_factory(tiny_repository, *PROCESS)


def test_process_mode_answers_as_the_in_process_server(process_server, tiny_server) -> None:
    assert "process mode: 1 engine, 2 front-ends" in process_server.log()
    got, want = ask_everything(process_server.url), ask_everything(tiny_server.url)
    assert all("results" in answer for answer in got), got
    assert scores_close(got, want)
    expected = {name: ("ready", "CPUExecutionProvider", "fp32") for name in MODELS.split(",")}

    def served() -> dict[str, tuple[str, str, str]]:  # a new connection: either front-end may answer
        models = httpx.get(process_server.url + "/v1/models").json()["models"]
        return {m["name"]: (m["status"], m["provider"], m["variant"]) for m in models}

    # /readyz said yes on one front-end; the other may still be self-testing its models ("checking") for a moment:
    # both say "ready" within the bound, ten new connections in a row
    streak = [0]

    def all_ready() -> bool:
        streak[0] = streak[0] + 1 if served() == expected else 0
        return streak[0] >= 10

    assert wait_for(all_ready, timeout=30, every_s=0.02), served()


def children(pid: int) -> dict[int, str]:
    """The processes whose parent is `pid`, with their command lines."""
    found = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[1]) == pid:
                found[int(stat.parent.name)] = (stat.parent / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except (OSError, ValueError, IndexError):
            continue
    return found


def loads_onnxruntime(pid: int) -> bool:
    return "onnxruntime" in Path(f"/proc/{pid}/maps").read_text()


def test_a_front_end_process_never_loads_onnxruntime(process_server) -> None:
    """The layer contract "the front-end never imports onnxruntime" at run time: only the engine process maps it."""
    processes = children(process_server.process.pid)
    frontends = [pid for pid, command in processes.items() if "-m service.frontend" in command]
    engines = [pid for pid, command in processes.items() if "-m service.engine" in command]
    assert len(frontends) == 2 and len(engines) == 1, processes
    assert loads_onnxruntime(engines[0])  # the check sees it where it is loaded
    assert not any(loads_onnxruntime(pid) for pid in frontends)


def test_qa_work_is_refused_in_the_front_end_before_it_is_done(process_server) -> None:
    """The window limits hold in process mode too: counted in the front-end, nothing queued."""
    context = (CONTEXT * 240)[:20_000]  # "Who?" takes 6 of 13 tokens: the default stride 6 advances 1 a window
    with httpx.Client(base_url=process_server.url, timeout=30) as client:
        response = client.post(
            "/v1/models/albert-qa/qa", json={"inputs": {"question": "Who?", "context": context}, "max_seq_len": 13}
        )
    assert response.status_code == 422, response.text
    assert response.json()["field"] == "max_seq_len" and "a context may need at most" in response.json()["error"]


def test_metrics_are_one_view_over_every_process(process_server) -> None:
    before = metric(process_server, "bertserve_requests_total", model="bert-classification")
    batches_before = metric(process_server, "bertserve_batch_size_count", model="bert-classification")
    for _ in range(10):  # new connections: the kernel spreads them over both front-ends
        response = httpx.post(
            process_server.url + "/v1/models/bert-classification/classify", json={"inputs": ["fine"]}, timeout=30
        )
        assert response.status_code == 200
    # whichever front-end answers the scrape, it counts every front-end's requests and the engine's batches
    for _ in range(4):
        assert metric(process_server, "bertserve_requests_total", model="bert-classification") - before == 10
        assert metric(process_server, "bertserve_batch_size_count", model="bert-classification") - batches_before >= 1
    assert metric(process_server, "bertserve_model_ready", model="albert-qa") == 1


def test_an_engine_that_dies_is_restarted_and_its_requests_get_503(tiny_repository: Path, server_factory) -> None:
    # a queue bound far above the work sent: every request is admitted, on however busy a machine
    server = server_factory(tiny_repository, *PROCESS, "--max-batch-size", "1", "--max-queue-s", "25")
    first_engine = engine_pids(server.log())[-1]
    assert restarts(server) == NO_RESTARTS  # there from the start: the first restart is an increase
    outcomes: list[tuple[int, str]] = []
    lock = threading.Lock()

    def ask(_: int) -> None:
        body = {"inputs": [{"question": "Who met whom?", "context": CONTEXT * 12}] * 16}
        response = httpx.post(server.url + "/v1/models/albert-qa/qa", json=body, timeout=30)
        with lock:
            outcomes.append((response.status_code, response.json().get("error_type", "")))

    with ThreadPoolExecutor(6) as pool:
        futures = [pool.submit(ask, i) for i in range(6)]
        # kill it while rows wait in its queue: those requests are in flight with the engine for certain
        assert wait_for(lambda: metric(server, "bertserve_queue_depth", model="albert-qa") > 0, timeout=30)
        batches_before = metric(server, "bertserve_batch_size_count", model="albert-qa")
        os.kill(first_engine, signal.SIGKILL)
        # the front-ends notice at once that their engine is gone
        not_ready = wait_for(lambda: httpx.get(server.url + "/readyz").status_code == 503, timeout=10)
        for future in futures:
            future.result()
    assert not_ready
    assert outcomes and all(status in (200, 503) for status, _ in outcomes), outcomes
    assert any(status == 503 for status, _ in outcomes), "no request was in flight when the engine died"
    assert all(kind == "unavailable" for status, kind in outcomes if status == 503)
    # ready again once the new engine has loaded and warmed up
    assert wait_for(lambda: len(engine_pids(server.log())) == 2), server.log()
    assert wait_for(lambda: httpx.get(server.url + "/readyz").status_code == 200), server.log()
    assert "exited with -9; restarting it" in server.log()
    answers = ask_everything(server.url)
    assert all("results" in answer for answer in answers), (answers, server.log())
    assert restarts(server) == {**NO_RESTARTS, ("engine", "exited"): 1.0}
    # the dead engine's batches are still counted, from the directory's folded totals, not a file of its own
    assert metric(server, "bertserve_batch_size_count", model="albert-qa") >= batches_before
    directory = Path(process_environment(engine_pids(server.log())[-1])[MULTIPROCESS_DIR])
    assert not list(directory.glob(f"*_{first_engine}.db")), sorted(path.name for path in directory.iterdir())
    assert (directory / "histogram_exited.db").exists()


def test_a_request_that_arrives_while_the_engine_restarts_waits_for_it(tiny_repository: Path, server_factory):
    """Not in flight when the engine died: such a request waits (within --max-queue-s and its deadline) for the
    new engine instead of a 503, so the front-ends that reconnect a moment after their siblings refuse nothing."""
    server = server_factory(tiny_repository, *PROCESS, "--max-queue-s", "25")
    os.kill(engine_pids(server.log())[-1], signal.SIGKILL)
    assert wait_for(lambda: httpx.get(server.url + "/readyz").status_code == 503, timeout=10)
    answers = ask_everything(server.url)
    assert all("results" in answer for answer in answers), answers
    assert wait_for(lambda: len(engine_pids(server.log())) == 2, 10), server.log()
    # with no time to wait, the same gap is a clear 503 at once
    short = server_factory(tiny_repository, *PROCESS, "--max-queue-s", "0.2")
    os.kill(engine_pids(short.log())[-1], signal.SIGKILL)
    assert wait_for(lambda: httpx.get(short.url + "/readyz").status_code == 503, timeout=10)
    refused = httpx.post(short.url + "/v1/models/bert-classification/classify", json={"inputs": ["ok"]}, timeout=30)
    assert refused.status_code == 503 and refused.json()["error_type"] == "unavailable", refused.text
    assert refused.headers["retry-after"] == "1"


def test_an_engine_that_hangs_is_killed_and_restarted(tiny_repository: Path, server_factory) -> None:
    """An engine whose event loop stops (SIGSTOP: as a deadlock or a hung driver call) answers nothing and does not
    exit: the launcher finds its state file stale past --liveness-stall-s, kills it, and the restart path follows
    (the request gets 503 at once where it was in flight with the engine, else the new engine's answer; either way
    not a 504 at its deadline)."""
    server = server_factory(tiny_repository, *PROCESS, "--liveness-stall-s", "1", "--request-timeout-s", "60")
    hung = engine_pids(server.log())[-1]
    os.kill(hung, signal.SIGSTOP)
    started = time.monotonic()
    response = httpx.post(server.url + "/v1/models/bert-classification/classify", json={"inputs": ["ok"]}, timeout=60)
    seconds = time.monotonic() - started
    # 200 where it reached a front-end still self-testing (ready is one front-end's word): it waited for the new engine
    assert response.status_code in (200, 503), response.text
    assert response.status_code == 200 or response.json()["error_type"] == "unavailable", response.text
    assert seconds < 15, seconds  # the stall bound and a poll, not the 60 s deadline
    # what the launcher logs, it logs while the answer is on its way: each line waited for, the bound the launcher's
    # stall check and a restart
    assert wait_for(lambda: f"engine (pid {hung}) is stuck: the event loop has not run for" in server.log(), 15)
    assert wait_for(lambda: f"engine (pid {hung}) exited with -9; restarting it" in server.log()), server.log()
    assert wait_for(lambda: len(engine_pids(server.log())) == 2), server.log()  # the new engine's "engine started"
    assert wait_for(lambda: httpx.get(server.url + "/readyz").status_code == 200), server.log()
    answers = ask_everything(server.url)
    assert all("results" in answer for answer in answers), (answers, server.log())
    assert server.log().count("is stuck") == 1  # the new engine, loading and then serving, is not
    assert restarts(server) == {**NO_RESTARTS, ("engine", "stuck"): 1.0}  # killed, and not counted again as exited


def test_a_silent_engine_makes_the_front_ends_not_ready_and_refuse_at_once(tiny_repository: Path, server_factory):
    """An engine that stops answering (SIGSTOP), well before the launcher's stall bound: after --engine-silence-s
    every front-end reports not ready (/readyz 503 with the reason) and answers 503, the request in flight with the
    engine and new ones at once, rather than holding them until the engine is killed or refusing them with 429 at
    its admission gate; /livez stays 200 (the front-end itself is fine). Once the engine speaks again: ready and
    answering, nothing restarted."""
    flags = ("--liveness-stall-s", "120", "--engine-silence-s", "1", "--request-timeout-s", "60")
    server = server_factory(tiny_repository, *PROCESS, *flags)
    assert wait_for(lambda: server.log().count("Application startup complete") == 2), server.log()
    silent = engine_pids(server.log())[-1]

    def readiness() -> list[tuple[int, str]]:  # a connection each: both front-ends answer some
        answers = [httpx.get(server.url + "/readyz", headers={"connection": "close"}) for _ in range(12)]
        return [(answer.status_code, answer.json().get("error", "")) for answer in answers]

    assert wait_for(lambda: {status for status, _ in readiness()} == {200}), server.log()
    os.kill(silent, signal.SIGSTOP)
    try:
        started = time.monotonic()
        in_flight = httpx.post(server.url + "/v1/models/bert-classification/classify", json={"inputs": ["ok"]})
        assert in_flight.status_code == 503 and time.monotonic() - started < 5, in_flight.text
        assert "--engine-silence-s 1) while this request was in flight" in in_flight.json()["error"]
        assert wait_for(lambda: {status for status, _ in readiness()} == {503}, timeout=10), server.log()
        assert all("not ready: the engine has not been heard from for" in why for _, why in readiness())
        started = time.monotonic()
        response = httpx.post(server.url + "/v1/models/bert-classification/classify", json={"inputs": ["ok"]})
        assert response.status_code == 503 and time.monotonic() - started < 2, response.text
        assert response.json()["error_type"] == "unavailable" and "--engine-silence-s 1" in response.json()["error"]
        assert response.headers["retry-after"] == "1"
        assert httpx.get(server.url + "/livez").status_code == 200
    finally:
        os.kill(silent, signal.SIGCONT)
    assert wait_for(lambda: {status for status, _ in readiness()} == {200}), server.log()
    assert all("results" in answer for answer in ask_everything(server.url))
    assert engine_pids(server.log()) == [silent] and "is stuck" not in server.log()
    assert restarts(server) == NO_RESTARTS
    # each front-end says so once it hears from it; readiness from a dozen connections need not have reached both
    assert wait_for(lambda: server.log().count("the engine is heard from again") == 2, 10), server.log()
    assert server.log().count("the engine is heard from again") == 2, server.log()


def test_a_front_end_that_hangs_is_killed_and_restarted(tiny_repository: Path, server_factory) -> None:
    """A hung front-end still owns its share of the port: the kernel hands it new connections that nobody answers.
    The launcher kills it once its state file is stale, the restart takes its place, and every request is served."""
    server = server_factory(tiny_repository, *PROCESS, "--liveness-stall-s", "1")
    hung = int(re.findall(r"front-end 0 started \(pid (\d+)\)", server.log())[-1])
    # ready is one front-end's word: this one may still be starting (and a process is judged once it has begun to
    # write its state file, as the app starts)
    assert wait_for(lambda: server.log().count("Application startup complete") == 2), server.log()
    os.kill(hung, signal.SIGSTOP)
    assert wait_for(lambda: f"front-end 0 (pid {hung}) exited with -9; restarting it" in server.log(), timeout=15)
    assert f"front-end 0 (pid {hung}) is stuck: the event loop has not run for" in server.log()
    assert wait_for(lambda: len(re.findall(r"front-end 0 started", server.log())) == 2)

    def ask(_: int) -> int:
        with httpx.Client(base_url=server.url, timeout=20) as client:  # a connection each: both sockets get some
            return client.post("/v1/models/bert-classification/classify", json={"inputs": ["ok"]}).status_code

    with ThreadPoolExecutor(8) as pool:  # at once: a new front-end's connections wait for its start, not refused
        assert list(pool.map(ask, range(32))) == [200] * 32
    assert restarts(server) == {**NO_RESTARTS, ("front-end", "stuck"): 1.0}


def test_sigterm_drains_the_front_ends_then_stops_the_engine(tiny_repository: Path, server_factory) -> None:
    server = server_factory(tiny_repository, *PROCESS, "--max-batch-size", "2", "--max-queue-s", "25")
    outcomes = sigterm_during_burst(server, "albert-qa")
    assert server.process.wait(60) == 0
    assert_admitted_work_finished(outcomes, server.log())
    log = server.log()
    assert log.rindex("Application shutdown complete") < log.index("engine: stopping") < log.index("stopped")


def test_a_hung_engine_holds_the_stop_no_longer_than_its_bound(tiny_repository: Path, server_factory) -> None:
    """An engine that is hung at SIGTERM (SIGSTOP: a deadlock, a hung driver call) is killed ENGINE_STOP_S after the
    front-ends have stopped: its front-ends are gone, and what it still runs has nobody to answer. The stop took a
    fixed 30 s whatever --drain-timeout-s said (an operator probe), the kubelet's SIGKILL before the launcher's own."""
    server = server_factory(tiny_repository, *PROCESS, "--drain-timeout-s", "1")
    hung = engine_pids(server.log())[-1]
    os.kill(hung, signal.SIGSTOP)
    started = time.monotonic()
    server.process.send_signal(signal.SIGTERM)
    assert server.process.wait(60) == 0  # the front-ends drained; the engine's kill is logged as an error
    seconds = time.monotonic() - started
    assert f"engine did not stop in {ENGINE_STOP_S:.0f} s; killing it" in server.log(), server.log()
    assert ENGINE_STOP_S <= seconds < ENGINE_STOP_S + 1 + FRONTEND_STOP_EXTRA_S, seconds
    assert server.log().rstrip().endswith("stopped"), server.log()[-2000:]


def test_ctrl_c_at_a_terminal_drains_the_front_ends_then_stops_the_engine(tiny_repository: Path, tmp_path: Path):
    """A terminal's Ctrl-C signals the whole foreground process group: the engine got SIGINT with the launcher and
    stopped at once, and the front-ends answered their requests in flight 503 ("lost the engine"). The launcher
    alone takes it now and stops them in order, as for a SIGTERM."""
    flags = (*PROCESS, "--max-batch-size", "2", "--max-queue-s", "25", "--probe-port", str(free_port()))
    server = start_service(tiny_repository, *flags, log_path=tmp_path / "server.log", own_group=True)
    try:
        outcomes = sigterm_during_burst(server, "albert-qa", stop=lambda: os.killpg(server.process.pid, signal.SIGINT))
        assert server.process.wait(60) == 0
    finally:
        server.stop()
    log = server.log()
    assert_admitted_work_finished(outcomes, log)
    assert "lost the engine" not in log and "Traceback" not in log and "KeyboardInterrupt" not in log, log
    assert log.rindex("Application shutdown complete") < log.index("engine: stopping") < log.index("stopped")


def test_a_model_that_cannot_load_stops_process_mode_at_start(tiny_repository: Path, tmp_path: Path, server_factory):
    (tmp_path / "broken").mkdir()
    for name in ("model.json", "tokenizer.json"):
        (tmp_path / "broken" / name).write_bytes((tiny_repository / "bert-ner" / name).read_bytes())
    (tmp_path / "broken" / "model.fp32.onnx").write_bytes(b"not an onnx graph")
    server = server_factory(tmp_path, "--engine-mode", "process", "--load-failure", "fail", wait_ready=False)
    assert server.process.wait(60) == 2
    assert "error: model broken failed to load" in server.log()


def test_a_process_that_served_is_restarted_however_often_it_dies_and_sighup_drains(
    tiny_repository: Path, server_factory
) -> None:
    """Three deaths each within 10 s of a start stopped the whole server, as a process that cannot start: an engine
    here serves ~4 s after its start, so three kill -9s under load did. A start fails only where the process dies
    before it began to serve. SIGHUP (a closed terminal) ended the launcher at once, its children left serving."""
    server = server_factory(tiny_repository, *PROCESS, "--models", "bert-classification")
    for kill in range(3):
        os.kill(engine_pids(server.log())[-1], signal.SIGKILL)
        assert wait_for(lambda: len(engine_pids(server.log())) == kill + 2, timeout=30), server.log()  # noqa: B023
        assert wait_for(lambda: httpx.get(server.url + "/readyz").status_code == 200, timeout=60), server.log()
    assert server.process.poll() is None, server.log()
    answer = httpx.post(server.url + "/v1/models/bert-classification/classify", json={"inputs": ["ok"]}, timeout=30)
    assert answer.status_code == 200, answer.text
    assert restarts(server) == {**NO_RESTARTS, ("engine", "exited"): 3.0}
    children = [engine_pids(server.log())[-1], *frontend_pids(server.log())]
    server.process.send_signal(signal.SIGHUP)
    assert server.process.wait(60) == 0
    assert "stopped" in server.log() and not any(alive(pid) for pid in children)


def test_the_children_end_with_the_launcher(tiny_repository: Path, server_factory) -> None:
    """A launcher killed (kill -9, an OOM kill) left its engine and front-ends serving, with nothing to restart
    them, holding the port: the kernel sends each SIGTERM now, and they drain and stop."""
    server = server_factory(tiny_repository, *PROCESS, "--models", "bert-classification")
    children = [engine_pids(server.log())[-1], *frontend_pids(server.log())]
    assert len(children) == 3 and all(alive(pid) for pid in children)
    os.kill(server.process.pid, signal.SIGKILL)
    assert wait_for(lambda: not any(alive(pid) for pid in children), timeout=60), server.log()


def frontend_pids(log: str) -> list[int]:
    """The pid of each front-end's latest start."""
    latest = dict(re.findall(r"(front-end \d+) started \(pid (\d+)\)", log))
    return [int(pid) for pid in latest.values()]


def alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie, ended but not yet reaped by whoever adopted it, does not)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return "State:\tZ" not in status


def test_a_restarted_engine_serves_the_models_the_repository_api_had_loaded(
    tiny_repository: Path, tmp_path: Path, server_factory
) -> None:
    """--model-control explicit: an engine restarted after a crash loaded --model's list again, so a model loaded
    through the API answered 404 and one unloaded was back, with /readyz 200 and nothing logged."""
    repository = tmp_path / "repository"
    repository.mkdir()
    publish(repository, "a", tiny_repository / "bert-classification")
    publish(repository, "b", tiny_repository / "bert-classification")
    (tmp_path / "admin.keys").write_text("admin-key-0123456789abcdef\n")
    (tmp_path / "admin.keys").chmod(0o600)
    admin = {"Authorization": "Bearer admin-key-0123456789abcdef"}
    server = server_factory(
        repository,
        *("--engine-mode", "process", "--frontends", "1", "--model-control", "explicit", "--model", "a"),
        *("--admin-api-key-file", str(tmp_path / "admin.keys")),
    )
    for call in ("/v2/repository/models/b/load", "/v2/repository/models/a/unload"):
        assert httpx.post(server.url + call, headers=admin, timeout=60).status_code == 200
    os.kill(engine_pids(server.log())[-1], signal.SIGKILL)
    assert wait_for(lambda: len(engine_pids(server.log())) == 2, timeout=30)
    assert wait_for(lambda: httpx.get(server.url + "/readyz").status_code == 200, timeout=60), server.log()
    listed = {model["name"] for model in httpx.get(server.url + "/v1/models").json()["models"]}
    assert listed == {"b"}, server.log()
    classify = {"inputs": ["fine"]}
    assert httpx.post(server.url + "/v1/models/b/classify", json=classify, timeout=30).status_code == 200
    assert httpx.post(server.url + "/v1/models/a/classify", json=classify, timeout=30).status_code == 404
    assert "engine: restarted: loading the models loaded before: b" in server.log()


def test_the_version_served_before_an_engine_crash_put_back_clears_the_failure_metrics(
    tiny_repository: Path, tmp_path: Path, server_factory
) -> None:
    """An engine restarted over a broken entry fails the model; the export that served before, put back, serves
    again, and the metrics said so no more: bertserve_model_load_failed stayed 1 (the alert firing for a model that
    serves), its load was not counted and it had no bertserve_model_version_info. The front-end, serving that very
    version still, never told the new engine it used it: the engine counts a load at a front-end's word."""
    repository = tmp_path / "repository"
    repository.mkdir()
    publish(repository, "a", tiny_repository / "bert-classification")
    serving = tmp_path / "serving-a"
    shutil.copytree(repository / "a", serving)
    server = server_factory(
        repository,
        *("--engine-mode", "process", "--frontends", "1", "--model-control", "poll", "--repository-poll-s", "0.5"),
    )
    version = httpx.get(server.url + "/v1/models/a").json()["version"]
    publish(repository, "a", tiny_repository / "bert-classification", corrupt=True)
    assert wait_for(lambda: "failed to load" in server.log(), timeout=30)
    os.kill(engine_pids(server.log())[-1], signal.SIGKILL)
    assert wait_for(lambda: len(engine_pids(server.log())) == 2, timeout=30)
    assert wait_for(lambda: httpx.get(server.url + "/v1/models/a").json()["status"] == "failed", timeout=60)
    shutil.rmtree(repository / "a")
    shutil.copytree(serving, repository / "a")  # the export that served, back
    classify = {"inputs": ["fine"]}
    assert wait_for(lambda: httpx.post(server.url + "/v1/models/a/classify", json=classify).status_code == 200, 60)

    def settled() -> bool:
        return (
            metric(server, "bertserve_model_load_failed", model="a") == 0
            and metric(server, "bertserve_model_version_info", model="a", version=version) == 1
        )

    assert wait_for(settled, timeout=30), httpx.get(server.url + "/metrics").text
