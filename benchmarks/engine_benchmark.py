"""The engine process at GPU speed on any machine: its session sleeps for as long as an H100 would compute.

What is measured is the engine's own work (frames, queue, batching, padding, the device thread) at the rate a
GPU would ask of it, without a GPU: every model session in a real engine process (`service.engine`, shape
buckets on, the GPU batch settings) is swapped for one that sleeps `--fixed-ms` + `--per-token-us` x padded
tokens per batch (defaults: BERT-base fp16 on an H100, fitted to the raw sorted ceiling and served batches:
1.2 ms + 0.375 us a token) and answers zeros. Client processes send pre-tokenized 16-row requests over the
engine's socket, as front-ends do, waiting `--think-ms` after each answer (the front-end's share of a request).
Row lengths are the 872 SST-2 sentences' (../shared), else a like spread.

Prints rows/s, request latency, batches/s, rows per batch, padded / real tokens, the share of the time batches
took (timed on the device thread; a checkout from before the device thread chained batches timed them from the
event loop, its waits included) and the engine's CPU, in cores and per request;
`--base-source DIR` measures another checkout's engine first, in the same run. Found with it: an engine that
waited for its event loop between batches managed 34-37k rows/s where the sleeping device allowed ~60k.

    python -m benchmarks.engine_benchmark                      # 12 connections x 6 requests in flight
    python -m benchmarks.engine_benchmark --in-flight 16 --base-source /path/to/old/checkout
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import multiprocessing
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks import sleeping_session
from benchmarks.loadclient import LoadResult
from benchmarks.process_cpu import ProcessTreeCpu
from benchmarks.realdata import SHARED, sst2
from benchmarks.reports import write_report
from benchmarks.scrape import delta, parse
from service.metrics import merged_exposition
from tests.harness.serving import ROOT

# Runs in the engine process, from the checkout measured, with benchmarks.sleeping_session copied beside it (so no
# import of this package): every session sleeps.
SLEEPING_ENGINE = f"""
import sys
from service.engine import server
from service.engine.core import EngineCore
from {sleeping_session.MODULE_NAME} import sleep_on_load
sleep_on_load(EngineCore, float(sys.argv[1]), float(sys.argv[2]))
sys.exit(server.main(["--socket", sys.argv[3]]))
"""


def row_lengths(seed: int = 0) -> tuple[list[int], str]:
    """Token counts of the SST-2 dev sentences with the MiniLM tokenizer, or a like spread where absent."""
    tokenizer = SHARED / "models" / "minilm-bert-sst2" / "tokenizer.json"
    if tokenizer.is_file() and (SHARED / "data" / "sst2" / "dev.tsv").is_file():
        from tokenizers import Tokenizer

        sentences = [sentence for sentence, _ in sst2()]
        return [len(e.ids) for e in Tokenizer.from_file(str(tokenizer)).encode_batch(sentences)], "SST-2 dev"
    rng = random.Random(seed)
    return [max(4, min(66, round(rng.gauss(25, 10)))) for _ in range(872)], "synthetic (no ../shared)"


def wire_of(source: Path) -> Any:
    """The measured checkout's own frames module (`service/wire/frames.py`; `service/protocol.py` before the
    re-layout), loaded under another name: the frames' format changes between checkouts, and a client of the engine
    must speak the one it measures."""
    found = [path for path in (source / "service/wire/frames.py", source / "service/protocol.py") if path.is_file()]
    if not found:
        raise SystemExit(f"no service/wire/frames.py (or service/protocol.py) in {source}")
    spec = importlib.util.spec_from_file_location(f"frames_of_{abs(hash(str(source)))}", found[0])
    if spec is None or spec.loader is None:
        raise SystemExit(f"cannot load {found[0]}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look themselves up there
    spec.loader.exec_module(module)
    return module


def client(
    source: Path, socket_path: str, model: str, lengths: list[int], args: dict, start_at: float, results
) -> None:
    """One client process: `connections` sockets, each with `in_flight` requests; counts rows answered in the
    measured window and each request's time."""
    import numpy as np

    from benchmarks.loadclient import LoadResult
    from service import errors

    protocol = wire_of(source)

    def status_of(frame: Any) -> int:
        """200 for a result; for an engine error, the status a front-end would answer it with."""
        if frame.header["op"] == "result":
            return 200
        kind = getattr(errors, str(frame.header.get("kind")), errors.InferenceFailed)
        return int(kind.status_code)

    async def connection(rng: random.Random, window: tuple[float, float], tally: LoadResult) -> None:
        reader, stream = await asyncio.open_unix_connection(socket_path)
        writer, pending = protocol.FrameWriter(stream), {}

        async def read() -> None:
            while True:
                frame = await protocol.read_frame(reader)
                future = pending.pop(frame.header.get("id"), None)
                if future is not None:
                    future.set_result(frame)

        reading = asyncio.create_task(read())

        async def requester(ids: range) -> None:
            for request_id in ids:
                if time.monotonic() >= window[1]:
                    return
                sizes = [rng.choice(lengths) for _ in range(args["rows"])]
                arrays = protocol.pack_rows(
                    [np.full(n, 1000, np.int64) for n in sizes], [np.zeros(n, np.int64) for n in sizes]
                )
                future = asyncio.get_running_loop().create_future()
                pending[request_id] = future
                header = {"op": "infer", "id": request_id, "model": model, "timeout": 30.0, "lengths": sizes}
                sent = time.monotonic()
                writer.write(protocol.encode(header, arrays))
                frame = await future
                if window[0] <= sent and time.monotonic() < window[1]:
                    status = status_of(frame)
                    tally.latencies.append(time.monotonic() - sent)
                    tally.requests += 1
                    tally.sequences += args["rows"] if status == 200 else 0
                    tally.statuses[status] = tally.statuses.get(status, 0) + 1
                await asyncio.sleep(args["think_ms"] / 1000)

        step = 10**7
        await asyncio.gather(*(requester(range(k * step, (k + 1) * step)) for k in range(args["in_flight"])))
        reading.cancel()
        stream.close()

    async def main() -> LoadResult:
        rng = random.Random(os.getpid())
        tally = LoadResult(seconds=args["seconds"])
        await asyncio.sleep(max(0.0, start_at - time.time()))
        now = time.monotonic()
        window = (now + args["warmup_s"], now + args["warmup_s"] + args["seconds"])
        await asyncio.gather(*(connection(rng, window, tally) for _ in range(args["connections"])))
        return tally

    import uvloop

    results.put(uvloop.run(main()))


def wait_ready(source: Path, socket_path: Path, process: subprocess.Popen, timeout: float = 120.0) -> None:
    """Until the engine says its models are warmed up."""
    protocol = wire_of(source)

    async def ready() -> bool:
        try:
            reader, stream = await asyncio.open_unix_connection(str(socket_path))
        except OSError:
            return False
        try:
            while True:
                frame = await asyncio.wait_for(protocol.read_frame(reader), 1.0)
                if frame.header.get("op") == "state" and frame.header.get("ready"):
                    return True
        except (TimeoutError, asyncio.IncompleteReadError):
            return False
        finally:
            stream.close()

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the engine exited with {process.returncode}")
        if asyncio.run(ready()):
            return
        time.sleep(0.2)
    raise RuntimeError(f"the engine was not ready in {timeout:.0f} s")


def measure(source: Path, args: argparse.Namespace, lengths: list[int]) -> dict:
    """One engine from `source`, loaded by the clients; the figures of its measured window."""
    if not (args.repository / args.model / "model.json").is_file():
        raise SystemExit(
            f"no model {args.model!r} in {args.repository}: `make demo` builds the demo repository, or pass "
            "--repository and --model"
        )
    with tempfile.TemporaryDirectory(prefix="engine-bench-") as workdir:
        socket_path, metrics_dir = Path(workdir) / "engine.sock", Path(workdir) / "metrics"
        metrics_dir.mkdir()
        env = {
            **os.environ,
            "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir),
            "BERTSERVE_REPOSITORY": str(args.repository.resolve()),
            "BERTSERVE_MODELS": json.dumps([args.model]),
            "BERTSERVE_DEVICE": "cpu",
            "BERTSERVE_SHAPE_BUCKETS": "on",
            "BERTSERVE_CPU_STREAMS": "1",  # a GPU runs one batch at a time (checkouts before streams ignore it)
            "BERTSERVE_MAX_BATCH_SIZE": str(args.max_batch_size),
            "BERTSERVE_MAX_BATCH_TOKENS": str(args.max_batch_tokens),
            # --max-queue-rows at its default (32 full batches); older checkouts refuse past 2,048 rows queued (429s)
            "BERTSERVE_LOG_LEVEL": "warning",
            "PYTHONPATH": str(sleeping_session.copy_beside(Path(workdir) / "site").parent),
        }
        command = [sys.executable, "-c", SLEEPING_ENGINE, str(args.fixed_ms / 1000), str(args.per_token_us / 1e6)]
        engine = subprocess.Popen([*command, str(socket_path)], cwd=source, env=env)
        try:
            wait_ready(source, socket_path, engine)
            options = {k: getattr(args, k) for k in ("connections", "in_flight", "rows", "think_ms", "seconds")}
            options["warmup_s"] = args.warmup_seconds
            context = multiprocessing.get_context("spawn")
            results = context.Queue()
            start_at = time.time() + 1.0  # every client process starts its load at once
            clients = [
                context.Process(
                    target=client, args=(source, str(socket_path), args.model, lengths, options, start_at, results)
                )
                for _ in range(args.client_procs)
            ]
            for process in clients:
                process.start()
            time.sleep(max(0.0, start_at - time.time()) + args.warmup_seconds)
            before = _engine_metrics(metrics_dir)
            with ProcessTreeCpu(engine.pid) as cpu:
                time.sleep(args.seconds)
            after = _engine_metrics(metrics_dir)
            tallies = [results.get(timeout=args.seconds + 60) for _ in clients]
            for process in clients:
                process.join(10)
        finally:
            engine.terminate()
            engine.wait(30)
    return _figures(tallies, before, after, args.seconds, cpu.summary())


def _engine_metrics(directory: Path) -> dict[str, float]:
    return parse(merged_exposition(str(directory)).decode())


def _figures(tallies: list[LoadResult], before: dict, after: dict, seconds: float, cpu: dict | None) -> dict:
    load = LoadResult.merge(tallies)
    batches = delta(before, after, "bertserve_batch_size_count") or 0
    rows = delta(before, after, "bertserve_batch_size_sum") or 0
    padded = delta(before, after, "bertserve_batch_padded_tokens_total") or 0
    real = delta(before, after, "bertserve_batch_real_tokens_total") or 0
    busy = delta(before, after, "bertserve_inference_duration_seconds_sum") or 0
    cores = (cpu or {}).get("engine", {}).get("cores")
    requests_per_s = load.requests / seconds
    return {
        "rows_per_s": round(load.sequences_per_s),
        "statuses": load.statuses,
        "p50_ms": round(load.percentile_ms(0.5), 1),
        "p99_ms": round(load.percentile_ms(0.99), 1),
        "batches_per_s": round(batches / seconds, 1),
        "rows_per_batch": round(rows / batches, 1) if batches else None,
        "padded_per_real_token": round(padded / real, 2) if real else None,
        "batch_time_share": round(busy / seconds, 2),
        "engine_cpu_cores": cores,
        # the engine's own work per request (frames, queue, batching, padding; the sleeping device costs none)
        "engine_cpu_us_per_request": round(cores / requests_per_s * 1e6) if cores and requests_per_s else None,
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repository", type=Path, default=ROOT / "models", help="model repository")
    parser.add_argument("--model", default="demo-sentiment", help="entry to serve (its outputs' shapes are kept)")
    parser.add_argument("--fixed-ms", type=float, default=1.2, help="the sleeping device: milliseconds per batch")
    parser.add_argument("--per-token-us", type=float, default=0.375, help="... plus microseconds per padded token")
    parser.add_argument("--connections", type=int, default=12, help="sockets per client process, as front-ends")
    parser.add_argument("--in-flight", type=int, default=6, help="requests in flight per connection")
    parser.add_argument("--rows", type=int, default=16, help="rows per request")
    parser.add_argument("--think-ms", type=float, default=10.0, help="wait after an answer (the front-end's share)")
    parser.add_argument("--client-procs", type=int, default=1)
    parser.add_argument("--max-batch-size", type=int, default=256)
    parser.add_argument("--max-batch-tokens", type=int, default=16384)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--warmup-seconds", type=float, default=2.0)
    parser.add_argument("--base-source", type=Path, help="another checkout whose engine is measured first")
    parser.add_argument("--report", type=Path, help="JSON report (default reports/engine_benchmark.json)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    lengths, where = row_lengths()
    print(f"row lengths: {where}, mean {sum(lengths) / len(lengths):.1f} tokens", flush=True)
    sources = [("base", args.base_source.resolve())] if args.base_source else []
    report: dict = {"settings": {k: str(v) for k, v in vars(args).items()}, "lengths": where, "runs": {}}
    for label, source in [*sources, ("this checkout", ROOT)]:
        figures = measure(source, args, lengths)
        report["runs"][label] = figures
        print(f"{label} ({source}): {json.dumps(figures)}", flush=True)
    write_report("engine_benchmark", report, args.report)


if __name__ == "__main__":
    main()
