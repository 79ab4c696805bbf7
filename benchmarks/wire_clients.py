"""Real-time clients of both protocols that count what crosses the wire, for `bench load --protocol`.

Each streams the same PCM on an absolute schedule, one page at a time, and measures the bytes of WebSocket
payload each way and the lag of every agent frame: from sending the last sample of user frame k to holding all of
agent frame k (decoded). `/api/chat` sends Ogg Opus pages (`sphn`, as the client library does); `/v1/realtime`
sends base64 PCM16 in JSON events, as the OpenAI SDKs do.
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import sphn
import websockets

from frontend_model.frame import FRAME_SAMPLES, SAMPLE_RATE
from server.wire import protocol as p

Protocol = Literal["moshi", "realtime"]
DRAIN_S = 10.0  # after the last page, how long the agent's last frames may take on a slow host


@dataclass
class WireResult:
    protocol: Protocol
    seconds: float = 0.0  # audio sent
    bytes_up: int = 0
    bytes_down: int = 0
    frames_sent: int = 0
    agent_samples: int = 0
    lag_ms: list[float] = field(default_factory=list)  # per agent frame
    sent_at: list[float] = field(default_factory=list)  # perf_counter when user frame k was complete

    def heard(self, samples: int) -> None:
        """`samples` more agent audio arrived now: every frame it completes gets its lag."""
        before = self.agent_samples // FRAME_SAMPLES
        self.agent_samples += samples
        now = time.perf_counter()
        for k in range(before, min(self.agent_samples // FRAME_SAMPLES, len(self.sent_at))):
            self.lag_ms.append((now - self.sent_at[k]) * 1e3)


async def _pace(result: WireResult, pcm: np.ndarray, page_samples: int, start_at: float,
                send_page: Callable[[np.ndarray], Awaitable[None]]) -> None:
    pages = len(pcm) // page_samples
    for i in range(pages):
        await asyncio.sleep(max(0.0, start_at + (i + 1) * page_samples / SAMPLE_RATE - time.perf_counter()))
        await send_page(pcm[i * page_samples:(i + 1) * page_samples])
        while len(result.sent_at) < (i + 1) * page_samples // FRAME_SAMPLES:
            result.sent_at.append(time.perf_counter())
    result.frames_sent = len(result.sent_at)
    result.seconds = pages * page_samples / SAMPLE_RATE


async def _drain(result: WireResult) -> None:
    deadline = time.monotonic() + DRAIN_S
    while result.agent_samples < (result.frames_sent - 1) * FRAME_SAMPLES and time.monotonic() < deadline:
        await asyncio.sleep(0.05)


async def moshi_session(base_ws: str, pcm: np.ndarray, page_samples: int, start_at: float) -> WireResult:
    result = WireResult("moshi")
    writer, reader = sphn.OpusStreamWriter(SAMPLE_RATE), sphn.OpusStreamReader(SAMPLE_RATE)
    async with websockets.connect(f"{base_ws}/api/chat", max_size=None) as ws:
        assert await ws.recv() == p.handshake()

        async def send_page(chunk: np.ndarray) -> None:
            pages = writer.append_pcm(chunk)
            if pages:
                message = p.audio_message(pages)
                result.bytes_up += len(message)
                await ws.send(message)

        async def receive() -> None:
            async for message in ws:
                result.bytes_down += len(message)
                if isinstance(message, bytes) and message[:1] == bytes([p.Kind.AUDIO]):
                    result.heard(np.asarray(reader.append_bytes(message[1:])).size)

        receiver = asyncio.create_task(receive())
        await _pace(result, pcm, page_samples, start_at, send_page)
        await _drain(result)
        receiver.cancel()
    return result


async def realtime_session(base_ws: str, pcm: np.ndarray, page_samples: int, start_at: float) -> WireResult:
    result = WireResult("realtime")
    async with websockets.connect(f"{base_ws}/v1/realtime?model=bench", max_size=None) as ws:
        first = json.loads(await ws.recv())
        assert first["type"] == "session.created", first

        async def send_page(chunk: np.ndarray) -> None:
            samples = (np.clip(chunk, -1, 1) * 32767).astype("<i2").tobytes()
            message = json.dumps({"type": "input_audio_buffer.append", "audio": base64.b64encode(samples).decode()})
            result.bytes_up += len(message)
            await ws.send(message)

        async def receive() -> None:
            async for message in ws:
                result.bytes_down += len(message)
                event = json.loads(message)
                if event["type"] == "response.output_audio.delta":
                    result.heard(len(base64.b64decode(event["delta"])) // 2)

        receiver = asyncio.create_task(receive())
        await _pace(result, pcm, page_samples, start_at, send_page)
        await _drain(result)
        receiver.cancel()
    return result


SESSIONS = {"moshi": moshi_session, "realtime": realtime_session}
