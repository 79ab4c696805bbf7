"""A served session of several context windows over a real WebSocket keeps its prefix and keeps answering: the tiny
model with a 96-frame (7.7 s) context, a 46-frame persona prefilled, about 8 s of audio (100 frames: a roll after 50,
then one every 12)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import numpy as np
import pytest

from benchmarks.harness import stream
from contextspan_client import chat_url
from frontend_model.loading.loader import load_model
from server.wire import protocol as p

from .pace import assert_kept_pace
from .servers import in_process_server, pinned_settings
from .test_batching import count_and_sum

pytestmark = pytest.mark.slow

CONTEXT = 96


def test_a_session_longer_than_the_context_rolls_its_window_and_keeps_answering(tmp_path: Path,
                                                                               speech: np.ndarray) -> None:
    settings = pinned_settings(recordings_dir=tmp_path / "rec", asr=False, window="keep-prefix",
                               persona="You are a helpful travel assistant called Ada.")
    with in_process_server(settings, load_model("tiny", context=CONTEXT)) as server:
        ready = httpx.get(f"{server.http}/readyz").json()
        assert (ready["window"], ready["window_refill"]) == ("keep-prefix", "ahead")
        audio = np.concatenate([speech, np.zeros(24_000 * 5 // 2, np.float32)])
        result = asyncio.run(stream(chat_url(server.ws, events=True), audio))
        rolls, _ = count_and_sum(server.state.metrics.window_rolls)
        in_tick = server.state.metrics.window_rolls_in_tick._value.get()
    assert result.close_code in (None, p.CLOSE_NORMAL)
    assert_kept_pace(result, min_frames=60)
    assert rolls >= 3 and in_tick == 0  # every window was built ahead
