"""Loading the repository: placement of each model, and what happens when one of them cannot load."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import httpx
import numpy as np
import pytest

from bertcore.model_config import ModelConfig
from bertcore.tasks import classification
from service.engine.runtime import CPU, CUDA, choose_placement
from service.settings import Settings
from tests.service.conftest import run_service

VARIANTS = {"fp32": {}, "fp16": {}, "int8": {}}


@pytest.mark.parametrize(
    ("device", "available", "cpu_variant", "expected"),
    [
        ("auto", [CPU], "fp32", (CPU, "fp32", None)),
        ("auto", [CUDA, CPU], "fp32", (CUDA, "fp16", None)),
        ("cuda", [CUDA, CPU], "int8", (CUDA, "fp16", None)),
        ("cpu", [CUDA, CPU], "int8", (CPU, "int8", None)),
    ],
)
def test_placement(device: str, available: list[str], cpu_variant: str, expected: tuple) -> None:
    placement = choose_placement(Settings(device=device, cpu_variant=cpu_variant), VARIANTS, available)
    assert (placement.provider, placement.variant, placement.note) == expected


def test_cpu_variant_falls_back_to_fp32_when_the_entry_has_no_int8() -> None:
    placement = choose_placement(Settings(device="cpu", cpu_variant="int8"), {"fp32": {}}, [CPU])
    assert placement.variant == "fp32"


def measured(within_budget: bool) -> dict:
    return {
        "accuracy": {"measured": True, "loss_points": 0.2 if within_budget else 0.9, "within_budget": within_budget}
    }


@pytest.mark.parametrize(
    ("variants", "expected"),
    [
        ({"fp32": {}, "int8": measured(True), "int8-dynamic": measured(True)}, "int8"),
        ({"fp32": {}, "int8": measured(False)}, "fp32"),  # an entry written with a larger budget than it meets
        ({"fp32": {}, "int8": {"accuracy": {"measured": False, "reason": "no --eval data was given"}}}, "fp32"),
        ({"fp32": {}, "int8": {}}, "fp32"),  # written before accuracy was measured
        ({"fp32": {}, "int8-dynamic": measured(True)}, "fp32"),  # auto never picks the batch-dependent one
    ],
)
def test_auto_cpu_variant_is_int8_only_where_measured_within_budget(variants: dict, expected: str) -> None:
    assert Settings().cpu_variant == "auto"
    for device in ("cpu", "auto"):
        assert choose_placement(Settings(device=device), variants, [CPU]).variant == expected


def test_named_cpu_variant_is_served_as_asked() -> None:
    variants = {"fp32": {}, "int8": measured(False), "int8-dynamic": {}}
    assert choose_placement(Settings(cpu_variant="int8-dynamic"), variants, [CPU]).variant == "int8-dynamic"
    assert choose_placement(Settings(cpu_variant="int8"), variants, [CPU]).variant == "int8"


def test_classification_scores_follow_the_problem_type() -> None:
    logits = np.array([2.0, 0.0, -1.0], dtype=np.float32)
    single = classification.postprocess(logits, ["a", "b", "c"], "single_label_classification", None)
    assert [x["label"] for x in single] == ["a", "b", "c"] and abs(sum(x["score"] for x in single) - 1) < 1e-9
    multi = classification.postprocess(logits, ["a", "b", "c"], "multi_label_classification", 2)
    assert [round(x["score"], 4) for x in multi] == [0.8808, 0.5]


@pytest.fixture(scope="module")
def repository_with_a_broken_entry(tiny_repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    repository = tmp_path_factory.mktemp("broken-repository")
    shutil.copytree(tiny_repository / "bert-classification", repository / "good")
    shutil.copytree(tiny_repository / "bert-ner", repository / "broken")
    (repository / "broken" / "model.fp32.onnx").write_bytes(b"not an onnx graph")
    shutil.copytree(tiny_repository / "bert-qa", repository / "no-tokenizer")
    (repository / "no-tokenizer" / "tokenizer.json").unlink()  # the front-end's part fails, the engine's loads
    (repository / ".half-written.staging-x").mkdir()  # an export in progress: not an entry
    return repository


@pytest.mark.parametrize("mode", ["in-process", "process"])
def test_a_model_that_fails_to_load_is_reported_and_the_rest_served(
    repository_with_a_broken_entry, server_factory, mode: str
):
    server = server_factory(repository_with_a_broken_entry, "--engine-mode", mode, "--frontends", "1")
    with server.client() as client:
        ready = client.get("/readyz")
        assert ready.status_code == 200 and ready.json()["failed"] == ["broken", "no-tokenizer"]
        models = {m["name"]: m for m in client.get("/v1/models").json()["models"]}
        assert set(models) == {"good", "broken", "no-tokenizer"}
        assert models["broken"]["status"] == models["no-tokenizer"]["status"] == "failed"
        assert "Protobuf parsing failed" in models["broken"]["error"]
        assert "tokenizer.json" in models["no-tokenizer"]["error"]
        for failed in ("broken", "no-tokenizer"):
            assert str(repository_with_a_broken_entry) not in models[failed]["error"]
        for path, body in [
            ("/v1/models/broken/ner", {"inputs": ["x"]}),
            ("/v1/models/no-tokenizer/qa", {"inputs": [{"question": "q", "context": "c"}]}),
        ]:
            response = client.post(path, json=body)
            assert response.status_code == 503 and response.json()["error_type"] == "unavailable", response.text
        assert client.post("/v1/models/good/classify", json={"inputs": ["x"]}).status_code == 200
    assert "model broken failed to load" in server.log() and "model no-tokenizer failed to load" in server.log()
    # the front-end's own failure (the tokenizer) is logged as the API says it: its type once, not wrapped again
    reason = models["no-tokenizer"]["error"]
    assert f"model no-tokenizer failed to load: {reason}" in server.log()
    assert f"ValueError: {reason}" not in server.log()


def test_load_failure_fail_refuses_to_start(repository_with_a_broken_entry, server_factory) -> None:
    server = server_factory(repository_with_a_broken_entry, "--load-failure", "fail", wait_ready=False)
    assert server.process.wait(60) == 2  # as every other start-up error: one line that says why, no traceback
    assert re.search(r"^error: model (broken|no-tokenizer) failed to load", server.log(), re.MULTILINE)
    assert "Traceback" not in server.log()
    with pytest.raises(httpx.TransportError):
        httpx.get(server.url + "/livez", timeout=1)


def test_batch_budget_below_a_models_length_is_refused(tiny_repository: Path, tmp_path: Path) -> None:
    shutil.copytree(tiny_repository / "bert-qa", tmp_path / "long")
    config = json.loads((tmp_path / "long" / "model.json").read_text())
    (tmp_path / "long" / "model.json").write_text(json.dumps({**config, "max_length": 128}))
    done = run_service("--repository", str(tmp_path), "--max-batch-tokens", "100")
    assert done.returncode == 2
    assert done.stderr.strip() == (
        "error: max_batch_tokens (100) is below model long's max_length (128): a full-length input could never "
        "be batched"
    )


def test_cuda_that_cannot_start_falls_back_to_the_cpu_variant_and_says_so(tiny_repository: Path, monkeypatch):
    """onnxruntime-gpu lists the CUDA provider even on a machine without a GPU (the gpu image on a CPU host)."""
    from service.engine import runtime

    monkeypatch.setattr(runtime.ort, "get_available_providers", lambda: [CUDA, CPU])
    entry = tiny_repository / "bert-qa"
    model = runtime.ModelRuntime(entry, ModelConfig.read(entry), Settings(device="auto", cpu_variant="int8"))
    assert (model.provider, model.variant) == (CPU, "int8")
    assert model.placement.note.startswith("CUDAExecutionProvider could not start")
    rows = [runtime.Row(np.array([2, 7, 9, 3], dtype=np.int64), np.zeros(4, dtype=np.int64))]
    assert model.run(rows)[0]["start_logits"].shape == (4,)


def test_auto_serves_int8_measured_within_budget_and_lists_its_figures(
    tiny_checkpoint, tmp_path_factory: pytest.TempPathFactory, server_factory
) -> None:
    from export.pipeline import export_checkpoint
    from tests.tiny_models import CORPUS

    repository = tmp_path_factory.mktemp("measured-repository")
    data = repository.parent / "dev.tsv"
    data.write_text("".join(f"{text}\t{i % 3}\n" for i, text in enumerate(CORPUS)))
    source = str(tiny_checkpoint("bert", "classification"))
    export_checkpoint(source, "measured", repository, variants="fp32,int8", eval_path=data, max_accuracy_loss=100)
    export_checkpoint(source, "unmeasured", repository, variants="fp32,int8")
    # the default --cpu-variant is auto; not timed here (int8 where within budget): the timing is test_variant_trial's
    server = server_factory(repository, "--cpu-variant-trial-s", "0")
    with server.client() as client:
        models = {m["name"]: m for m in client.get("/v1/models").json()["models"]}
        single = client.post("/v1/models/measured/classify", json={"inputs": [CORPUS[0]]}).json()
        batched = client.post("/v1/models/measured/classify", json={"inputs": CORPUS[:6]}).json()
    measured = models["measured"]
    assert (measured["variant"], measured["provider"]) == ("int8", CPU)
    record = measured["variant_accuracy"]
    assert record["measured"] and record["within_budget"] and record["metric"] == "accuracy"
    assert set(record) >= {"scores", "loss_points", "agreement", "budget_points"}
    assert models["unmeasured"]["variant"] == "fp32"
    assert models["unmeasured"]["variant_accuracy"] == {"measured": False, "reason": "no --eval data was given"}
    assert single["results"][0] == batched["results"][0]  # static int8: the same scores alone and in a batch


def test_models_list_the_engines_shape_buckets(tiny_repository: Path, server_factory, tiny_server) -> None:
    """The engine counts the shapes it warmed and whether CUDA graphs are on; /v1/models says so (it used to drop
    the count, which the README promised)."""
    bucketed = server_factory(tiny_repository, "--models", "bert-classification", "--shape-buckets", "on")
    plain = {m["name"]: m for m in httpx.get(tiny_server.url + "/v1/models").json()["models"]}
    shapes = httpx.get(bucketed.url + "/v1/models").json()["models"][0]["shapes"]
    assert shapes["buckets"] > 1 and shapes["warmed"] == shapes["buckets"] and shapes["cuda_graphs"] is False
    assert plain["bert-classification"]["shapes"]["buckets"] == 0  # the CPU runs exact shapes by default
