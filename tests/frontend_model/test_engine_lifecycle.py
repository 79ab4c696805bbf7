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
