"""Shared helpers for engine tests: state snapshots and forced blocks."""

from __future__ import annotations

import copy
import dataclasses
import os
from dataclasses import dataclass

import torch
from moshi.models import loaders
from moshi.models.lm import LMModel

from frontend_model.engine.engine import Engine
from frontend_model.loading.loader import LoadedModel, load_model
from frontend_model.loading.profiles import TINY_LM_CONFIG
from frontend_model.moshi_internals.depformer import run_depformer_for_agent_only
from frontend_model.moshi_internals.kv_ring import attention_layers
from frontend_model.moshi_internals.streaming_state import streaming_states
from frontend_model.span.block import Block
from frontend_model.span.build import placeholder_rows

FAMILIES = (8, 16)  # depformer steps: Moshi-shaped, PersonaPlex-shaped
# The engine, batch and codec tests run on CPU; CONTEXTSPAN_TEST_DEVICE=cuda runs them on a GPU (scripts/gpu_check.sh).
TEST_DEVICE = os.environ.get("CONTEXTSPAN_TEST_DEVICE", "cpu")


def tiny_lm(dep_q: int, context: int, dtype: torch.dtype, text_card: int, seed: int = 0,
            num_layers: int = TINY_LM_CONFIG["num_layers"]) -> LMModel:
    config = dict(TINY_LM_CONFIG, dep_q=dep_q, text_card=text_card, context=context, num_layers=num_layers)
    state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        return loaders.get_moshi_lm(None, lm_kwargs=config, device=TEST_DEVICE, dtype=dtype).eval()
    finally:
        torch.random.set_rng_state(state)


def tiny_model(dep_q: int = 8, context: int = 3000, dtype: torch.dtype = torch.float32,
               num_layers: int = TINY_LM_CONFIG["num_layers"]) -> LoadedModel:
    """The tiny profile, or with a PersonaPlex-shaped LM (16 depformer steps) limited to its agent rows, or with
    another number of transformer layers (random weights of their own)."""
    base = load_model("tiny", device=TEST_DEVICE, dtype=dtype, context=context)
    if dep_q == base.lm.dep_q and num_layers == len(base.lm.transformer.layers):
        return base
    lm = tiny_lm(dep_q, context, dtype, base.tokenizer.vocab_size(), num_layers=num_layers)
    trained = run_depformer_for_agent_only(lm)
    profile = f"tiny-dep_q{dep_q}" + ("" if num_layers == TINY_LM_CONFIG["num_layers"] else f"-layers{num_layers}")
    return dataclasses.replace(base, profile=profile, lm=lm, span=dataclasses.replace(base.span, dep_q=trained))


def unlimited(model: LoadedModel) -> LMModel:
    """A copy of the model's LM with every depformer step it was trained with (the reference runs them all)."""
    lm = copy.deepcopy(model.lm)
    lm.dep_q = model.span.dep_q
    return lm


@dataclass
class Snapshot:
    ring: torch.Tensor
    offsets: torch.Tensor
    offset_cpu: int
    kv: list[torch.Tensor]
    kv_end: list[torch.Tensor]
    attn_offsets: list[torch.Tensor]


def snapshot(engine: Engine) -> Snapshot:
    state = engine.lm_gen._streaming_state
    layers = attention_layers(engine.model.lm.transformer)
    return Snapshot(
        ring=state.cache.clone(),
        offsets=state.offsets.clone(),
        offset_cpu=state.offset_cpu,
        kv=[a._streaming_state.kv_cache.cache.clone() for a in layers],
        kv_end=[a._streaming_state.kv_cache.end_offset.clone() for a in layers],
        attn_offsets=[a._streaming_state.offset.clone() for a in layers],
    )


def assert_same_state(a: Snapshot, b: Snapshot, atol: float = 1e-5) -> None:
    assert torch.equal(a.ring, b.ring), "LMGen token ring differs"
    assert torch.equal(a.offsets, b.offsets), (a.offsets, b.offsets)
    assert a.offset_cpu == b.offset_cpu
    for x, y in zip(a.kv_end, b.kv_end, strict=True):
        assert torch.equal(x, y), "KV ring end offsets differ"
    for x, y in zip(a.attn_offsets, b.attn_offsets, strict=True):
        assert torch.equal(x, y), "attention offsets differ"
    for x, y in zip(a.kv, b.kv, strict=True):
        diff = (x - y).abs().max().item()
        assert diff <= atol, f"KV cache differs by {diff}"


def span_like_block(engine: Engine, frames: int, seed: int) -> Block:
    """A block shaped like a Context Span: random text ids, silence on agent rows, sine on user rows."""
    g = torch.Generator().manual_seed(seed)
    span = engine.span
    text = torch.randint(5, engine.model.tokenizer.vocab_size(), (frames,), generator=g)
    text[0], text[-1] = span.open_id, span.close_id
    agent, user = placeholder_rows(span, frames)
    return Block(torch.cat([text[None], agent, user]))


def user_frames(count: int, seed: int) -> torch.Tensor:
    return torch.randint(0, 2048, (count, 8), generator=torch.Generator().manual_seed(seed))


def state_rows(roots: list[torch.nn.Module], slot: int) -> list[torch.Tensor]:
    """`slot`'s row of every streaming state under `roots` but the exec masks, which every call sets: what a module
    carries from one call to the next for that slot. Of a KV ring, its end and the keys and values the row can read:
    a masked call on the graph path writes past a row's end, which the row's next call overwrites."""
    states = streaming_states(roots)
    rows = [getattr(s.state, name)[slot].clone() for s in states for name in s.rows if name != "exec_mask"]
    for ring in (getattr(s.state, name) for s in states for name in s.rings):
        end, capacity = int(ring.end_offset[slot]), ring.cache.shape[3]
        readable = torch.arange(max(0, end - capacity), end) % capacity
        rows += [ring.end_offset[slot].clone(), ring.cache[:, slot, :, readable]]
    return rows
