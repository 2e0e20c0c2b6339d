"""The CUDA paths, run on a GPU (`make test-gpu`; skipped with the reason where onnxruntime has no CUDA provider).

- fp16 sessions on CUDA for the three tasks against fp32 on the CPU, through real servers, on the shared data: SST-2
  dev labels all equal, CoNLL-2003 entities >= 99% in agreement, SQuAD answer spans >= 99% equal;
- CUDA graphs on and off give the same outputs; every shape bucket is warmed before ready;
- process mode on CUDA; and every test asserts the provider that served (CUDA, with nodes on it).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from bertcore.model_config import ModelConfig
from bertcore.rows import Row
from tests.gpu.conftest import CUDA, REQUIRED

pytestmark = pytest.mark.gpu

TASKS = ("classification", "ner", "qa")
SQUAD_QUESTIONS = 1000
GRID = {"shape_buckets": "on", "max_batch_size": 16, "max_batch_tokens": 1024, "bucket_width_step": 16}


@pytest.fixture(scope="module")
def tiny_fp16(tiny_checkpoint, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny BERT per task, exported fp32 and fp16."""
    from export.pipeline import export_checkpoint

    repository = tmp_path_factory.mktemp("gpu-tiny")
    for task in TASKS:
        export_checkpoint(str(tiny_checkpoint("bert", task)), f"bert-{task}", repository, variants="fp32,fp16")
    return repository


def cuda_runtime(entry: Path, **settings: object):
    from service.engine.runtime import ModelRuntime
    from service.settings import Settings

    runtime = ModelRuntime(entry, ModelConfig.read(entry), Settings(device="cuda", **settings))
    assert runtime.provider == CUDA and runtime.variant == "fp16"
    report = runtime.placement_report()
    assert report["reason"] == "requested" and report["nodes"].get(CUDA, 0) > 0, report
    return runtime


def random_rows(count: int, seed: int, max_length: int = 60) -> list[Row]:
    generator = np.random.default_rng(seed)
    rows = []
    for _ in range(count):
        n = int(generator.integers(3, max_length))
        rows.append(Row(generator.integers(5, 90, n).astype(np.int64), np.zeros(n, dtype=np.int64)))
    return rows


@pytest.mark.parametrize("task", TASKS)
def test_cuda_graphs_on_and_off_give_the_same_outputs(tiny_fp16: Path, task: str) -> None:
    entry = tiny_fp16 / f"bert-{task}"
    graphs = cuda_runtime(entry, cuda_graphs="on", **GRID)
    plain = cuda_runtime(entry, cuda_graphs="off", **GRID)
    assert graphs.graphs is not None and graphs.graphs_note is None  # captured, not dropped
    assert plain.graphs is None
    assert graphs.warm_up() == plain.warm_up() == len(graphs.warm_up_shapes())
    assert graphs.graphs is not None, graphs.graphs_note  # the capture at warm-up held
    for seed, count in enumerate((1, 3, 7, 16, 5)):
        rows = random_rows(count, seed)
        for want, got in zip(plain.run(rows), graphs.run(rows), strict=True):
            for name in want:
                np.testing.assert_allclose(got[name], want[name], atol=1e-3, rtol=1e-3)


def test_every_bucket_is_warmed_before_ready_on_cuda(tiny_fp16: Path) -> None:
    from service.engine.core import EngineCore
    from service.metrics import Metrics
    from service.settings import Settings
    from service.wire.ticket import Ticket

    settings = Settings(device="cuda", repository=tiny_fp16, models=["bert-ner"], cuda_graphs="on", **GRID)
    core = EngineCore(settings, Metrics())
    core.load()
    runtime = core.models["bert-ner"].runtime
    assert runtime is not None and runtime.grid is not None and runtime.provider == CUDA
    shapes: list[tuple[int, int]] = []
    execute = runtime.execute

    def recording(batch):
        shapes.append(batch.shape)
        return execute(batch)

    runtime.execute = recording  # type: ignore[method-assign]

    async def scenario() -> None:
        core.start()
        try:
            await core.warm_up()
            state = core.models["bert-ner"].state()
            assert state["status"] == "ready" and state["warmed_shapes"] == len(runtime.grid.shapes)
            assert set(shapes) == set(runtime.grid.shapes) and state["cuda_graphs"]
            warmed = set(shapes)
            shapes.clear()
            rng = random.Random(3)
            requests = [random_rows(rng.randint(1, 8), seed) for seed in range(30)]
            await asyncio.gather(*(core.infer("bert-ner", r, Ticket.with_timeout(30)) for r in requests))
            assert shapes and set(shapes) <= warmed
        finally:
            await core.stop()

    asyncio.run(scenario())


@pytest.fixture(scope="module")
def real_fp16(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The three real MiniLM checkpoints of the shared folder (BERTSERVE_SHARED), exported fp32 and fp16."""
    from benchmarks.evaluate_served import MODELS
    from benchmarks.realdata import SHARED, shared_available
    from export.pipeline import export_checkpoint

    if not shared_available():
        message = f"no shared checkpoints and data at {SHARED} (set BERTSERVE_SHARED; docs/gpu.md)"
        if REQUIRED:
            pytest.fail(message)
        pytest.skip(message)
    repository = tmp_path_factory.mktemp("gpu-real")
    for name in MODELS.values():
        export_checkpoint(str(SHARED / "models" / name), name, repository, variants="fp32,fp16")
    return repository


def serve(repository: Path, log: Path, *args: str):
    from tests.harness.serving import start_service

    return start_service(repository, "--log-level", "info", "--access-log", "off", *args, log_path=log)


@pytest.fixture(scope="module")
def cuda_server(real_fp16: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator:
    """fp16 on CUDA in process mode: an engine process and front-ends (what --device auto picks on a GPU)."""
    server = serve(
        real_fp16,
        tmp_path_factory.mktemp("gpu-logs") / "cuda.log",
        *("--device", "cuda", "--engine-mode", "process", "--frontends", "4"),
        *("--max-batch-size", "64", "--max-batch-tokens", "16384"),
    )
    try:
        yield server
    finally:
        server.stop()


def test_process_mode_serves_every_model_on_cuda(cuda_server) -> None:
    models = httpx.get(cuda_server.url + "/v1/models", timeout=30).json()["models"]
    assert len(models) == 3
    for model in models:
        assert (model["status"], model["provider"], model["variant"]) == ("ready", CUDA, "fp16"), model
        placement = model["placement"]
        assert placement["reason"] == "requested" and placement["nodes"][CUDA] > 0, placement
        assert model["note"] is None
    exposition = httpx.get(cuda_server.url + "/metrics", timeout=30).text
    assert 'provider="CUDAExecutionProvider",reason="requested"' in exposition
    assert "engine started" in cuda_server.log() and "CUDAExecutionProvider (fp16)" in cuda_server.log()
    print("\n" + "\n".join(f"{m['name']}: {m['placement']}" for m in models))


def test_fp16_on_cuda_answers_as_fp32_on_the_cpu_on_the_shared_data(
    cuda_server, real_fp16: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    from benchmarks.served_agreement import agreement, record

    tasks = ["sst2", "conll03", "squad"]
    cpu = serve(real_fp16, tmp_path_factory.mktemp("cpu-logs") / "cpu.log", "--device", "cpu", "--cpu-variant", "fp32")
    try:
        for model in httpx.get(cpu.url + "/v1/models", timeout=30).json()["models"]:
            assert (model["provider"], model["variant"]) == ("CPUExecutionProvider", "fp32"), model
        reference = record(cpu.url, tasks, SQUAD_QUESTIONS)
    finally:
        cpu.stop()
    got = record(cuda_server.url, tasks, SQUAD_QUESTIONS)
    report = agreement(got, reference)
    print(f"\nfp16 on CUDA against fp32 on the CPU: {report}")
    assert report["sst2"]["inputs"] == 872 and report["sst2"]["agreement"] == 1.0, report
    assert report["conll03"]["sentences"] == 3453 and report["conll03"]["agreement"] >= 0.99, report
    assert report["squad"]["inputs"] == SQUAD_QUESTIONS and report["squad"]["agreement"] >= 0.99, report
