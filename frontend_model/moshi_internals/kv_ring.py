"""KV ring sizing for span injection.

A T=n forward writes n keys before the block's first query has attended: with a ring of exactly `context`
slots, once the ring has wrapped those writes overwrite keys that early queries in the block still need.
Giving the ring `context + max_span_frames` slots keeps every needed key while the attention mask still
limits each query to `context` past frames, so one-pass injection equals frame-by-frame stepping.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial

import torch
from moshi.modules.transformer import (
    KVCacheResult,
    RingKVCache,
    StreamingMultiheadAttention,
    StreamingTransformer,
    _MHAState,
)


class MaskedRingKVCache(RingKVCache):
    """A ring whose writes respect the exec mask.

    moshi's ring writes the T new keys into every batch row and only holds back the masked rows' end offsets: a
    T-frame span injected for one session would write its keys into the other sessions' rings. Here masked rows
    keep their old keys, so one session's injection leaves the others' caches bit for bit as they were.
    """

    def complete(self, k: torch.Tensor, v: torch.Tensor, exec_mask: torch.Tensor) -> KVCacheResult:
        # No shortcut on `exec_mask.all()`: reading it on the host would break CUDA graph capture of the step.
        B, H, T, D = k.shape
        index = ((torch.arange(T, device=k.device) + self.end_offset.view(-1, 1)) % self.capacity)
        index = index.view(B, 1, T, 1).expand(-1, H, T, D)
        keep = ~exec_mask.view(B, 1, 1, 1)
        k = torch.where(keep, self.cache[0].gather(2, index), k)
        v = torch.where(keep, self.cache[1].gather(2, index), v)
        return super().complete(k, v, exec_mask)


def attention_layers(transformer: StreamingTransformer) -> list[StreamingMultiheadAttention]:
    return [
        m for m in transformer.modules()
        if isinstance(m, StreamingMultiheadAttention) and not m.cross_attention
    ]


@contextmanager
def wide_rings(transformer: StreamingTransformer, extra_frames: int) -> Iterator[int]:
    """Streaming entered inside the block gives each self-attention layer a masked ring of `context + extra_frames`
    slots; yields that capacity.

    The wide ring is the layer's only ring: it is created in place of moshi's `context`-slot one, never next to it, so
    entering streaming for B rows allocates B rows of wide rings and nothing more
    (tests/frontend_model/test_memory.py counts it).
    """
    layers = attention_layers(transformer)
    if any(attn.context is None for attn in layers):
        raise RuntimeError("wide_rings needs a transformer with a finite attention context")
    capacity = max((attn.context or 0) + extra_frames for attn in layers) if layers else 0
    for attn in layers:
        attn._init_streaming_state = partial(_wide_state, attn, extra_frames)  # type: ignore[method-assign]
    try:
        yield capacity
    finally:
        for attn in layers:
            del attn._init_streaming_state


def _wide_state(attn: StreamingMultiheadAttention, extra_frames: int, batch_size: int) -> _MHAState:
    """moshi's own state, built while the layer's context reads `context + extra_frames` (its ring's capacity is the
    only use of it there), with the ring re-typed to MaskedRingKVCache over the same tensors."""
    context = attn.context
    assert context is not None
    attn.context = context + extra_frames
    try:
        state = type(attn)._init_streaming_state(attn, batch_size)
    finally:
        attn.context = context
    if state.kv_cache is not None:
        ring = MaskedRingKVCache.__new__(MaskedRingKVCache)
        vars(ring).update(vars(state.kv_cache))
        state.kv_cache = ring
    return state
