from __future__ import annotations

import pytest
import torch

from frontend_model.engine.calibration import calibrate_prefill, calibration_sizes, no_span_budget_warning
from frontend_model.engine.costs import PrefillCost
from frontend_model.engine.engine import GREEDY, NO_FRAME_BUDGET, Engine
from frontend_model.loading.loader import LoadedModel, load_model
from frontend_model.loading.profiles import moshi_7b_lm_config
from tests.support.engine import tiny_model


@pytest.fixture(scope="module")
def model() -> LoadedModel:
    return load_model("tiny", device="cpu", dtype=torch.float32, context=64)


def test_prediction_interpolates_and_extrapolates() -> None:
    cost = PrefillCost(step_s=0.010, span_s={1: 0.011, 16: 0.016, 64: 0.040})
    assert cost.predict(0) == 0.010
    assert cost.predict(16) == pytest.approx(0.016)
    assert cost.predict(40) == pytest.approx(0.028)
    assert cost.predict(128) == pytest.approx(0.072)
    assert cost.max_frames(0.028, 600) == 40
    assert cost.max_frames(0.005, 600) == 0
    assert cost.max_frames(1.0, 100) == 100


def test_calibration_measures_every_size(model: LoadedModel) -> None:
    cost = calibrate_prefill(model, max_frames=48, repeats=1)
    assert sorted(cost.span_s) == calibration_sizes(48) == [1, 2, 4, 8, 16, 32, 48]
    assert cost.step_s > 0 and all(v > 0 for v in cost.span_s.values())
    with Engine(model, GREEDY, max_span_frames=48, cost=cost) as engine:  # the model is free again
        assert 0 <= engine.span_frame_cap <= 48


def test_calibration_steps_a_dep_q16_model() -> None:
    cost = calibrate_prefill(tiny_model(dep_q=16, context=64), max_frames=8, repeats=1)
    assert sorted(cost.span_s) == [1, 2, 4, 8] and cost.step_s > 0


def test_engine_cuts_spans_to_what_fits_the_frame_and_reports_it(model: LoadedModel) -> None:
    # A machine where each span frame costs 1 ms on top of a 10 ms step: 80 ms fits 70 frames.
    cost = PrefillCost(step_s=0.010, span_s={1: 0.011, 100: 0.110})
    text = "The museum opens every day except Tuesday from nine in the morning until six in the evening. " * 6
    with Engine(model, GREEDY, max_span_frames=200, cost=cost) as engine:
        assert engine.span_frame_cap == 70
        built = engine.prepare_span(text)
        assert built.truncated and built.dropped_text and built.block is not None
        assert 60 < built.frames <= 70
        engine.step(torch.tensor(model.span.sine_codes))
        engine.inject(built.block)
        assert engine.offset == 1 + built.frames
    with Engine(model, GREEDY, max_span_frames=200) as engine:
        assert engine.span_frame_cap == 200
        assert not engine.prepare_span("The museum opens at nine.").truncated


def test_a_cap_of_zero_drops_every_span_with_its_reason(model: LoadedModel) -> None:
    # A host where even a 3-frame span and its step take 120 ms: no span fits an 80 ms frame.
    cost = PrefillCost(step_s=0.050, span_s={1: 0.120, 640: 2.0})
    with Engine(model, GREEDY, max_span_frames=640, cost=cost) as engine:
        assert engine.span_frame_cap == 0
        built = engine.prepare_span("The museum opens at nine.")
        assert built.block is None and built.reason == NO_FRAME_BUDGET
    assert no_span_budget_warning(cost, 0.080).startswith(
        "no span fits the frame: a 3-frame span and the next step were measured at 125.9 ms, over the 80.0 ms left")


def test_moshi_7b_profile_has_the_real_architecture() -> None:
    config = moshi_7b_lm_config()
    assert (config["dim"], config["num_layers"], config["num_heads"]) == (4096, 32, 32)
    assert (config["n_q"], config["dep_q"], config["context"], config["card"]) == (16, 8, 3000, 2048)
    assert config["delays"] == [0, 0, 1, 1, 1, 1, 1, 1, 1, 0, 1, 1, 1, 1, 1, 1, 1]
