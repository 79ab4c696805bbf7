"""Roll an update through the CPU Swarm stack (docker/swarm/stack.cpu.yml) while calls go on, and check that every
call kept its session (scripts/swarm_check.sh is the entry point; see its header).

Every step prints what it does and how long it took; the result JSON is written whether the checks pass or not, with
what failed, so that a failed run is a record too.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from image_check import (  # scripts/ is on sys.path when run; image_check puts the repository root there too
    LOCAL_BASE,
    ROOT,
    SYSTEM_CA,
    CheckFailed,
    build,
    docker_cli,
    ensure_daemon,
    local_base,
    run,
)

from benchmarks.harness.servers import free_port
from benchmarks.harness.speech import speak
from benchmarks.report import machine_info, save_json
from contextspan_client import AudioChunk, TextPiece, connect, session_token
from frontend_model.frame import FRAME_SAMPLES, SAMPLE_RATE
from server.wire import protocol as p

STACK_FILE = ROOT / "docker" / "swarm" / "stack.cpu.yml"
STACK = "contextspan-check"
SERVICE = f"{STACK}_contextspan"
TAG = "swarm-check"
IMAGES = {f"contextspan:{TAG}": "docker/Dockerfile", f"contextspan-redis:{TAG}": "docker/Dockerfile.redis",
          f"contextspan-haproxy:{TAG}": "docker/Dockerfile.haproxy"}
REPLICAS = 2
SECRET_NAMES = ("contextspan_api_keys", "contextspan_resume_secret")
QUESTION = "What is twelve times seven?"  # the built-in arithmetic tool answers it: no LLM in this stack
SPEECH = "Tell me more about the weather in the mountains this week, and whether the trains are running."
READY_WITHIN_S = 300
SPAN_WITHIN_S = 30
UPDATE_WITHIN_S = 600


def step(message: str) -> float:
    print(f"swarm_check: {message}", flush=True)
    return time.monotonic()


def stack_cli(candidates: list[str]) -> str:
    """A docker CLI whose `stack` reads the file as `docker stack deploy` will: Debian's 20.10 CLI wants a `version`
    key that the current Compose format (and stack.yml) leaves out, a newer CLI does not."""
    for cli in filter(None, map(shutil.which, candidates)):
        done = subprocess.run([cli, "stack", "config", "-c", str(STACK_FILE)], capture_output=True, text=True,
                              check=False)
        if done.returncode == 0:
            return cli
    raise CheckFailed(f"no docker CLI here reads {STACK_FILE.relative_to(ROOT)} (`docker stack config`): a Docker CLI "
                      "of version 24 or later is needed")


def create_secret(docker: str, name: str, value: str) -> None:
    """From stdin: the value is on no command line and in no log."""
    subprocess.run([docker, "secret", "rm", name], capture_output=True, check=False)
    done = subprocess.run([docker, "secret", "create", name, "-"], input=value, capture_output=True, text=True,
                          check=False)
    if done.returncode != 0:
        raise CheckFailed(f"docker secret create {name}: {done.stderr.strip()}")


def running_tasks(docker: str) -> set[str]:
    out = run([docker, "service", "ps", SERVICE, "--filter", "desired-state=running", "-q"], quiet=True).stdout
    return set(out.split())


def replica_containers(docker: str, stopped: bool = False) -> list[str]:
    """The replicas' containers on this machine; `stopped`: the replaced tasks' too (Swarm keeps them a while)."""
    out = run([docker, "ps", "-q", *(["-a"] if stopped else []), "--filter",
               f"label=com.docker.swarm.service.name={SERVICE}"], quiet=True).stdout
    return out.split()


def replica_logs(docker: str, tail: int | None = None) -> list[str]:
    """Every replica's log lines, from its container: `docker service logs` of a 20.10 daemon can hang for good
    once a task is gone."""
    lines = []
    for container in replica_containers(docker, stopped=True):
        cmd = [docker, "logs", *(["--tail", str(tail)] if tail else []), container]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=30, check=False)
        except subprocess.TimeoutExpired:
            continue
        lines += (done.stdout + done.stderr).splitlines()
    return lines


def replica_ready(docker: str, container: str) -> bool:
    """/readyz from inside the task (the replicas publish no port: HAProxy alone is reachable)."""
    probe = ("import urllib.request; urllib.request.urlopen('http://127.0.0.1:8998/readyz', timeout=4)")
    return subprocess.run([docker, "exec", container, "python3", "-c", probe], capture_output=True,
                          check=False).returncode == 0


def wait_replicas_ready(docker: str, url: str) -> float:
    """Both replicas loaded with a free slot (/readyz inside each), and the front answering."""
    started = time.monotonic()
    while True:
        containers = replica_containers(docker)
        if len(containers) == REPLICAS and all(replica_ready(docker, c) for c in containers):
            try:
                with urllib.request.urlopen(f"{url}/readyz", timeout=5) as response:
                    if response.status == 200:
                        return time.monotonic() - started
            except OSError:
                pass
        if time.monotonic() - started > READY_WITHIN_S:
            raise CheckFailed(f"{REPLICAS} replicas not ready within {READY_WITHIN_S} s")
        time.sleep(2)


@dataclass
class Call:
    """One caller's conversation: when each piece arrived and how many times the client had resumed by then."""

    index: int
    audio: list[tuple[float, int, int]] = field(default_factory=list)  # (arrival, resumes, samples)
    text_pieces: list[int] = field(default_factory=list)  # resumes when each text piece arrived
    readies: list[tuple[float, int, p.SessionReady]] = field(default_factory=list)
    span: p.SpanInjected | None = None
    spoken_at: float = 0.0
    error: str | None = None
    resumes: int = 0
    close_code: int | None = None

    @property
    def user(self) -> str:
        return f"caller-{self.index}"

    def summary(self) -> dict[str, Any]:
        """The per-call record, and what is wrong with it (an empty list when it kept its session)."""
        ids = sorted({ready.session_id for _, _, ready in self.readies})
        resumed = [ready for _, n, ready in self.readies if n > 0]
        gaps = []
        for n in range(1, self.resumes + 1):
            before = [t for t, k, _ in self.audio if k == n - 1]
            after = [t for t, k, _ in self.audio if k == n]
            if before and after:
                gaps.append(round((min(after) - max(before)) * 1000))
        last = self.resumes
        audio_after_s = sum(s for _, k, s in self.audio if k == last and last > 0) / SAMPLE_RATE
        text_after = sum(1 for k in self.text_pieces if k == last and last > 0)
        span_frame = self.span.offset_after if self.span else None
        record = {
            "user": self.user, "session_ids": ids, "resumes": self.resumes, "audio_gap_ms_at_each_resume": gaps,
            "audio_s": round(sum(s for _, _, s in self.audio) / SAMPLE_RATE, 1),
            "audio_s_after_last_resume": round(audio_after_s, 1), "text_pieces_after_last_resume": text_after,
            "span": {"text": self.span.text, "source": self.span.source, "offset_after": self.span.offset_after}
            if self.span else None,
            "resumed_frames": [ready.resumed_frames for ready in resumed], "close_code": self.close_code,
            "error": self.error,
        }
        problems = [text for ok, text in [
            (self.error is None, f"the call ended with {self.error}"),
            (len(ids) == 1, f"session ids {ids}"),
            (self.resumes >= 1, "never resumed"),
            (len(self.readies) == self.resumes + 1, f"{len(self.readies)} session.ready for {self.resumes} resumes"),
            (self.span is not None, "no span before the update"),
            (bool(resumed) and span_frame is not None and all((r.resumed_frames or 0) >= span_frame for r in resumed),
             f"a resume replayed fewer frames than the span's end ({span_frame}): {record['resumed_frames']}"),
            (audio_after_s > 2.0, f"only {audio_after_s:.1f} s of agent audio after the last resume"),
            (text_after > 0, "no agent text after the last resume"),
            (self.close_code == p.CLOSE_NORMAL, f"closed {self.close_code}, not by the caller (1000)"),
        ] if not ok]
        return {**record, "problems": problems}


async def talk(call: Call, url: str, api_key: str, speech: np.ndarray, asked: asyncio.Event,
               stop: asyncio.Event) -> None:
    """Speak without a pause (80 ms pages on the real-time schedule), ask the typed question once the session is
    ready, and record everything that comes back, until `stop`."""
    token = await session_token(url, api_key)
    async with connect(url, token=token, user=call.user, resume_within_s=120) as conversation:

        async def receive() -> None:
            async for item in conversation:
                now = time.monotonic()
                if isinstance(item, AudioChunk):
                    if item.pcm.size:
                        call.audio.append((now, conversation.resumes, item.pcm.size))
                elif isinstance(item, TextPiece):
                    call.text_pieces.append(conversation.resumes)
                elif isinstance(item, p.SessionReady):
                    call.readies.append((now, conversation.resumes, item))
                elif isinstance(item, p.SpanInjected) and call.span is None:
                    call.span = item
                    asked.set()

        receiver = asyncio.create_task(receive())
        pages = len(speech) // FRAME_SAMPLES
        start = time.perf_counter()
        i = 0
        try:
            while not stop.is_set() and not receiver.done():
                if i == round(2 / 0.08):  # 2 s in: the question, typed
                    await conversation.send(p.UserText(type="user.text", text=QUESTION))
                    call.spoken_at = time.monotonic()
                page = speech[(i % pages) * FRAME_SAMPLES : (i % pages + 1) * FRAME_SAMPLES]
                await conversation.send_audio(page)
                i += 1
                await asyncio.sleep(max(0.0, start + i * FRAME_SAMPLES / SAMPLE_RATE - time.perf_counter()))
        except Exception as exc:  # a send that could not resume: the call is lost
            call.error = f"{type(exc).__name__}: {exc}"
        if receiver.done() and receiver.exception() is not None:
            exc = receiver.exception()
            call.error = f"{type(exc).__name__}: {exc}"
        call.resumes = conversation.resumes
        await conversation.close()
        await asyncio.wait_for(asyncio.gather(receiver, return_exceptions=True), 10)
        call.close_code = conversation.close_code


async def calls_through_update(docker: str, url: str, api_key: str, n_calls: int, after_s: float,
                               speech: np.ndarray) -> tuple[list[Call], dict[str, Any]]:
    """N calls; once every one has its span in (and a save after it), `docker service update --force`; the calls go
    on until the update is done and every task replaced, and `after_s` more."""
    calls = [Call(i) for i in range(n_calls)]
    asked = [asyncio.Event() for _ in calls]
    stop = asyncio.Event()
    tasks = [asyncio.create_task(talk(c, url, api_key, speech, a, stop)) for c, a in zip(calls, asked, strict=True)]
    before = running_tasks(docker)
    try:
        await asyncio.wait_for(asyncio.gather(*(a.wait() for a in asked)), SPAN_WITHIN_S)
    except TimeoutError:
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise CheckFailed(f"not every call got its span within {SPAN_WITHIN_S} s: "
                          f"{[c.span is not None for c in calls]} {[c.error for c in calls]}") from None
    await asyncio.sleep(2.0)  # a save with the span in it
    started = step(f"{n_calls} calls talking, spans in: docker service update --force {SERVICE}")
    update = await asyncio.to_thread(run, [docker, "service", "update", "--force", "--detach=false", "--quiet",
                                           SERVICE], quiet=True, timeout=UPDATE_WITHIN_S, check=False)
    update_s = time.monotonic() - started
    after = running_tasks(docker)
    step(f"update done in {update_s:.0f} s (exit {update.returncode}); talking {after_s:.0f} s more")
    await asyncio.sleep(after_s)
    stop.set()
    await asyncio.gather(*tasks)
    return calls, {"update_s": round(update_s, 1), "update_exit": update.returncode,
                   "update_output_tail": (update.stderr or update.stdout)[-400:], "tasks_before": sorted(before),
                   "tasks_after": sorted(after), "every_task_replaced": len(after) == REPLICAS and not before & after}


def drain_log(docker: str) -> tuple[list[str], int]:
    """What the replicas said about handing sessions over on SIGTERM (their JSON log lines' messages), and how many
    resume requests reached them (more than the calls' resumes: some were refused and tried again)."""
    said, requests = [], 0
    for line in replica_logs(docker):
        try:
            message = json.loads(line).get("message", "")
        except (ValueError, AttributeError):
            continue
        if "handing" in message or "draining" in message:
            said.append(message)
        requests += "WebSocket /api/chat" in message and "resume=" in message
    return said, requests


def check(docker: str, stack_docker: str, base: str, ca: Path | None, n_calls: int, after_s: float,
          advertise: str) -> dict[str, Any]:
    builds = {tag: round(build(docker, base, ca, tag=tag, dockerfile=dockerfile), 1)
              for tag, dockerfile in IMAGES.items()}
    swarm_state = run([docker, "info", "--format", "{{.Swarm.LocalNodeState}}"], quiet=True).stdout.strip()
    created_swarm = swarm_state != "active"
    if created_swarm:
        step(f"docker swarm init --advertise-addr {advertise}")
        run([docker, "swarm", "init", "--advertise-addr", advertise], quiet=True)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    api_key = secrets.token_hex(16)
    deploy_env = {**os.environ, "CONTEXTSPAN_IMAGE_TAG": TAG, "CONTEXTSPAN_PUBLISH_PORT": str(port),
                  "CONTEXTSPAN_REPLICAS": str(REPLICAS)}
    try:
        create_secret(docker, "contextspan_api_keys", json.dumps([api_key]))
        create_secret(docker, "contextspan_resume_secret", secrets.token_hex(32))
        step(f"docker stack deploy {STACK} ({STACK_FILE.relative_to(ROOT)}), HAProxy on port {port}")
        run([stack_docker, "stack", "deploy", "--resolve-image", "never", "-c", str(STACK_FILE), STACK],
            env=deploy_env, quiet=True)
        ready_s = wait_replicas_ready(docker, url)
        step(f"{REPLICAS} replicas ready {ready_s:.0f} s after deploy")
        with tempfile.TemporaryDirectory() as work:
            speech = speak(SPEECH, Path(work) / "speech.wav")
        calls, update = asyncio.run(calls_through_update(docker, url, api_key, n_calls, after_s, speech))
        handed, resume_requests = drain_log(docker)
    except Exception:
        print("\n".join(replica_logs(docker, tail=20))[-6000:], file=sys.stderr)
        raise
    finally:
        step(f"docker stack rm {STACK}")
        run([stack_docker, "stack", "rm", STACK], quiet=True, check=False)
        deadline = time.monotonic() + 120
        while replica_containers(docker) and time.monotonic() < deadline:
            time.sleep(2)
        time.sleep(3)  # the secrets are in use until the last task is gone
        for name in SECRET_NAMES:
            run([docker, "secret", "rm", name], quiet=True, check=False)
        if created_swarm:
            run([docker, "swarm", "leave", "--force"], quiet=True, check=False)
    per_call = [c.summary() for c in calls]
    gaps = [g for c in per_call for g in c["audio_gap_ms_at_each_resume"]]
    problems = [f"{c['user']}: {problem}" for c in per_call for problem in c["problems"]]
    if not update["every_task_replaced"]:
        problems.append(f"tasks not all replaced: before {update['tasks_before']}, after {update['tasks_after']}")
    if update["update_exit"] != 0:
        problems.append(f"docker service update exited {update['update_exit']}")
    versions = run([docker, "version", "--format", "{{.Client.Version}} {{.Server.Version}}"], quiet=True).stdout
    return {
        "stack_file": str(STACK_FILE.relative_to(ROOT)), "docker": versions.strip(), "base": base,
        "build_s": builds, "replicas": REPLICAS, "calls": n_calls, "ready_after_deploy_s": round(ready_s, 1),
        **update, "audio_gap_ms": {"max": max(gaps, default=None), "mean": round(float(np.mean(gaps)))
                                   if gaps else None},
        "resumes_per_call": [c["resumes"] for c in per_call], "resume_requests_seen": resume_requests,
        "drain_log": handed, "per_call": per_call,
        "passed": not problems, "problems": problems,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/swarm_check.sh", description=__doc__)
    parser.add_argument("--base", default=None, help=f"base image (default: {LOCAL_BASE}, made here if missing)")
    parser.add_argument("--ca", type=Path, default=SYSTEM_CA if SYSTEM_CA.is_file() else None,
                        help="CA bundle given to the builds as the `ca` secret (default: the system bundle)")
    parser.add_argument("--no-ca", action="store_true", help="build without a CA secret")
    parser.add_argument("--calls", type=int, default=3, help="conversations through the update (default 3)")
    parser.add_argument("--after-s", type=float, default=10.0,
                        help="seconds the calls go on once every task is replaced (default 10)")
    parser.add_argument("--advertise", default="127.0.0.1", help="docker swarm init --advertise-addr (default "
                        "127.0.0.1; only when this machine is in no swarm yet)")
    parser.add_argument("--json", type=Path, default=ROOT / "benchmarks" / "results" / "swarm-rolling-update-cpu.json")
    args = parser.parse_args(argv)
    started = time.monotonic()
    try:
        docker = docker_cli()
        ensure_daemon(docker)
        stack_docker = stack_cli(["docker", "/usr/local/bin/docker", docker])
        base = args.base or local_base(docker)
        result = check(docker, stack_docker, base, None if args.no_ca else args.ca, args.calls, args.after_s,
                       args.advertise)
    except (CheckFailed, subprocess.TimeoutExpired) as exc:
        print(f"swarm_check: FAILED: {exc}", file=sys.stderr)
        return 1
    result.update(machine=machine_info(), total_s=round(time.monotonic() - started, 1))
    save_json(args.json, result)
    gaps = result["audio_gap_ms"]
    print(f"swarm_check: {'passed' if result['passed'] else 'FAILED'}: update {result['update_s']:.0f} s, "
          f"resumes per call {result['resumes_per_call']}, audio gap at a resume max {gaps['max']} ms")
    for problem in result["problems"]:
        print(f"swarm_check: {problem}", file=sys.stderr)
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
