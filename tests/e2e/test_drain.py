"""SIGTERM drains: new sessions refused, live ones warned and closed within the grace, recordings complete."""

from __future__ import annotations

import asyncio
import json
import signal
import time
import wave
from pathlib import Path

import httpx
import numpy as np
import pytest
import websockets

from benchmarks.harness import StreamResult, stream
from contextspan_client import chat_url
from frontend_model.frame import FRAME_SAMPLES, SAMPLE_RATE
from server.wire import protocol as p

from .servers import start_server, stop_server

pytestmark = pytest.mark.slow
GRACE_S = 4.0


def test_sigterm_drains_within_the_grace_period(tmp_path: Path, speech: np.ndarray) -> None:
    server = start_server(tmp_path, "--shutdown-grace-s", str(GRACE_S), "--no-asr")
    pcm = np.concatenate([speech, speech])  # ~11 s: longer than the grace

    async def run() -> tuple[StreamResult, int | None, int, float]:
        client = asyncio.create_task(stream(chat_url(server.ws, events=True), pcm))
        # SIGTERM once the session is live, however long a loaded host takes to start it: with none live yet, the
        # drain has nothing to wait for and the server exits at once (a fixed 2 s was once too short, one core busy).
        deadline = time.monotonic() + 60
        while (await asyncio.to_thread(httpx.get, f"{server.http}/api/info", timeout=5)).json()["sessions"] < 1:
            assert time.monotonic() < deadline and not client.done(), "the session never started"
            await asyncio.sleep(0.1)
        server.process.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        await asyncio.sleep(0.3)
        ready = httpx.get(f"{server.http}/readyz", timeout=5).status_code
        async with websockets.connect(chat_url(server.ws)) as late:
            with pytest.raises(websockets.ConnectionClosed):
                await asyncio.wait_for(late.recv(), timeout=5)
        result = await client
        await asyncio.to_thread(server.process.wait, GRACE_S + 10)
        return result, late.close_code, ready, time.monotonic() - signalled

    try:
        result, late_code, ready, exited_after = asyncio.run(run())
    finally:
        stop_server(server)
    assert ready == 503, "load balancers stop sending new sessions"
    assert late_code == p.CLOSE_TRY_AGAIN
    ending = result.of_type("session.ending")
    assert len(ending) == 1 and ending[0].reason == "server_shutdown" and ending[0].in_s == pytest.approx(GRACE_S - 1)
    assert result.close_code == p.CLOSE_GOING_AWAY and json.loads(result.close_reason)["error"] == "server_shutdown"
    assert server.process.returncode == 0
    # The sessions were closed at the grace deadline (above); the process then exits, Whisper's process and all: a
    # hang guard, not a speed bar.
    assert exited_after < GRACE_S + 30, exited_after

    session_id = result.of_type("session.ready")[0].session_id
    with wave.open(str(server.recordings / f"{session_id}.wav")) as wav:
        seconds = wav.getnframes() / wav.getframerate()
    streamed = result.frames_sent * FRAME_SAMPLES / SAMPLE_RATE
    assert streamed - 0.5 < seconds <= streamed + 0.1, (seconds, streamed)
    lines = [json.loads(line) for line in (server.recordings / f"{session_id}.jsonl").read_text().splitlines()]
    assert [line["type"] for line in lines if line["type"] == "session.ending"] == ["session.ending"]
    assert lines[-1]["type"] == "stats", "the last partial second was written at teardown"
