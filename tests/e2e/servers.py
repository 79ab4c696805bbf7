"""Helpers for e2e tests: `contextspan serve` in a subprocess on a free loopback port, espeak-ng speech."""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pytest

from benchmarks import harness
from server.session.retrieval import SpanAnswer
from server.settings import ServerSettings

if TYPE_CHECKING:
    from frontend_model.loading.loader import LoadedModel
    from server.app.routes import ServerState

ARTIFACTS = Path(__file__).parent / "artifacts"

# Tests state the capacity and span length they need: a calibrated server on a slow host admits fewer sessions
# and cuts spans shorter than a test expects (calibrated admission and caps have their own tests, with injected costs).
PINNED_FLAGS = ("--admission", "fixed", "--span-cap", "fixed")


def pinned_settings(**fields: Any) -> ServerSettings:
    """Settings for an in-process test server on a free port, with admission and span cap pinned."""
    return ServerSettings(**{"port": harness.free_port(), "admission": "fixed", "span_cap": "fixed", **fields})


@dataclass
class InProcessServer:
    http: str
    ws: str
    state: ServerState
    loop: asyncio.AbstractEventLoop


@contextlib.contextmanager
def in_process_server(settings: ServerSettings, model: LoadedModel | None = None) -> Iterator[InProcessServer]:
    """A uvicorn server in a thread of this process, so a test can reach its sessions and patch its parts."""
    import torch
    import uvicorn

    from server.app.draining import websocket_config
    from server.app.routes import create_app

    threads = torch.get_num_threads()  # the server sets its own; later tests in this process get theirs back
    app = create_app(settings, model=model)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=settings.port, log_level="warning",
                                           **websocket_config(settings)))
    loops: list[asyncio.AbstractEventLoop] = []

    def run() -> None:
        loop = asyncio.new_event_loop()
        loops.append(loop)
        loop.run_until_complete(server.serve())

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    state: ServerState = app.state.server
    deadline = time.monotonic() + 120
    while not state.ready() and state.load_error is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert state.ready(), state.load_error
    try:
        yield InProcessServer(f"http://127.0.0.1:{settings.port}", f"ws://127.0.0.1:{settings.port}", state, loops[0])
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        torch.set_num_threads(threads)


@dataclass
class RunningServer:
    http: str
    ws: str
    recordings: Path
    process: subprocess.Popen[bytes]
    log: Path

    def rss_bytes(self) -> int:
        import psutil

        return int(psutil.Process(self.process.pid).memory_info().rss)

    def metrics(self) -> str:
        return httpx.get(f"{self.http}/metrics", timeout=5).text


def start_server(tmp: Path, *flags: str, ready_timeout: float = 120.0, faults: str = "") -> RunningServer:
    """`faults` (see benchmarks/fakes/faulty_server.py) runs the same server with those faults injected."""
    recordings = tmp / "recordings"
    module = "benchmarks.fakes.faulty_server" if faults else "server.cli"
    process, http = harness.start_server(tmp, *PINNED_FLAGS, "--recordings-dir", str(recordings), "--log-level",
                                         "info", *flags, ready_timeout=ready_timeout, module=module,
                                         env={"FAULTS": faults})
    return RunningServer(http, "ws" + http.removeprefix("http"), recordings, process, tmp / "server.log")


def stop_server(server: RunningServer) -> None:
    harness.stop_server(server.process)


@contextlib.contextmanager
def weather_tool_server(tmp: Path, api_key: str) -> Iterator[RunningServer]:
    """The deployed deadlines; a question in the user's final transcript starts a retrieval, and the backend's LLM
    (a fake on loopback) always picks the client's `get_weather` tool for Paris; the agent listens while its user
    speaks."""
    from benchmarks.fakes.fake_openai import fake_openai

    with fake_openai() as (url, script):
        script.mode, script.tool, script.arguments = "tool_call", "get_weather", {"place": "Paris"}
        running = start_server(tmp, "--max-sessions", "1", "--api-keys", api_key, "--trigger", "asr",
                               "--llm-base-url", url, "--llm-model", "fake", faults="agent_listens@6")
        try:
            yield running
        finally:
            stop_server(running)


def recorded_spans(server: RunningServer) -> list[dict[str, Any]]:
    """The spans the server injected or dropped so far, from its session recordings (flushed every second)."""
    return [event for path in server.recordings.glob("*.jsonl") for line in path.read_text().splitlines()
            if (event := json.loads(line))["type"] in ("span.injected", "span.dropped")]


def app_answer(text: str, source: str = "test") -> SpanAnswer:
    """A span's text as an app hands it in (`span.inject`): no question, requested now."""
    return SpanAnswer(text, source, "app", None, time.perf_counter(), trigger="app")


def espeak_wav(path: Path, text: str) -> Path:
    if shutil.which("espeak-ng") is None:
        pytest.skip("espeak-ng is not installed (apt-get install espeak-ng)")
    subprocess.run(["espeak-ng", "-w", str(path), text], check=True)
    return path
