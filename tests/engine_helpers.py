"""Shared helpers for engine tests: state snapshots and forced blocks."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from frontend_model.block import Block
from frontend_model.engine import Engine
from frontend_model.kv_ring import attention_layers
from frontend_model.span_block import placeholder_rows


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
