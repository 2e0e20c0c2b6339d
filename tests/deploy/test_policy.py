"""What the rendered objects must agree on with the server, the images and each other. The server is real (started
with the base's settings), and so are its /metrics series and, where Debian's prometheus is installed, the
autoscalers' PromQL evaluated by a real Prometheus scraping it."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import grpc
import httpx
import yaml
from grpc_health.v1 import health_pb2, health_pb2_grpc

from benchmarks.autoscale_simulation import CANDIDATES, HpaSpec
from benchmarks.scrape import scrape
from service.frontend.grpc.health import LIVENESS
from service.settings import Settings
from service.supervisor.launcher import ENGINE_STOP_S, FRONTEND_STOP_EXTRA_S
from tests.deploy.manifests import (
    KUBERNETES,
    ROOT,
    containers,
    dockerfile_targets,
    environment,
    of_kind,
    pod_specs,
    quantity,
    serving_container,
)
from tests.harness.serving import ServiceProcess, free_port, start_service
from tests.prometheus_server import log_tail, needs_prometheus, query, running_prometheus, wait_for

ADAPTER_RULES = KUBERNETES / "overlays" / "autoscaling" / "prometheus-adapter-rules.yaml"
SERVING_TARGETS = {"cpu", "gpu", "demo"}
# The series labels the Prometheus Operator gives a pod's samples (ServiceMonitor), which the queries select on.
TARGET_LABELS = {"namespace": "bertserve", "pod": "bertserve-7d9f-abcde", "service": "bertserve"}


def every_pod(rendered: dict[str, list[dict]]):
    for name, docs in rendered.items():
        for owner, pod in pod_specs(docs):
            yield name, docs, owner, pod


def image_tag(image: str) -> str:
    repository, _, tag = image.rpartition(":")
    assert repository.rsplit("/", 1)[-1] == "bertserve", image
    return tag


def pre_stop_sleep_s(container: dict) -> float:
    command = container.get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command", [])
    return float(command[1]) if command[:1] == ["sleep"] else 0.0


def metric_names(promql: str) -> set[str]:
    return set(re.findall(r"\bbertserve_[a-z_]+", promql))


def adapter_rule() -> dict:
    (rule,) = yaml.safe_load(ADAPTER_RULES.read_text())["rules"]
    return rule


def adapter_query(rule: dict, namespace: str, pods: list[str]) -> str:
    """The rule's metricsQuery as prometheus-adapter expands it for one namespace's pods."""
    (series,) = metric_names(rule["seriesQuery"])
    matchers = f'namespace="{namespace}",pod=~"{"|".join(pods)}"'
    return (
        rule["metricsQuery"]
        .replace("<<.Series>>", series)
        .replace("<<.LabelMatchers>>", matchers)
        .replace("<<.GroupBy>>", "pod")
    )


def only(docs: list[dict], kind: str) -> dict:
    (doc,) = of_kind(docs, kind)
    return doc


# --- probes and ports -----------------------------------------------------------------------------------------
def test_probes_use_paths_the_server_answers_on_its_own_port(
    rendered, deploy_server: ServiceProcess, deploy_probe_port: int
) -> None:
    served = {path: httpx.get(deploy_server.url + path, timeout=10).status_code for path in ("/livez", "/readyz")}
    assert served == {"/livez": 200, "/readyz": 200}
    on_probe_port = {
        path: httpx.get(f"http://127.0.0.1:{deploy_probe_port}{path}", timeout=10).status_code
        for path in ("/livez", "/readyz")
    }
    assert on_probe_port == served
    for name, docs, owner, pod in every_pod(rendered):
        server = serving_container(pod)
        env = environment(server, docs)
        port, probe_port = int(env["BERTSERVE_PORT"]), int(env.get("BERTSERVE_PROBE_PORT", "0"))
        ports = {p["containerPort"]: p.get("name") for p in server["ports"]}
        if grpc_port := int(env.get("BERTSERVE_GRPC_PORT", "0")):
            # KServe's v2 variant: Knative routes one port, gRPC's (h2c), and readiness is asked there by the
            # kubelet's native gRPC probe (grpc.health.v1, the whole server); liveness too, for its own service
            # name (Knative sends every probe of the serving container to its one port: HTTP's would fail there)
            assert ports == {grpc_port: "h2c"}, (name, owner)
            assert server["readinessProbe"]["grpc"] == {"port": grpc_port}, (name, owner)
            assert server["livenessProbe"]["grpc"] == {"port": grpc_port, "service": LIVENESS}, (name, owner)
            ports = {port: None}
        else:
            assert server["readinessProbe"]["httpGet"]["path"] == "/readyz", (name, owner)
            # Liveness must not follow readiness: a draining or loading pod is alive.
            assert server["livenessProbe"]["httpGet"]["path"] == "/livez", (name, owner)
        assert list(ports) == [port, *([probe_port] if probe_port else [])], (name, owner)
        # the kubelet asks the probe port where there is one (a thread answers it, fast under any load)
        probed = probe_port or port
        if "startupProbe" in server:
            assert server["startupProbe"]["httpGet"]["path"] == "/readyz", (name, owner)
        for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
            if kind in server:
                if get := server[kind].get("httpGet"):
                    assert get["path"] in served and get["port"] in (probed, ports[probed]), (name, owner, kind)
                assert server[kind]["timeoutSeconds"] >= 2, (name, owner, kind)


def test_service_and_monitor_reach_the_pods(rendered) -> None:
    for name, docs in rendered.items():
        for service in of_kind(docs, "Service"):
            (deployment,) = of_kind(docs, "Deployment")
            template = deployment["spec"]["template"]
            assert service["spec"]["selector"].items() <= template["metadata"]["labels"].items(), name
            port_names = {p["name"] for p in serving_container(template["spec"])["ports"]}
            assert {p["targetPort"] for p in service["spec"]["ports"]} <= port_names, name
            for pdb in of_kind(docs, "PodDisruptionBudget"):
                assert pdb["spec"]["selector"]["matchLabels"].items() <= template["metadata"]["labels"].items()
            for monitor in of_kind(docs, "ServiceMonitor"):
                assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
                for endpoint in monitor["spec"]["endpoints"]:
                    assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}, name
                    assert endpoint["path"] == "/metrics", name


# --- images, resources, security --------------------------------------------------------------------------------
def test_images_are_dockerfile_targets(rendered) -> None:
    targets = dockerfile_targets()
    assert SERVING_TARGETS | {"export"} <= targets
    for name, docs, owner, pod in every_pod(rendered):
        for container in pod.get("initContainers", []):
            assert image_tag(container["image"]) == "export", (name, owner)
        server = serving_container(pod)
        tag = image_tag(server["image"])
        assert tag in SERVING_TARGETS & targets, (name, owner, tag)
        device = environment(server, docs)["BERTSERVE_DEVICE"]
        gpus = server["resources"]["limits"].get("nvidia.com/gpu")
        if name == "overlays/gpu":
            assert (tag, device, gpus) == ("gpu", "cuda", 1)
            assert pod["tolerations"] and pod["nodeSelector"]
        else:
            assert (tag, device, gpus) == ("cpu", "cpu", None), name


def test_resources_are_set_and_threads_match_the_cpu_limit(rendered) -> None:
    for name, docs, owner, pod in every_pod(rendered):
        for container in containers(pod):
            resources = container["resources"]
            for kind in ("cpu", "memory"):
                assert resources["requests"][kind] == resources["limits"][kind], (name, owner, container["name"])
        server = serving_container(pod)
        env = environment(server, docs)
        # threads=0 follows the pod's CPU quota, but would mean one per core of the node were the limit taken away.
        assert 0 < int(env["BERTSERVE_THREADS"]) <= quantity(server["resources"]["limits"]["cpu"]), (name, owner)


def test_security_context(rendered) -> None:
    uid = re.search(r"useradd .*--uid (\d+)", (ROOT / "Dockerfile").read_text())
    assert uid, "the Dockerfile's user"
    for name, _, owner, pod in every_pod(rendered):
        pod_context = pod.get("securityContext", {})
        for container in containers(pod):
            context = {**pod_context, **container.get("securityContext", {})}
            where = (name, owner, container["name"])
            assert context["runAsNonRoot"] is True and context["runAsUser"] == int(uid.group(1)), where
            assert context["allowPrivilegeEscalation"] is False, where
            assert context["readOnlyRootFilesystem"] is True, where
            assert context.get("privileged", False) is False, where
            assert context["capabilities"] == {"drop": ["ALL"]}, where
            assert context["seccompProfile"] == {"type": "RuntimeDefault"}, where
            # A read-only root: whatever writes gets an emptyDir or a volume of its own.
            assert any(m["mountPath"] == "/tmp" for m in container.get("volumeMounts", [])) or owner.startswith(
                "InferenceService"
            ), where
        if owner.startswith("Deployment"):
            # The Service is called bertserve: its links would set BERTSERVE_PORT=tcp://... in every pod.
            assert pod["enableServiceLinks"] is False and pod["automountServiceAccountToken"] is False, name


def test_model_repository_is_mounted_read_only(rendered) -> None:
    for name, _, owner, pod in every_pod(rendered):
        if owner.startswith("InferenceService"):
            continue
        volumes = {v["name"]: v for v in pod["volumes"]}
        mount = next(m for m in serving_container(pod)["volumeMounts"] if m["mountPath"] == "/models")
        assert mount["readOnly"] is True, name
        claim = volumes[mount["name"]].get("persistentVolumeClaim")
        assert claim is None or claim["readOnly"] is True, name


def test_the_export_init_container_has_scratch_space_for_the_export(rendered) -> None:
    """It shared the server's /tmp (64Mi): onnxruntime's static quantization wrote ~90 MB there for MiniLM, and the
    init container ran out (ENOSPC) or the pod was evicted, so no pod of the overlay became ready."""
    units = {"Mi": 2**20, "Gi": 2**30}
    checked = 0
    for name, _, _, pod in every_pod(rendered):
        volumes = {v["name"]: v for v in pod.get("volumes", [])}
        for init in pod.get("initContainers", []):
            tmp = next(m for m in init["volumeMounts"] if m["mountPath"] == "/tmp")
            limit = volumes[tmp["name"]]["emptyDir"]["sizeLimit"]
            assert int(limit[:-2]) * units[limit[-2:]] >= 2**30, (name, limit)
            checked += 1
    assert checked  # the export-init overlay has one


def test_the_export_job_meets_the_restricted_standard_and_writes_the_repository(rendered) -> None:
    """The docs' `kubectl create job` made a pod without volumes and without a security context, which the
    namespace's `restricted` pod security standard refuses: the Job of export-job writes the base's PVC."""
    (job,) = of_kind(rendered["export-job"], "Job")
    pod = job["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] == 10001
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    (container,) = pod["containers"]
    context = container["securityContext"]
    assert context["allowPrivilegeEscalation"] is False and context["capabilities"]["drop"] == ["ALL"]
    assert container["image"] == "bertserve:export" and container["args"][2:] == [
        "minilm-bert-sst2",
        "--repository",
        "/models",
    ]
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    assert volumes[mounts["/models"]["name"]]["persistentVolumeClaim"]["claimName"] == "bertserve-models"
    assert not mounts["/models"].get("readOnly")
    assert mounts["/checkpoints"]["readOnly"] is True
    assert volumes[mounts["/tmp"]["name"]]["emptyDir"]["sizeLimit"] == "2Gi"
    (claim,) = of_kind(rendered["base"], "PersistentVolumeClaim")
    assert "ReadWriteMany" in claim["spec"]["accessModes"]  # ReadOnlyMany alone: no writer


# --- shutdown -------------------------------------------------------------------------------------------------
def test_grace_period_outlasts_the_drain(rendered) -> None:
    default = Settings.model_fields["drain_timeout_s"].default
    for name, docs, owner, pod in every_pod(rendered):
        server = serving_container(pod)
        drain = float(environment(server, docs).get("BERTSERVE_DRAIN_TIMEOUT_S", default))
        if owner.startswith("InferenceService"):
            # Knative gives the container the revision's timeout to finish.
            assert pod["timeout"] > drain, name
            continue
        assert pre_stop_sleep_s(server) > 0, name
        settings = environment(server, docs)
        process_mode = settings.get("BERTSERVE_DEVICE") == "cuda" or settings.get("BERTSERVE_ENGINE_MODE") == "process"
        # process mode stops the front-ends (the drain, then a kill) and then the engines: the GPU overlay's 45 s
        # were the in-process bound, short of its 70 s
        stop = drain + FRONTEND_STOP_EXTRA_S + ENGINE_STOP_S if process_mode else drain
        assert pod["terminationGracePeriodSeconds"] > pre_stop_sleep_s(server) + stop, name


# --- settings ---------------------------------------------------------------------------------------------------
def test_every_setting_is_one_the_server_has(rendered) -> None:
    help_text = subprocess.run(
        [sys.executable, "-m", "service", "--help"], capture_output=True, text=True, check=True, cwd=ROOT
    ).stdout
    known = set(re.findall(r"\[env\s+(BERTSERVE_[A-Z0-9_]+)\]", help_text))
    assert {"BERTSERVE_PORT", "BERTSERVE_DRAIN_TIMEOUT_S"} <= known
    for name, docs, owner, pod in every_pod(rendered):
        for container in containers(pod):
            used = {k for k in environment(container, docs) if k.startswith("BERTSERVE_")}
            assert used <= known, (name, owner, sorted(used - known))


def test_the_base_settings_start_a_server(base_settings, deploy_server: ServiceProcess) -> None:
    """deploy_server runs with the base's variables: they parse, and the server reports them."""
    assert base_settings["BERTSERVE_LOAD_FAILURE"] == "fail"
    models = httpx.get(deploy_server.url + "/v1/models", timeout=10).json()
    assert "tiny-sst2" in json_names(models)
    assert deploy_server.process.poll() is None


def test_api_keys_come_from_an_optional_secret(rendered) -> None:
    """Every serving container takes BERTSERVE_API_KEYS from the Secret where it exists, and starts without it."""
    for name, _docs, owner, pod in every_pod(rendered):
        refs = {
            item["name"]: item["valueFrom"]
            for item in serving_container(pod).get("env", [])
            if item["name"].startswith("BERTSERVE_") and "valueFrom" in item
        }
        assert refs == {
            "BERTSERVE_API_KEYS": {"secretKeyRef": {"name": "bertserve-api-keys", "key": "api-keys", "optional": True}}
        }, (name, owner)
        assert "BERTSERVE_API_KEYS" in {f"BERTSERVE_{field.upper()}" for field in Settings.model_fields}


def grpc_probes(rendered: dict[str, list[dict]]) -> list[dict]:
    """The kubelet's native gRPC probes of every serving container (the `grpc` of a probe)."""
    return [
        probe["grpc"]
        for _, _, _, pod in every_pod(rendered)
        for kind, probe in serving_container(pod).items()
        if kind.endswith("Probe") and "grpc" in probe
    ]


def test_with_the_secret_set_the_probes_and_the_scrape_need_no_key(
    rendered, pod_env: dict[str, str], deploy_repository: Path, tmp_path: Path
) -> None:
    """The base's settings plus a key, as the Secret gives it, and a gRPC port: the kubelet's probes (HTTP, and the
    gRPC one of KServe's v2 variant, grpc.health.v1's Check as the kubelet calls it) and Prometheus (no key) still
    get their answers; the API asks for the key."""
    key = "deploy-key-0123456789abcdef"
    probes = grpc_probes(rendered)
    assert probes, "no manifest probes the gRPC port"
    grpc_port = free_port()
    env = {**pod_env, "BERTSERVE_API_KEYS": key, "BERTSERVE_GRPC_PORT": str(grpc_port)}
    server = start_service(deploy_repository, log_path=tmp_path / "server.log", env=env)
    try:
        with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
            health = health_pb2_grpc.HealthStub(channel)
            for probe in probes:  # the kubelet asks for the probe's `service`, "" where it names none
                request = health_pb2.HealthCheckRequest(service=probe.get("service", ""))
                assert health.Check(request, timeout=10).status == health_pb2.HealthCheckResponse.SERVING, probe
        with httpx.Client(base_url=server.url, timeout=10) as client:
            assert {path: client.get(path).status_code for path in ("/livez", "/readyz", "/metrics")} == {
                "/livez": 200,
                "/readyz": 200,
                "/metrics": 200,
            }
            assert client.get("/v1/models").status_code == 401
            assert client.get("/v1/models", headers={"Authorization": f"Bearer {key}"}).status_code == 200
    finally:
        server.stop()
    access = [line for line in server.log().splitlines() if line.startswith("{")]
    assert len(access) >= 5 and all('"request_id": ' in line for line in access)  # BERTSERVE_ACCESS_LOG=json
    assert key not in server.log()


def json_names(models: dict | list) -> set[str]:
    entries = models["models"] if isinstance(models, dict) else models
    return {entry["name"] for entry in entries}


# --- autoscaling ------------------------------------------------------------------------------------------------
def test_autoscalers_agree(rendered) -> None:
    hpa_docs, keda_docs = rendered["overlays/autoscaling"], rendered["overlays/keda"]
    hpa, scaled = only(hpa_docs, "HorizontalPodAutoscaler"), only(keda_docs, "ScaledObject")
    for docs, ref in ((hpa_docs, hpa["spec"]["scaleTargetRef"]), (keda_docs, scaled["spec"]["scaleTargetRef"])):
        deployment = only(docs, "Deployment")
        assert (ref.get("kind", "Deployment"), ref["name"]) == ("Deployment", "bertserve")
        assert deployment["metadata"]["name"] == ref["name"] and "replicas" not in deployment["spec"]
        assert of_kind(docs, "ServiceMonitor")
    assert hpa["spec"]["minReplicas"] == scaled["spec"]["minReplicaCount"] >= 2  # the PDB leaves one of two
    assert hpa["spec"]["maxReplicas"] == scaled["spec"]["maxReplicaCount"]
    assert hpa["spec"]["behavior"] == scaled["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    spec = HpaSpec.from_manifest()
    (trigger,) = scaled["spec"]["triggers"]
    assert trigger["metricType"] == "AverageValue" and float(trigger["metadata"]["threshold"]) == spec.target
    assert adapter_rule()["name"]["as"] == spec.metric and spec.metric in CANDIDATES
    assert 0 < spec.target < 1  # a busy share per pod


def test_autoscaling_series_are_ones_the_server_exports(deploy_server: ServiceProcess, rendered) -> None:
    with deploy_server.client() as client:
        assert client.post("/v1/models/tiny-sst2/classify", json={"inputs": ["fine"]}).status_code == 200
    exported = set(scrape(deploy_server.url))
    (trigger,) = only(rendered["overlays/keda"], "ScaledObject")["spec"]["triggers"]
    rule = adapter_rule()
    for promql in (rule["seriesQuery"], trigger["metadata"]["query"]):
        names = metric_names(promql)
        assert names and names <= exported, (promql, sorted(names - exported))


@needs_prometheus
def test_autoscaling_queries_answer_in_prometheus(deploy_server: ServiceProcess, rendered, tmp_path: Path) -> None:
    """A real Prometheus scrapes the server with the labels the Prometheus Operator adds; the adapter's queries and
    KEDA's return one positive per-pod value while requests are answered."""
    rule = adapter_rule()
    (trigger,) = only(rendered["overlays/keda"], "ScaledObject")["spec"]["triggers"]
    with running_prometheus([deploy_server.url.removeprefix("http://")], tmp_path, TARGET_LABELS) as url:
        assert wait_for(url, 'up{job="bertserve"} == 1'), log_tail(tmp_path)
        with deploy_server.client() as client:
            deadline = time.monotonic() + 4
            while time.monotonic() < deadline:
                assert client.post("/v1/models/tiny-sst2/classify", json={"inputs": ["a fine film"]}).status_code == 200
        assert wait_for(url, rule["seriesQuery"]), log_tail(tmp_path)
        per_pod = wait_for(url, adapter_query(rule, "bertserve", [TARGET_LABELS["pod"]]) + " > 0")
        assert [series["metric"] for series in per_pod] == [{"pod": TARGET_LABELS["pod"]}], per_pod
        keda = query(url, trigger["metadata"]["query"])
        assert len(keda) == 1 and float(keda[0]["value"][1]) > 0, keda
        # Another namespace's pods are not counted.
        assert query(url, adapter_query(rule, "elsewhere", [TARGET_LABELS["pod"]])) == []
