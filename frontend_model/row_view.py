"""Run the streaming temporal transformer on one batch row, in place.

A span for one session in a batch of B would otherwise cost a T=n forward over all B rows, B - 1 of them masked
and thrown away. Every streaming state of the transformer is swapped, for the duration of the call, for a copy
whose per-row tensors are views of that row; moshi updates its states in place (`[:] =`, `scatter_`), so the
writes land in the batch's own tensors.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from moshi.modules.streaming import StreamingModule
from moshi.modules.transformer import RingKVCache, StreamingTransformer


def _row_kv(cache: RingKVCache, row: int) -> RingKVCache:
    view = copy.copy(cache)
    view.cache = cache.cache[:, row : row + 1]
    view.end_offset = cache.end_offset[row : row + 1]
    return view


def _row_state(state: object, row: int, batch: int) -> object:
    view = copy.copy(state)
    for name, value in vars(state).items():
        if isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape[0] == batch:
            setattr(view, name, value[row : row + 1])
        elif isinstance(value, RingKVCache):
            setattr(view, name, _row_kv(value, row))
    view.batch_size = 1  # type: ignore[attr-defined]
    return view


@contextmanager
def single_row(transformer: StreamingTransformer, row: int) -> Iterator[None]:
    """Within the block, `transformer` streams as a batch of one: batch row `row`."""
    modules = [m for m in transformer.modules() if isinstance(m, StreamingModule) and m._streaming_state is not None]
    originals = [m._streaming_state for m in modules]
    batch = originals[0].batch_size  # type: ignore[union-attr]
    if not 0 <= row < batch:
        raise ValueError(f"row {row} out of range 0..{batch - 1}")
    try:
        for module, state in zip(modules, originals, strict=True):
            module._streaming_state = _row_state(state, row, batch)  # type: ignore[assignment]
        yield
    finally:
        for module, state in zip(modules, originals, strict=True):
            module._streaming_state = state
