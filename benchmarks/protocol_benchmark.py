"""The protocols side by side on one server: native REST, the Open Inference Protocol v2 over REST and over gRPC, on the
real MiniLM SST-2 checkpoint (exported fp32, as serve_benchmark does) and the SST-2 dev sentences; 1-input and
16-input requests, concurrent keep-alive clients at saturation, every adapter back to back in each round, the rounds
interleaved so that a slow spell of the shared machine falls on all of them alike.

    python -m benchmarks.protocol_benchmark [--seconds 10] [--rounds 3] [--clients-1 8] [--clients-16 3]

An adapter is one entry of ADAPTERS: how a list of texts becomes one request (a JSON body for a path, or a gRPC
message), so another protocol (say the Hugging Face task route, POST /v1/models/{name} with {"inputs": [...]}) is
one more entry. Clients and server share this machine's cores: each figure includes its client's CPU cost.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.loadclient import LoadResult, run_load
from benchmarks.realdata import SHARED, shared_available, sst2
from benchmarks.reports import write_report
from export.pipeline import export_checkpoint
from export.quiet import quiet_libraries
from tests.harness.serving import free_port, start_service

MODEL = "minilm-bert-sst2"
GRPC_INFER = "/inference.GRPCInferenceService/ModelInfer"


@dataclass(frozen=True)
class Adapter:
    name: str
    transport: str  # "http": `request` gives a JSON body for `path`; "grpc": a serialized ModelInferRequest
    request: Callable[[list[str]], Any]
    path: str = ""


def oip_json(texts: list[str]) -> dict:
    return {"inputs": [{"name": "text", "shape": [len(texts)], "datatype": "BYTES", "data": texts}]}


def oip_grpc(texts: list[str]) -> bytes:
    """As tritonclient.grpc sends it: the BYTES tensor in raw_input_contents."""
    from service.frontend.grpc import inference_pb2 as pb

    request = pb.ModelInferRequest(model_name=MODEL)
    request.inputs.add(name="text", datatype="BYTES", shape=[len(texts)])
    raw = b"".join(struct.pack("<I", len(t.encode())) + t.encode() for t in texts)
    request.raw_input_contents.append(raw)
    return request.SerializeToString()


ADAPTERS = [
    Adapter("native REST", "http", lambda texts: {"inputs": texts}, f"/v1/models/{MODEL}/classify"),
    Adapter("OIP v2 REST", "http", oip_json, f"/v2/models/{MODEL}/infer"),
    Adapter("OIP v2 gRPC", "grpc", oip_grpc),
    # Adapter("HF task REST", "http", lambda texts: {"inputs": texts}, f"/v1/models/{MODEL}"),
]


def grpc_load(target: str, messages: list[bytes], sizes: list[int], clients: int, seconds: float) -> LoadResult:
    """`clients` channels, each sending the next message as soon as its last answer came, for `seconds`."""
    import grpc

    async def main() -> LoadResult:
        result = LoadResult(seconds=seconds)
        deadline = time.perf_counter() + seconds
        counter = iter(range(10**12))

        async def worker() -> None:
            async with grpc.aio.insecure_channel(target) as channel:
                call = channel.unary_unary(GRPC_INFER)  # bytes in, bytes out
                while time.perf_counter() < deadline:
                    i = next(counter) % len(messages)
                    started = time.perf_counter()
                    try:
                        await call(messages[i], timeout=60)
                        status = 200
                    except grpc.aio.AioRpcError as exc:
                        status = exc.code().value[0]
                    result.latencies.append(time.perf_counter() - started)
                    result.statuses[status] = result.statuses.get(status, 0) + 1
                    result.requests += 1
                    result.sequences += sizes[i] if status == 200 else 0

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(clients)))
        result.seconds = time.perf_counter() - started
        return result

    return asyncio.run(main())


def measure(adapter: Adapter, url: str, grpc_target: str, batches: list[list[str]], clients: int, seconds: float):
    requests = [adapter.request(batch) for batch in batches]
    sizes = [len(batch) for batch in batches]
    if adapter.transport == "grpc":
        return grpc_load(grpc_target, requests, sizes, clients, seconds)
    return run_load(url, adapter.path, requests, sizes, clients, seconds)


def combined(rounds: list[LoadResult]) -> LoadResult:
    """One adapter's rounds as one run: their requests over the sum of their times."""
    merged = LoadResult.merge(rounds)
    merged.seconds = sum(r.seconds for r in rounds)
    return merged


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="per adapter, request size and round")
    parser.add_argument("--rounds", type=int, default=3)
    # fewer than serve_benchmark's 16 and 6: enough to keep 2 shared cores busy without the admission bound refusing
    # a share of the requests (refused requests cost each protocol differently, and say nothing of its throughput)
    parser.add_argument("--clients-1", type=int, default=8, help="connections for 1-input requests")
    parser.add_argument("--clients-16", type=int, default=3, help="connections for 16-input requests")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/bertserve-protocol-bench"))
    # a wide admission bound: the figures are the protocols' cost, not how each answers a refusal (429 closes the
    # connection; RESOURCE_EXHAUSTED does not), which a slow shared machine would otherwise make them
    parser.add_argument("--server-args", default="--max-queue-s 10", help="settings for python -m service")
    args = parser.parse_args()
    if not shared_available():
        raise SystemExit("../shared is absent: the real checkpoints and data are needed")
    quiet_libraries()
    repository = args.workdir / "models"
    if not (repository / MODEL / "model.fp32.onnx").is_file():
        export_checkpoint(str(SHARED / "models" / MODEL), MODEL, repository, variants="fp32")
    sentences = [s for s, _ in sst2()]
    shapes = {
        "1 input": ([[s] for s in sentences], args.clients_1),
        "16 inputs": ([sentences[i : i + 16] for i in range(0, len(sentences) - 15, 16)], args.clients_16),
    }
    grpc_port = free_port()
    server = start_service(
        repository, "--log-level", "warning", "--access-log", "off", "--cpu-variant", "fp32",
        "--grpc-port", str(grpc_port),
        *args.server_args.split(),
    )  # fmt: skip
    grpc_target = f"127.0.0.1:{grpc_port}"
    runs: dict[tuple[str, str], list[LoadResult]] = {}
    try:
        for round_number in range(args.rounds):
            for shape, (batches, clients) in shapes.items():
                for adapter in ADAPTERS:
                    measure(adapter, server.url, grpc_target, batches, clients, 2.0)  # warm-up
                    result = measure(adapter, server.url, grpc_target, batches, clients, args.seconds)
                    runs.setdefault((shape, adapter.name), []).append(result)
                    print(f"round {round_number + 1} {shape} {adapter.name}: {result.summary()}", flush=True)
    finally:
        server.stop()

    report: dict = {"cores": os.cpu_count(), "seconds": args.seconds, "rounds": args.rounds, "rows": []}
    print("\n| request | protocol | clients | sequences/s | vs native | p50 ms | p99 ms | non-200 |")
    print("|---|---|---|---|---|---|---|---|")
    for shape, (_, clients) in shapes.items():
        native = combined(runs[(shape, ADAPTERS[0].name)]).sequences_per_s
        for adapter in ADAPTERS:
            merged = combined(runs[(shape, adapter.name)])
            summary = merged.summary()
            failed = sum(count for status, count in merged.statuses.items() if status != 200)
            ratio = merged.sequences_per_s / native if native else float("nan")
            print(
                f"| {shape} | {adapter.name} | {clients} | {summary['sequences_per_s']} | {ratio:.1%} | "
                f"{summary['p50_ms']} | {summary['p99_ms']} | {failed} |"
            )
            report["rows"].append({"request": shape, "protocol": adapter.name, "clients": clients, **summary})
    write_report("protocol_benchmark", report)


if __name__ == "__main__":
    main()
