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

`WindowAhead` is `refill_window` spread over ticks, on a shadow row beside the batch (what the server does by
default: server/batching/window_keeper.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from moshi.models.lm import LMModel
from moshi.modules.transformer import StreamingMultiheadAttention

from frontend_model.engine.chunked_prefill import ChunkedPrefill, ScratchRow
from frontend_model.engine.column_log import ColumnLog
from frontend_model.engine.columns import embed_columns, forward_last
from frontend_model.engine.engine import Engine
from frontend_model.moshi_internals.kv_ring import attention_layers
from frontend_model.moshi_internals.row_view import rows
from frontend_model.moshi_internals.streaming_state import streaming_modules


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
    _rewind(lm, row, prefix_frames)
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


def _rewind(lm: LMModel, row: int, prefix_frames: int) -> None:
    """The installed streaming states' row `row` reads its next frame right after its prefix: what follows it in the
    ring is written over."""
    for attn in attention_layers(lm.transformer):
        attn._streaming_state.kv_cache.end_offset[row] = prefix_frames
        attn._streaming_state.offset[row] = prefix_frames
    lm.transformer._streaming_state.offsets[row] = prefix_frames


def _relog(engine: Engine, row: int, prefix_frames: int, columns: torch.Tensor) -> None:
    """The session history (engine/history.py) follows the window: the kept columns now sit right after the prefix,
    so the next roll, and a replay, read them there."""
    if engine.recorder is not None:
        start = torch.full((1,), prefix_frames, device=engine.model.device)
        engine.recorder.forced(row, start, columns.to(engine.model.device)[None])


@dataclass
class Build:
    """A window being built ahead for `slot`: its prefix, then its recorded columns from stream position `start` on,
    `fed` of them so far."""

    slot: int
    prefix_frames: int
    start: int
    fed: int = 0

    @property
    def end(self) -> int:
        """The stream position of the next column to feed."""
        return self.start + self.fed


class WindowAhead:
    """`refill_window` spread over ticks: a shadow row beside the batch (a batch-1 copy of the temporal transformer's
    streaming state, with its own chunk graphs on a GPU) holds a copy of a slot's prefix and is fed the slot's
    recorded columns from `start` on, `chunk` frames a tick, while the slot goes on stepping; once it has caught up,
    `swap` copies its keys and values into the slot's row, which then holds exactly what `refill_window` of the
    columns from `start` on writes (chunks of at most the ring's extra slots are exact the way a one-pass span is:
    chunked_prefill.py). In a tick, a build costs a `chunk`-frame prefill of one row; the refill it replaces costs a
    prefill of `keep` frames (about 2300 on 7B, several frame budgets). One shadow: one build at a time."""

    def __init__(self, engine: Engine, chunk: int) -> None:
        if engine.recorder is None:
            raise ValueError("a window built ahead feeds a slot's recorded columns: start the engine recording")
        if not 1 <= chunk <= engine.max_span_frames or chunk & (chunk - 1):
            raise ValueError(f"chunk must be a power of two of at most {engine.max_span_frames} frames, got {chunk}")
        self.engine = engine
        self.chunk = chunk
        lm = engine.model.lm
        self.prefill = ChunkedPrefill(lm, ScratchRow(lm.transformer), chunk,
                                      graphs=engine.optimisations.enabled("prefill_graphs"))
        self.build: Build | None = None

    def close(self) -> None:
        self.prefill.close()
        self.build = None

    def nbytes(self) -> int:
        return self.prefill.scratch.nbytes()

    def begin(self, slot: int, prefix_frames: int, start: int) -> Build:
        """A build for `slot`: its prefix, then its columns from stream position `start` (past the prefix, at most
        the slot's offset)."""
        offset = _check(self.engine, slot, prefix_frames, 0)
        if not prefix_frames <= start <= offset:
            raise ValueError(f"a window after a {prefix_frames}-frame prefix starts between it and the offset "
                             f"{offset}, not at {start}")
        lm = self.engine.model.lm
        self.prefill.scratch.load(slot)
        with self.prefill.scratch.installed(None):
            _rewind(lm, 0, prefix_frames)
            for module in streaming_modules(lm.transformer):
                module._streaming_state.exec_mask.fill_(True)  # the masked ring writes where the row executes
        self.build = Build(slot, prefix_frames, start)
        return self.build

    @torch.no_grad()  # served weights require grad (refill_window)
    def feed(self, frames: int, offset: int | None = None) -> int:
        """Up to `frames` more of the build's columns, none past its slot's offset (`offset` where the caller has read
        it: on a GPU each host read waits for the device); returns the columns still to feed (0: caught up)."""
        build = self._build()
        offset = self._offset(build) if offset is None else offset
        n = min(frames, offset - build.end)
        if n > 0:
            columns = self._recorder().recent(build.slot, build.end + n, n).long()
            lm = self.engine.model.lm
            self.prefill.forward(embed_columns(lm, columns.to(self.engine.model.device)[None]), None)
            build.fed += n
        return offset - build.end

    def swap(self, offset: int | None = None) -> int:
        """The caught-up window into its slot's row, which reads its next frame right after it (`offset` as for
        `feed`); returns the frames kept after the prefix."""
        build = self._build()
        offset = self._offset(build) if offset is None else offset
        if build.end != offset:
            raise ValueError(f"slot {build.slot} is at {offset}; its window was fed up to {build.end}")
        keep = build.fed
        columns = self._recorder().recent(build.slot, offset, keep)
        self.prefill.scratch.store(build.slot)
        _relog(self.engine, build.slot, build.prefix_frames, columns)
        _turn_token_ring(self.engine, build.slot, offset, build.prefix_frames + keep)
        self.build = None
        return keep

    def forget(self, slot: int) -> None:
        """`slot`'s session is gone or starts again: its build, if any, is dropped."""
        if self.build is not None and self.build.slot == slot:
            self.build = None

    def _offset(self, build: Build) -> int:
        return int(self.engine._state().offsets[build.slot])

    def _build(self) -> Build:
        if self.build is None:
            raise ValueError("no window is being built")
        return self.build

    def _recorder(self) -> ColumnLog:
        recorder = self.engine.recorder
        assert recorder is not None  # checked at construction; an engine keeps its recorder
        return recorder
