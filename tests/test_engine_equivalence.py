"""One-pass injection leaves exactly the state of n forced LMGen steps (float32, tiny profile, greedy)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from frontend_model import engine as engine_module
from frontend_model.block import Block
from frontend_model.engine import GREEDY, Engine
from frontend_model.loading import LoadedModel, load_model
from frontend_model.span_block import build_prefix
from tests.engine_helpers import assert_same_state, snapshot, span_like_block, user_frames

CONTEXT = 8
MAX_SPAN = 64
WRAPPED = CONTEXT + MAX_SPAN + 9  # steps before injection: the KV ring (capacity context + max span) has wrapped


@pytest.fixture(scope="module")
def small_context_model() -> LoadedModel:
    return load_model("tiny", device="cpu", dtype=torch.float32, context=CONTEXT)


def run(
    model: LoadedModel, warm: int, block: Block, force: Callable[[Engine, Block], None], user: torch.Tensor
) -> tuple[object, torch.Tensor, list[tuple]]:
    engine = Engine(model, GREEDY, max_span_frames=MAX_SPAN)
    engine.start()
    try:
        for i in range(warm):
            engine.step(user[i])
        force(engine, block)
        state = snapshot(engine)
        continuation = []
        logits = None
        for i in range(20):
            out = engine.step(user[warm + i])
            if logits is None:
                logits = engine.last_text_logits.clone()
            codes = None if out.agent_codes is None else tuple(out.agent_codes.tolist())
            continuation.append((out.text_token, codes))
        return state, logits, continuation
    finally:
        engine.close()


def one_pass(engine: Engine, block: Block) -> None:
    if engine.steps == 0:
        engine.prefill(block)
    else:
        engine.inject(block)


def stepwise(engine: Engine, block: Block) -> None:
    engine.inject_stepwise(block)


@pytest.mark.parametrize("frames", [1, 2, 16, 64])
@pytest.mark.parametrize("warm", [0, 1, 12, WRAPPED], ids=["offset0", "offset1", "offset12", "wrapped"])
def test_inject_equals_forced_steps(small_context_model: LoadedModel, frames: int, warm: int) -> None:
    user = user_frames(warm + 20, seed=warm)
    probe = Engine(small_context_model, GREEDY, max_span_frames=MAX_SPAN)
    block = span_like_block(probe, frames, seed=frames)
    fast = run(small_context_model, warm, block, one_pass, user)
    slow = run(small_context_model, warm, block, stepwise, user)
    assert_same_state(fast[0], slow[0])
    assert fast[0].offsets.item() == warm + frames
    assert (fast[1] - slow[1]).abs().max().item() <= 1e-4
    assert fast[2] == slow[2]


def test_ring_of_exactly_context_breaks_after_wrap(
    small_context_model: LoadedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reason for the widened ring: without it, one-pass injection after a wrap is not exact."""
    monkeypatch.setattr(engine_module, "widen_kv_rings", lambda transformer, extra: CONTEXT)
    warm = 3 * CONTEXT
    user = user_frames(warm + 20, seed=5)
    block = span_like_block(Engine(small_context_model, GREEDY), 16, seed=3)
    fast = run(small_context_model, warm, block, one_pass, user)
    slow = run(small_context_model, warm, block, stepwise, user)
    assert (fast[1] - slow[1]).abs().max().item() > 1e-3


def test_persona_prefix_prefill_equals_stepping(small_context_model: LoadedModel) -> None:
    model = small_context_model
    voice = torch.randint(0, 2048, (model.span.agent_codebooks, 6), generator=torch.Generator().manual_seed(9))
    block = build_prefix("You are a helpful travel assistant called Ada.", model.tokenizer, model.span, voice)
    assert block is not None and block.frames > 6
    assert (block.tokens[0, :6] == model.span.text_pad_id).all()
    assert torch.equal(block.tokens[1 : 1 + model.span.agent_codebooks, :6], voice)
    user = user_frames(20, seed=1)
    fast = run(model, 0, block, one_pass, user)
    slow = run(model, 0, block, stepwise, user)
    assert_same_state(fast[0], slow[0])
    assert (fast[1] - slow[1]).abs().max().item() <= 1e-4
    assert fast[2] == slow[2]
