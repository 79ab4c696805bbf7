"""Run streaming modules on a contiguous range of batch rows, in place.

A batch computes every row each call, masked or not. A span for one session in a batch of B, or a tick in which
only a few sessions have a frame, would pay for all B rows. Within `rows(modules, lo, hi)` every streaming state
under `modules` is swapped for a copy whose per-row tensors are views of rows lo..hi-1: in-place updates
(`[:] =`, `scatter_`, the KV rings) land in the batch's own tensors, and what a step reassigns instead (LMGen's
offsets, a conv's `first` flags, step counters) is written back into those rows on the way out.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from moshi.modules.streaming import StreamingModule
from moshi.modules.transformer import RingKVCache

from frontend_model.moshi_internals.streaming_state import StreamingState, streaming_states


def _kv_rows(cache: RingKVCache, lo: int, hi: int) -> RingKVCache:
    view = copy.copy(cache)
    view.cache = cache.cache[:, lo:hi]
    view.end_offset = cache.end_offset[lo:hi]
    return view


@dataclass
class _Swap:
    state: StreamingState
    view: object
    sliced: dict[str, torch.Tensor]


def _view_of(state: StreamingState, lo: int, hi: int) -> _Swap:
    view = copy.copy(state.state)
    sliced: dict[str, torch.Tensor] = {}
    for name in state.rows:
        sliced[name] = getattr(state.state, name)[lo:hi]
        setattr(view, name, sliced[name])
    for name in state.rings:
        setattr(view, name, _kv_rows(getattr(state.state, name), lo, hi))
    view.batch_size = hi - lo  # type: ignore[attr-defined]
    return _Swap(state, view, sliced)


def _write_back(swap: _Swap, lo: int, hi: int) -> None:
    original = swap.state.state
    for name, value in vars(swap.view).items():
        if name == "batch_size":
            continue
        if name in swap.sliced:
            if value is not swap.sliced[name]:
                getattr(original, name)[lo:hi] = value
        elif name not in swap.state.rings and value is not getattr(original, name):
            setattr(original, name, value)


@contextmanager
def rows(modules: list[StreamingModule], lo: int, hi: int) -> Iterator[None]:
    """Within the block, the streaming modules under `modules` (all streaming) stream as a batch of rows lo..hi-1."""
    batch = modules[0]._streaming_state.batch_size  # type: ignore[union-attr]
    if not 0 <= lo < hi <= batch:
        raise ValueError(f"rows {lo}..{hi - 1} out of range 0..{batch - 1}")
    if (lo, hi) == (0, batch):
        yield
        return
    swaps = [_view_of(state, lo, hi) for state in streaming_states(modules)]
    try:
        for swap in swaps:
            swap.state.module._streaming_state = swap.view  # type: ignore[assignment]
        yield
    finally:
        for swap in swaps:
            swap.state.module._streaming_state = swap.state.state
            _write_back(swap, lo, hi)


def active_rows(active: torch.Tensor, compact: bool) -> tuple[int, int]:
    """The rows a batched call computes: from the first to the last active row when `compact`, else all of them.

    Compact on CPU, where a row costs compute; not under CUDA graphs, which replay one captured batch shape.
    """
    batch = active.shape[0]
    if not compact or not bool(active.any()):
        return 0, batch
    index = active.nonzero().flatten()
    return int(index[0]), int(index[-1]) + 1
