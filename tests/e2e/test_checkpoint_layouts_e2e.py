"""`contextspan serve --profile personaplex|contextspan --checkpoint DIR` on tiny checkpoints written in the real
file layouts, to a real client on loopback: handshake after the voice + persona prefix, one frame out per frame in."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from frontend_model.frame import FRAME_SAMPLES, SAMPLE_RATE
from frontend_model.profiles import Layout
from frontend_model.tiny_checkpoints import write_tiny_checkpoint
from server.client import chat_url, stream

from .servers import start_server, stop_server

pytestmark = pytest.mark.slow


# Each layout with the voice format its release ships: PersonaPlex's replayed embeddings, Context Spanning's codes.
@pytest.mark.parametrize(("profile", "voice"), [("personaplex", "tiny-embeddings"), ("contextspan", "tiny-codes")])
def test_serves_a_checkpoint_in_its_layout(tmp_path: Path, profile: Layout, voice: str) -> None:
    checkpoint = write_tiny_checkpoint(profile, tmp_path / "checkpoint")
    server = start_server(tmp_path, "--profile", profile, "--checkpoint", str(checkpoint), "--no-asr")
    try:
        pcm = (0.05 * np.random.default_rng(0).standard_normal(2 * SAMPLE_RATE)).astype(np.float32)
        url = chat_url(server.ws, events=True, voice=voice, persona="Ada")
        result = asyncio.run(stream(url, pcm))
    finally:
        stop_server(server)
    frames = len(pcm) // FRAME_SAMPLES
    assert result.handshake_s is not None and result.frames_sent == frames
    assert abs(result.audio_messages - frames) <= 1, (result.audio_messages, frames)
    ready = result.of_type("session.ready")
    assert len(ready) == 1 and ready[0].profile == profile and not ready[0].random_weights
