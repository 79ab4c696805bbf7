"""Graph safety, checked on CPU: what moshi's CUDA graphs need from the code around them
(frontend_model.moshi_internals.graphs).

Ticks on the graph path (the whole batch, graphed calls replaying persistent outputs) are audited op by op with a
dispatch mode: no host sync inside a graphed call; outside them none but the one transfer of all slots' outputs and
moshi's own (KNOWN_SYNCS); the same op sequence whichever rows are active, after a span and after a join, since a
graph replays what it recorded. Every streaming-state tensor a graph reads keeps its storage across ticks, spans,
joins, leaves and resets (updated in place), and an output kept by the engine survives the next replay.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from moshi.modules.streaming import StreamingModule
from moshi.modules.transformer import RingKVCache
from torch.utils._python_dispatch import TorchDispatchMode

import frontend_model.engine.batch_engine
import frontend_model.engine.batch_model
from frontend_model.engine.batch_model import BatchedModel
from frontend_model.engine.chunked_prefill import SpanPrefill
from frontend_model.engine.engine import GREEDY, Engine
from frontend_model.frame import FRAME_SAMPLES
from frontend_model.loading.loader import LoadedModel, load_model
from frontend_model.moshi_internals.graphs import REPLAY_ENV, ReplayedGraph
from frontend_model.span.block import Prefix
from tests.support.engine import span_like_block, user_frames

SLOTS = 3
MAX_SPAN = 12
# Ops that read device data on the host or size their output by it: on a GPU each one waits for the stream.
SYNC_OPS = {"_local_scalar_dense", "is_nonzero", "nonzero", "nonzero_static", "masked_select", "masked_scatter",
            "unique", "_unique", "_unique2", "unique_dim", "unique_consecutive", "equal", "bincount",
            "repeat_interleave", "item"}
INDEX_OPS = {"index", "index_put", "index_put_", "_index_put_impl_"}
HOST_READS = ("cpu", "numpy", "tolist", "item")
# moshi's LMGen._step blanks the outputs of masked rows with a boolean index (`out[mask, :, :] = ...`): one sync per
# tick in the installed package, after the step's graphs are launched; removing it would mean forking LMGen._step.
KNOWN_SYNCS = {("index_put_", "moshi/models/lm.py:_step")}


@dataclass
class Event:
    op: str
    in_graph: bool
    in_transfer: bool
    sync: bool
    caller: str


_ROOT = f"{Path(__file__).resolve().parents[2]}/"
_AUDIT_FRAMES = {"_caller", "record", "__torch_dispatch__", "wrapper"}


def _caller() -> str:
    """The first frame outside torch and the audit itself: where a sync comes from."""
    frame = sys._getframe(1)
    while frame is not None:
        name = frame.f_code.co_filename
        if "/torch/" not in name and not (name == __file__ and frame.f_code.co_name in _AUDIT_FRAMES):
            short = name.split("site-packages/")[-1].removeprefix(_ROOT)
            return f"{short}:{frame.f_code.co_name}"
        frame = frame.f_back  # type: ignore[assignment]
    return "?"


def _is_sync(op: str, args: tuple[Any, ...]) -> bool:
    if op in SYNC_OPS:
        return True
    if op in INDEX_OPS and len(args) > 1 and isinstance(args[1], list | tuple):
        return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in args[1])
    return False


class Audit(TorchDispatchMode):
    """Every aten op and host read of the block, with whether it ran inside a graphed call or the sanctioned
    transfer."""

    def __init__(self) -> None:
        super().__init__()
        self.events: list[Event] = []
        self.transfers = 0
        self.graph_depth = 0
        self.transfer_depth = 0

    def record(self, op: str, sync: bool) -> None:
        self.events.append(Event(op, self.graph_depth > 0, self.transfer_depth > 0, sync,
                                 _caller() if sync else ""))

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        op = func.overloadpacket.__name__
        self.record(op, _is_sync(op, args))
        return func(*args, **(kwargs or {}))

    def ops(self) -> list[str]:
        return [e.op for e in self.events]

    def syncs_in_graphs(self) -> list[tuple[str, str]]:
        return [(e.op, e.caller) for e in self.events if e.sync and e.in_graph]

    def unsanctioned_syncs(self) -> list[tuple[str, str]]:
        return [(e.op, e.caller) for e in self.events
                if e.sync and not e.in_transfer and (e.op, e.caller) not in KNOWN_SYNCS]


@pytest.fixture
def audited(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[Callable[[], object]], Audit]]:
    """Runs a call under a fresh Audit; graphed calls, the transfer and host reads of tensors are marked."""
    current: list[Audit] = []

    def marking(fn: Callable[..., Any], depth: str) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            audit = current[-1] if current else None
            if audit is None:
                return fn(*args, **kwargs)
            setattr(audit, depth, getattr(audit, depth) + 1)
            audit.transfers += depth == "transfer_depth"
            try:
                return fn(*args, **kwargs)
            finally:
                setattr(audit, depth, getattr(audit, depth) - 1)
        return wrapper

    def host_read(name: str) -> Callable[..., Any]:
        original = getattr(torch.Tensor, name)

        def wrapper(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            if current:
                current[-1].record(f"Tensor.{name}", True)
            return original(self, *args, **kwargs)
        return wrapper

    monkeypatch.setattr(ReplayedGraph, "__call__", marking(ReplayedGraph.__call__, "graph_depth"))
    for module in (frontend_model.engine.batch_model, frontend_model.engine.batch_engine):
        monkeypatch.setattr(module, "to_host", marking(module.to_host, "transfer_depth"))
    for name in HOST_READS:
        monkeypatch.setattr(torch.Tensor, name, host_read(name))

    def run(call: Callable[[], object]) -> Audit:
        audit = Audit()
        current.append(audit)
        try:
            with audit:
                call()
        finally:
            current.pop()
        return audit

    yield run


@pytest.fixture(scope="module")
def model() -> LoadedModel:
    return load_model("tiny", device="cpu", dtype=torch.float32, context=8)


@pytest.fixture
def replayed(model: LoadedModel, monkeypatch: pytest.MonkeyPatch) -> Iterator[BatchedModel]:
    """A started BatchedModel on the graph path: every slot open, past the frames its delays hold back."""
    monkeypatch.setenv(REPLAY_ENV, "1")
    together = BatchedModel(model, SLOTS, GREEDY, max_span_frames=MAX_SPAN)
    assert not together.engine.compact and not together.codec.compact
    together.start()
    try:
        for slot in range(SLOTS):
            together.open_slot(slot, None)
        for _ in range(4):
            together.tick(frames(range(SLOTS)))
        yield together
    finally:
        together.close()


def frames(slots: range | list[int]) -> dict[int, np.ndarray]:
    rng = np.random.default_rng(len(slots))
    return {s: (0.1 * rng.standard_normal(FRAME_SAMPLES)).astype(np.float32) for s in slots}


def test_a_tick_syncs_once_and_runs_the_same_ops_whichever_rows_are_active(
        replayed: BatchedModel, audited: Callable[[Callable[[], object]], Audit]) -> None:
    together = replayed
    every = range(SLOTS)
    ticks: dict[str, Audit] = {
        "all rows": audited(lambda: together.tick(frames(every))),
        "rows 0, 2": audited(lambda: together.tick(frames([0, 2]))),
        "row 1": audited(lambda: together.tick(frames([1]))),
    }
    together.inject(1, span_like_block(together.engine, MAX_SPAN, seed=1))
    ticks["after a span"] = audited(lambda: together.tick(frames(every)))
    together.open_slot(2, Prefix(span_like_block(together.engine, 4, seed=2)))
    ticks["after a join"] = audited(lambda: together.tick(frames(every)))
    ticks["after a leave"] = audited(lambda: together.tick(frames([1, 2])))
    reference = ticks["all rows"]
    assert any(e.in_graph for e in reference.events), "no graphed call was audited"
    for name, audit in ticks.items():
        assert audit.syncs_in_graphs() == [], f"{name}: host syncs inside graphed calls"
        assert audit.unsanctioned_syncs() == [], f"{name}: host syncs outside the tick's one transfer"
        assert audit.transfers == 1, f"{name}: {audit.transfers} device -> host transfers, want one per tick"
        assert audit.ops() == reference.ops(), f"{name}: the op sequence depends on which rows are active"


def test_a_chunked_span_syncs_nowhere_inside_its_graphs(
        model: LoadedModel, monkeypatch: pytest.MonkeyPatch, audited: Callable[[Callable[[], object]], Audit]) -> None:
    """A span written in power-of-two chunks on the scratch row: every chunk a graphed call, none reading the host."""
    monkeypatch.setenv(REPLAY_ENV, "1")
    together = BatchedModel(model, SLOTS, GREEDY, max_span_frames=MAX_SPAN, prefill=SpanPrefill.CHUNKED)
    together.start()
    try:
        for slot in range(SLOTS):
            together.open_slot(slot, None)
        together.tick(frames(range(SLOTS)))
        audit = audited(lambda: together.inject(1, span_like_block(together.engine, 11, seed=6)))  # 8 + 2 + 1
        assert sum(e.in_graph for e in audit.events) > 3 * len(list(model.lm.transformer.layers))
        assert audit.syncs_in_graphs() == [], "host syncs inside a chunk's graph"
    finally:
        together.close()


def test_the_audit_sees_a_host_read(replayed: BatchedModel,
                                    audited: Callable[[Callable[[], object]], Audit]) -> None:
    """The audit is not blind: a per-slot read, as the tick used to make, is reported where it happens."""
    together = replayed

    def read_each_slot() -> None:
        codes = torch.zeros(SLOTS, together.model.span.user_codebooks, dtype=torch.long)
        tokens = together.engine.step_batch(codes, torch.ones(SLOTS, dtype=torch.bool)).tokens
        for slot in range(SLOTS):
            int(tokens[slot, 0])

    audit = audited(read_each_slot)
    here = "tests/frontend_model/test_graph_safety.py:read_each_slot"
    assert audit.unsanctioned_syncs() == [("_local_scalar_dense", here)] * SLOTS


def _graph_read_tensors(together: BatchedModel) -> dict[str, torch.Tensor]:
    """Every tensor of the streaming states under the LM and the codec, and the row sampler's settings (read inside
    the graphed depformer), by a stable name."""
    found: dict[str, torch.Tensor] = {}
    roots: dict[str, torch.nn.Module] = {"lm_gen": together.engine.lm_gen, "mimi": together.codec.mimi}
    for root_name, root in roots.items():
        for path, module in root.named_modules():
            state = module._streaming_state if isinstance(module, StreamingModule) else None
            for attr, value in vars(state).items() if state is not None else ():
                name = f"{root_name}.{path}.{attr}"
                if isinstance(value, torch.Tensor):
                    found[name] = value
                elif isinstance(value, RingKVCache):
                    found[f"{name}.cache"] = value.cache
                    found[f"{name}.end_offset"] = value.end_offset
    sampler = together.engine.sampler
    assert sampler is not None
    for attr in ("temperature", "topk", "seed"):
        for stream, tensor in getattr(sampler, attr).items():
            found[f"sampler.{attr}.{stream.value}"] = tensor
    found["sampler.draws"] = sampler.draws
    found["sampler.active"] = sampler.active
    return found


# Reassigned by moshi's own eager code, outside any graph: LMGen's per-row offsets (`state.offsets = torch.where(...)`
# in LMGen._step; graphs receive their inputs as arguments, never this attribute) and the `first` flags of Mimi's
# frame-rate downsampling conv (StreamingConv1d with replicate padding, run by `_to_framerate` after the graphed
# encoder and its transformer, not inside them).
REASSIGNED_OUTSIDE_GRAPHS = {"lm_gen..offsets", "mimi.downsample.conv.first"}


def test_streaming_state_is_updated_in_place(replayed: BatchedModel) -> None:
    together = replayed
    before = {name: (t, t.data_ptr()) for name, t in _graph_read_tensors(together).items()}
    assert before.keys() >= REASSIGNED_OUTSIDE_GRAPHS
    assert sum(".cache" in n for n in before) > 2, "no KV ring found"
    steps: dict[str, Callable[[], object]] = {
        "tick": lambda: together.tick(frames(range(SLOTS))),
        "span": lambda: together.inject(0, span_like_block(together.engine, MAX_SPAN, seed=3)),
        "join": lambda: together.open_slot(1, Prefix(span_like_block(together.engine, 4, seed=4))),
        "leave": lambda: together.tick(frames([0, 1])),
        "reset": lambda: together.open_slot(2, None),
        "tick after": lambda: together.tick(frames(range(SLOTS))),
    }
    for step, call in steps.items():
        call()
        after = _graph_read_tensors(together)
        assert after.keys() == before.keys(), f"{step}: streaming state appeared or vanished"
        moved = sorted(name for name, (tensor, ptr) in before.items() if name not in REASSIGNED_OUTSIDE_GRAPHS
                       and (after[name] is not tensor or after[name].data_ptr() != ptr))
        assert moved == [], f"{step}: reassigned instead of updated in place (a graph would read the old one)"


def test_replayed_graph_outputs_are_persistent_buffers() -> None:
    graphed = ReplayedGraph(type("G", (), {"func": staticmethod(lambda x: (x * 2, x + 1))})())  # type: ignore[arg-type]
    first = graphed(torch.ones(3))
    second = graphed(torch.full((3,), 5.0))
    assert first is second and torch.equal(second[0], torch.full((3,), 10.0))
    with pytest.raises(ValueError, match="changed shape"):
        graphed(torch.ones(4))


def test_the_engine_keeps_a_copy_of_what_a_graph_outputs(model: LoadedModel, monkeypatch: pytest.MonkeyPatch) -> None:
    """`last_text_logits` outlives the step that made it: it must not be the graph's buffer, which the next replay
    overwrites."""
    monkeypatch.setenv(REPLAY_ENV, "1")
    codes = user_frames(3, seed=5)
    with Engine(model, GREEDY) as engine:
        engine.step(codes[0])
        kept = engine.last_text_logits
        assert kept is not None
        snapshot = kept.clone()
        engine.step(codes[1])
        engine.step(codes[2])
        assert torch.equal(kept, snapshot), "a kept graph output changed under a later step"
