"""bfloat16: one-pass injection and prefill against the column-by-column references, and a batch against each
session alone, on the tiny models of both families, within a stated tolerance.

Measured on CPU (PyTorch's bf16 kernels accumulate in float32 row by row): 0.0 for the next-step logits, the KV
cache and the batch, i.e. bit for bit. A GPU's bf16 GEMMs tile T=n and T=1 products differently, so the bound
asserted is the one docs/engine.md states: BF16_TOLERANCE, four bf16 steps at the logits' magnitude (|logit| < 8).
"""

from __future__ import annotations

import pytest
import torch

from frontend_model.engine.batch_engine import BatchEngine
from frontend_model.engine.engine import GREEDY, Engine
from frontend_model.loading.loader import LoadedModel
from frontend_model.span.build import build_prefix
from tests.frontend_model.test_engine_equivalence import columns_one_by_one, voice_codes
from tests.support.engine import FAMILIES, snapshot, span_like_block, tiny_model, user_frames

BF16_TOLERANCE = 0.125
CONTEXT = 8
MAX_SPAN = 64
WRAPPED = CONTEXT + MAX_SPAN + 9


@pytest.fixture(scope="module", params=FAMILIES, ids=lambda q: f"dep_q{q}")
def model(request: pytest.FixtureRequest) -> LoadedModel:
    return tiny_model(request.param, context=CONTEXT, dtype=torch.bfloat16)


def after(model: LoadedModel, warm: int, force, forced: object, user: torch.Tensor) -> tuple[list, torch.Tensor]:
    with Engine(model, GREEDY, max_span_frames=MAX_SPAN) as engine:
        for i in range(warm):
            engine.step(user[i])
        force(engine, forced)
        kv = [k.float() for k in snapshot(engine).kv]
        engine.step(user[warm])
        return kv, engine.last_text_logits.float().clone()


def assert_close(a: tuple[list, torch.Tensor], b: tuple[list, torch.Tensor]) -> None:
    assert b[1].abs().max().item() < 8
    assert (a[1] - b[1]).abs().max().item() <= BF16_TOLERANCE
    assert max((x - y).abs().max().item() for x, y in zip(a[0], b[0], strict=True)) <= BF16_TOLERANCE


def test_bf16_inject_after_wrap_is_within_tolerance(model: LoadedModel) -> None:
    assert model.lm.dtype == torch.bfloat16
    user = user_frames(WRAPPED + 1, seed=6)
    block = span_like_block(Engine(model, GREEDY), MAX_SPAN, seed=6)
    assert_close(after(model, WRAPPED, lambda e, b: e.inject(b), block, user),
                 after(model, WRAPPED, columns_one_by_one, block, user))


def test_bf16_prefill_is_within_tolerance(model: LoadedModel) -> None:
    prefix = build_prefix("You are Ada.", model.tokenizer, model.span, voice_codes(model, 7), model.lm.delays)
    user = user_frames(1, seed=7)
    assert_close(after(model, 0, lambda e, p: e.prefill(p), prefix, user),
                 after(model, 0, lambda e, p: e.prefill_stepwise(p), prefix, user))


def test_bf16_batch_is_within_tolerance_of_each_alone(model: LoadedModel) -> None:
    frames = [user_frames(20, seed=s) for s in (1, 2, 3)]
    block = span_like_block(Engine(model, GREEDY), 16, seed=1)
    with BatchEngine(model, 3, GREEDY, max_span_frames=MAX_SPAN) as batch:
        for tick in range(12):
            if tick == 10:
                batch.inject_slot(1, block)
            batch.step_slots(torch.stack([f[tick] for f in frames]), torch.tensor([True, True, True]))
        together = batch.last_text_logits.float().clone()
    for slot in range(3):
        with Engine(model, GREEDY, max_span_frames=MAX_SPAN) as engine:
            for tick in range(12):
                if tick == 10 and slot == 1:
                    engine.inject(block)
                engine.step(frames[slot][tick])
            assert (engine.last_text_logits.float()[0] - together[slot]).abs().max().item() <= BF16_TOLERANCE
