"""The worker-side session: one step per frame, a span injected at the next frame boundary, or dropped."""

from __future__ import annotations

import dataclasses
import time

import numpy as np
import pytest
import torch

from frontend_model.frame import FRAME_SAMPLES
from frontend_model.loading.loader import LoadedModel, load_model
from frontend_model.span.voice_prompt import VoicePrompt
from server.offline.stack import ModelSession
from server.session.persona import PersonaError, build_persona_block
from server.session.retrieval import SpanAnswer
from server.session.spans import span_request
from server.wire.frame_clock import InputFrame


@pytest.fixture(scope="module")
def model() -> LoadedModel:
    return load_model("tiny")


def frame(i: int) -> InputFrame:
    t = np.arange(FRAME_SAMPLES) / 24000
    return InputFrame(i, (0.1 * np.sin(2 * np.pi * 220 * t)).astype(np.float32), time.perf_counter())


def answer(text: str, triggered: float | None = None) -> SpanAnswer:
    return SpanAnswer(text, "calendar", "test", None, time.perf_counter() if triggered is None else triggered)


def test_steps_inject_and_drop(model: LoadedModel) -> None:
    session = ModelSession(model, span_deadline_s=2.5)
    session.open(None)
    try:
        first = session.step(frame(0), None)
        assert first.agent_pcm is None  # delays still filling
        second = session.step(frame(1), None)
        assert second.agent_pcm is not None and second.agent_pcm.shape == (FRAME_SAMPLES,)

        offset = session.engine.offset
        out = session.step(frame(2), span_request(answer("The meeting is at noon."), session.prepare_span))
        (span,) = out.spans
        assert span.injected and span.frames >= 3
        assert session.engine.offset == offset + span.frames + 1

        late = session.step(frame(3), span_request(answer("too late", time.perf_counter() - 10),
                                                   session.prepare_span))
        assert [(s.injected, s.reason) for s in late.spans] == [(False, "late")]
        empty = session.step(frame(4), span_request(answer("   "), session.prepare_span))
        assert [s.reason for s in empty.spans] == ["empty text"]
    finally:
        session.close()


def test_a_span_that_waited_on_a_client_tool_is_late_only_a_span_deadline_after_the_tools_answer(
        model: LoadedModel) -> None:
    session = ModelSession(model, span_deadline_s=2.5)
    session.open(None)
    try:
        session.step(frame(0), None)
        session.step(frame(1), None)
        now = time.perf_counter()
        fresh = SpanAnswer("Sunny in Paris.", "client:get_weather", "get_weather", None, now - 8, waited_until=now - 1)
        stale = SpanAnswer("Rain in Paris.", "client:get_weather", "get_weather", None, now - 8, waited_until=now - 3)
        injected = session.step(frame(2), span_request(fresh, session.prepare_span))
        assert [(s.injected, s.reason) for s in injected.spans] == [(True, None)]
        late = session.step(frame(3), span_request(stale, session.prepare_span))
        assert [(s.injected, s.reason) for s in late.spans] == [(False, "late")]
    finally:
        session.close()


def test_persona_prefill_fills_the_delays(model: LoadedModel) -> None:
    session = ModelSession(model, span_deadline_s=2.5)
    prefix = build_persona_block(model, "You are a helpful assistant.", None, 640)
    assert prefix is not None
    assert session.open(prefix) > 0
    try:
        assert session.engine.offset == prefix.frames
        assert session.step(frame(0), None).agent_pcm is not None
    finally:
        session.close()


def test_persona_errors(model: LoadedModel) -> None:
    with pytest.raises(PersonaError, match="unknown voice"):
        build_persona_block(model, "hi", "nobody", 640)
    with pytest.raises(PersonaError, match="at most 5 fit"):
        build_persona_block(model, "a long persona that takes more than five frames", None, 5)
    assert build_persona_block(model, "", None, 640) is None


def test_persona_block_takes_the_voice_from_the_model(model: LoadedModel) -> None:
    codes = torch.randint(0, 2048, (model.span.agent_codebooks, 4), generator=torch.Generator().manual_seed(0))
    voiced = dataclasses.replace(model, voice_prompts={"ada": VoicePrompt("ada", codes=codes),
                                                        "broken": VoicePrompt("broken")})
    prefix = build_persona_block(voiced, "You are Ada.", "ada", 640)
    plain = build_persona_block(voiced, "You are Ada.", None, 640)
    assert prefix is not None and plain is not None
    assert prefix.frames == plain.frames + 4 + model.span.prefix_silence_frames
    assert torch.equal(prefix.block.tokens[1 : 1 + model.span.agent_codebooks, :4], codes)
    with pytest.raises(PersonaError, match="neither codes nor embeddings"):
        build_persona_block(voiced, "hi", "broken", 640)


def test_voice_prompts_by_format() -> None:
    model = load_model("tiny-contextspan", device="cpu", dtype=torch.float32)
    codes = model.voice_prompts["tiny-codes"].codes
    assert codes is not None
    prefix = build_persona_block(model, "hi", "tiny-codes", 640)
    assert prefix is not None and torch.equal(prefix.block.tokens[1 : 1 + model.span.agent_codebooks, : codes.shape[1]],
                                              codes)
    replayed = build_persona_block(model, "hi", "tiny-embeddings", 640)
    assert replayed is not None and replayed.embeddings is not None
    session = ModelSession(model, span_deadline_s=2.5)
    session.open(replayed)
    try:
        assert session.engine.offset == replayed.frames
        assert session.step(frame(0), None).agent_pcm is not None
    finally:
        session.close()
