"""`contextspan serve --profile personaplex|contextspan --checkpoint DIR` on tiny checkpoints written in the real
file layouts, to a real client on loopback: handshake after the voice + persona prefix, one frame out per frame in."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import numpy as np
import pytest

from benchmarks.harness import stream
from contextspan_client import chat_url
from frontend_model.frame import FRAME_SAMPLES, SAMPLE_RATE
from frontend_model.loading.loader import load_model
from frontend_model.loading.profiles import Layout
from frontend_model.loading.tiny_files import write_tiny_checkpoint

from .servers import start_server, stop_server

pytestmark = pytest.mark.slow


# Each layout with the voice format its release ships (PersonaPlex's replayed embeddings, Context Spanning's codes),
# the other format too, and Context Spanning weights as a compiled training run saves them (`_orig_mod.` keys).
@pytest.mark.parametrize(("profile", "voice", "compiled_keys"), [
    ("personaplex", "tiny-embeddings", False),
    ("personaplex", "tiny-codes", False),
    ("contextspan", "tiny-codes", False),
    ("contextspan", "tiny-embeddings", True),
])
def test_serves_a_checkpoint_in_its_layout(tmp_path: Path, profile: Layout, voice: str, compiled_keys: bool) -> None:
    checkpoint = write_tiny_checkpoint(profile, tmp_path / "checkpoint", compiled_keys=compiled_keys)
    server = start_server(tmp_path, "--profile", profile, "--checkpoint", str(checkpoint), "--no-asr",
                          "--app-spans", "on")
    inject = json.dumps({"type": "span.inject", "text": "The museum opens at nine.", "source": "test"})
    try:
        pcm = (0.05 * np.random.default_rng(0).standard_normal(2 * SAMPLE_RATE)).astype(np.float32)
        url = chat_url(server.ws, events=True, voice=voice, persona="Ada")
        result = asyncio.run(stream(url, pcm, texts=[(0.8, inject)],
                                    until=lambda r: bool(r.of_type("span.injected") or r.of_type("span.dropped"))))
        readyz = httpx.get(f"{server.http}/readyz", timeout=10).json()
    finally:
        stop_server(server)
    # Clients are told which checkpoint by its folder's name, never this host's path to it; the log says where.
    assert readyz["description"] == f"{profile}: checkpoint ({profile} layout)"
    assert str(tmp_path) in server.log.read_text()
    assert result.handshake_s is not None and result.frames_sent >= len(pcm) // FRAME_SAMPLES
    assert abs(result.audio_messages - result.frames_sent) <= 1, (result.audio_messages, result.frames_sent)
    ready = result.of_type("session.ready")
    assert len(ready) == 1 and ready[0].profile == profile and not ready[0].random_weights
    assert ready[0].description == readyz["description"]
    # The handshake came after the voice, silence, `<system> Ada <system>` and silence frames were prefilled.
    model = load_model(profile, str(checkpoint), device="cpu")
    prompt = model.voice_prompts[voice]
    # A codes voice is the stream's initial column, then one frame a code column (as trained); an embeddings voice
    # its replayed columns and the restored one.
    voice_frames = prompt.codes.shape[1] + 1 if prompt.codes is not None else prompt.embeddings.shape[0] + 1
    silence = model.span.prefix_silence_frames
    persona_frames = len(model.tokenizer.encode("<system> Ada <system>"))
    assert ready[0].prefix_frames == voice_frames + 2 * silence + persona_frames, (ready[0], voice_frames)
    assert ready[0].prefill_ms > 0
    spans = result.of_type("span.injected")
    assert len(spans) == 1, result.events
    span = spans[0]
    assert span.text == "The museum opens at nine." and span.source == "test" and span.tool == "app"
    assert span.offset_before > ready[0].prefix_frames and span.offset_after - span.offset_before == span.frames
