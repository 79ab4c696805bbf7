"""Fault injection in a real server on loopback: one session's step raises, the ASR raises, the worker wedges.

The first two run the server in its own process with the fault installed (faulty_server.py), so the healthy
session's deadlines are measured as in production; the wedged worker runs in process, where a test can hold the
stuck call and release it. Clients are real WebSocket clients streaming Ogg Opus in real time.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from frontend_model.loading import load_model
from server import protocol as p
from server.batcher import Batcher
from server.client import StreamResult, chat_url, stream
from server.settings import ServerSettings

from .faulty_server import break_slot_frame
from .pace import assert_kept_pace
from .servers import RunningServer, in_process_server, pinned_settings, start_server, stop_server

pytestmark = pytest.mark.slow


def settings_for(tmp: Path, **overrides: Any) -> ServerSettings:
    return pinned_settings(recordings_dir=tmp / "rec", max_sessions=2, **overrides)


async def wait_for(condition: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.05)


def two_sessions(ws: str, pcm: np.ndarray, sessions: Callable[[], int]) -> tuple[StreamResult, StreamResult]:
    async def run() -> tuple[StreamResult, StreamResult]:
        first = asyncio.create_task(stream(chat_url(ws, events=True), pcm))
        await wait_for(lambda: sessions() == 1)
        second = asyncio.create_task(stream(chat_url(ws, events=True), pcm))
        return await first, await second

    return asyncio.run(run())


def active_sessions(server: RunningServer) -> Callable[[], int]:
    return lambda: int(httpx.get(f"{server.http}/api/info", timeout=5).json()["sessions"])


def test_a_step_that_raises_closes_that_session_only(tmp_path: Path, speech: np.ndarray) -> None:
    server = start_server(tmp_path, "--max-sessions", "2", "--no-asr", faults="step_raise@20")
    try:
        broken, healthy = two_sessions(server.ws, speech, active_sessions(server))
        info = httpx.get(f"{server.http}/api/info", timeout=5).json()
    finally:
        stop_server(server)
    assert broken.close_code == p.CLOSE_INTERNAL and json.loads(broken.close_reason)["error"] == "internal"
    assert 15 <= broken.audio_messages <= 21
    assert healthy.close_code in (None, p.CLOSE_NORMAL)
    assert_kept_pace(healthy, min_frames=60)
    assert info["free_slots"] == 2, "both slots came back"


def test_an_asr_that_raises_is_reported_and_every_session_keeps_pace(tmp_path: Path, speech: np.ndarray) -> None:
    server = start_server(tmp_path, "--max-sessions", "2", faults="asr_raise")
    try:
        results = two_sessions(server.ws, speech, active_sessions(server))
    finally:
        stop_server(server)
    for result in results:
        errors = [e for e in result.of_type("error") if e.code == "asr_failed"]
        assert errors and "injected ASR fault" in errors[0].message
        assert_kept_pace(result, min_frames=60)


def test_a_wedged_worker_is_restarted_and_its_slots_come_back(tmp_path: Path, speech: np.ndarray,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    release = threading.Event()
    with in_process_server(settings_for(tmp_path, asr=False, worker_stall_s=1.0), load_model("tiny")) as server:
        monkeypatch.setattr(Batcher, "_slot_frame", break_slot_frame(20, lambda: release.wait(60)))
        try:
            results = two_sessions(server.ws, speech, lambda: len(server.state.sessions))
            for result in results:
                assert result.close_code == p.CLOSE_INTERNAL, result.close_reason
                assert json.loads(result.close_reason)["error"] in ("worker_restarted", "internal")
            asyncio.run(wait_for(lambda: server.state.batcher is not None and server.state.batcher.free == 2,
                                 timeout=60))
            assert "contextspan_worker_restarts_total 1.0" in server.state.metrics.render().decode()
            after = asyncio.run(stream(chat_url(server.ws, events=True), speech[: 24000 * 2]))
            assert after.close_code in (None, p.CLOSE_NORMAL) and after.audio_messages >= 20
        finally:
            release.set()
