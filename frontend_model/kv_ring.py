"""KV ring sizing for span injection.

A T=n forward writes n keys before the block's first query has attended: with a ring of exactly `context`
slots, once the ring has wrapped those writes overwrite keys that early queries in the block still need.
Giving the ring `context + max_span_frames` slots keeps every needed key while the attention mask still
limits each query to `context` past frames, so one-pass injection equals frame-by-frame stepping.
"""

from __future__ import annotations

import torch
from moshi.modules.transformer import KVCacheResult, RingKVCache, StreamingMultiheadAttention, StreamingTransformer


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


def widen_kv_rings(transformer: StreamingTransformer, extra_frames: int) -> int:
    """Replace each self-attention ring by one with `extra_frames` more slots; returns the new capacity.

    Must run right after entering streaming, before the first step, since the new rings start empty.
    """
    capacity = 0
    for attn in attention_layers(transformer):
        state = attn._streaming_state
        if state is None or state.kv_cache is None or attn.context is None:
            raise RuntimeError("widen_kv_rings needs a streaming transformer with a finite attention context")
        old = state.kv_cache
        if int(old.end_offset.max()) != 0:
            raise RuntimeError("widen_kv_rings must run before the first step")
        _, batch, heads, _, dim = old.cache.shape
        capacity = attn.context + extra_frames
        state.kv_cache = MaskedRingKVCache(
            batch, heads, dim, capacity, respect_exec_mask=old.respect_exec_mask,
            device=old.cache.device, dtype=old.cache.dtype,
        )
    return capacity
