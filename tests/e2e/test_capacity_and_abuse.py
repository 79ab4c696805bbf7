"""Capacity refusal, a stalled reader, and bad input: the server refuses or reports, and keeps serving."""

from __future__ import annotations

import asyncio
import json
import os
import time

import httpx
import numpy as np
import pytest
import sphn
import websockets

from benchmarks.harness import StreamResult, stream
from contextspan_client import chat_url
from frontend_model.frame import FRAME_SAMPLES, SAMPLE_RATE
from server.wire import protocol as p

from .pace import assert_kept_pace
from .servers import RunningServer

pytestmark = pytest.mark.slow

async def refused_within(url: str) -> tuple[int | None, str, float]:
    start = time.perf_counter()
    async with websockets.connect(url) as ws:
        with pytest.raises(websockets.ConnectionClosed):
            await asyncio.wait_for(ws.recv(), timeout=5)
    return ws.close_code, ws.close_reason or "", time.perf_counter() - start


def test_capacity_refuses_at_once_and_others_keep_deadlines(server: RunningServer, speech: np.ndarray) -> None:
    async def run() -> tuple[list[StreamResult], tuple[int | None, str, float]]:
        clients = [asyncio.create_task(stream(chat_url(server.ws, events=True), speech)) for _ in range(2)]
        await asyncio.sleep(2.0)
        refusal = await refused_within(chat_url(server.ws))
        return list(await asyncio.gather(*clients)), refusal

    results, (code, reason, elapsed) = asyncio.run(run())
    assert code == p.CLOSE_TRY_AGAIN and json.loads(reason)["error"] == "at_capacity"
    assert elapsed < 1.0, elapsed
    for result in results:
        assert_kept_pace(result, min_frames=50)
    assert 'contextspan_sessions_total{outcome="refused_capacity"} 1.0' in server.metrics()


def test_stalled_reader_is_bounded_and_others_unaffected(server: RunningServer, speech: np.ndarray) -> None:
    pcm = np.concatenate([speech, speech])  # ~11 s
    rss_before = server.rss_bytes()
    samples: list[int] = []

    async def sample_rss() -> None:
        while True:
            samples.append(server.rss_bytes())
            await asyncio.sleep(0.5)

    async def run() -> list[StreamResult]:
        sampler = asyncio.create_task(sample_rss())
        stalled = stream(chat_url(server.ws, events=True), pcm, pause_reading_s=(1.0, 5.0), tail_s=2.0)
        normal = stream(chat_url(server.ws, events=True), pcm)
        try:
            return list(await asyncio.gather(stalled, normal))
        finally:
            sampler.cancel()

    stalled, normal = asyncio.run(run())
    assert max(samples) - rss_before < 64 * 2**20, (rss_before, max(samples))
    assert_kept_pace(normal, min_frames=100)
    # The stalled client got the audio it had not lost to the bounded send queue, and nothing more.
    dropped = stalled.of_type("stats")[-1].audio_dropped
    assert stalled.audio_messages + dropped >= stalled.frames_sent - 2


def test_bad_input_gets_errors_and_the_server_keeps_serving(server: RunningServer, speech: np.ndarray) -> None:
    async def run() -> tuple[list[str], int, int | None]:
        writer = sphn.OpusStreamWriter(SAMPLE_RATE)
        codes: list[str] = []
        audio = 0
        async with websockets.connect(chat_url(server.ws, events=True)) as ws:
            assert await ws.recv() == p.handshake()
            bad = [b"\x07hello", b"", p.audio_message(os.urandom(300)), p.audio_message(b"OggS" + os.urandom(200)),
                   b"\x00", "{not json", json.dumps({"type": "session.update", "persona": "pirate"}),
                   json.dumps({"type": "explode"})]
            for message in bad:
                await ws.send(message)
            for i in range(25):  # then 2 s of good audio: the session goes on
                chunk = speech[i * FRAME_SAMPLES : (i + 1) * FRAME_SAMPLES]
                await ws.send(p.audio_message(writer.append_pcm(chunk)))
                await asyncio.sleep(0.08)
            end = time.monotonic() + 1.0
            while time.monotonic() < end:
                try:
                    message = await asyncio.wait_for(ws.recv(), timeout=0.2)
                except TimeoutError:
                    continue
                if isinstance(message, str):
                    event = p.decode_event(message)
                    if event.type == "error":
                        codes.append(event.code)
                elif message[0] == p.Kind.AUDIO:
                    audio += 1
            await ws.send(p.audio_message(b"\x00" * 400_000))  # over --max-message-bytes
            with pytest.raises(websockets.ConnectionClosed):
                while True:
                    await asyncio.wait_for(ws.recv(), timeout=5)
        return codes, audio, ws.close_code

    codes, audio, close_code = asyncio.run(run())
    assert codes[:8] == ["unknown_kind", "empty_message", "bad_audio", "bad_audio", "unexpected_kind",
                         "invalid_json", "persona_locked", "unknown_type"]
    assert audio >= 20
    assert close_code == p.CLOSE_TOO_BIG
    assert httpx.get(f"{server.http}/readyz").json()["free_slots"] == 2
    after = asyncio.run(stream(chat_url(server.ws), speech[: SAMPLE_RATE]))
    assert after.audio_messages >= 11


@pytest.mark.parametrize(("query", "error"), [("persona=" + "x" * 3000, "bad_persona"),
                                              ("voice=nobody", "bad_persona"),
                                              ("text_temperature=9", "bad_sampling"),
                                              ("audio_topk=many", "bad_sampling")])
def test_bad_session_options_are_refused(server: RunningServer, query: str, error: str) -> None:
    code, reason, _ = asyncio.run(refused_within(f"{server.ws}/api/chat?{query}"))
    assert code == p.CLOSE_POLICY and json.loads(reason)["error"] == error


def test_health_ready_metrics(server: RunningServer) -> None:
    assert httpx.get(f"{server.http}/healthz").json() == {"status": "alive"}
    ready = httpx.get(f"{server.http}/readyz")
    assert ready.status_code == 200 and ready.json()["free_slots"] == 2 and ready.json()["random_weights"]
    metrics = server.metrics()
    for name in ("contextspan_sessions_active", "contextspan_step_latency_seconds_bucket",
                 "contextspan_deadline_misses_total", "contextspan_span_injections_total",
                 "contextspan_frames_dropped_total", "contextspan_frame_latency_seconds_count"):
        assert name in metrics, name
