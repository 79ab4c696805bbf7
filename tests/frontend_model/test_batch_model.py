"""The server's batched model, PCM in and PCM out: each slot hears and says what one session alone would.

Four sessions share one BatchedModel (Mimi encode, LM step, Mimi decode batched), with a persona prefix for one,
joins and leaves, frames missing on some ticks, and spans injected mid-stream, after every ring has wrapped.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pytest
import torch

from frontend_model.engine.batch_model import BatchedModel
from frontend_model.engine.codec import FrameCodec
from frontend_model.engine.engine import GREEDY, Engine
from frontend_model.frame import FRAME_SAMPLES
from frontend_model.loading.loader import LoadedModel, load_model
from frontend_model.moshi_internals.graphs import graph_path
from frontend_model.span.block import Block, Prefix
from frontend_model.span.build import build_prefix
from frontend_model.span.voice_prompt import VoicePrompt
from tests.support.engine import TEST_DEVICE, span_like_block, tiny_model

CONTEXT = 8
MAX_SPAN = 24
TICKS = 60  # > CONTEXT + MAX_SPAN: every ring wraps


@pytest.fixture(scope="module")
def model() -> LoadedModel:
    return load_model("tiny", device=TEST_DEVICE, dtype=torch.float32, context=CONTEXT)


@pytest.fixture(scope="module")
def personaplex_model() -> LoadedModel:
    return tiny_model(dep_q=16, context=CONTEXT)


@dataclass
class Plan:
    seed: int
    join: int = 0
    leave: int = TICKS
    idle: set[int] = field(default_factory=set)
    span_at: int | None = None
    prefix_frames: int = 0


def speech(seed: int) -> np.ndarray:
    return (0.2 * np.random.default_rng(seed).standard_normal((TICKS, FRAME_SAMPLES))).astype(np.float32)


def alone(model: LoadedModel, plan: Plan, prefix: Prefix | None, span: Block | None) -> list[tuple]:
    pcm = speech(plan.seed)
    got: list[tuple] = []
    codec = FrameCodec(model.mimi)
    codec.open()
    with Engine(model, GREEDY, max_span_frames=MAX_SPAN) as engine:
        if prefix is not None:
            engine.prefill(prefix)
        for tick in range(plan.join, plan.leave):
            if tick in plan.idle:
                continue
            if tick == plan.span_at and span is not None:
                engine.inject(span)
            result = engine.step(codec.encode(pcm[tick]))
            audio = codec.decode(result.agent_codes) if result.agent_codes is not None else None
            got.append((result.text_token, audio))
    codec.close()
    return got


def batched(model: LoadedModel, plans: list[Plan], prefixes: list[Prefix | None],
            spans: list[Block | None], compact: bool) -> list[list[tuple]]:
    pcm = [speech(p.seed) for p in plans]
    got: list[list[tuple]] = [[] for _ in plans]
    together = BatchedModel(model, len(plans), GREEDY, max_span_frames=MAX_SPAN)
    together.engine.compact = together.codec.compact = compact
    together.start()
    together.warm_up()  # leaves nothing behind: each slot is reset when it opens
    try:
        for tick in range(TICKS):
            frames = {}
            for slot, plan in enumerate(plans):
                if tick == plan.join:
                    together.open_slot(slot, prefixes[slot])
                if tick == plan.span_at and spans[slot] is not None:
                    together.inject(slot, spans[slot])  # type: ignore[arg-type]
                if plan.join <= tick < plan.leave and tick not in plan.idle:
                    frames[slot] = pcm[slot][tick]
            for slot, out in together.tick(frames).items():
                got[slot].append((out.text_token, out.agent_pcm))
    finally:
        together.close()
    return got


# compact: see tests/conftest.py (compact, whole batch, replayed graph outputs).
def test_four_sessions_in_one_batch_equal_each_alone(model: LoadedModel, compact: bool) -> None:
    plans = [
        Plan(1, idle={4, 5, 30}, span_at=45),
        Plan(2, prefix_frames=6, span_at=12),
        Plan(3, join=10, leave=50, span_at=40),
        Plan(4, leave=25),
    ]
    probe = Engine(model, GREEDY, max_span_frames=MAX_SPAN)
    prefixes = [Prefix(span_like_block(probe, p.prefix_frames, seed=100 + p.seed)) if p.prefix_frames else None
                for p in plans]
    spans = [span_like_block(probe, MAX_SPAN, seed=p.seed) if p.span_at is not None else None for p in plans]
    together = batched(model, plans, prefixes, spans, compact)
    for slot, plan in enumerate(plans):
        expected = alone(model, plan, prefixes[slot], spans[slot])
        assert len(together[slot]) == len(expected)
        assert [t for t, _ in together[slot]] == [t for t, _ in expected], f"slot {slot}: text differs"
        assert sum(t is not None for t, _ in expected) > 10
        for (_, got_pcm), (_, want_pcm) in zip(together[slot], expected, strict=True):
            assert (got_pcm is None) == (want_pcm is None)
            if want_pcm is not None:
                np.testing.assert_allclose(got_pcm, want_pcm, atol=1e-5)


def test_dep_q16_sessions_with_a_voice_prefix_equal_each_alone(personaplex_model: LoadedModel) -> None:
    model = personaplex_model
    codes = torch.randint(0, 2048, (model.span.agent_codebooks, 6), generator=torch.Generator().manual_seed(3))
    prefix = build_prefix("", model.tokenizer, model.span, VoicePrompt("v", codes=codes), model.lm.delays)
    assert prefix is not None and prefix.frames <= MAX_SPAN
    plans = [Plan(1, span_at=30), Plan(2, join=5, span_at=20), Plan(3, idle={9, 10}, leave=40)]
    prefixes = [None, prefix, None]
    probe = Engine(model, GREEDY, max_span_frames=MAX_SPAN)
    spans = [span_like_block(probe, 12, seed=p.seed) if p.span_at is not None else None for p in plans]
    together = batched(model, plans, prefixes, spans, compact=not graph_path(model.device))
    for slot, plan in enumerate(plans):
        expected = alone(model, plan, prefixes[slot], spans[slot])
        assert [t for t, _ in together[slot]] == [t for t, _ in expected], f"slot {slot}: text differs"
        for (_, got_pcm), (_, want_pcm) in zip(together[slot], expected, strict=True):
            assert (got_pcm is None) == (want_pcm is None)
            if want_pcm is not None:
                np.testing.assert_allclose(got_pcm, want_pcm, atol=1e-5)


def test_a_slot_steps_count_and_prefill_guard(model: LoadedModel) -> None:
    together = BatchedModel(model, 2, GREEDY, max_span_frames=MAX_SPAN)
    together.start()
    try:
        probe = Prefix(span_like_block(together.engine, 4, seed=1))
        together.open_slot(0, probe)
        together.open_slot(1, None)
        together.tick({0: np.zeros(FRAME_SAMPLES, np.float32)})
        assert together.frames_stepped == [1, 0]
        # The prefix fills its 4 frames after the stream's initial column (the trained layout), then one step.
        assert together.engine.slot_offset(0) == probe.frames + 1 == 6 and together.engine.slot_offset(1) == 0
        with pytest.raises(RuntimeError, match="prefill of slot 0 after its first step"):
            together.engine.prefill_slot(0, probe)
    finally:
        together.close()


def test_a_resumed_slot_takes_spans_at_once_unless_its_session_never_filled_a_column(model: LoadedModel) -> None:
    """A span waiting when a session was saved goes in at the resumed slot's first frame boundary; a session saved
    before it filled a column has nothing to inject after (the engine refuses it): its span is dropped before the
    first frame, as it would have been on the first replica, instead of failing the session."""
    together = BatchedModel(model, 2, GREEDY, max_span_frames=MAX_SPAN, record=True)
    together.start()
    try:
        together.open_slot(0, None)
        empty = together.history(0)
        together.tick({0: np.zeros(FRAME_SAMPLES, np.float32)})
        together.resume_slot(1, together.history(0))
        assert together.frames_stepped[1] == 1
        together.resume_slot(1, empty)
        assert together.frames_stepped[1] == 0 and together.engine.slot_offset(1) == 0
    finally:
        together.close()
