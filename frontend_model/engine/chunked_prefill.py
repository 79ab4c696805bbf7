"""Span and prefix prefills in power-of-two chunks, one graphed forward per chunk size, captured at startup.

A CUDA graph replays one shape on the tensors it was captured with. A one-pass prefill of n frames would need a
graph per n, and per slot, since each slot's KV rows sit at their own addresses. Chunks of 512, 256, ..., 1 frames
cover any n with one graph per size, run on a scratch row: a batch-1 copy of the temporal transformer's streaming
state whose tensors never move. The slot's row is copied in, the chunks run, the row is copied back (on an H200 a 7B
row is ~1.8 GB, about a millisecond each way; calibration counts it). Each chunk is at most the ring's extra
`max_span_frames` slots long, so it is exact the way a one-pass span is (frontend_model/moshi_internals/kv_ring.py),
and a chunked
prefill leaves the state and next-step logits of the one-pass one (tests/frontend_model/test_chunked_prefill.py).

On CPU graphs are off and the chunks run eagerly; in replay mode (frontend_model/moshi_internals/graphs.py) they
replay persistent
outputs, as graphs would. Calibration measures one-pass and chunked prefills and the engine uses the faster.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from enum import Enum
from functools import partial
from typing import Any

import torch
from moshi.models.lm import LMModel
from moshi.modules.streaming import StreamingModule
from moshi.utils.compile import CUDAGraphed

from frontend_model.engine.columns import forward_last
from frontend_model.moshi_internals.graphs import ReplayedGraph, replay_outputs
from frontend_model.moshi_internals.streaming_state import StreamingState, streaming_states


class SpanPrefill(Enum):
    """How an engine writes a span or prefix: one forward, power-of-two chunks, or whichever calibration measured
    faster for its length (one-pass where nothing was measured)."""

    ONE_PASS = "one-pass"
    CHUNKED = "chunked"
    FASTER = "faster"


def chunk_sizes(max_frames: int) -> list[int]:
    """The chunk sizes an engine graphs: powers of two up to `max_frames`, largest first."""
    if max_frames < 1:
        raise ValueError(f"max_frames must be at least 1, got {max_frames}")
    return [1 << k for k in range(max_frames.bit_length() - 1, -1, -1)]


def power_of_two_chunks(frames: int, largest: int) -> list[int]:
    """`frames` as chunks of powers of two, largest first, none over `largest` (a power of two): 600, 512 ->
    [512, 64, 16, 8]."""
    if largest < 1 or largest & (largest - 1):
        raise ValueError(f"largest must be a power of two, got {largest}")
    if frames < 0:
        raise ValueError(f"frames must be >= 0, got {frames}")
    chunks = [largest] * (frames // largest)
    rest = frames % largest
    return chunks + [1 << k for k in range(rest.bit_length() - 1, -1, -1) if rest >> k & 1]


@dataclass
class _Pair:
    """One streaming module's state in the batch and its batch-1 scratch copy."""

    module: StreamingModule
    scratch: Any
    rows: tuple[str, ...]  # per-row tensors (first dimension the batch)
    rings: tuple[str, ...]  # RingKVCache attributes
    counters: tuple[str, ...]  # host values a forward may change (offset_cpu)


def _scratch_pair(state: StreamingState) -> _Pair:
    scratch = copy.copy(state.state)
    for name in state.rows:
        setattr(scratch, name, getattr(state.state, name)[:1].clone())
    for name in state.rings:
        value = getattr(state.state, name)
        ring = copy.copy(value)
        ring.cache = value.cache[:, :1].clone()
        ring.end_offset = value.end_offset[:1].clone()
        setattr(scratch, name, ring)
    scratch.batch_size = 1
    return _Pair(state.module, scratch, state.rows, state.rings, state.counters)


class ScratchRow:
    """A batch-1 copy of the streaming states under `root`, at addresses that never change: what the chunk graphs
    are captured on."""

    def __init__(self, root: StreamingModule) -> None:
        self.pairs = [_scratch_pair(state) for state in streaming_states([root])]

    def tensors(self) -> Iterator[torch.Tensor]:
        """Every tensor of the scratch states (a graph reads them all)."""
        for pair in self.pairs:
            for name in pair.rows:
                yield getattr(pair.scratch, name)
            for name in pair.rings:
                ring = getattr(pair.scratch, name)
                yield from (ring.cache, ring.end_offset)

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors())

    def load(self, row: int) -> None:
        """Batch row `row` copied into the scratch states (the batch's states installed)."""
        for pair in self.pairs:
            _copy_row(pair.module._streaming_state, pair.scratch, pair, row, into_scratch=True)

    def store(self, row: int) -> None:
        """The scratch states copied into batch row `row` (the batch's states installed)."""
        for pair in self.pairs:
            _copy_row(pair.module._streaming_state, pair.scratch, pair, row, into_scratch=False)

    @contextmanager
    def installed(self, row: int | None) -> Iterator[None]:
        """The scratch states in place of the batch's: holding a copy of batch row `row`, written back on the way
        out, or as they are when `row` is None (graph capture, which leaves garbage every later use overwrites; a
        window built ahead, which lives on its own scratch row: engine/window.py)."""
        if row is not None:
            self.load(row)
        states = [pair.module._streaming_state for pair in self.pairs]
        for pair in self.pairs:
            pair.module._streaming_state = pair.scratch
        try:
            yield
        finally:
            for pair, state in zip(self.pairs, states, strict=True):
                pair.module._streaming_state = state
            if row is not None:
                self.store(row)


def _copy_row(state: Any, scratch: Any, pair: _Pair, row: int, into_scratch: bool) -> None:
    """In place both ways: the graphs hold the scratch tensors, moshi's step graphs the batch's."""
    def move(batch: torch.Tensor, one: torch.Tensor) -> None:
        (one if into_scratch else batch).copy_(batch if into_scratch else one)

    for name in pair.rows:
        move(getattr(state, name)[row : row + 1], getattr(scratch, name))
    for name in pair.rings:
        ring, scratch_ring = getattr(state, name), getattr(scratch, name)
        move(ring.cache[:, row : row + 1], scratch_ring.cache)
        move(ring.end_offset[row : row + 1], scratch_ring.end_offset)
    source, target = (state, scratch) if into_scratch else (scratch, state)
    for name in pair.counters:
        setattr(target, name, getattr(source, name))


class ChunkedPrefill:
    """One graphed `forward_last` per chunk size on a scratch row, for an engine whose LM is streaming; captured as
    it is built, so that an engine holds chunk graphs only where they captured (frontend_model/engine/optimisations.py:
    where the scratch row or a capture fails, spans go in one pass)."""

    def __init__(self, lm: LMModel, scratch: ScratchRow, max_frames: int, graphs: bool = True) -> None:
        """`graphs`: CUDA graphs where the LM is on a GPU (off: eager chunks, where the prefill graphs failed)."""
        self.lm = lm
        self.sizes = chunk_sizes(max_frames)
        self.scratch = scratch
        cuda = graphs and next(lm.parameters()).device.type == "cuda"
        self._graphs: dict[int, Callable[..., Any]] = {}
        for size in self.sizes:
            # forward_last bound to the LM, not a method of self: no cycle keeps a closed prefill's graphs alive
            graphed = CUDAGraphed(partial(forward_last, lm), warmup_steps=1, disable=not cuda)
            self._graphs[size] = ReplayedGraph(graphed) if replay_outputs() else graphed
        self._capture()

    def close(self) -> None:
        """Destroys the chunk graphs now, not in a garbage collection during another engine's capture
        (moshi_internals/graphs.py `release_graphs`)."""
        for graphed in self._graphs.values():
            if isinstance(graphed, CUDAGraphed):
                graphed.reset()
        self._graphs.clear()

    @torch.no_grad()
    def _capture(self) -> None:
        """Warm up and capture every size's graph now, not inside a session's deadline (eager on CPU: only the first
        calls' lazy initialisation is paid)."""
        param = next(self.lm.parameters())
        with self.scratch.installed(None):
            for size in self.sizes:
                x = torch.zeros(1, size, self.lm.dim, device=param.device, dtype=param.dtype)
                for _ in range(2):
                    self._graphs[size](x)

    def forward(self, x: torch.Tensor, row: int | None) -> tuple[torch.Tensor, torch.Tensor]:
        """`x` [1, T, dim] for batch row `row` (None: for the scratch row as it stands), in chunks: the (out, text
        logits) of its last position, copied out of the graphs' buffers."""
        if x.shape[0] != 1:
            raise ValueError(f"a chunked prefill writes one row, got {x.shape[0]}")
        start = 0
        last: tuple[torch.Tensor, torch.Tensor] | None = None
        with self.scratch.installed(row):
            for size in power_of_two_chunks(x.shape[1], self.sizes[0]):
                last = self._graphs[size](x[:, start : start + size])
                start += size
        if last is None:
            raise ValueError("a chunked prefill of zero frames")
        return last[0].clone(), last[1].clone()
