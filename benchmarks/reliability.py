"""Reliability benchmark: overload, soak and repository faults against a real server process. Prints figures.

    python -m benchmarks.reliability overload [--factor 3] [--seconds 30] [--shape classify-1] [-- SERVER FLAGS...]
    python -m benchmarks.reliability mixed [--factor 3] [--seconds 30] [--shape classify-1,qa-long] [-- FLAGS...]
    python -m benchmarks.reliability soak [--minutes 30] [--fraction 0.5] [-- SERVER FLAGS...]
    python -m benchmarks.reliability faults
    python -m benchmarks.reliability hang [--fraction 0.5] [--seconds 30] [-- SERVER FLAGS...]
    python -m benchmarks.reliability all

The model is the real MiniLM SST-2 checkpoint in ../shared/models, exported (fp32) into a work folder once.

- overload: measure the capacity with a closed loop of 8 clients (requests of `--shape`, comma-separated for
  several, each on a fresh server: classify-1, classify-16, qa-long, ner-long, classify-1-large, embed-1, embed-64,
  embeddings-1, rerank-20; benchmarks.request_shapes), then an open loop at `factor` x that rate for `seconds` (a
  new connection per request, latency from the moment it was due) while /livez is probed every 100 ms; then, 5 s
  after the load stopped, 20 normal requests one by one.
  Wanted: only 200 and 429 (each 429 with Retry-After), admitted p99 within the queue bound plus one request's
  own time alone (measured first, one request at a time), /livez p99 under 100 ms, normal answers after.
- mixed: the shapes of `--shape` at once, on one server that serves each shape's model: each shape's capacity
  measured alone (a closed loop, as overload does), then an open loop per shape at the same time, each at `factor` /
  (number of shapes) x its own capacity, so that together they ask `factor` x what the server can do. Wanted: what
  overload wants of each shape, and no shape shut out: each one's share of its requests answered (200) near the
  others' (a door that counts work in tokens and admits a request only where its own tokens fit would let the small
  requests take every gap, and refuse the large ones nearly always).
- soak: an open loop at `fraction` x capacity for `minutes`, RSS of the server's process tree sampled every
  10 s; growth measured from the end of a warm-up minute. Wanted: no errors, RSS growth under 5%.
- faults: for each broken repository entry (corrupt ONNX, non-JSON model.json, missing tokenizer, missing
  variant file) beside a good model, start with --load-failure skip and fail and report what happened.
- hang: process mode (one front-end); an open loop at `fraction` x capacity for `seconds`, and a quarter of the way
  in the engine process is stopped (SIGSTOP: as a deadlock or a driver call that never returns). Reported: the
  answers due before the stop, while the engine was stuck, and after the first 200 that followed, by status; when
  the launcher said it was stuck; when /readyz (polled every 100 ms) said 503, and 200 again; the longest wait.
  Wanted: nothing waits for its deadline (no NO_ANSWER, no 504), answers while stuck are 503, /readyz says 503
  within --engine-silence-s, and every answer after the first 200 is 200.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

from benchmarks import realdata
from benchmarks.loadclient import run_load
from benchmarks.openloop import OpenLoopResult, open_loop, post_request
from benchmarks.process_cpu import OtherCpu, busy_warning, process_tree, role_of
from benchmarks.reports import write_report
from benchmarks.request_shapes import LARGE, SHAPES
from benchmarks.rerank_benchmark import CROSS_ENCODER, make_cross_encoder
from service.settings import Settings
from tests.harness.serving import ROOT, ServiceProcess, free_port, start_service

CHECKPOINT = "minilm-bert-sst2"
PATH = f"/v1/models/{CHECKPOINT}/classify"


def exported_repository(workdir: Path, checkpoint_name: str = CHECKPOINT) -> Path:
    """A repository of `checkpoint_name` alone (fp32), exported once into the work folder."""
    repository = workdir / f"models-{checkpoint_name}"
    if not (repository / checkpoint_name / "model.json").exists():
        if checkpoint_name == LARGE:
            checkpoint = large_checkpoint(workdir)
        elif checkpoint_name == CROSS_ENCODER:
            checkpoint = make_cross_encoder(workdir / "cross-encoder-checkpoint")
        else:
            checkpoint = realdata.SHARED / "models" / checkpoint_name
        flags = ["--name", checkpoint_name, "--repository", str(repository), "--variants", "fp32", "--quiet"]
        subprocess.run(
            [sys.executable, "-m", "export", str(checkpoint), *flags],
            check=True,
            cwd=ROOT,
            env={**os.environ, "HF_HUB_OFFLINE": "1"},
        )
    return repository


def large_checkpoint(workdir: Path) -> Path:
    """LARGE (benchmarks.request_shapes): a BERT classifier of 6 layers, hidden 768 (~4x MiniLM's cost per token),
    random weights (seed 0), MiniLM SST-2's tokenizer: a costlier model beside MiniLM in one repository."""
    directory = workdir / LARGE
    if not (directory / "config.json").exists():
        import torch
        from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

        source = realdata.SHARED / "models" / CHECKPOINT
        config = BertConfig.from_pretrained(source)
        config.hidden_size, config.num_attention_heads, config.intermediate_size = 768, 12, 3072
        config.num_hidden_layers = 6
        torch.manual_seed(0)
        BertForSequenceClassification(config).eval().save_pretrained(directory)
        AutoTokenizer.from_pretrained(source).save_pretrained(directory)
    return directory


def sentences() -> list[str]:
    return [text for text, _ in realdata.sst2()]


def capacity(server: ServiceProcess, texts: list[str], seconds: float = 10.0) -> float:
    """Requests a second the server answers to a closed loop of 8 clients sending one sentence each."""
    run_load(server.url, PATH, [{"inputs": [t]} for t in texts[:64]], [1] * 64, clients=8, seconds=3)  # warm
    result = run_load(server.url, PATH, [{"inputs": [t]} for t in texts], [1] * len(texts), clients=8, seconds=seconds)
    return result.sequences_per_s  # answered (200) requests: one sentence each


def rss_tree_mb(pid: int) -> float:
    """Resident memory of a process and its descendants (process mode: launcher, engine, front-ends)."""
    total, todo = 0, [pid]
    while todo:
        current = todo.pop()
        try:
            for line in Path(f"/proc/{current}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
            children = Path(f"/proc/{current}/task/{current}/children").read_text().split()
        except OSError:
            continue
        todo.extend(int(c) for c in children)
    return total / 1024


def normal_after(server: ServiceProcess, path: str, bodies: list[dict], count: int = 20) -> dict:
    statuses, latencies = [], []
    with httpx.Client(base_url=server.url, timeout=30) as client:
        for body in bodies[:count]:
            started = time.perf_counter()
            statuses.append(client.post(path, json=body).status_code)
            latencies.append(time.perf_counter() - started)
    return {"all_200": all(s == 200 for s in statuses), "max_ms": round(1000 * max(latencies), 1)}


def alone_ms(server: ServiceProcess, path: str, bodies: list[dict], count: int = 20) -> float:
    """One request's own time, with nothing else in flight: the median of `count` sent one by one."""
    times = []
    with httpx.Client(base_url=server.url, timeout=60) as client:
        for body in bodies[:count]:
            started = time.perf_counter()
            client.post(path, json=body).raise_for_status()
            times.append(time.perf_counter() - started)
    return 1000 * sorted(times)[len(times) // 2]


def closed_loop_rate(server: ServiceProcess, shape_name: str, bodies: list[dict]) -> float:
    """Answered (200) requests of a shape a second, the better of 4 and 8 closed-loop clients, after a warm-up of 4:
    a client that meets a 429 retries at once, and 8 clients of long QA contexts (over the floor of one batch of
    tokens) spent the CPU on that: 3.5 answers a second, where an open loop at 5.3 a second got every one answered."""
    shape = SHAPES[shape_name]
    sizes = [shape.rows_per_request()] * len(bodies)
    run_load(server.url, shape.path(), bodies[:64], sizes[:64], clients=4, seconds=3)  # 8 long QA clients meet 429s
    return max(
        run_load(server.url, shape.path(), bodies, sizes, clients=clients, seconds=10).sequences_per_s / sizes[0]
        for clients in (4, 8)
    )


def overload(workdir: Path, factor: float, seconds: float, server_args: list[str], shape_name: str) -> dict:
    shape = SHAPES[shape_name]
    repository = exported_repository(workdir, shape.checkpoint)
    bodies = shape.bodies()
    path = shape.path()
    log_path = workdir / f"overload-{shape.name}-server.log"
    probe_port = free_port()
    server = start_service(repository, "--probe-port", str(probe_port), *server_args, log_path=log_path)
    try:
        own_ms = alone_ms(server, path, bodies)
        rate = closed_loop_rate(server, shape.name, bodies)
        print(
            f"{shape.name}: alone {own_ms:.0f} ms; capacity (closed loop, the better of 4 and 8 clients) "
            f"{rate:.1f} requests/s; open loop at {rate * factor:.1f}/s",
            flush=True,
        )
        host, port = "127.0.0.1", int(server.url.rsplit(":", 1)[1])
        requests = [post_request(host, path, json.dumps(body).encode()) for body in bodies]
        with OtherCpu(server.process.pid) as other:
            result = asyncio.run(open_loop(host, port, requests, rate * factor, seconds, probe_port=probe_port))
        other_cores = other.cores()
        summary = {
            "shape": shape.name,
            "factor": factor,
            "capacity_per_s": round(rate, 1),
            "alone_ms": round(own_ms, 1),
            "server_args": server_args,
            "other_cores": None if other_cores is None else round(other_cores, 2),
            **result.summary(),
        }
        time.sleep(5)
        summary["after_5_s"] = normal_after(server, path, bodies)
        summary["server_alive"] = server.process.poll() is None
    finally:
        server.stop()
    return summary


def mixed_repository(workdir: Path, checkpoints: list[str]) -> Path:
    """One repository holding each checkpoint's entry (links to the entries `exported_repository` made)."""
    repository = workdir / ("models-mixed-" + "-".join(sorted(set(checkpoints))))
    repository.mkdir(parents=True, exist_ok=True)
    for name in set(checkpoints):
        link = repository / name
        if not link.exists():
            link.symlink_to(exported_repository(workdir, name) / name, target_is_directory=True)
    return repository


def mixed(workdir: Path, factor: float, seconds: float, server_args: list[str], shape_names: list[str]) -> list[dict]:
    """The shapes' open loops at once on one server, each at factor / len(shapes) x its own capacity."""
    shapes = [SHAPES[name] for name in shape_names]
    repository = mixed_repository(workdir, [shape.checkpoint for shape in shapes])
    log_path = workdir / f"mixed-{'-'.join(shape_names)}-server.log"
    server = start_service(repository, *server_args, log_path=log_path)
    host, port = "127.0.0.1", int(server.url.rsplit(":", 1)[1])
    try:
        plans = []
        for shape in shapes:
            bodies = shape.bodies()
            own_ms = alone_ms(server, shape.path(), bodies)
            rate = closed_loop_rate(server, shape.name, bodies)
            offered = rate * factor / len(shapes)
            print(f"{shape.name}: alone {own_ms:.0f} ms; capacity alone {rate:.1f} requests/s; offered {offered:.1f}/s")
            requests = [post_request(host, shape.path(), json.dumps(body).encode()) for body in bodies]
            plans.append((shape, own_ms, rate, offered, requests))

        async def together() -> list[OpenLoopResult]:
            loops = [open_loop(host, port, requests, offered, seconds) for _, _, _, offered, requests in plans]
            return list(await asyncio.gather(*loops))

        with OtherCpu(server.process.pid) as other:
            results = asyncio.run(together())
        other_cores = other.cores()
        rows = []
        for (shape, own_ms, rate, _, _), result in zip(plans, results, strict=True):
            summary = result.summary()
            rows.append(
                {
                    "shape": shape.name,
                    "factor": factor,
                    "mixed_with": [name for name in shape_names if name != shape.name],
                    "capacity_per_s": round(rate, 1),
                    "alone_ms": round(own_ms, 1),
                    "server_args": server_args,
                    "other_cores": None if other_cores is None else round(other_cores, 2),
                    "answered_share": round(summary["statuses"].get(200, 0) / max(1, summary["sent"]), 3),
                    **summary,
                }
            )
        rows[0]["server_alive"] = server.process.poll() is None
    finally:
        server.stop()
    return rows


def _against_promise(row: dict, max_queue_s: float) -> tuple[dict[int, int], int, float, float]:
    """A row's statuses, its answers other than 200 and 429, its promise (the bound plus one request's own time
    alone) and its admitted p99, in seconds."""
    statuses = {int(k): v for k, v in row["statuses"].items()}
    other = sum(v for k, v in statuses.items() if k not in (200, 429))
    return statuses, other, max_queue_s + row["alone_ms"] / 1000, row["p99_ms_200"] / 1000


def mixed_table(rows: list[dict], max_queue_s: float) -> str:
    """Per shape of one mixed run: its share of requests answered beside overload's columns."""
    columns = ["shape", "offered/s (its capacity alone)", "200", "429", "other", "answered share"]
    columns += ["admitted p50 / p99 s", "bound + alone s", "p99 within"]
    cells = []
    for row in rows:
        statuses, other, promise_s, p99_s = _against_promise(row, max_queue_s)
        cells.append(
            [
                row["shape"],
                f"{row['offered_per_s']:.1f} ({row['capacity_per_s']:.1f})",
                str(statuses.get(200, 0)),
                str(statuses.get(429, 0)),
                str(other),
                f"{row['answered_share']:.1%}",
                f"{row['p50_ms_200'] / 1000:.2f} / {p99_s:.2f}",
                f"{promise_s:.2f}",
                "yes" if p99_s <= promise_s else "NO",
            ]
        )
    return _markdown(columns, cells)


def _markdown(columns: list[str], cells: list[list[str]]) -> str:
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in cells])


def busy_rows(rows: list[dict]) -> list[str]:
    """The warnings under the table: a row whose open loop ran while the machine did other work is not the server's
    figure (`busy_warning`)."""
    warnings = {f"{row['shape']} ({row['factor']:g}x)": busy_warning(row.get("other_cores")) for row in rows}
    return [f"{row}: {warning}" for row, warning in warnings.items() if warning]


def overload_table(rows: list[dict], max_queue_s: float) -> str:
    """The README's table: per shape and factor, what was admitted and how long it took, against the promise."""
    lines = [
        "| shape | offered/s (x capacity) | 200 | 429 | other | admitted p50 / p90 / p99 s | server p99 s | "
        "queue p50 / p99 ms | alone ms | bound + alone s | p99 within |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        statuses, other, promise_s, p99_s = _against_promise(row, max_queue_s)
        lines.append(
            f"| {row['shape']} | {row['offered_per_s']:.1f} ({row['factor']:g}x) | {statuses.get(200, 0)} | "
            f"{statuses.get(429, 0)} | {other} | {row['p50_ms_200'] / 1000:.2f} / {row['p90_ms_200'] / 1000:.2f} / "
            f"{p99_s:.2f} | {row.get('server_p99_ms_200', float('nan')) / 1000:.2f} | "
            f"{row['queue_p50_ms_200']:.0f} / {row['queue_p99_ms_200']:.0f} | {row['alone_ms']:.0f} | "
            f"{promise_s:.2f} | {'yes' if p99_s <= promise_s else 'NO'} |"
        )
    return "\n".join(lines)


def hang(workdir: Path, fraction: float, seconds: float, server_args: list[str]) -> dict:
    repository = exported_repository(workdir)
    texts = sentences()
    log_path = workdir / "hang-server.log"
    process_mode = ["--engine-mode", "process", "--frontends", "1"]
    server = start_service(repository, *process_mode, *server_args, log_path=log_path)
    try:
        rate = capacity(server, texts) * fraction
        engine = next(pid for pid in process_tree(server.process.pid) if role_of(pid) == "engine")
        stop_after_s = seconds / 4
        print(f"open loop at {rate:.0f}/s for {seconds:g} s; engine (pid {engine}) stopped after {stop_after_s:g} s")
        host, port = "127.0.0.1", int(server.url.rsplit(":", 1)[1])
        requests = [post_request(host, PATH, json.dumps({"inputs": [t]}).encode()) for t in texts]
        stopped: dict[str, float] = {}

        def stop_engine() -> None:
            stopped["perf"], stopped["wall"] = time.perf_counter(), time.time()
            os.kill(engine, signal.SIGSTOP)

        async def load() -> OpenLoopResult:
            asyncio.get_running_loop().call_later(stop_after_s, stop_engine)
            return await open_loop(host, port, requests, rate, seconds)

        readiness: list[tuple[float, int]] = []
        poller = threading.Thread(target=_poll_readiness, args=(server.url, seconds, readiness), daemon=True)
        poller.start()
        result = asyncio.run(load())
        poller.join()
        summary = {"offered_per_s": round(rate, 1), "seconds": seconds, "server_args": server_args}
        summary.update(_hang_outcome(result, stopped, server.log()))
        summary.update(_readiness_outcome(readiness, stopped["perf"]))
        summary["server_alive"] = server.process.poll() is None
    finally:
        server.stop()
    return summary


def _poll_readiness(url: str, seconds: float, out: list[tuple[float, int]]) -> None:
    """(perf_counter, /readyz status) every 100 ms for `seconds`, a connection each; 0 for no answer in 2 s."""
    until = time.perf_counter() + seconds
    while time.perf_counter() < until:
        started = time.perf_counter()
        try:
            status = httpx.get(url + "/readyz", headers={"connection": "close"}, timeout=2).status_code
        except httpx.HTTPError:
            status = 0
        out.append((started, status))
        time.sleep(max(0.0, 0.1 - (time.perf_counter() - started)))


def _readiness_outcome(readiness: list[tuple[float, int]], stop: float) -> dict:
    """When /readyz first said 503 after the stop, and 200 again after that, in seconds after the stop."""
    after = [(at - stop, status) for at, status in readiness if at >= stop]
    not_ready = next((at for at, status in after if status == 503), None)
    ready_again = next((at for at, status in after if status == 200 and not_ready is not None and at > not_ready), None)
    return {
        "readyz_503_after_s": round(not_ready, 2) if not_ready is not None else None,
        "readyz_200_again_after_s": round(ready_again, 2) if ready_again is not None else None,
    }


def _hang_outcome(result: OpenLoopResult, stopped: dict[str, float], log: str) -> dict:
    """The answers by when they were due: before the stop, while stuck (up to the first 200 due after it), after."""
    answers = sorted(result.answers, key=lambda a: a.due)
    stop = stopped["perf"]
    recovered = next((a.due for a in answers if a.due > stop and a.status == 200), None)

    def window(low: float, high: float | None) -> dict[str, int]:
        picked = [a.status for a in answers if low <= a.due and (high is None or a.due < high)]
        return {str(status): picked.count(status) for status in sorted(set(picked))}

    stuck_lines = [line for line in log.splitlines() if "is stuck" in line]
    said = None
    if stuck_lines:  # "2026-11-25 07:21:36,817 ERROR ...": seconds after the stop by the wall clock
        stamp = stuck_lines[0][:23]
        said = time.mktime(time.strptime(stamp[:19], "%Y-%m-%d %H:%M:%S")) + int(stamp[20:]) / 1000 - stopped["wall"]
    return {
        "before_stop": window(0.0, stop),
        "while_stuck": window(stop, recovered),
        "after_recovery": window(recovered, None) if recovered is not None else {},
        "first_200_after_stop_s": round(recovered - stop, 2) if recovered is not None else None,
        "launcher_said_stuck_after_s": round(said, 2) if said is not None else None,
        "launcher_line": stuck_lines[0].split("]: ", 1)[-1] if stuck_lines else None,
        "longest_wait_s": round(max(a.seconds for a in answers), 2),
    }


def soak(workdir: Path, minutes: float, fraction: float, server_args: list[str]) -> dict:
    repository = exported_repository(workdir)
    texts = sentences()
    server = start_service(repository, *server_args, log_path=workdir / "soak-server.log")
    try:
        rate = capacity(server, texts) * fraction
        host, port = "127.0.0.1", int(server.url.rsplit(":", 1)[1])
        requests = [post_request(host, PATH, json.dumps({"inputs": [t]}).encode()) for t in texts]
        samples: list[tuple[float, float]] = []
        statuses: dict[int, int] = {}
        started = time.perf_counter()
        warm_up_s = 60.0
        while (elapsed := time.perf_counter() - started) < minutes * 60:
            chunk = min(10.0, minutes * 60 - elapsed)
            result = asyncio.run(open_loop(host, port, requests, rate, chunk, probe_every_s=1.0))
            for status, count in result.statuses().items():
                statuses[status] = statuses.get(status, 0) + count
            samples.append((time.perf_counter() - started, rss_tree_mb(server.process.pid)))
            print(f"  {samples[-1][0]:6.0f} s  RSS {samples[-1][1]:7.1f} MB  statuses {statuses}", flush=True)
        after_warm = [rss for t, rss in samples if t >= warm_up_s] or [samples[-1][1]]
        growth = (after_warm[-1] - after_warm[0]) / after_warm[0]
        return {
            "rate_per_s": round(rate, 1),
            "minutes": minutes,
            "statuses": statuses,
            "rss_mb_after_warm_up": round(after_warm[0], 1),
            "rss_mb_end": round(after_warm[-1], 1),
            "rss_mb_max": round(max(rss for _, rss in samples), 1),
            "rss_growth_pct": round(100 * growth, 2),
        }
    finally:
        server.stop()


FAULTS = {
    "corrupt ONNX": lambda entry: (entry / "model.fp32.onnx").write_bytes(b"\x08\x07not a model" * 100),
    "non-JSON model.json": lambda entry: (entry / "model.json").write_text("{ this is not json"),
    "missing tokenizer": lambda entry: (entry / "tokenizer.json").unlink(),
    "missing variant file": lambda entry: (entry / "model.fp32.onnx").unlink(),
}


def faults(workdir: Path) -> list[dict]:
    good = exported_repository(workdir) / CHECKPOINT
    rows = []
    for fault, breaks in FAULTS.items():
        for policy in ("skip", "fail"):
            repository = Path(tempfile.mkdtemp(prefix="faults-", dir=workdir))
            shutil.copytree(good, repository / "good")
            shutil.copytree(good, repository / "broken")
            breaks(repository / "broken")
            log_path = repository / "server.log"
            server = start_service(repository, "--load-failure", policy, log_path=log_path, wait=False)
            row = {"fault": fault, "policy": policy}
            try:
                row.update(_fault_outcome(server))
            finally:
                server.stop()
            print(f"  {fault:<22} {policy:<5} {row['verdict']}", flush=True)
            rows.append(row)
            shutil.rmtree(repository, ignore_errors=True)
    return rows


def _fault_outcome(server: ServiceProcess) -> dict:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            errors = [line for line in server.log().splitlines() if line.startswith("error:")]
            traceback = "Traceback" in server.log()
            return {
                "verdict": f"exit {server.process.returncode}: {errors[-1] if errors else 'no error line'}"
                + (" (traceback printed)" if traceback else ""),
            }
        try:
            ready = httpx.get(server.url + "/readyz", timeout=2)
        except httpx.TransportError:
            time.sleep(0.2)
            continue
        if ready.status_code == 200:
            body = ready.json()
            good = httpx.post(server.url + "/v1/models/good/classify", json={"inputs": ["fine"]}, timeout=10)
            broken = httpx.post(server.url + "/v1/models/broken/classify", json={"inputs": ["fine"]}, timeout=10)
            return {
                "verdict": f"serves good ({good.status_code}); broken reported failed "
                f"({'broken' in body.get('failed', [])}), its requests {broken.status_code} "
                f"{broken.json().get('error_type')}",
            }
        time.sleep(0.2)
    return {"verdict": "neither ready nor exited in 120 s"}


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The phase and its options; whatever follows `--` goes to `python -m service` as it is. (A positional list
    after the phase never got them: argparse fills both positionals at the phase, so it refused the flags.)"""
    own, server_args = (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="flags after -- go to python -m service (overload, mixed, hang, soak)",
    )
    parser.add_argument("phase", choices=["overload", "mixed", "soak", "faults", "hang", "all"])
    parser.add_argument(
        "--factor", default="3", help="overload: offered load / capacity (comma-separated for several, e.g. 1.5,3)"
    )
    parser.add_argument(
        "--shape",
        default=None,
        help=f"overload, mixed: request shapes, comma-separated ({', '.join(SHAPES)}; benchmarks.request_shapes); "
        "overload's default classify-1, mixed's classify-1,qa-long (two or more)",
    )
    parser.add_argument("--seconds", type=float, default=30.0, help="overload, hang: length of the open loop")
    parser.add_argument("--minutes", type=float, default=30.0, help="soak: length")
    parser.add_argument("--fraction", type=float, default=0.5, help="soak, hang: offered load / capacity")
    parser.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "bertserve-reliability")
    args = parser.parse_args(own)
    args.server_args = server_args
    if args.shape is None:
        args.shape = "classify-1,qa-long" if args.phase == "mixed" else "classify-1"
    unknown = [name for name in args.shape.split(",") if name not in SHAPES]
    if unknown:
        parser.error(f"unknown shape {', '.join(unknown)}: one of {', '.join(SHAPES)}")
    if args.phase == "mixed" and len(set(args.shape.split(","))) < 2:
        parser.error("mixed runs two shapes or more at once: --shape A,B")
    return args


def queue_bound(server_args: list[str]) -> float:
    """--max-queue-s as the server runs with it (its default where not given)."""
    if "--max-queue-s" in server_args:
        return float(server_args[server_args.index("--max-queue-s") + 1])
    return float(Settings.model_fields["max_queue_s"].default)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    args.workdir.mkdir(parents=True, exist_ok=True)
    report: dict = {}
    if args.phase in ("overload", "all"):
        rows = [
            overload(args.workdir, float(factor), args.seconds, args.server_args, shape)
            for shape in args.shape.split(",")
            for factor in args.factor.split(",")
        ]
        report["overload"] = rows
        print(json.dumps(rows, indent=2))
        print(overload_table(rows, queue_bound(args.server_args)))
        for warning in busy_rows(rows):
            print(warning)
    if args.phase == "mixed":
        factor = float(args.factor.split(",")[0])
        rows = mixed(args.workdir, factor, args.seconds, args.server_args, args.shape.split(","))
        report["mixed"] = rows
        print(json.dumps(rows, indent=2))
        print(mixed_table(rows, queue_bound(args.server_args)))
        for warning in busy_rows(rows):
            print(warning)
    if args.phase in ("faults", "all"):
        report["faults"] = faults(args.workdir)
    if args.phase in ("hang", "all"):
        report["hang"] = hang(args.workdir, args.fraction, args.seconds, args.server_args)
        print(json.dumps(report["hang"], indent=2))
    if args.phase in ("soak", "all"):
        report["soak"] = soak(args.workdir, args.minutes, args.fraction, args.server_args)
        print(json.dumps(report["soak"], indent=2))
    write_report("reliability", report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
