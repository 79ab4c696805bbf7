"""docker/k8s/ and docker/swarm/: the manifests validate offline, and say what the server needs to join and drain.

Kubernetes manifests are checked against the Kubernetes schemas in strict mode (`kubernetes-validate`, offline);
the Swarm stack by `docker stack config`, the Docker CLI's own parser for `docker stack deploy`.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from server.settings import ServerSettings

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "docker" / "k8s"
STACK = ROOT / "docker" / "swarm" / "stack.yml"
KUBERNETES_VERSION = "1.30.0"
SECRET_WORDS = ("KEY", "TOKEN", "PASSWORD", "SECRET")


def manifests() -> list[dict[str, Any]]:
    return [doc for path in sorted(K8S.glob("*.yaml")) for doc in yaml.safe_load_all(path.read_text()) if doc]


def one(kind: str, name: str) -> dict[str, Any]:
    found = [doc for doc in manifests() if doc["kind"] == kind and doc["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}: {len(found)} found"
    return found[0]


def container(deployment: dict[str, Any]) -> dict[str, Any]:
    return deployment["spec"]["template"]["spec"]["containers"][0]


def config_map() -> dict[str, str]:
    return one("ConfigMap", "contextspan-config")["data"]


def settings_field(variable: str) -> str:
    return variable.removeprefix("CONTEXTSPAN_").lower()


@pytest.mark.parametrize("doc", manifests(), ids=lambda d: f"{d['kind']}-{d['metadata']['name']}")
def test_every_kubernetes_manifest_validates_strictly(doc: dict[str, Any]) -> None:
    kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


def test_a_misspelt_field_is_caught_by_the_validation() -> None:
    deployment = one("Deployment", "contextspan")
    broken = {**deployment, "spec": {**deployment["spec"], "replica": 2}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES_VERSION, strict=True)


def test_a_pod_is_ready_only_while_readyz_says_so_and_alive_while_healthz_does() -> None:
    spec = container(one("Deployment", "contextspan"))
    assert spec["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert spec["readinessProbe"]["periodSeconds"] <= 2
    assert spec["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert spec["startupProbe"]["httpGet"]["path"] == "/healthz"


def test_each_replica_holds_one_gpu_and_a_rollout_never_needs_a_spare_one() -> None:
    deployment = one("Deployment", "contextspan")
    assert container(deployment)["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert deployment["spec"]["strategy"]["rollingUpdate"]["maxSurge"] == 0


def test_the_grace_period_outlasts_the_prestop_pause_and_the_servers_drain() -> None:
    pod = one("Deployment", "contextspan")["spec"]["template"]["spec"]
    pause = int(pod["containers"][0]["lifecycle"]["preStop"]["exec"]["command"][-1])
    drain = float(config_map()["CONTEXTSPAN_SHUTDOWN_GRACE_S"])
    assert pod["terminationGracePeriodSeconds"] > pause + drain


def test_the_disruption_budget_and_the_service_select_the_speech_model_pods() -> None:
    labels = one("Deployment", "contextspan")["spec"]["template"]["metadata"]["labels"]
    for selector in (one("PodDisruptionBudget", "contextspan")["spec"]["selector"]["matchLabels"],
                     one("Service", "contextspan")["spec"]["selector"]):
        assert selector.items() <= labels.items()
    assert one("PodDisruptionBudget", "contextspan")["spec"]["maxUnavailable"] == 1


def test_the_ingress_keeps_a_websocket_open_as_long_as_a_session_may_last() -> None:
    annotations = one("Ingress", "contextspan")["metadata"]["annotations"]
    longest = ServerSettings().max_session_s
    assert float(annotations["nginx.ingress.kubernetes.io/proxy-read-timeout"]) >= longest
    assert float(annotations["nginx.ingress.kubernetes.io/proxy-send-timeout"]) >= longest


def test_secrets_are_only_referenced_never_written_in_a_manifest() -> None:
    assert not [key for key in config_map() if any(word in key for word in SECRET_WORDS)]
    for doc in manifests():
        if doc["kind"] != "Deployment":
            continue
        for variable in container(doc).get("env", []):
            if any(word in variable["name"] for word in SECRET_WORDS):
                assert "secretKeyRef" in variable.get("valueFrom", {}), variable["name"]


def test_every_server_setting_in_the_config_map_is_one_the_server_reads() -> None:
    fields = set(ServerSettings.model_fields)
    unknown = [k for k in config_map() if k.startswith("CONTEXTSPAN_") and settings_field(k) not in fields]
    assert not unknown


def stack() -> dict[str, Any]:
    return yaml.safe_load(STACK.read_text())


def test_the_swarm_stack_is_accepted_by_docker_stack_config() -> None:
    docker = shutil.which("docker")
    assert docker, "the Docker CLI (docker stack config) is needed to validate docker/swarm/stack.yml"
    result = subprocess.run([docker, "stack", "config", "-c", str(STACK)], capture_output=True, text=True,
                            timeout=60, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    rendered = yaml.safe_load(result.stdout)
    assert set(rendered["services"]) == {"traefik", "llm", "contextspan", "redis"}


def test_swarm_routes_new_conversations_by_readyz_and_drains_within_the_stop_grace_period() -> None:
    service = stack()["services"]["contextspan"]
    labels = service["deploy"]["labels"]
    assert labels["traefik.http.services.chat.loadbalancer.healthcheck.path"] == "/readyz"
    assert "/api/chat" in labels["traefik.http.routers.chat.rule"]
    drain = float(service["environment"]["CONTEXTSPAN_SHUTDOWN_GRACE_S"])
    assert float(service["stop_grace_period"].removesuffix("s")) > drain
    gpus = service["deploy"]["resources"]["reservations"]["generic_resources"]
    assert gpus == [{"discrete_resource_spec": {"kind": "NVIDIA-GPU", "value": 1}}]
    assert service["deploy"]["update_config"]["order"] == "stop-first"


def test_swarm_secrets_are_files_the_server_reads_and_not_variables() -> None:
    service = stack()["services"]["contextspan"]
    assert not [k for k in service["environment"] if any(word in k for word in SECRET_WORDS)]
    fields = set(ServerSettings.model_fields)
    for secret in service["secrets"]:
        assert settings_field(secret.upper()) in fields
        assert stack()["secrets"][secret] == {"external": True}


def test_a_secret_file_sets_the_setting_of_its_name(tmp_path: Path) -> None:
    (tmp_path / "contextspan_api_keys").write_text('["k1", "k2"]')
    (tmp_path / "contextspan_llm_api_key").write_text("llm-key")
    settings = ServerSettings(_secrets_dir=tmp_path)
    assert settings.api_keys == ["k1", "k2"]
    assert settings.llm_api_key == "llm-key"


CPU_STACK = ROOT / "docker" / "swarm" / "stack.cpu.yml"


def test_the_cpu_swarm_stack_is_accepted_by_docker_stack_config() -> None:
    docker = shutil.which("docker")
    assert docker, "the Docker CLI (docker stack config) is needed to validate docker/swarm/stack.cpu.yml"
    result = subprocess.run([docker, "stack", "config", "-c", str(CPU_STACK)], capture_output=True, text=True,
                            timeout=60, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    assert set(yaml.safe_load(result.stdout)["services"]) == {"haproxy", "redis", "contextspan"}


def test_the_cpu_stack_updates_one_drained_task_at_a_time_and_resumes_calls_through_redis() -> None:
    """What scripts/swarm_check.sh relies on: a rolling update hands calls over instead of dropping them, and the
    front takes a replica only while its /readyz says so."""
    cpu = yaml.safe_load(CPU_STACK.read_text())
    service = cpu["services"]["contextspan"]
    update = service["deploy"]["update_config"]
    assert (update["order"], update["parallelism"]) == ("stop-first", 1)
    drain = float(service["environment"]["CONTEXTSPAN_SHUTDOWN_GRACE_S"])
    assert float(service["stop_grace_period"].removesuffix("s")) > drain
    assert service["environment"]["CONTEXTSPAN_RESUME_STORE"] == "redis://redis:6379/0"
    assert "contextspan_resume_secret" in service["secrets"]
    assert all(cpu["secrets"][secret] == {"external": True} for secret in service["secrets"])
    assert not [k for k in service["environment"] if any(word in k for word in SECRET_WORDS)]
    front = (CPU_STACK.parent / cpu["configs"]["haproxy_cfg"]["file"]).read_text()
    assert "option httpchk GET /readyz" in front and "tasks.contextspan:8998" in front


@pytest.mark.parametrize("path", [STACK, CPU_STACK], ids=lambda p: p.name)
def test_a_swarm_task_is_healthy_once_its_model_is_loaded(path: Path) -> None:
    """A rolling update stops the next task once the new one is healthy: /healthz passes while the model loads, and
    the calls handed over would find no replica to take them (scripts/swarm_check.sh measured it)."""
    check = " ".join(yaml.safe_load(path.read_text())["services"]["contextspan"]["healthcheck"]["test"])
    assert "/api/info" in check and "['loaded']" in check
