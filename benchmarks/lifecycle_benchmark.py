"""Models swapped while serving: model A under closed-loop load while A is reloaded to a new export and model B is
loaded and unloaded, `--cycles` times, in each engine mode asked for (--model-control explicit).

A real server (`python -m service`) over the real MiniLM checkpoints in ../shared, exported once (fp32): A is SST-2
(classification), B CoNLL-2003 (NER). Each reload of A is a new export as the server sees one: the entry's files
copied into a staging folder with a new export time in model.json, then renamed into place as `python -m export`
does (a new version). Figures:

- every answer for A (`statuses`: all 200 is the goal), A's p50/p99 in a quiet baseline and during the swaps
  (`--clients` connections, 1-input requests, the same load);
- the time from a load call to its answer, which comes once the front-end serves the new version (session opened,
  warmed up, self-tested, traffic moved), for A's reloads and B's loads;
- RSS of the server and its child processes after the first cycle and after the last (after each cycle's unload
  of B and the close of A's old version), and their ratio (the goal: within 5%).

    python -m benchmarks.lifecycle_benchmark [--engine-modes in-process,process] [--cycles 10] [--clients 4]
        [--baseline-s 15]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import threading
import time
from pathlib import Path

import httpx

from benchmarks.loadclient import LoadResult, run_load
from benchmarks.memory_benchmark import rss_mb
from benchmarks.realdata import SHARED, shared_available, sst2
from export.pipeline import export_checkpoint
from export.quiet import quiet_libraries
from tests.harness.serving import start_service
from tests.service.lifecycle import publish

ADMIN_KEY = "benchmark-admin-key-0123456789"
ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}
WINDOW_S = 5.0


def sources(work: Path) -> Path:
    """The MiniLM SST-2 and CoNLL-2003 checkpoints exported once (fp32), as entries a and b of a source folder."""
    source = work / "source"
    for name, checkpoint in (("a", "minilm-bert-sst2"), ("b", "minilm-bert-conll03")):
        export_checkpoint(str(SHARED / "models" / checkpoint), name, source, variants="fp32")
    return source


def admin(url: str, path: str) -> tuple[float, httpx.Response]:
    started = time.perf_counter()
    response = httpx.post(url + path, headers=ADMIN, timeout=600)
    return time.perf_counter() - started, response


def run_mode(mode: str, source: Path, work: Path, args: argparse.Namespace) -> dict:
    repository = work / f"repository-{mode}"
    repository.mkdir()
    for name in ("a", "b"):
        publish(repository, name, source / name)
    keys = work / "admin.keys"
    keys.write_text(ADMIN_KEY + "\n")
    keys.chmod(0o600)
    log_path = work / f"server-{mode}.log"
    server = start_service(
        repository,
        *("--engine-mode", mode, "--model-control", "explicit", "--model", "a", "--admin-api-key-file", str(keys)),
        *args.server_args.split(),
        log_path=log_path,
    )
    bodies = [{"inputs": [text]} for text, _ in sst2(512)]
    path = "/v1/models/a/classify"
    try:
        run_load(server.url, path, bodies, [1] * len(bodies), args.clients, 3.0)  # warm the connections
        baseline = run_load(server.url, path, bodies, [1] * len(bodies), args.clients, args.baseline_s)
        reloads: list[float] = []
        loads: list[float] = []
        rss: list[float] = []
        failures: list[str] = []

        def swaps() -> None:
            for _ in range(args.cycles):
                publish(repository, "a", source / "a")
                seconds, response = admin(server.url, "/v2/repository/models/a/load")
                reloads.append(seconds)
                if response.status_code != 200:
                    failures.append(f"reload a: {response.status_code} {response.text}")
                seconds, response = admin(server.url, "/v2/repository/models/b/load")
                loads.append(seconds)
                if response.status_code != 200:
                    failures.append(f"load b: {response.status_code} {response.text}")
                _, response = admin(server.url, "/v2/repository/models/b/unload")
                if response.status_code != 200 or response.json()["state"] != "UNAVAILABLE":
                    failures.append(f"unload b: {response.status_code} {response.text}")
                time.sleep(1.0)  # A's old version closes once its last request is answered
                rss.append(rss_mb(server.process.pid))

        swapping = threading.Thread(target=swaps, daemon=True)
        started = time.perf_counter()
        swapping.start()
        windows = []
        while swapping.is_alive():  # the same load as the baseline, in windows, until the last cycle is done
            windows.append(run_load(server.url, path, bodies, [1] * len(bodies), args.clients, WINDOW_S))
        swapping.join()
        during = LoadResult.merge(windows)
        during.seconds = time.perf_counter() - started
        version = httpx.get(server.url + "/v1/models").json()["models"][0]["version"]
    finally:
        server.stop()
    return {
        "mode": mode,
        "baseline": baseline,
        "during": during,
        "reloads": reloads,
        "loads": loads,
        "rss": rss,
        "failures": failures,
        "version": version,
        "log": log_path,
    }


def report(results: list[dict], args: argparse.Namespace) -> None:
    print(f"\n{args.cycles} cycles (reload A to a new export, load B, unload B), {args.clients} clients on A, 1 input")
    header = (
        "| mode | A statuses during swaps | A p50 / p99 quiet (ms) | A p50 / p99 during swaps (ms) | A reload: "
        "call to serving, median / max (s) | B load, median / max (s) | RSS after cycle 1 / last (MiB) | ratio |"
    )
    print(header)
    print("|" + "---|" * header.count(" | ") + "---|")
    for r in results:
        base, during, rss = r["baseline"], r["during"], r["rss"]
        print(
            f"| {r['mode']} | {during.statuses} | {base.percentile_ms(0.5):.1f} / {base.percentile_ms(0.99):.1f} | "
            f"{during.percentile_ms(0.5):.1f} / {during.percentile_ms(0.99):.1f} | "
            f"{statistics.median(r['reloads']):.2f} / {max(r['reloads']):.2f} | "
            f"{statistics.median(r['loads']):.2f} / {max(r['loads']):.2f} | "
            f"{rss[0]:.0f} / {rss[-1]:.0f} | {rss[-1] / rss[0]:.3f} |"
        )
    for r in results:
        print(f"{r['mode']}: RSS after each cycle (MiB): {', '.join(f'{x:.0f}' for x in r['rss'])}")
        print(f"{r['mode']}: A requests quiet {r['baseline'].requests}, during swaps {r['during'].requests}")
        for failure in r["failures"]:
            print(f"{r['mode']}: FAILED {failure}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.lifecycle_benchmark", description=__doc__)
    parser.add_argument("--engine-modes", default="in-process,process")
    parser.add_argument("--cycles", type=int, default=10)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--baseline-s", type=float, default=15.0)
    parser.add_argument("--server-args", default="", help="more flags for the server")
    args = parser.parse_args(argv)
    if not shared_available():
        print(f"the MiniLM checkpoints are not in {SHARED}")
        return 2
    quiet_libraries()
    work = Path(tempfile.mkdtemp(prefix="bertserve-lifecycle-"))
    try:
        source = sources(work)
        results = [run_mode(mode, source, work, args) for mode in args.engine_modes.split(",")]
        report(results, args)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if all(not r["failures"] and set(r["during"].statuses) == {200} for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
