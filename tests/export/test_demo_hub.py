"""`python -m export demo` from the hub, against a stand-in hub on 127.0.0.1 (tests/export/hub_standin.py) that
serves tiny real checkpoints under the default repository ids; and its fallback to the random demo, in one line.

The exports run in a subprocess: huggingface_hub reads HF_ENDPOINT and HF_HUB_OFFLINE when imported, and this
test process is offline (tests/conftest.py). Only that subprocess has HF_HUB_OFFLINE unset.
"""

from __future__ import annotations

import hashlib
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from export.cli import main
from export.demo_hub import HUB_CHECKPOINTS, HUB_TIMEOUT_S, hub_checkpoints, wanted_files
from export.errors import ExportError
from export.repository import read_config
from tests.export.hub_standin import StandInHub
from tests.harness.environment import online_env
from tests.harness.serving import free_port, start_service

ROOT = Path(__file__).resolve().parents[2]
# entry -> (architecture, task, tiny_checkpoint overrides) served under HUB_CHECKPOINTS[entry]; NER's repository
# has only the older pytorch_model.bin, the others safetensors and a decoy .bin that must not be fetched.
CELLS = {
    "demo-sentiment": ("distilbert", "classification", {"labels": ["NEGATIVE", "POSITIVE"]}),
    "demo-ner": ("bert", "ner", {"safe": False}),
    "demo-qa": ("distilbert", "qa", {}),
}
DECOYS = {"README.md": b"# a model card\n", ".gitattributes": b"*.bin filter=lfs\n", "tf_model.h5": b"decoy"}
SENTENCES = ["I loved every minute of it.", "What a dull, clumsy waste of two hours.", "The music and the city shine."]


def export_env(endpoint: str, home: Path) -> dict[str, str]:
    """This process's environment with the hub at `endpoint`, online, its cache in `home`."""
    env = online_env("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_TOKEN")
    # no telemetry: huggingface_hub would otherwise ask the hub for its agent registry, best effort
    quiet = {"HF_HUB_DISABLE_PROGRESS_BARS": "1", "HF_HUB_DISABLE_TELEMETRY": "1"}
    return {**env, "HF_ENDPOINT": endpoint, "HF_HOME": str(home), **quiet}


def run_demo(env: dict[str, str], repository: Path, *args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "export", "demo", "--repository", str(repository), "--variants", "fp32", *args]
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def hub_demo(tiny_checkpoint, tmp_path_factory: pytest.TempPathFactory):
    """The demo exported from the stand-in: (repository, the stand-in after it stopped, checkpoints, the run)."""
    served, checkpoints = tmp_path_factory.mktemp("served"), {}
    for name, (arch, task, overrides) in CELLS.items():
        checkpoints[name] = tiny_checkpoint(arch, task, **overrides)
        folder = served / name
        shutil.copytree(checkpoints[name], folder)
        for decoy, data in DECOYS.items():
            (folder / decoy).write_bytes(data)
        (folder / "onnx").mkdir()
        (folder / "onnx" / "model.onnx").write_bytes(b"decoy")
        if (folder / "model.safetensors").exists():
            (folder / "pytorch_model.bin").write_bytes(b"decoy")
    repository = tmp_path_factory.mktemp("hub-demo")
    with StandInHub({HUB_CHECKPOINTS[name]: served / name for name in CELLS}) as hub:
        started = time.perf_counter()
        run = run_demo(export_env(hub.url, tmp_path_factory.mktemp("hf-home")), repository)
        print(f"hub demo export: {time.perf_counter() - started:.1f} s")
    assert run.returncode == 0, run.stderr
    return repository, hub, checkpoints, run


def test_demo_exports_the_hub_checkpoints_and_fetches_only_what_it_reads(hub_demo) -> None:
    repository, hub, checkpoints, run = hub_demo
    assert "random-weight" not in run.stderr and f"asking {hub.url} for" in run.stderr
    for name, (arch, task, _) in CELLS.items():
        repo_id = HUB_CHECKPOINTS[name]
        commit = hub.repositories[repo_id].commit
        config = read_config(repository / name)
        assert config["demo"] is False and config["task"] == task and config["model_type"] == arch
        source = config["source"]
        assert source["kind"] == "hub" and source["checkpoint"] == repo_id and source["revision"] == commit
        assert source["url"] == f"{hub.url}/{repo_id}/tree/{commit}" and source["requested_revision"] is None
        assert f"exported {repo_id} -> {repository / name}" in run.stdout
        # config, tokenizer files and one set of weights: no model card, no other framework, no decoy .bin
        weights = "model.safetensors" if arch == "distilbert" else "pytorch_model.bin"
        expected = {p.name for p in checkpoints[name].iterdir() if p.name.startswith(("config", "tokenizer"))}
        assert hub.downloads(repo_id) == expected | {weights} == set(source["files"])
        served_weights = hub.repositories[repo_id].files[weights]
        assert source["weights"] == [{"file": weights, "sha256": hashlib.sha256(served_weights).hexdigest()}]
    # The model info (default branch), the tree at its commit and the files: the export itself asked nothing.
    api = sorted(path for _, path in hub.requests if path.startswith("/api/"))
    assert api == sorted(
        path
        for repo_id, served in hub.repositories.items()
        for path in (f"/api/models/{repo_id}", f"/api/models/{repo_id}/tree/{served.commit}")
    )


def test_served_answers_come_from_the_hub_weights(hub_demo, tmp_path: Path) -> None:
    repository, _, checkpoints, _ = hub_demo
    tokenizer = AutoTokenizer.from_pretrained(str(checkpoints["demo-sentiment"]))
    model = AutoModelForSequenceClassification.from_pretrained(str(checkpoints["demo-sentiment"])).eval()
    with torch.no_grad():
        probabilities = model(**tokenizer(SENTENCES, padding=True, return_tensors="pt")).logits.softmax(-1)
    expected = [(model.config.id2label[int(row.argmax())], float(row.max())) for row in probabilities]
    server = start_service(repository, log_path=tmp_path / "server.log")
    try:
        with server.client() as client:
            models = client.get("/v1/models").json()["models"]
            body = client.post("/v1/models/demo-sentiment/classify", json={"inputs": SENTENCES}).json()
    finally:
        server.stop()
    assert {m["name"]: m["demo"] for m in models} == dict.fromkeys(CELLS, False)
    answers = [(result[0]["label"], result[0]["score"]) for result in body["results"]]
    assert [label for label, _ in answers] == [label for label, _ in expected]
    assert [score for _, score in answers] == pytest.approx([score for _, score in expected], abs=1e-4)


def test_hub_down_builds_the_random_demo_and_says_so_in_one_line(tmp_path: Path) -> None:
    env = export_env(f"http://127.0.0.1:{free_port()}", tmp_path / "hf-home")  # nothing listens there
    started = time.perf_counter()
    run = run_demo(env, tmp_path / "models", "--quiet")
    print(f"random demo after a refused connection: {time.perf_counter() - started:.1f} s")
    assert run.returncode == 0, run.stderr
    notes = [line for line in run.stderr.splitlines() if "random-weight demo" in line]
    assert len(notes) == 1 and notes[0].startswith("note: hub unreachable (ConnectError: "), run.stderr
    assert "its answers are not meaningful" in notes[0] and "python -m export CHECKPOINT --name NAME" in notes[0]
    assert notes[0] == run.stderr.strip().splitlines()[-1]  # the last line, after the summaries
    for name in CELLS:
        config = read_config(tmp_path / "models" / name)
        assert config["demo"] is True and config["source"]["kind"] == "demo"

    # --source hub does not fall back: one error line, nothing written.
    run = run_demo(env, tmp_path / "strict", "--source", "hub", "--quiet")
    assert run.returncode == 1
    assert run.stderr.startswith("error: the demo checkpoints could not be fetched from the hub: hub unreachable")
    assert len(run.stderr.strip().splitlines()) == 1 and not (tmp_path / "strict").exists()


def test_a_silent_hub_is_given_up_on_after_the_timeout(tmp_path: Path) -> None:
    """A hub that accepts the connection and never answers: the model info times out after HUB_TIMEOUT_S."""
    with socket.create_server(("127.0.0.1", 0)) as silent:  # the kernel accepts; nobody reads or answers
        env = export_env(f"http://127.0.0.1:{silent.getsockname()[1]}", tmp_path / "hf-home")
        started = time.perf_counter()
        run = run_demo(env, tmp_path / "models", "--source", "hub", "--quiet")
        elapsed = time.perf_counter() - started
    print(f"--source hub against a silent hub: {elapsed:.1f} s")
    assert run.returncode == 1 and "hub unreachable" in run.stderr and "ReadTimeout" in run.stderr, run.stderr
    assert HUB_TIMEOUT_S <= elapsed < HUB_TIMEOUT_S + 40  # the timeout, the imports, a loaded machine; no retries


def test_offline_hub_source_is_refused_at_once(tmp_path: Path, capsys) -> None:
    # This process has HF_HUB_OFFLINE=1 and TRANSFORMERS_OFFLINE=1 (tests/conftest.py).
    assert main(["demo", "--repository", str(tmp_path), "--source", "hub", "--quiet"]) == 1
    assert (
        "could not be fetched from the hub: HF_HUB_OFFLINE and TRANSFORMERS_OFFLINE are set" in capsys.readouterr().err
    )
    assert not any(tmp_path.iterdir())
    assert main(["demo", "--repository", str(tmp_path), "--checkpoints", "demo-ner"]) == 1
    assert "'demo-ner' is not NAME=OWNER/REPO[@REVISION]" in capsys.readouterr().err
    assert main(["./ckpt", "--name", "x", "--repository", str(tmp_path), "--source", "hub"]) == 1
    assert "--source and --checkpoints are for `python -m export demo`" in capsys.readouterr().err


def test_checkpoint_overrides_and_the_files_fetched() -> None:
    chosen = {c.name: (c.repo_id, c.revision) for c in hub_checkpoints("demo-ner=me/ner@v2, extra=me/more")}
    assert chosen["demo-ner"] == ("me/ner", "v2") and chosen["extra"] == ("me/more", None)
    assert chosen["demo-qa"] == (HUB_CHECKPOINTS["demo-qa"], None)
    with pytest.raises(ExportError):
        hub_checkpoints("=me/ner")
    common = {"config.json", "tokenizer.json", "vocab.txt", "README.md", "onnx/model.onnx", "flax_model.msgpack"}
    both = common | {"model.safetensors", "pytorch_model.bin", "tf_model.h5"}
    assert wanted_files(both) == {"config.json", "tokenizer.json", "vocab.txt", "model.safetensors"}
    assert wanted_files(common | {"pytorch_model.bin"}) == {
        "config.json",
        "tokenizer.json",
        "vocab.txt",
        "pytorch_model.bin",
    }
    sharded = common | {
        "model.safetensors.index.json",
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
    }
    assert wanted_files(sharded) - common == sharded - common
