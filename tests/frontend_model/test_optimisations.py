"""GPU optimisations that fail to start (frontend_model/engine/optimisations.py): each is turned off with its cause in
one log line, and the engine takes its eager path: the step without graphs, spans in one pass, assumed costs. On CPU
the failures are injected (`Optimisations.fail`) or raised where a GPU would raise them (replay mode for the step
graphs)."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
from moshi.utils.compile import CUDAGraphed

from frontend_model.engine import calibration, chunked_prefill, optimisations
from frontend_model.engine.batch_model import BatchedModel, start_batch
from frontend_model.engine.calibration import calibrate_costs, calibrate_prefill
from frontend_model.engine.chunked_prefill import SpanPrefill
from frontend_model.engine.costs import PrefillCost, assumed_cost
from frontend_model.engine.device_memory import streaming_bytes
from frontend_model.engine.engine import GREEDY, Engine
from frontend_model.engine.optimisations import Optimisations
from frontend_model.frame import FRAME_SAMPLES
from frontend_model.loading.loader import LoadedModel
from frontend_model.moshi_internals.graphs import REPLAY_ENV, ReplayedGraph
from tests.support.engine import assert_same_state, snapshot, span_like_block, tiny_model, user_frames

CONTEXT = 16
MAX_SPAN = 16
CAPTURE_ERROR = "CUDA error: operation not permitted when stream is capturing\nCompile with TORCH_USE_CUDA_DSA"


@pytest.fixture(scope="module")
def model() -> LoadedModel:
    return tiny_model(context=CONTEXT)


def disabled(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == optimisations.__name__ and r.levelno >= logging.INFO]


# the record --------------------------------------------------------------------------------------------------------
def test_a_start_that_raises_turns_its_optimisation_off_with_the_cause_in_one_log_line(
        caplog: pytest.LogCaptureFixture) -> None:
    record = Optimisations(cuda=True)
    tries: list[str] = []

    def capture() -> None:
        tries.append("capture")
        raise RuntimeError(CAPTURE_ERROR)

    with caplog.at_level(logging.INFO, logger=optimisations.__name__):
        assert record.attempt("prefill_graphs", capture) is None
        assert record.attempt("prefill_graphs", capture) is None  # off for good: not tried again
    cause = "RuntimeError: CUDA error: operation not permitted when stream is capturing Compile with TORCH_USE_CUDA_DSA"
    assert disabled(caplog) == [f"optimisation prefill_graphs disabled: {cause}"] and tries == ["capture"]
    assert record.status()["prefill_graphs"] == f"off: {cause}" and not record.enabled("prefill_graphs")
    assert record.attempt("calibration", lambda: 42) == 42 and record.enabled("calibration")


def test_a_long_cause_is_cut_to_fit_a_line() -> None:
    def calibrate() -> None:
        raise ValueError("x" * 1000)

    record = Optimisations(cuda=True)
    record.attempt("calibration", calibrate)
    assert len(record.off["calibration"]) == optimisations.CAUSE_CHARS and record.off["calibration"].endswith("...")


def test_each_optimisation_is_active_unused_off_or_not_applicable_on_cpu() -> None:
    gpu = Optimisations(cuda=True, fail=frozenset({"scratch_row"}))
    gpu.attempt("step_graphs", lambda: None)
    gpu.attempt("scratch_row", lambda: None)
    assert gpu.status() == {"step_graphs": "active", "prefill_graphs": "unused",
                            "scratch_row": "off: InjectedFailure: scratch_row failed as injected",
                            "calibration": "unused", "window_ahead": "unused"}
    cpu = Optimisations(cuda=False)
    for name in optimisations.OPTIMISATIONS:
        cpu.attempt(name, lambda: None)
    cpu.unused("scratch_row")
    assert cpu.status() == {"step_graphs": "not applicable (cpu)", "prefill_graphs": "not applicable (cpu)",
                            "scratch_row": "unused", "calibration": "active", "window_ahead": "active"}


# spans ------------------------------------------------------------------------------------------------------------
@pytest.fixture(params=["scratch_row", "prefill_graphs", "capture raises"])
def chunk_failure(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> tuple[Optimisations, str]:
    """A record on which the chunks fail to start, and the one that fails: injected, or a chunk that raises while it
    is captured on the installed scratch row."""
    if request.param != "capture raises":
        return Optimisations(cuda=False, fail=frozenset({request.param})), request.param

    def chunk(lm: object, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        raise RuntimeError(CAPTURE_ERROR)

    monkeypatch.setattr(chunked_prefill, "forward_last", chunk)
    return Optimisations(cuda=False), "prefill_graphs"


def test_spans_go_in_one_pass_where_the_chunks_fail_to_start(model: LoadedModel,
                                                            chunk_failure: tuple[Optimisations, str]) -> None:
    record, failed = chunk_failure
    # Measured chunks faster for every length: the cap must stop counting on them once they are off.
    cost = PrefillCost(step_s=0.010, span_s={1: 0.011, MAX_SPAN: 0.090}, chunk_s={n: 0.011 for n in (1, 2, 4, 8, 16)})
    states = []
    for engine in (Engine(model, GREEDY, MAX_SPAN, cost, prefill=SpanPrefill.FASTER, optimisations=record),
                   Engine(model, GREEDY, MAX_SPAN, prefill=SpanPrefill.ONE_PASS)):
        with engine:  # one engine streams a model at a time
            for codes in user_frames(3, seed=1):
                engine.step(codes)
            engine.inject(span_like_block(engine, 9, seed=2))
            states.append(snapshot(engine))
            if engine.optimisations is record:
                assert engine.chunked is None and not record.enabled(failed)
                assert engine.cost is not None and engine.cost.chunk_s == {}
                assert engine.span_frame_cap == cost.max_frames(0.080, MAX_SPAN, SpanPrefill.ONE_PASS) < MAX_SPAN
    assert_same_state(*states, atol=0)
    assert record.status()["scratch_row"] in ("unused", f"off: {record.off.get('scratch_row')}")


def test_calibration_measures_no_chunks_where_they_fail_to_start(model: LoadedModel) -> None:
    record = Optimisations(cuda=False, fail=frozenset({"prefill_graphs"}))
    cost = calibrate_prefill(model, max_frames=8, repeats=1, optimisations=record)
    assert cost.chunk_s == {} and sorted(cost.span_s) == [1, 2, 4, 8]


# the step -----------------------------------------------------------------------------------------------------------
def test_a_batch_whose_step_graphs_fail_to_capture_starts_again_eager(
        model: LoadedModel, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """Replay mode runs the graph path on CPU; there the LM step's graph raises as it is captured (its first call),
    inside the batched step, as a GPU whose driver refuses the capture would."""
    monkeypatch.setenv(REPLAY_ENV, "1")
    frames = dict.fromkeys(range(2), np.full(FRAME_SAMPLES, 0.05, np.float32))
    graphed = start_batch(lambda: BatchedModel(model, 2, GREEDY, MAX_SPAN))
    try:
        expected = [graphed.tick(frames) for _ in range(3)]
    finally:
        graphed.close()

    replay = ReplayedGraph.__call__

    def capture(self: ReplayedGraph, *args: object) -> object:
        if self._args is None and getattr(self.func, "__name__", "") == "forward_text":
            raise RuntimeError(CAPTURE_ERROR)
        return replay(self, *args)

    monkeypatch.setattr(ReplayedGraph, "__call__", capture)
    record = Optimisations(cuda=False)
    with caplog.at_level(logging.INFO, logger=optimisations.__name__):
        eager = start_batch(lambda: BatchedModel(model, 2, GREEDY, MAX_SPAN, optimisations=record))
    try:
        assert disabled(caplog) == [f"optimisation step_graphs disabled: {record.off['step_graphs']}"]
        assert record.off["step_graphs"].startswith("RowFault: slot 0: RuntimeError: CUDA error")
        state = eager.model.lm.transformer._streaming_state
        graphs = [v for m in (eager.engine.lm_gen, eager.model.mimi) for s in _states(m) for v in vars(s).values()
                  if isinstance(v, CUDAGraphed | ReplayedGraph)]
        assert state is not None and graphs and all(isinstance(g, CUDAGraphed) and g.disable for g in graphs)
        got = [eager.tick(frames) for _ in range(3)]
    finally:
        eager.close()
    assert [{s: o.text_token for s, o in tick.items()} for tick in got] == [
        {s: o.text_token for s, o in tick.items()} for tick in expected]
    assert streaming_bytes(model.lm, model.mimi) == 0, "the batch that failed to capture was released"


def _states(root: torch.nn.Module) -> list[object]:
    return [m._streaming_state for m in root.modules() if getattr(m, "_streaming_state", None) is not None]


# calibration -------------------------------------------------------------------------------------------------------
def test_a_calibration_that_fails_frees_the_model_and_assumes_its_costs(
        model: LoadedModel, monkeypatch: pytest.MonkeyPatch) -> None:
    def fails_half_way(*args: object, **kwargs: object) -> None:
        Engine(model, GREEDY, MAX_SPAN).start()  # left streaming, as a start that raised half way would leave it
        raise torch.OutOfMemoryError("not even one session fits the memory of cuda:0")

    monkeypatch.setattr(calibration, "calibrate_prefill", fails_half_way)
    record = Optimisations(cuda=True)
    cost = calibrate_costs(model, [1, 2], 0.060, MAX_SPAN, record)
    assert record.status()["calibration"] == "off: OutOfMemoryError: not even one session fits the memory of cuda:0"
    assert cost == assumed_cost(0.060) and streaming_bytes(model.lm, model.mimi) == 0
    # As fixed admission and span cap: every tick the tick share, a span adds nothing, spans up to the ceiling.
    assert cost.tick(1) == cost.tick(64) == 0.060 and cost.span(MAX_SPAN) == 0.0
    assert cost.prefill.max_frames(cost.span_budget(0.080, 64), 640) == 640
