"""Every kustomization renders with `kubectl kustomize`, and every object is valid against the Kubernetes OpenAPI
schemas (kubernetes-validate's bundled copies, strict: unknown fields are errors) for the versions stated in the
README: the oldest and the newest supported. The custom resources (Prometheus Operator, KEDA, KServe) have no
schema there; the core types they embed (containers, HPA behaviour, label selectors) are validated as such, and
the PrometheusRule's rules by promtool (tests/deploy/test_alerts.py)."""

from __future__ import annotations

import importlib.resources
import json
from functools import cache

import jsonschema
import kubernetes_validate
import pytest
from referencing import Registry, Resource

from tests.deploy.manifests import EXPECTED, kustomizations

KUBERNETES_VERSIONS = ("1.30.0", "1.37.0")
CUSTOM_KINDS = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"),
    ("monitoring.coreos.com/v1", "PrometheusRule"),
    ("keda.sh/v1alpha1", "ScaledObject"),
    ("serving.kserve.io/v1beta1", "InferenceService"),
}
CORE = "io.k8s.api.core.v1."


@cache
def definitions(version: str) -> Registry:
    folder = importlib.resources.files("kubernetes_validate") / "kubernetes-json-schema" / f"v{version}-local-strict"
    return Resource.from_contents(json.loads((folder / "_definitions.json").read_text())) @ Registry()


def validate_as(value: object, definition: str, version: str) -> None:
    """`value` against one type of the API (e.g. io.k8s.api.core.v1.Container), strict."""
    schema = {"$ref": f"https://kubernetes.io/api/_definitions.json#/$defs/{definition}"}
    jsonschema.Draft202012Validator(schema, registry=definitions(version)).validate(value)


def embedded_parts(doc: dict) -> list[tuple[object, str]]:
    """The core types inside a custom resource, with their API type names."""
    spec = doc["spec"]
    if doc["kind"] == "InferenceService":
        predictor = spec["predictor"]
        return [(c, CORE + "Container") for c in predictor["containers"]]
    if doc["kind"] == "ScaledObject":
        behavior = spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
        return [(behavior, "io.k8s.api.autoscaling.v2.HorizontalPodAutoscalerBehavior")]
    if doc["kind"] == "ServiceMonitor":
        return [(spec["selector"], "io.k8s.apimachinery.pkg.apis.meta.v1.LabelSelector")]
    if doc["kind"] == "PrometheusRule":
        return []  # no core types inside; tests/deploy/test_alerts.py checks its rules with promtool
    raise AssertionError(doc["kind"])


def test_every_expected_kustomization_is_there() -> None:
    assert set(kustomizations()) == EXPECTED


@pytest.mark.parametrize("name", sorted(EXPECTED))
@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_renders_valid_objects(name: str, version: str, rendered: dict[str, list[dict]]) -> None:
    docs = rendered[name]
    assert docs, f"{name} rendered nothing"
    for doc in docs:
        where = f"{name}: {doc['kind']}/{doc['metadata']['name']}"
        # Every namespaced object names it: one without lands in whatever namespace kubectl's context has (an HPA
        # there scales nothing, a ServiceMonitor there watches nothing, a pod's claim there is never bound)
        expected_namespace = None if doc["kind"] == "Namespace" else "bertserve"
        assert doc["metadata"].get("namespace") == expected_namespace, where
        if (doc["apiVersion"], doc["kind"]) in CUSTOM_KINDS:
            for value, definition in embedded_parts(doc):
                try:
                    validate_as(value, definition, version)
                except jsonschema.ValidationError as error:
                    pytest.fail(f"{where}: {definition}: {error.message} at {list(error.absolute_path)}")
            continue
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as error:
            pytest.fail(f"{where}: {error.message} at {list(error.path)}")


def test_validation_catches_a_mistake(rendered: dict[str, list[dict]]) -> None:
    """The validation above can fail: a misspelt field and a wrong type are both refused."""
    (deployment,) = [doc for doc in rendered["base"] if doc["kind"] == "Deployment"]
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate({**deployment, "spec": {**deployment["spec"], "replica": 2}}, "1.37.0", True)
    with pytest.raises(jsonschema.ValidationError):
        validate_as({**container, "ports": [{"containerPort": "http"}]}, CORE + "Container", "1.37.0")
