"""`stream`: one real-time client session as the tests and benchmarks drive it, with everything it got back."""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from contextspan_client import AudioChunk, SessionClosed, TextPiece, connect
from frontend_model.frame import FRAME_SAMPLES, SAMPLE_RATE

DRAIN_LIMIT_S = 60.0  # how long after its last frame a session is still read while the server's audio keeps coming


@dataclass
class StreamResult:
    """What one `stream` session sent and got back; the close code is recorded, never raised."""

    handshake_s: float | None = None  # seconds from connect to the handshake
    frames_sent: int = 0
    audio_messages: int = 0
    output_samples: int = 0
    text_pieces: list[str] = field(default_factory=list)
    events: list[Any] = field(default_factory=list)
    close_code: int | None = None
    close_reason: str = ""

    @property
    def output_seconds(self) -> float:
        return self.output_samples / SAMPLE_RATE

    def of_type(self, kind: str) -> list[Any]:
        return [e for e in self.events if e.type == kind]


async def stream(
    url: str,
    pcm: np.ndarray,
    tail_s: float = 0.6,
    pause_reading_s: tuple[float, float] | None = None,
    token: str | None = None,
    page_samples: int = FRAME_SAMPLES,
    start_at: float | None = None,
    until: Callable[[StreamResult], bool] | None = None,
    until_timeout_s: float = 30.0,
    texts: Sequence[tuple[float, str]] = (),
    every_stats: bool = False,
) -> StreamResult:
    """For tests and benchmarks: send `pcm` (24 kHz float32) as Ogg Opus, `page_samples` at a time (default one
    80 ms frame; a divisor of it, at least 960, for shorter pages), paced by an absolute schedule, and collect
    everything the server sends until its audio has been quiet for `tail_s` after the last frame (a server behind
    real time on a slow host is still answering: at most DRAIN_LIMIT_S more), or until the server closes (its close
    code is in the result, not raised).

    `pause_reading_s=(start, length)` stops reading for `length` seconds from `start`, as a stalled client.
    `token` is a session token from POST /api/token, sent as an app does: `Authorization: Bearer`.
    `start_at` (a `time.perf_counter()` value) starts sending then instead of right after the handshake.
    `until`: after `pcm`, keep the session going with silence until `until(result)` holds (at most
    `until_timeout_s`), e.g. until an answer the client waits for has come, however long this host takes.
    `texts` are (seconds into the audio, JSON text message) pairs, e.g. a `span.inject`, sent at those times.
    `every_stats`: after the audio, also wait for the `stats` (sent once a second) that time every frame answered,
    so that a benchmark measures them all (at most DRAIN_LIMIT_S in all; a session needs `events`).
    """
    if FRAME_SAMPLES % page_samples or page_samples < 960:
        raise ValueError(f"page_samples must divide {FRAME_SAMPLES} and be at least 960 (sphn's Opus page)")
    pages_per_frame = FRAME_SAMPLES // page_samples
    result = StreamResult()
    frames = len(pcm) // FRAME_SAMPLES
    t0 = time.perf_counter()
    async with connect(url, token=token, events=False) as conversation:
        result.handshake_s = time.perf_counter() - t0
        result.events.extend(conversation.preparing)

        async def send() -> None:
            start = time.perf_counter() if start_at is None else start_at
            silence = np.zeros(page_samples, np.float32)
            pending = sorted(texts)
            give_up = math.inf
            i = 0
            while True:
                if i < frames * pages_per_frame:
                    page = pcm[i * page_samples : (i + 1) * page_samples].astype(np.float32)
                elif until is not None and not until(result) and time.perf_counter() < give_up:
                    give_up = min(give_up, time.perf_counter() + until_timeout_s)
                    page = silence
                else:
                    return
                await asyncio.sleep(max(0.0, start + i * page_samples / SAMPLE_RATE - time.perf_counter()))
                try:
                    while pending and pending[0][0] <= i * page_samples / SAMPLE_RATE:
                        await conversation.send(pending.pop(0)[1])
                    await conversation.send_audio(page)
                except SessionClosed:
                    return  # the server ended the session: what it sent, and its close code, are the result
                i += 1
                if i % pages_per_frame == 0:
                    result.frames_sent += 1

        last_audio = time.perf_counter()

        async def receive() -> None:
            nonlocal last_audio
            start = time.perf_counter()
            paused = False
            with contextlib.suppress(SessionClosed):
                async for item in conversation:
                    if pause_reading_s and not paused and time.perf_counter() - start >= pause_reading_s[0]:
                        paused = True
                        await asyncio.sleep(pause_reading_s[1])
                    if isinstance(item, AudioChunk):
                        last_audio = time.perf_counter()
                        result.audio_messages += 1
                        result.output_samples += item.pcm.size
                    elif isinstance(item, TextPiece):
                        result.text_pieces.append(item.text)
                    else:
                        result.events.append(item)

        receiver = asyncio.create_task(receive())
        try:
            await send()
            sent = time.perf_counter()
            while conversation.close_code is None and time.perf_counter() - sent < DRAIN_LIMIT_S:
                quiet_until = max(last_audio, sent) + tail_s
                if time.perf_counter() >= quiet_until:
                    break
                await asyncio.sleep(quiet_until - time.perf_counter())
            while (every_stats and conversation.close_code is None and time.perf_counter() - sent < DRAIN_LIMIT_S
                   and sum(s.frames_out for s in result.of_type("stats")) < result.audio_messages):
                await asyncio.sleep(0.05)
        finally:
            receiver.cancel()
            await asyncio.gather(receiver, return_exceptions=True)
    result.close_code = conversation.close_code
    result.close_reason = conversation.close_reason
    return result
