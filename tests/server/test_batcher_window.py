"""Served sessions past the context keep their prefix: the batcher rolls a slot's window in its tick, and the slot then
reads exactly what a fresh engine prefilled with [prefix + the same recent columns] reads (float32, tiny model with a
96-frame context, so that a session passes it in a few seconds of CPU)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
import torch

from frontend_model.engine.batch_model import BatchedModel
from frontend_model.engine.columns import embed_columns, forward_last
from frontend_model.engine.costs import PrefillCost, TickCost
from frontend_model.engine.engine import GREEDY, Engine
from frontend_model.engine.history import SessionHistory
from frontend_model.frame import FRAME_SAMPLES
from frontend_model.loading.loader import LoadedModel
from frontend_model.moshi_internals.kv_ring import attention_layers
from frontend_model.span.block import Block, Prefix
from frontend_model.span.build import build_prefix
from server.batching.batcher import Batcher
from server.batching.tick_scheduler import Capacity
from server.batching.window_policy import WindowPolicy
from server.batching.worker import ModelWorker
from server.ops.metrics import Metrics
from server.session.retrieval import SpanAnswer
from server.session.spans import FrameOutput
from server.wire.frame_clock import InputFrame
from tests.frontend_model.test_engine_equivalence import PERSONA, voice_codes
from tests.support.engine import tiny_model

CONTEXT = 96
MAX_SPAN = 64
POLICY = WindowPolicy.for_context(CONTEXT)


@pytest.fixture(scope="module")
def model() -> LoadedModel:
    return tiny_model(context=CONTEXT)


@pytest.fixture(scope="module")
def reference(model: LoadedModel) -> LoadedModel:
    """The same weights again, for the fresh engine beside the streaming batch (a model streams once at a time)."""
    again = tiny_model(context=CONTEXT)
    assert again.lm is not model.lm and torch.equal(again.lm.text_linear.weight, model.lm.text_linear.weight)
    return again


@pytest.fixture(scope="module")
def prefix(model: LoadedModel) -> Prefix:
    built = build_prefix(PERSONA, model.tokenizer, model.span, voice_codes(model, 7), model.lm.delays)
    assert built is not None and POLICY.keeps_prefix(built.frames)
    return built


@dataclass
class Roll:
    """What a roll left in its slot, read at once (before the tick's step), and that tick's step."""

    slot: int
    offset: int  # before the roll
    keep: int
    columns: torch.Tensor  # the kept frames' columns [rows, keep]
    kv: list[torch.Tensor]  # each layer's K/V of the slot, positions 0..P+keep-1
    token_ring: torch.Tensor
    codes: torch.Tensor | None = None  # the tick's user codes for the slot
    logits: torch.Tensor | None = None  # and its text logits
    ahead: bool = False  # a window built ahead swapped in, not a refill in the tick


@pytest.fixture
def batched(model: LoadedModel) -> Iterator[BatchedModel]:
    batched = BatchedModel(model, 2, GREEDY, max_span_frames=MAX_SPAN, record=True)
    batched.start()
    yield batched
    batched.close()


@pytest.fixture
def ahead(batched: BatchedModel) -> BatchedModel:
    """The batch with a shadow row that builds windows ahead, a chunk a tick, as the server starts it."""
    batched.build_windows_ahead(POLICY.ahead_chunk(batched.slots, MAX_SPAN))
    return batched


def spied(batched: BatchedModel) -> list[Roll]:
    """Every roll the batcher makes, with the slot's state right after it and the step of its tick."""
    rolls: list[Roll] = []
    engine = batched.engine
    keep_window, step_batch = batched.keep_window, engine.step_batch

    def roll(slot: int, prefix_frames: int, keep: int) -> None:
        offset = batched.slot_offset(slot)
        assert engine.recorder is not None
        columns = engine.recorder.recent(slot, offset, keep).long()
        keep_window(slot, prefix_frames, keep)
        kv = [attn._streaming_state.kv_cache.cache[:, slot, :, : prefix_frames + keep].clone()
              for attn in attention_layers(batched.model.lm.transformer)]
        rolls.append(Roll(slot, offset, keep, columns, kv, engine._state().cache[slot].clone()))

    def step(codes: torch.Tensor, active: torch.Tensor):  # type: ignore[no-untyped-def]
        out = step_batch(codes, active)
        for r in rolls:
            if r.codes is None:
                assert engine.last_text_logits is not None
                r.codes, r.logits = codes[r.slot].clone(), engine.last_text_logits[r.slot].clone()
        return out

    batched.keep_window = roll  # type: ignore[method-assign]
    engine.step_batch = step  # type: ignore[method-assign]
    if batched.window_ahead is not None:
        shadow = batched.window_ahead
        swap = shadow.swap

        def swapped(offset: int | None = None) -> int:
            assert shadow.build is not None and engine.recorder is not None
            slot, prefix_frames = shadow.build.slot, shadow.build.prefix_frames
            read = batched.slot_offset(slot)
            assert offset in (None, read)  # what the keeper read once for the tick
            offset = read
            columns = engine.recorder.recent(slot, offset, shadow.build.fed).long()
            keep = swap(offset)
            kv = [attn._streaming_state.kv_cache.cache[:, slot, :, : prefix_frames + keep].clone()
                  for attn in attention_layers(batched.model.lm.transformer)]
            rolls.append(Roll(slot, offset, keep, columns, kv, engine._state().cache[slot].clone(), ahead=True))
            return keep

        shadow.swap = swapped  # type: ignore[method-assign]
    return rolls


def fresh_matches(model: LoadedModel, prefix: Prefix, roll: Roll, span: Block | None = None) -> None:
    """A fresh engine prefilled with [prefix + the kept columns] holds the same keys and values, and with the rolled
    slot's token ring (then the span that went in after the roll) and the same user codes its next text logits are
    the rolled slot's."""
    with Engine(model, GREEDY, max_span_frames=MAX_SPAN) as fresh:
        fresh.prefill(prefix)
        forward_last(model.lm, embed_columns(model.lm, roll.columns[None]))
        state = fresh._state()
        state.offsets += roll.keep
        state.cache[0].copy_(roll.token_ring)
        window = prefix.frames + roll.keep
        for kv, attn in zip(roll.kv, attention_layers(model.lm.transformer), strict=True):
            assert (kv - attn._streaming_state.kv_cache.cache[:, 0, :, :window]).abs().max().item() <= 1e-5
        assert roll.codes is not None and roll.logits is not None
        if span is not None:
            fresh.steps = 1  # it goes on with a conversation: spans are taken at once
            fresh.inject(span)
        fresh.step(roll.codes)
        assert fresh.last_text_logits is not None
        assert (fresh.last_text_logits[0] - roll.logits).abs().max().item() <= 1e-5


def batcher_for(batched: BatchedModel, window: WindowPolicy | None = POLICY, metrics: Metrics | None = None) -> Batcher:
    cost = TickCost({1: 0.001, 2: 0.001}, PrefillCost(step_s=0.001, span_s={1: 0.001, MAX_SPAN: 0.001}))
    return Batcher(batched, ModelWorker("cpu"), cost, Capacity(2, "test"), 0.080, 30.0, metrics or Metrics(), window)


def frame(i: int, seed: int) -> InputFrame:
    pcm = np.random.default_rng([seed, i]).uniform(-0.3, 0.3, FRAME_SAMPLES).astype(np.float32)
    return InputFrame(i, pcm, time.perf_counter())


def serve(batcher: Batcher, prefixes: dict[int, Prefix],
          body: Callable[[Batcher], Awaitable[list[FrameOutput]]]) -> list[FrameOutput]:
    async def go() -> list[FrameOutput]:
        batcher.start()
        try:
            for slot, prefix in prefixes.items():
                await batcher.open(slot, prefix)
            return await body(batcher)
        finally:
            await batcher.stop(RuntimeError("test over"))
            batcher.worker.shutdown()

    return asyncio.run(go())


def rings(batched: BatchedModel) -> list[tuple[int, tuple[int, ...]]]:
    return [(attn._streaming_state.kv_cache.cache.data_ptr(), tuple(attn._streaming_state.kv_cache.cache.shape))
            for attn in attention_layers(batched.model.lm.transformer)]


def test_a_session_past_its_context_keeps_its_prefix_as_a_fresh_prefill_would(
        reference: LoadedModel, prefix: Prefix, batched: BatchedModel) -> None:
    rolls = spied(batched)
    memory = rings(batched)

    async def body(batcher: Batcher) -> list[FrameOutput]:
        return [await batcher.step(0, frame(i, 0)) for i in range(CONTEXT + 3 * POLICY.headroom)]

    outputs = serve(batcher_for(batched), {0: prefix}, body)
    assert len(outputs) == CONTEXT + 3 * POLICY.headroom
    keep = CONTEXT - prefix.frames - POLICY.headroom
    assert len(rolls) >= 3 and all(r.keep == keep and r.offset == CONTEXT for r in rolls)
    assert batched.slot_offset(0) <= CONTEXT
    assert rings(batched) == memory  # the window lives in the ring the session was given: no memory grows
    for roll in (rolls[0], rolls[-1]):
        fresh_matches(reference, prefix, roll)


def test_without_a_window_policy_the_session_slides_past_its_context(prefix: Prefix, batched: BatchedModel) -> None:
    rolls = spied(batched)

    async def body(batcher: Batcher) -> list[FrameOutput]:
        return [await batcher.step(0, frame(i, 0)) for i in range(CONTEXT - prefix.frames + 5)]

    serve(batcher_for(batched, None), {0: prefix}, body)
    assert rolls == [] and batched.slot_offset(0) == CONTEXT + 5


def test_two_sessions_of_a_batch_roll_at_their_own_ticks(
        reference: LoadedModel, prefix: Prefix, batched: BatchedModel) -> None:
    rolls = spied(batched)
    late = 17  # the second session joins this many frames after the first

    async def body(batcher: Batcher) -> list[FrameOutput]:
        outputs = [await batcher.step(0, frame(i, 0)) for i in range(late)]
        await batcher.open(1, prefix)
        for i in range(late, late + CONTEXT):
            outputs += await asyncio.gather(batcher.step(0, frame(i, 0)), batcher.step(1, frame(i, 1)))
        return outputs

    serve(batcher_for(batched), {0: prefix}, body)
    first = {slot: next(i for i, r in enumerate(rolls) if r.slot == slot) for slot in (0, 1)}
    assert first[0] < first[1]
    for roll in (rolls[first[0]], rolls[first[1]]):
        fresh_matches(reference, prefix, roll)


def test_a_span_that_would_pass_the_context_goes_in_after_the_roll(
        reference: LoadedModel, prefix: Prefix, batched: BatchedModel) -> None:
    rolls = spied(batched)

    async def body(batcher: Batcher) -> list[FrameOutput]:
        outputs, i = [], 0
        while batched.slot_offset(0) < CONTEXT - 3:
            outputs.append(await batcher.step(0, frame(i, 0)))
            i += 1
        batcher.request_span(0, SpanAnswer("The meeting is at noon in room four.", "kb", "test", "when?",
                                           time.perf_counter()))
        return [*outputs, await batcher.step(0, frame(i, 0))]

    outputs = serve(batcher_for(batched), {0: prefix}, body)
    (span,) = outputs[-1].spans
    assert span.injected and span.frames > 3
    (roll,) = rolls
    assert roll.offset + span.frames + 1 > CONTEXT  # it would have straddled the context
    assert batched.slot_offset(0) == prefix.frames + roll.keep + span.frames + 1 <= CONTEXT
    fresh_matches(reference, prefix, roll, span.request.built.block)


def test_a_resumed_session_keeps_its_prefix_when_its_window_rolls(
        reference: LoadedModel, prefix: Prefix, batched: BatchedModel) -> None:
    """Issue 36 with 37: the resumed slot's window keeps the prefix its persona and voice rebuild (it once kept none:
    a resumed long call lost its persona at its next roll)."""
    rolls = spied(batched)

    async def body(batcher: Batcher) -> list[FrameOutput]:
        outputs = [await batcher.step(0, frame(i, 0)) for i in range(CONTEXT)]
        history, _ = await batcher.saved(0)
        await batcher.resume(1, SessionHistory.from_bytes(history), prefix)
        for i in range(CONTEXT, CONTEXT + 2 * POLICY.headroom):  # side by side: a tick's logits span both rows
            outputs += await asyncio.gather(batcher.step(0, frame(i, 0)), batcher.step(1, frame(i, 1)))
        return outputs

    serve(batcher_for(batched), {0: prefix}, body)
    resumed = [r for r in rolls if r.slot == 1]
    assert resumed and all(r.keep == CONTEXT - prefix.frames - POLICY.headroom for r in resumed)
    fresh_matches(reference, prefix, resumed[-1])


# built ahead ------------------------------------------------------------------------------------------------------
def count(metric: Any) -> float:
    return sum(sample.value for family in metric.collect() for sample in family.samples
               if sample.name.endswith(("_count", "_total")))


def test_a_window_built_ahead_goes_in_as_a_fresh_prefill_of_the_prefix_and_the_recent_frames(
        reference: LoadedModel, prefix: Prefix, ahead: BatchedModel) -> None:
    rolls = spied(ahead)
    memory = rings(ahead)
    metrics = Metrics()

    async def body(batcher: Batcher) -> list[FrameOutput]:
        return [await batcher.step(0, frame(i, 0)) for i in range(CONTEXT + 3 * POLICY.headroom)]

    serve(batcher_for(ahead, metrics=metrics), {0: prefix}, body)
    assert len(rolls) >= 3 and all(r.ahead for r in rolls)
    assert count(metrics.window_rolls_in_tick) == 0
    assert count(metrics.window_build_seconds) >= 2 * len(rolls)  # each build fed over several ticks
    start = POLICY.ahead_window_start(prefix.frames)
    for roll in rolls:  # the frames a roll at the context keeps, or its last ones if it caught up sooner
        assert roll.offset - roll.keep == start and roll.offset <= CONTEXT
    assert rings(ahead) == memory  # the shadow is its own row: the session's ring is the one it was given
    for roll in (rolls[0], rolls[-1]):
        fresh_matches(reference, prefix, roll)


def test_two_sessions_share_the_shadow_and_each_window_is_exact(
        reference: LoadedModel, prefix: Prefix, ahead: BatchedModel) -> None:
    rolls = spied(ahead)

    async def body(batcher: Batcher) -> list[FrameOutput]:
        await batcher.open(1, prefix)
        outputs = []
        for i in range(CONTEXT + 2 * POLICY.headroom):  # in step: both want the shadow at the same ticks
            outputs += await asyncio.gather(batcher.step(0, frame(i, 0)), batcher.step(1, frame(i, 1)))
        return outputs

    serve(batcher_for(ahead), {0: prefix}, body)
    first = {slot: next(r for r in rolls if r.slot == slot) for slot in (0, 1)}
    assert any(r.ahead for r in first.values())
    for roll in first.values():
        fresh_matches(reference, prefix, roll)


def test_a_span_too_long_for_the_window_built_rolls_in_its_tick_and_goes_in_after(
        reference: LoadedModel, prefix: Prefix, ahead: BatchedModel) -> None:
    rolls = spied(ahead)
    chunk = ahead.window_ahead.chunk if ahead.window_ahead is not None else 0

    async def body(batcher: Batcher) -> list[FrameOutput]:
        outputs, i = [], 0
        while ahead.slot_offset(0) < POLICY.ahead_start(prefix.frames, chunk):
            outputs.append(await batcher.step(0, frame(i, 0)))
            i += 1
        batcher.request_span(0, SpanAnswer("The meeting is at noon in room four, bring the slides.", "kb", "test",
                                           "when?", time.perf_counter()))
        return [*outputs, await batcher.step(0, frame(i, 0))]

    outputs = serve(batcher_for(ahead), {0: prefix}, body)
    (span,) = outputs[-1].spans
    assert span.injected and span.frames > POLICY.headroom
    (roll,) = rolls
    assert not roll.ahead and roll.keep == CONTEXT - prefix.frames - span.frames - 1
    assert ahead.window_ahead is not None and ahead.window_ahead.build is None  # dropped: the shadow is free
    fresh_matches(reference, prefix, roll, span.request.built.block)


def test_a_session_that_leaves_during_its_build_frees_the_shadow_for_the_next(
        prefix: Prefix, ahead: BatchedModel) -> None:
    rolls = spied(ahead)
    chunk = ahead.window_ahead.chunk if ahead.window_ahead is not None else 0
    late = 10  # slot 0 joins this many frames after slot 1, which builds first

    async def body(batcher: Batcher) -> list[FrameOutput]:
        outputs = [await batcher.step(1, frame(i, 1)) for i in range(late)]
        await batcher.open(0, prefix)
        i = late
        while ahead.slot_offset(1) <= POLICY.ahead_start(prefix.frames, chunk):
            outputs += await asyncio.gather(batcher.step(0, frame(i, 0)), batcher.step(1, frame(i, 1)))
            i += 1
        assert ahead.window_ahead is not None and ahead.window_ahead.build is not None
        assert ahead.window_ahead.build.slot == 1
        batcher.release(1)
        for j in range(i, i + late + POLICY.headroom):
            outputs.append(await batcher.step(0, frame(j, 0)))
        return outputs

    serve(batcher_for(ahead), {1: prefix}, body)
    assert rolls and all(r.ahead and r.slot == 0 for r in rolls)


@pytest.mark.parametrize("refill", ["in-tick", "ahead"])
def test_a_span_just_before_the_windows_start_is_kept_whole_when_the_window_rolls(
        reference: LoadedModel, prefix: Prefix, batched: BatchedModel, refill: str) -> None:
    """The agent may still be saying it: a roll that cut the span's first columns left a small model garbling the
    rest (the app-span e2e test, under load)."""
    if refill == "ahead":
        batched.build_windows_ahead(POLICY.ahead_chunk(batched.slots, MAX_SPAN))
    rolls = spied(batched)
    usual_start = POLICY.ahead_window_start(prefix.frames)

    async def body(batcher: Batcher) -> list[FrameOutput]:
        outputs, i = [], 0
        while batched.slot_offset(0) < usual_start - 3:
            outputs.append(await batcher.step(0, frame(i, 0)))
            i += 1
        batcher.request_span(0, SpanAnswer("The meeting is at noon.", "kb", "test", "when?", time.perf_counter()))
        while not rolls:
            outputs.append(await batcher.step(0, frame(i, 0)))
            i += 1
        return outputs

    outputs = serve(batcher_for(batched), {0: prefix}, body)
    (span,) = [s for out in outputs for s in out.spans]
    assert span.injected and span.offsets[0] == usual_start - 3
    (roll,) = rolls
    assert roll.ahead == (refill == "ahead")
    assert roll.offset - roll.keep == span.offsets[0]  # kept from the span's first column
    fresh_matches(reference, prefix, roll)
