"""A window that keeps the persona prefix: [prefix + the most recent frames], read as one sequence.

moshi's ring slides: past the model's context the prefix (persona, voice prompt) scrolls out of attention, and the
model, trained on sequences that start with one, reads a conversation without it. Both functions here instead keep a
row's prefix where it was prefilled (positions 0..P-1) and put its `keep` most recent frames right after it
(P..P+keep-1), the next step reading at P+keep.

`roll_window` moves the cached frames: keys are cached after RoPE, so moving a frame is a rotation of its keys by the
position difference, and values do not change. That is exact through the first layer only: deeper, a recent frame's
keys and values were computed while it attended to the frames the window drops (on the tiny random models the next
logits then differ from a fresh prefill's by as much as a sliding ring's do). `refill_window` feeds the recent frames'
columns again after the prefix in one forward, the cost of a prefill of `keep` frames, and is exactly a fresh prefill
of [prefix + those frames] (tests/frontend_model/test_window.py measures both).

Both work in place on the ring's slots, so they must come before the ring wraps over the prefix: while a row's
offset is at most the ring's capacity (`context + max_span_frames`), slot s holds position s.
"""

from __future__ import annotations

import math

import torch
from moshi.modules.transformer import StreamingMultiheadAttention

from frontend_model.engine.columns import embed_columns, forward_last
from frontend_model.engine.engine import Engine
from frontend_model.moshi_internals.kv_ring import attention_layers
from frontend_model.moshi_internals.row_view import rows


def rotate_keys(keys: torch.Tensor, shift: int, attn: StreamingMultiheadAttention) -> torch.Tensor:
    """RoPE keys [..., T, D] as `attn` cached them, moved `shift` positions (the rotation moshi's `apply_rope` makes
    for an offset of `shift`, composed with theirs); the angles in float64, so that a shift of thousands of positions
    adds no rounding of its own."""
    rope = attn.rope
    if rope is None:
        raise ValueError("only RoPE keys can be moved by rotation")
    D = keys.shape[-1]
    freqs = torch.exp(torch.arange(D // 2, device=keys.device, dtype=torch.float64)
                      * (-math.log(rope.max_period) * 2 / D))
    cos = torch.cos(freqs * shift).float()
    sin = torch.sin(freqs * shift).float()
    if rope.interleave:
        pairs = keys.float().view(*keys.shape[:-1], D // 2, 2)
        kr, ki = pairs[..., 0], pairs[..., 1]
        return torch.stack([kr * cos - ki * sin, kr * sin + ki * cos], dim=-1).view(keys.shape).to(keys.dtype)
    kr, ki = keys[..., : D // 2].float(), keys[..., D // 2 :].float()
    return torch.cat([kr * cos - ki * sin, kr * sin + ki * cos], dim=-1).to(keys.dtype)


def _check(engine: Engine, row: int, prefix_frames: int, keep: int) -> int:
    """The row's offset, where its ring still holds the prefix and `keep` frames after it."""
    offset = int(engine._state().offsets[row])
    if keep < 0 or offset - keep < prefix_frames:
        raise ValueError(f"keeping {keep} frames after a {prefix_frames}-frame prefix needs an offset of at least "
                         f"{prefix_frames + keep}; row {row} is at {offset}")
    for attn in attention_layers(engine.model.lm.transformer):
        ring = attn._streaming_state.kv_cache
        if int(ring.end_offset[row]) != offset or offset > ring.capacity:
            raise ValueError(f"row {row} at {offset}: its ring ({ring.capacity} slots, at "
                             f"{int(ring.end_offset[row])}) no longer holds the prefix where it was prefilled")
    return offset


def _turn_token_ring(engine: Engine, row: int, offset: int, new_offset: int) -> None:
    """LMGen reads the row's next column at `new_offset`: its token ring turns with it, so that the pending column
    and the last frame's delayed rows are read as before."""
    state = engine._state()
    state.cache[row] = torch.roll(state.cache[row], new_offset - offset, dims=-1)
    state.offsets[row] = new_offset


def roll_window(engine: Engine, row: int, prefix_frames: int, keep: int) -> None:
    """Row `row`'s cache becomes its first `prefix_frames` positions (as prefilled, untouched) followed by its
    `keep` most recent frames, re-positioned to prefix_frames.. prefix_frames + keep - 1 by rotating their keys; the
    row's next step reads at prefix_frames + keep. No forward pass: exact through the first layer only.

    Everything that counts positions per row is set there: each attention layer's offset (RoPE of new queries, the
    causal mask) and its ring's end offset (positions of cached keys; slots past the window read as invalid), the
    transformer's offsets and LMGen's. Other rows are untouched, so rows of a batch roll at their own ticks. Reads the
    row's offset on the host: not for inside a captured graph.
    """
    offset = _check(engine, row, prefix_frames, keep)
    start, new_offset = offset - keep, prefix_frames + keep
    for attn in attention_layers(engine.model.lm.transformer):
        mha = attn._streaming_state
        ring = mha.kv_cache
        recent = ring.cache[:, row, :, start:offset].clone()  # may overlap where it goes
        ring.cache[0, row, :, prefix_frames:new_offset] = rotate_keys(recent[0], prefix_frames - start, attn)
        ring.cache[1, row, :, prefix_frames:new_offset] = recent[1]
        ring.end_offset[row] = new_offset
        mha.offset[row] = new_offset
    engine.model.lm.transformer._streaming_state.offsets[row] = new_offset
    if engine.recorder is not None:
        _relog(engine, row, prefix_frames, engine.recorder.recent(row, offset, keep))
    _turn_token_ring(engine, row, offset, new_offset)


@torch.no_grad()  # served weights require grad: a graph here would chain every roll to the cache
def refill_window(engine: Engine, row: int, prefix_frames: int, columns: torch.Tensor) -> None:
    """The exact window: row `row`'s prefix kept as prefilled, then `columns` ([rows, keep], the stream columns of
    its `keep` most recent frames, as the transformer read them) fed again right after it in one forward, so every
    layer's keys and values are those of a fresh prefill of [prefix + those frames]. Costs a prefill of `keep`
    frames where `roll_window` costs none. Other rows are untouched; reads the row's offset on the host.
    """
    keep = columns.shape[-1]
    offset = _check(engine, row, prefix_frames, keep)
    lm = engine.model.lm
    for attn in attention_layers(lm.transformer):
        attn._streaming_state.kv_cache.end_offset[row] = prefix_frames
        attn._streaming_state.offset[row] = prefix_frames
    lm.transformer._streaming_state.offsets[row] = prefix_frames
    state = engine._state()
    exec_mask = state.exec_mask.clone()
    only_row = torch.zeros_like(exec_mask)
    only_row[row] = True
    engine.lm_gen.set_exec_mask(only_row)  # the masked ring writes the row's keys only where its row executes
    try:
        with rows([lm.transformer], row, row + 1):
            forward_last(lm, embed_columns(lm, columns.to(engine.model.device)[None]))
    finally:
        engine.lm_gen.set_exec_mask(exec_mask)
    _relog(engine, row, prefix_frames, columns)
    _turn_token_ring(engine, row, offset, prefix_frames + keep)


def _relog(engine: Engine, row: int, prefix_frames: int, columns: torch.Tensor) -> None:
    """The session history (engine/history.py) follows the window: the kept columns now sit right after the prefix,
    so the next roll, and a replay, read them there."""
    if engine.recorder is not None:
        start = torch.full((1,), prefix_frames, device=engine.model.device)
        engine.recorder.forced(row, start, columns.to(engine.model.device)[None])
