"""The same frames give the same agent transcript live (a session on the server) and offline (`contextspan infer`):
both ask the checkpoint which text ids are text (frontend_model/span/text_ids.py)."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest
import torch

from benchmarks.harness import stream
from contextspan_client import chat_url
from frontend_model.frame import SAMPLE_RATE
from frontend_model.loading.loader import load_model
from frontend_model.moshi_internals.row_sampling import RowSampling, SamplingConfig
from server.offline.infer import OfflineSession
from server.session.backend import Backend
from server.wire import protocol as p

from .servers import in_process_server, pinned_settings

pytestmark = pytest.mark.slow
SEEDS = {"text_seed": "7", "audio_seed": "8"}


def test_a_live_session_and_infer_write_the_same_transcript_of_the_same_frames(speech: np.ndarray) -> None:
    settings = pinned_settings(max_sessions=1, asr=False, recordings=False)
    stepped: list[np.ndarray] = []
    with in_process_server(settings, load_model("tiny", device="cpu", dtype=torch.float32)) as running:
        batcher = running.state.batcher
        assert batcher is not None
        step = batcher.step

        async def recording_step(slot: int, frame: Any) -> Any:
            stepped.append(frame.pcm.copy())
            return await step(slot, frame)

        batcher.step = recording_step  # type: ignore[method-assign]
        live = asyncio.run(stream(chat_url(running.ws, events=True, **SEEDS), speech[: 3 * SAMPLE_RATE]))
    live_text = [e.text for e in live.of_type("agent.text")]

    model = load_model("tiny", device="cpu", dtype=torch.float32)  # the same weights (seed 0), not streaming
    backend = Backend.create(settings)
    sampling = RowSampling.from_config(SamplingConfig(), int(SEEDS["text_seed"]), int(SEEDS["audio_seed"]))

    # The frames were recorded as the live session stepped them, its leveller's output: not levelled a second time.
    stepped_as_is = settings.model_copy(update={"level_user_audio": False})

    async def offline() -> list[Any]:
        try:
            session = OfflineSession(model, backend, stepped_as_is, sampling=sampling)
            return (await session.run(np.concatenate(stepped))).events
        finally:
            await backend.aclose()

    offline_text = [e.text for e in asyncio.run(offline()) if isinstance(e, p.AgentText)]
    assert len(stepped) >= 30 and live_text
    # The random tiny model samples byte pieces as often as words: a filter that kept them would differ here.
    assert offline_text == live_text
