"""Chunked prefill (frontend_model/engine/chunked_prefill.py): spans and prefixes written in power-of-two chunks on a
scratch
row leave the state and next-step logits of the one-pass prefill (float32), in one engine and for one slot of a
batch, on CPU eagerly and in replay mode (persistent graph inputs and outputs); calibration measures both ways and
the engine writes each span the faster one."""

from __future__ import annotations

import pytest
import torch

from frontend_model.engine.batch_engine import BatchEngine
from frontend_model.engine.calibration import calibrate_prefill
from frontend_model.engine.chunked_prefill import ChunkedPrefill, SpanPrefill, chunk_sizes, power_of_two_chunks
from frontend_model.engine.costs import PrefillCost
from frontend_model.engine.engine import GREEDY, Engine
from frontend_model.loading.loader import LoadedModel
from frontend_model.moshi_internals.graphs import REPLAY_ENV
from frontend_model.span.block import Prefix
from frontend_model.span.build import build_prefix
from tests.support.engine import (
    FAMILIES,
    Snapshot,
    assert_same_state,
    snapshot,
    span_like_block,
    tiny_model,
    user_frames,
)

CONTEXT = 8
MAX_SPAN = 64
WRAPPED = CONTEXT + MAX_SPAN + 9


@pytest.fixture(scope="module", params=FAMILIES, ids=lambda q: f"dep_q{q}")
def model(request: pytest.FixtureRequest) -> LoadedModel:
    return tiny_model(request.param, context=CONTEXT)


# pure -------------------------------------------------------------------------------------------------------------
def test_power_of_two_chunks() -> None:
    assert power_of_two_chunks(600, 512) == [512, 64, 16, 8]
    assert power_of_two_chunks(77, 64) == [64, 8, 4, 1]
    assert power_of_two_chunks(1300, 512) == [512, 512, 256, 16, 4]
    assert power_of_two_chunks(0, 8) == []
    for frames in range(1, 200):
        chunks = power_of_two_chunks(frames, 32)
        assert sum(chunks) == frames and chunks == sorted(chunks, reverse=True) and max(chunks) <= 32
    with pytest.raises(ValueError, match="power of two"):
        power_of_two_chunks(10, 12)


def test_chunk_sizes() -> None:
    assert chunk_sizes(640) == [512, 256, 128, 64, 32, 16, 8, 4, 2, 1]
    assert chunk_sizes(64) == [64, 32, 16, 8, 4, 2, 1] and chunk_sizes(1) == [1]


def test_a_chunked_prediction_sums_its_chunks_and_the_faster_way_wins() -> None:
    # A GPU-like profile: one pass pays per frame, a graphed chunk mostly a fixed launch.
    cost = PrefillCost(step_s=0.010, span_s={1: 0.020, 64: 0.080},
                       chunk_s={64: 0.040, 32: 0.030, 16: 0.025, 8: 0.022, 4: 0.021, 2: 0.0205, 1: 0.020})
    assert cost.chunked(64) == pytest.approx(0.040)
    assert cost.chunked(77) == pytest.approx(0.010 + 0.030 + 0.012 + 0.011 + 0.010)  # 64 + 8 + 4 + 1
    assert cost.chunked_faster(64) and not cost.chunked_faster(1)
    assert cost.predict(64) == pytest.approx(0.040)
    assert cost.predict(64, SpanPrefill.ONE_PASS) == pytest.approx(0.080)
    assert cost.predict(1, SpanPrefill.CHUNKED) == pytest.approx(0.020)
    # The cap is the longest span below which every length fits: 35 = 32 + 2 + 1 is the first that fits neither way.
    assert cost.max_frames(0.05, 64) == 34 and cost.max_frames(0.05, 64, SpanPrefill.ONE_PASS) == 32
    assert PrefillCost(0.01, {1: 0.02}).chunked(5) is None


# equivalence ------------------------------------------------------------------------------------------------------
def run_span(model: LoadedModel, mode: SpanPrefill, frames: int, warm: int = WRAPPED, after: int = 12
             ) -> tuple[Snapshot, torch.Tensor, list[tuple]]:
    user = user_frames(warm + after, seed=warm)
    with Engine(model, GREEDY, max_span_frames=MAX_SPAN, prefill=mode) as engine:
        block = span_like_block(engine, frames, seed=frames)
        for i in range(warm):
            engine.step(user[i])
        engine.inject(block)
        return continuation(engine, user[warm:])


def continuation(engine: Engine, user: torch.Tensor) -> tuple[Snapshot, torch.Tensor, list[tuple]]:
    state = snapshot(engine)
    outputs = []
    logits = None
    for codes in user:
        out = engine.step(codes)
        if logits is None:
            assert engine.last_text_logits is not None
            logits = engine.last_text_logits.clone()
        outputs.append((out.text_token, None if out.agent_codes is None else tuple(out.agent_codes.tolist())))
    assert logits is not None
    return state, logits, outputs


def assert_same(a: tuple, b: tuple) -> None:
    assert_same_state(a[0], b[0])
    assert (a[1] - b[1]).abs().max().item() <= 1e-4
    assert a[2] == b[2]


@pytest.mark.parametrize("frames", [37, 63, 64])
def test_a_chunked_span_equals_the_one_pass_span_after_the_ring_wrapped(model: LoadedModel, frames: int) -> None:
    chunked = run_span(model, SpanPrefill.CHUNKED, frames)
    assert chunked[0].offsets.item() == WRAPPED + frames
    assert_same(chunked, run_span(model, SpanPrefill.ONE_PASS, frames))


def test_a_chunked_span_replaying_graph_buffers_equals_the_one_pass_span(
        model: LoadedModel, monkeypatch: pytest.MonkeyPatch) -> None:
    reference = run_span(model, SpanPrefill.ONE_PASS, 45)
    monkeypatch.setenv(REPLAY_ENV, "1")
    assert_same(run_span(model, SpanPrefill.CHUNKED, 45), reference)


def test_a_chunked_prefix_with_a_replayed_voice_equals_the_one_pass_prefix(model: LoadedModel) -> None:
    dim = model.lm.dim
    embeddings = torch.randn(5, dim, generator=torch.Generator().manual_seed(3)).to(model.lm.dtype)
    carry = torch.tensor([model.span.text_pad_id, *model.span.silence_codes, *model.span.sine_codes])
    persona = build_prefix("You are Ada, a travel assistant who knows every museum in town.", model.tokenizer,
                           model.span)
    assert persona is not None
    prefix = Prefix(persona.block, embeddings, carry)
    user = user_frames(12, seed=4)
    runs = []
    for mode in (SpanPrefill.ONE_PASS, SpanPrefill.CHUNKED):
        with Engine(model, GREEDY, max_span_frames=MAX_SPAN, prefill=mode) as engine:
            engine.prefill(prefix)
            runs.append(continuation(engine, user))
    assert_same(*runs)


def test_a_chunked_span_for_one_slot_leaves_the_others_as_they_were(model: LoadedModel) -> None:
    """Slot 1 of 3 takes a span through the scratch row; slots 0 and 2 are bit for bit what one-pass leaves."""
    user = user_frames(WRAPPED + 10, seed=8).to(model.device)
    states = []
    for mode in (SpanPrefill.ONE_PASS, SpanPrefill.CHUNKED):
        engine = BatchEngine(model, 3, GREEDY, max_span_frames=MAX_SPAN, prefill=mode)
        engine.start()
        try:
            for i in range(WRAPPED):
                engine.step_slots(user[i][None].expand(3, -1), torch.ones(3, dtype=torch.bool))
            engine.inject_slot(1, span_like_block(engine, 29, seed=5))
            outputs = [engine.step_slots(user[WRAPPED + i][None].expand(3, -1), torch.ones(3, dtype=torch.bool))
                       for i in range(10)]
            states.append((snapshot(engine), [[None if r is None else (r.text_token, r.agent_codes.tolist())
                                               for r in o] for o in outputs]))
        finally:
            engine.close()
    (one_pass, one_out), (chunked, chunked_out) = states
    for a, b in zip(one_pass.kv, chunked.kv, strict=True):
        assert torch.equal(a[:, [0, 2]], b[:, [0, 2]]), "a slot without the span changed"
        assert (a[:, 1] - b[:, 1]).abs().max().item() <= 1e-5
    assert chunked_out == one_out


def test_a_chunk_longer_than_the_rings_extra_slots_is_never_run(model: LoadedModel) -> None:
    """The exactness argument needs every chunk within `max_span_frames`: the largest graph is the largest power of
    two in it, and a longer prefix is cut into several of those."""
    with Engine(model, GREEDY, max_span_frames=48, prefill=SpanPrefill.CHUNKED) as engine:
        assert engine.chunked is not None and engine.chunked.sizes[0] == 32
        seen: list[int] = []
        graphs = engine.chunked._graphs
        for size, graph in list(graphs.items()):
            graphs[size] = lambda x, g=graph: (seen.append(x.shape[1]), g(x))[1]
        engine.step(user_frames(1, seed=1)[0])
        engine.inject(span_like_block(engine, 47, seed=1))
        assert seen == [32, 8, 4, 2, 1]


# choosing ---------------------------------------------------------------------------------------------------------
def test_calibration_measures_both_ways_and_the_engine_takes_the_faster(
        model: LoadedModel, monkeypatch: pytest.MonkeyPatch) -> None:
    cost = calibrate_prefill(model, max_frames=MAX_SPAN, repeats=1)
    assert sorted(cost.chunk_s) == sorted(chunk_sizes(MAX_SPAN)) and all(v > 0 for v in cost.chunk_s.values())
    chunked_calls: list[int] = []
    original = ChunkedPrefill.forward
    monkeypatch.setattr(ChunkedPrefill, "forward",
                        lambda self, x, row: (chunked_calls.append(x.shape[1]), original(self, x, row))[1])
    # Injected costs, so the choice does not depend on this host: a chunk under 16 frames costs 4 ms, one of 16 or
    # more 2 ms, one pass 1 ms a frame: 3 frames go in one pass, 32 in one chunk.
    rigged = PrefillCost(0.010, {1: 0.011, 64: 0.074}, {s: 0.010 + (0.004 if s < 16 else 0.002)
                                                          for s in chunk_sizes(MAX_SPAN)})
    with Engine(model, GREEDY, max_span_frames=MAX_SPAN, cost=rigged, prefill=SpanPrefill.FASTER) as engine:
        engine.step(user_frames(1, seed=2)[0])
        for frames in (3, 32):
            engine.inject(span_like_block(engine, frames, seed=frames))
    assert rigged.chunked_faster(32) and not rigged.chunked_faster(3)
    assert chunked_calls == [32]
    with Engine(model, GREEDY, max_span_frames=MAX_SPAN, prefill=SpanPrefill.FASTER) as engine:
        assert engine.chunked is None, "no measured chunk costs: nothing to choose, no graphs built"
    never = PrefillCost(0.010, {1: 0.011, 64: 0.074}, dict.fromkeys(chunk_sizes(MAX_SPAN), 1.0))
    with Engine(model, GREEDY, max_span_frames=MAX_SPAN, cost=never, prefill=SpanPrefill.FASTER) as engine:
        assert engine.chunked is None, "chunks never faster: no scratch row held for nothing"


def test_the_scratch_row_keeps_its_storage(model: LoadedModel, monkeypatch: pytest.MonkeyPatch) -> None:
    """The chunk graphs are captured on the scratch row's tensors: spans of any length and steps between them must
    update those in place."""
    monkeypatch.setenv(REPLAY_ENV, "1")
    with Engine(model, GREEDY, max_span_frames=MAX_SPAN, prefill=SpanPrefill.CHUNKED) as engine:
        assert engine.chunked is not None
        before = [(t, t.data_ptr()) for t in engine.chunked.scratch.tensors()]
        assert len(before) > 4 and engine.chunked.scratch.nbytes() > 0
        user = user_frames(4, seed=3)
        for i, frames in enumerate((5, 64, 1)):
            engine.step(user[i])
            engine.inject(span_like_block(engine, frames, seed=frames))
        after = list(engine.chunked.scratch.tensors())
        moved = [i for i, (a, (t, p)) in enumerate(zip(after, before, strict=True)) if a is not t or a.data_ptr() != p]
        assert moved == [], "scratch tensors reassigned instead of updated in place (a graph would read the old ones)"

