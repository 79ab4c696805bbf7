from __future__ import annotations

import copy

import pytest
import torch

from frontend_model.engine.engine import GREEDY, Engine, EngineStateError
from frontend_model.loading.loader import LoadedModel, load_model
from frontend_model.span.block import Prefix
from tests.support.engine import span_like_block, user_frames


@pytest.fixture(scope="module")
def model() -> LoadedModel:
    return load_model("tiny", device="cpu", dtype=torch.float32, context=32)


def test_inject_before_first_step_is_refused(model: LoadedModel) -> None:
    with (
        Engine(model, GREEDY, max_span_frames=16) as engine,
        pytest.raises(EngineStateError, match="before the first step"),
    ):
        engine.inject(span_like_block(engine, 4, seed=0))


def test_inject_after_close_is_refused(model: LoadedModel) -> None:
    engine = Engine(model, GREEDY, max_span_frames=16)
    engine.start()
    engine.step(user_frames(1, seed=0)[0])
    engine.close()
    with pytest.raises(EngineStateError, match="after close"):
        engine.inject(span_like_block(engine, 4, seed=0))
    with pytest.raises(EngineStateError, match="closed"):
        engine.start()


def test_calls_before_start_are_refused(model: LoadedModel) -> None:
    engine = Engine(model, GREEDY)
    with pytest.raises(EngineStateError, match="before start"):
        engine.step(user_frames(1, seed=0)[0])


def test_prefill_after_first_step_is_refused(model: LoadedModel) -> None:
    with Engine(model, GREEDY, max_span_frames=16) as engine:
        engine.step(user_frames(1, seed=0)[0])
        with pytest.raises(EngineStateError, match="before the first step"):
            engine.prefill(Prefix(span_like_block(engine, 4, seed=0)))


def test_oversized_and_misshaped_blocks_are_refused(model: LoadedModel) -> None:
    with Engine(model, GREEDY, max_span_frames=16) as engine:
        engine.step(user_frames(1, seed=0)[0])
        with pytest.raises(ValueError, match=r"1\.\.16"):
            engine.inject(span_like_block(engine, 17, seed=0))
        block = span_like_block(engine, 4, seed=0)
        with pytest.raises(ValueError, match=r"\[17, n\]"):
            engine.inject(type(block)(block.tokens[:5]))


def test_model_is_free_again_after_close(model: LoadedModel) -> None:
    for _ in range(2):
        with Engine(model, GREEDY, max_span_frames=16) as engine:
            out = [engine.step(f) for f in user_frames(3, seed=1)]
        assert out[0].text_token is None and out[-1].text_token is not None


def test_random_weights_never_sample_ret_or_span_markers(model: LoadedModel) -> None:
    span = model.span
    assert model.suppressed_text_ids == {span.ret_id, span.open_id, span.close_id}
    loud = copy.deepcopy(model)
    with torch.no_grad():
        loud.lm.text_linear.weight[span.ret_id] = 50 * loud.lm.text_linear.weight[span.ret_id].sign()
    tokens = []
    with Engine(loud, max_span_frames=16) as engine:  # sampling, as served
        for frame in user_frames(30, seed=3):
            engine.step(frame)
            assert engine.last_text_logits is not None
            tokens.append(int(engine.last_text_logits[0, 0, 0].argmax()))
            tokens.append(engine.lm_gen._streaming_state.cache[0, 0].tolist())
    assert span.ret_id in tokens[0::2], "the model itself favours <ret>"
    sampled = {t for column in tokens[1::2] for t in column}
    assert not sampled & model.suppressed_text_ids


def test_closing_an_engine_frees_its_graphs_at_once_not_in_a_later_garbage_collection(model: LoadedModel) -> None:
    """On a GPU a graph destroyed by a garbage collection that runs while another engine captures its own invalidates
    that capture: a closed engine's graphs must go when it closes, by reference counting alone."""
    import gc
    import weakref

    from moshi.utils.compile import CUDAGraphed

    from frontend_model.engine.chunked_prefill import SpanPrefill

    gc.collect()
    gc.disable()
    try:
        engine = Engine(model, GREEDY, max_span_frames=16, prefill=SpanPrefill.CHUNKED)
        engine.start()
        engine.step(user_frames(1, seed=0)[0])
        assert engine.chunked is not None
        graphs = [weakref.ref(g) for g in engine.chunked._graphs.values()]
        states = [getattr(m, "_streaming_state", None) for m in engine.lm_gen.modules()]
        step_graphs = [v for state in states if state is not None for v in vars(state).values()
                       if isinstance(v, CUDAGraphed)]
        assert graphs and step_graphs
        for graphed in step_graphs:
            graphed._graph = object()  # as if captured
        prefill = weakref.ref(engine.chunked)
        engine.close()
        assert all(graphed._graph is None for graphed in step_graphs)
        del step_graphs
        assert prefill() is None
        assert all(ref() is None for ref in graphs)
    finally:
        gc.enable()


def test_an_engine_that_fails_to_start_leaves_the_model_free_for_the_next(model: LoadedModel,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """A batch whose rings do not fit the device fails half-way through moshi's `streaming()`: the layers it reached
    must not stay streaming (and holding their rings), or every smaller batch after it is refused."""
    layer = model.lm.transformer.layers[-1].self_attn
    real = type(layer)._init_streaming_state

    def out_of_memory(self: object, batch_size: int) -> object:
        if self is layer:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 3.18 GiB.")
        return real(self, batch_size)

    monkeypatch.setattr(type(layer), "_init_streaming_state", out_of_memory)
    with pytest.raises(torch.OutOfMemoryError):
        Engine(model, GREEDY, max_span_frames=16).start()
    monkeypatch.undo()
    assert all(m._streaming_state is None for m in model.lm.modules() if hasattr(m, "_streaming_state"))
    with Engine(model, GREEDY, max_span_frames=16) as engine:
        engine.step(user_frames(1, seed=0)[0])
