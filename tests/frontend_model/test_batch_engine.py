"""Sessions in one batch produce exactly what they would alone (tiny profiles, greedy). In float64: float32 is equal
only up to rounding, as the CPU's matrix kernels may sum in another order for another batch size (with one torch
thread, the server's default, a near tie in one depformer code went the other way for the 16-step profile)."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
import torch

from frontend_model.engine.batch_engine import BatchEngine
from frontend_model.engine.engine import GREEDY, Engine
from frontend_model.loading.loader import LoadedModel, load_model
from frontend_model.moshi_internals.kv_ring import attention_layers
from frontend_model.span.block import Block
from tests.support.engine import TEST_DEVICE, span_like_block, tiny_model, user_frames

CONTEXT = 8
MAX_SPAN = 24
TICKS = 70  # > CONTEXT + MAX_SPAN: every ring wraps


@pytest.fixture(scope="module")
def model() -> LoadedModel:
    return load_model("tiny", device=TEST_DEVICE, dtype=torch.float64, context=CONTEXT)


@pytest.fixture(scope="module")
def personaplex_model() -> LoadedModel:
    return tiny_model(dep_q=16, context=CONTEXT, dtype=torch.float64)


@dataclass
class Plan:
    """One session's part in a run: when it joins and leaves, the ticks it has no frame, its span."""

    seed: int
    join: int = 0
    leave: int = TICKS
    idle: set[int] = field(default_factory=set)
    span_at: int | None = None  # inject before this tick (a tick it is active and has stepped)
    span_frames: int = 16


def outputs(result: list) -> list[tuple]:
    return [(r.text_token, None if r.agent_codes is None else tuple(r.agent_codes.tolist())) for r in result]


def alone(model: LoadedModel, plan: Plan, block: Block | None) -> list[tuple]:
    frames = user_frames(TICKS, plan.seed)
    got = []
    with Engine(model, GREEDY, max_span_frames=MAX_SPAN) as engine:
        for tick in range(plan.join, plan.leave):
            if tick in plan.idle:
                continue
            if tick == plan.span_at and block is not None:
                engine.inject(block)
            got.append(engine.step(frames[tick]))
    return outputs(got)


def batched(model: LoadedModel, plans: list[Plan], blocks: list[Block | None], compact: bool) -> list[list[tuple]]:
    frames = [user_frames(TICKS, p.seed) for p in plans]
    got: list[list] = [[] for _ in plans]
    with BatchEngine(model, len(plans), GREEDY, max_span_frames=MAX_SPAN) as engine:
        engine.compact = compact
        for tick in range(TICKS):
            for slot, plan in enumerate(plans):
                if tick == plan.join and tick > 0:
                    engine.reset_slot(slot)
                if tick == plan.span_at and blocks[slot] is not None:
                    engine.inject_slot(slot, blocks[slot])
            active = torch.tensor([p.join <= tick < p.leave and tick not in p.idle for p in plans])
            codes = torch.stack([f[tick] for f in frames])
            for slot, result in enumerate(engine.step_slots(codes, active)):
                if result is not None:
                    got[slot].append(result)
    return [outputs(g) for g in got]


def run_and_compare(model: LoadedModel, plans: list[Plan], compact: bool) -> None:
    probe = Engine(model, GREEDY, max_span_frames=MAX_SPAN)
    blocks = [span_like_block(probe, p.span_frames, seed=p.seed) if p.span_at is not None else None for p in plans]
    together = batched(model, plans, blocks, compact)
    for slot, plan in enumerate(plans):
        expected = alone(model, plan, blocks[slot])
        assert together[slot] == expected, f"slot {slot} differs from running alone"
        assert sum(1 for text, _ in expected if text is not None) > 10


# compact: see tests/conftest.py (compact, whole batch, replayed graph outputs).
def test_four_sessions_equal_alone_with_a_span_mid_stream_after_wrap(model: LoadedModel, compact: bool) -> None:
    run_and_compare(model, [Plan(1), Plan(2, span_at=50, span_frames=MAX_SPAN), Plan(3, span_at=5), Plan(4)], compact)


def test_dep_q16_sessions_equal_alone(personaplex_model: LoadedModel, compact: bool) -> None:
    run_and_compare(personaplex_model, [Plan(1, idle={7, 8}), Plan(2, span_at=50, span_frames=MAX_SPAN),
                                        Plan(3, join=9, leave=60, span_at=20)], compact)


def test_masked_ticks_and_joins_and_leaves_do_not_change_the_others(model: LoadedModel, compact: bool) -> None:
    run_and_compare(model, [
        Plan(5, idle={3, 4, 20, 41}),
        Plan(6, join=12, leave=55, span_at=40),
        Plan(7, leave=30),
        Plan(8, join=31, span_at=45, span_frames=4),
    ], compact)


def test_a_span_for_one_slot_leaves_the_other_caches_bit_for_bit(model: LoadedModel) -> None:
    with BatchEngine(model, 2, GREEDY, max_span_frames=MAX_SPAN) as engine:
        frames = user_frames(60, seed=9)
        for tick in range(60):  # past the ring's capacity: the rings have wrapped
            engine.step_slots(torch.stack([frames[tick], frames[59 - tick]]), torch.tensor([True, True]))
        layers = attention_layers(model.lm.transformer)
        before = [a._streaming_state.kv_cache.cache[:, 1].clone() for a in layers]
        ring_before = engine.lm_gen._streaming_state.cache[1].clone()
        engine.inject_slot(0, span_like_block(engine, MAX_SPAN, seed=1))
        for layer, old in zip(layers, before, strict=True):
            assert torch.equal(layer._streaming_state.kv_cache.cache[:, 1], old)
        assert torch.equal(engine.lm_gen._streaming_state.cache[1], ring_before)
        assert engine.slot_offset(0) == 60 + MAX_SPAN and engine.slot_offset(1) == 60


def _masked_step_changes_row(model: LoadedModel) -> bool:
    """Step both rows past the ring's capacity, then one tick with row 1 masked: did row 1's keys change?

    The whole batch is stepped, masked row included, as under CUDA graphs (on CPU only the active rows are)."""
    with BatchEngine(model, 2, GREEDY, max_span_frames=MAX_SPAN) as engine:
        engine.compact = False
        frames = user_frames(60, seed=9)
        for tick in range(59):
            engine.step_slots(torch.stack([frames[tick], frames[58 - tick]]), torch.tensor([True, True]))
        layers = attention_layers(model.lm.transformer)
        before = [a._streaming_state.kv_cache.cache[:, 1].clone() for a in layers]
        engine.step_slots(torch.stack([frames[59], frames[0]]), torch.tensor([True, False]))
        return any(not torch.equal(a._streaming_state.kv_cache.cache[:, 1], b) for a, b in zip(layers, before,
                                                                                               strict=True))


def test_a_masked_slot_keeps_its_cache_bit_for_bit(model: LoadedModel, monkeypatch: pytest.MonkeyPatch) -> None:
    """MaskedRingKVCache holds back the writes moshi's ring makes into every row, masked or not."""
    from moshi.modules.transformer import RingKVCache

    from frontend_model.moshi_internals import kv_ring

    assert not _masked_step_changes_row(model)
    monkeypatch.setattr(kv_ring, "MaskedRingKVCache", RingKVCache)
    assert _masked_step_changes_row(model), "moshi's own ring writes into the masked row"
