"""Run streaming modules on a contiguous range of batch rows, in place.

A batch computes every row each call, masked or not. A span for one session in a batch of B, or a tick in which
only a few sessions have a frame, would pay for all B rows. Within `rows(modules, lo, hi)` every streaming state
under `modules` is swapped for a copy whose per-row tensors are views of rows lo..hi-1: in-place updates
(`[:] =`, `scatter_`, the KV rings) land in the batch's own tensors, and what a step reassigns instead (LMGen's
offsets, a conv's `first` flags, step counters) is written back into those rows on the way out.
"""

from __future__ import annotations

import copy
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from moshi.modules.streaming import StreamingModule
from moshi.modules.transformer import RingKVCache


def _kv_rows(cache: RingKVCache, lo: int, hi: int) -> RingKVCache:
    view = copy.copy(cache)
    view.cache = cache.cache[:, lo:hi]
    view.end_offset = cache.end_offset[lo:hi]
    return view


@dataclass
class _Swap:
    module: StreamingModule
    state: object
    view: object
    sliced: dict[str, torch.Tensor]


def _view_of(module: StreamingModule, lo: int, hi: int) -> _Swap:
    state = module._streaming_state
    batch = state.batch_size  # type: ignore[union-attr]
    view = copy.copy(state)
    sliced: dict[str, torch.Tensor] = {}
    for name, value in vars(state).items():
        if isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape[0] == batch:
            sliced[name] = value[lo:hi]
            setattr(view, name, sliced[name])
        elif isinstance(value, RingKVCache):
            setattr(view, name, _kv_rows(value, lo, hi))
    view.batch_size = hi - lo  # type: ignore[attr-defined]
    return _Swap(module, state, view, sliced)


def _write_back(swap: _Swap, lo: int, hi: int) -> None:
    for name, value in vars(swap.view).items():
        if name == "batch_size":
            continue
        if name in swap.sliced:
            if value is not swap.sliced[name]:
                getattr(swap.state, name)[lo:hi] = value
        elif not isinstance(value, RingKVCache) and value is not getattr(swap.state, name):
            setattr(swap.state, name, value)


_DESCENDANTS: weakref.WeakKeyDictionary[StreamingModule, list[StreamingModule]] = weakref.WeakKeyDictionary()


def _streaming_descendants(root: StreamingModule) -> list[StreamingModule]:
    """Walking a model's modules costs about a millisecond on CPU, three times a tick: walk each root once."""
    if root not in _DESCENDANTS:
        _DESCENDANTS[root] = [m for m in root.modules() if isinstance(m, StreamingModule)]
    return _DESCENDANTS[root]


@contextmanager
def rows(modules: list[StreamingModule], lo: int, hi: int) -> Iterator[None]:
    """Within the block, the streaming modules under `modules` (all streaming) stream as a batch of rows lo..hi-1."""
    batch = modules[0]._streaming_state.batch_size  # type: ignore[union-attr]
    if not 0 <= lo < hi <= batch:
        raise ValueError(f"rows {lo}..{hi - 1} out of range 0..{batch - 1}")
    if (lo, hi) == (0, batch):
        yield
        return
    swaps = [_view_of(m, lo, hi) for root in modules for m in _streaming_descendants(root)
             if m._streaming_state is not None]
    try:
        for swap in swaps:
            swap.module._streaming_state = swap.view  # type: ignore[assignment]
        yield
    finally:
        for swap in swaps:
            swap.module._streaming_state = swap.state  # type: ignore[assignment]
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
