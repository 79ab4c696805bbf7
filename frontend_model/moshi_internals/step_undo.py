"""What a batched step changes in the model's streaming state, saved before the step so that a failed one can be
undone for the slots that did nothing wrong.

A step writes three kinds of state. Counters and small per-row tensors (LMGen's offsets and token ring, the
transformer's and each attention's offsets, each KV ring's end offsets, the sampler's draw counts) are saved here,
a few hundred bytes per slot, copied on the device in one `cat` per dtype and never read on the host: the healthy
path pays that copy, not a sync. The KV rings' contents are not saved: a step writes each executing row's keys at
its end offset, into the ring's oldest slot, which no query reads again (the ring holds `context +
max_span_frames` keys and a query attends to `context`); with the end offset put back, that slot is again the
oldest, and the step run again overwrites it before any query reads it. Masked rows are never written
(MaskedRingKVCache). LMGen writes its token ring at the step's own columns, which a step run again with the same
codes writes again with the same values first. So putting the counters back undoes a step that raised anywhere
in the transformer, the depformer or the sampler.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import torch
from moshi.modules.streaming import StreamingModule

from frontend_model.moshi_internals.streaming_state import streaming_states


@dataclass(frozen=True)
class _Layout:
    tensors: dict[torch.dtype, list[tuple[Any, str]]]  # dtype -> the (holder, attribute) pairs saved in one cat
    ints: list[tuple[Any, str]]  # host counters (offset_cpu)


def _layout(roots: list[StreamingModule], extra: list[tuple[Any, str]]) -> _Layout:
    tensors: dict[torch.dtype, list[tuple[Any, str]]] = defaultdict(list)
    ints: list[tuple[Any, str]] = []
    for state in streaming_states(roots):
        for name in state.rings:
            ring = getattr(state.state, name)
            tensors[ring.end_offset.dtype].append((ring, "end_offset"))
        for name in state.rows:
            if name != "exec_mask":
                tensors[getattr(state.state, name).dtype].append((state.state, name))
        ints.extend((state.state, name) for name in state.counters)
    for holder, name in extra:
        tensors[getattr(holder, name).dtype].append((holder, name))
    return _Layout(dict(tensors), ints)


@dataclass(frozen=True)
class StepCheckpoint:
    layout: _Layout
    saved: dict[torch.dtype, torch.Tensor]
    ints: list[int]

    @classmethod
    def take(cls, layout: _Layout) -> StepCheckpoint:
        saved = {dtype: torch.cat([getattr(h, n).reshape(-1) for h, n in pairs])
                 for dtype, pairs in layout.tensors.items()}
        return cls(layout, saved, [getattr(h, n) for h, n in layout.ints])

    def restore(self) -> None:
        """Every saved tensor back, in place (CUDA graphs replay the tensors they captured)."""
        for dtype, pairs in self.layout.tensors.items():
            targets = [getattr(h, n) for h, n in pairs]
            for target, value in zip(targets, self.saved[dtype].split([t.numel() for t in targets]), strict=True):
                target.copy_(value.view_as(target))
        for (holder, name), value in zip(self.layout.ints, self.ints, strict=True):
            setattr(holder, name, value)


class Checkpoints:
    """Takes step checkpoints of `roots` and of `extra` tensors; the layout is read once per streaming session."""

    def __init__(self, roots: list[StreamingModule], extra: list[tuple[Any, str]]) -> None:
        self._layout = _layout(roots, extra)

    def take(self) -> StepCheckpoint:
        return StepCheckpoint.take(self._layout)
