"""The bounded send path with a client that never reads: memory stays flat, the oldest audio is dropped."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

from frontend_model.frame import FRAME_SAMPLES
from frontend_model.loading.loader import LoadedModel, load_model
from server.ops.metrics import Metrics
from server.session.session import Session, SessionOptions
from server.session.spans import FrameOutput
from server.settings import ServerSettings
from server.wire.frame_clock import InputFrame


class StalledSocket:
    """A WebSocket whose peer stopped reading: every send blocks."""

    def __init__(self) -> None:
        self.query_params: dict[str, str] = {}
        self.sent = 0

    async def send_bytes(self, data: bytes) -> None:
        self.sent += 1
        await asyncio.Event().wait()

    send_text = send_bytes


@pytest.fixture(scope="module")
def model() -> LoadedModel:
    return load_model("tiny")


async def test_stalled_client_loses_oldest_audio_only(model: LoadedModel) -> None:
    settings = ServerSettings(recordings=False, send_queue_frames=5)
    metrics = Metrics()
    ws = StalledSocket()
    session = Session(ws, settings, model, None, 0, metrics, SessionOptions(events=True))  # type: ignore[arg-type]
    sender = asyncio.create_task(session._send_loop())
    try:
        pcm = np.zeros(FRAME_SAMPLES, np.float32)
        for i in range(200):
            session._on_output(FrameOutput(InputFrame(i, pcm, time.perf_counter()), pcm, 42, 0.01))
            await asyncio.sleep(0)
        queue = session.outbound
        audio_queued = sum(1 for item in queue._items if item.kind == "audio")
        assert ws.sent == 1  # the first message is stuck in the socket
        assert audio_queued == 5 and queue.audio_dropped == 200 - 1 - 5
        assert metrics.frames_dropped.labels("slow_client")._value.get() == queue.audio_dropped
    finally:
        sender.cancel()
