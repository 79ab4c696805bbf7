"""The one walk over moshi's streaming states: which modules under a root stream, and what each state holds.

A state is a plain object of attributes. What batching code does with one depends on its kind: a tensor whose first
dimension is the batch holds one entry per row (offsets, token rings, exec masks); a RingKVCache holds its keys and
values [2, batch, ...] and per-row end offsets; a host int other than `batch_size` counts steps (`offset_cpu`); any
other tensor is shared by the rows. Row views (row_view.py), the step undo (step_undo.py), the chunked prefill's
scratch row (engine/chunked_prefill.py) and the memory accounting (engine/device_memory.py) all read this one sorting.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from moshi.modules.streaming import StreamingModule
from moshi.modules.transformer import RingKVCache

_DESCENDANTS: weakref.WeakKeyDictionary[torch.nn.Module, list[StreamingModule]] = weakref.WeakKeyDictionary()


def streaming_modules(root: torch.nn.Module) -> list[StreamingModule]:
    """Every streaming module under `root`, itself included. Walking a model's modules costs about a millisecond on
    CPU, several times a tick: each root is walked once."""
    if root not in _DESCENDANTS:
        _DESCENDANTS[root] = [m for m in root.modules() if isinstance(m, StreamingModule)]
    return _DESCENDANTS[root]


def stop_streaming(root: torch.nn.Module) -> None:
    """Every module under `root` out of streaming. moshi's `streaming()` that fails half-way (a ring that does not fit
    the device) loses the exit stack that would undo what it started: the modules it reached stay streaming and hold
    their rings, and the next `streaming()` refuses them ("already streaming")."""
    for module in streaming_modules(root):
        module._streaming_state = None


@dataclass(frozen=True)
class StreamingState:
    """One module's streaming state, its attributes sorted by kind (see the module docstring)."""

    module: StreamingModule
    state: Any
    rows: tuple[str, ...]
    rings: tuple[str, ...]
    counters: tuple[str, ...]
    shared: tuple[str, ...]

    @property
    def batch_size(self) -> int:
        return int(self.state.batch_size)

    def tensors(self) -> Iterator[torch.Tensor]:
        """Every tensor the state holds, the rings' keys, values and end offsets included."""
        for name in (*self.rows, *self.shared):
            yield getattr(self.state, name)
        for name in self.rings:
            ring = getattr(self.state, name)
            yield from (ring.cache, ring.end_offset)


def sort_state(module: StreamingModule, state: Any) -> StreamingState:
    """`state` (the module's own, or a copy of it) with its attributes sorted by kind."""
    batch = state.batch_size
    rows: list[str] = []
    rings: list[str] = []
    counters: list[str] = []
    shared: list[str] = []
    for name, value in vars(state).items():
        if isinstance(value, RingKVCache):
            rings.append(name)
        elif isinstance(value, torch.Tensor):
            (rows if value.dim() > 0 and value.shape[0] == batch else shared).append(name)
        elif isinstance(value, int) and not isinstance(value, bool) and name != "batch_size":
            counters.append(name)
    return StreamingState(module, state, tuple(rows), tuple(rings), tuple(counters), tuple(shared))


def streaming_states(roots: Iterable[torch.nn.Module]) -> list[StreamingState]:
    """The states of the modules under `roots` that stream now (a depformer streams within each step only)."""
    return [sort_state(module, module._streaming_state) for root in roots for module in streaming_modules(root)
            if module._streaming_state is not None]
