"""The batcher alone holds a slot's span from the answer to its outcome: a span that does not fit a tick waits in
the batcher for a later one, a newer answer supersedes one still waiting, a closing session hears of its last, and a
save hands over the answers its history does not hold yet. Costs are injected, so the plans do not depend on how fast
this host is."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator

import numpy as np
import pytest
import torch

from frontend_model.engine.batch_model import BatchedModel
from frontend_model.engine.costs import PrefillCost, TickCost
from frontend_model.engine.history import SessionHistory
from frontend_model.frame import FRAME_SAMPLES
from frontend_model.loading.loader import load_model
from server.batching.batcher import Batcher
from server.batching.tick_scheduler import MAX_DEFERS, Capacity
from server.batching.worker import ModelWorker
from server.ops.metrics import Metrics
from server.session.retrieval import InFlight, SpanAnswer
from server.session.spans import FrameOutput, SpanOutcome
from server.wire.frame_clock import InputFrame

BUDGET_S = 0.080


@pytest.fixture(scope="module")
def batched() -> Iterator[BatchedModel]:
    model = load_model("tiny", device="cpu", dtype=torch.float32)
    batched = BatchedModel(model, 2, max_span_frames=64, record=True)  # recording: a save reads the history
    batched.start()
    yield batched
    batched.close()


def batcher_for(batched: BatchedModel, span_s: float) -> Batcher:
    """A batcher whose ticks cost nothing and whose spans cost `span_s` each (above the budget: never fits)."""
    cost = TickCost({1: 0.001, 2: 0.001}, PrefillCost(step_s=0.001, span_s={1: span_s, 64: span_s}))
    return Batcher(batched, ModelWorker("cpu"), cost, Capacity(2, "test"), BUDGET_S, 30.0, Metrics())


def frame(i: int) -> InputFrame:
    return InputFrame(i, np.zeros(FRAME_SAMPLES, np.float32), time.perf_counter())


def answer(text: str) -> SpanAnswer:
    return SpanAnswer(text, "kb", "test", "what is on?", time.perf_counter())


async def stepped(batcher: Batcher, first: int, count: int) -> list[FrameOutput]:
    return [await batcher.step(0, frame(i)) for i in range(first, first + count)]


def run(batcher: Batcher, body: object) -> object:
    async def go() -> object:
        batcher.start()
        try:
            await batcher.open(0, None)
            return await body(batcher)  # type: ignore[operator]
        finally:
            await batcher.stop(RuntimeError("test over"))
            batcher.worker.shutdown()

    return asyncio.run(go())


def test_a_span_that_does_not_fit_waits_in_the_batcher_and_rides_after_max_defers(batched: BatchedModel) -> None:
    async def body(batcher: Batcher) -> list[FrameOutput]:
        outputs = await stepped(batcher, 0, 2)
        batcher.request_span(0, answer("The meeting is at noon."))
        return outputs + await stepped(batcher, 2, MAX_DEFERS + 2)

    batcher = batcher_for(batched, span_s=1.0)
    outputs = run(batcher, body)
    assert [len(o.spans) for o in outputs] == [0, 0, *[0] * MAX_DEFERS, 1, 0]  # type: ignore[union-attr]
    (span,) = outputs[2 + MAX_DEFERS].spans  # type: ignore[index]
    assert span.injected and span.deferred_ticks == MAX_DEFERS and span.step == 2 + MAX_DEFERS
    assert batcher.metrics.spans_deferred._value.get() == MAX_DEFERS


def test_a_newer_answer_supersedes_the_waiting_one_and_both_outcomes_come_with_the_next_frame(
        batched: BatchedModel) -> None:
    async def body(batcher: Batcher) -> list[FrameOutput]:
        outputs = await stepped(batcher, 0, 2)
        batcher.request_span(0, answer("The meeting is at noon."))
        batcher.request_span(0, answer("The meeting moved to one."))
        return outputs + await stepped(batcher, 2, 1)

    outputs = run(batcher_for(batched, span_s=0.002), body)
    old, new = outputs[-1].spans  # type: ignore[index]
    assert (old.injected, old.reason, old.text) == (False, "superseded", "The meeting is at noon.")
    assert new.injected and new.text == "The meeting moved to one."


def test_a_closing_session_hears_of_its_waiting_span_and_the_slot_takes_no_more(batched: BatchedModel) -> None:
    async def body(batcher: Batcher) -> tuple[list[str | None], list[str | None]]:
        await stepped(batcher, 0, 1)
        batcher.request_span(0, answer("Never read."))
        closed = [o.reason for o in batcher.close_spans(0, "session closed")]
        batcher.request_span(0, answer("Too late for this session."))
        return closed, [o.reason for o in batcher.close_spans(0, "session closed")]

    assert run(batcher_for(batched, span_s=0.002), body) == (["session closed"], [])


async def until(condition: object, what: str) -> None:
    deadline = time.monotonic() + 30
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0)


def test_a_session_leaving_while_its_span_goes_in_hears_it_dropped(batched: BatchedModel) -> None:
    """The tick that took the span still runs when the session's step is cancelled: the outcome is not lost."""
    async def body(batcher: Batcher) -> list[tuple[bool, str | None, str]]:
        await stepped(batcher, 0, 1)
        gate = threading.Event()
        held = asyncio.ensure_future(batcher.worker.run(gate.wait))  # the next tick queues behind it
        batcher.request_span(0, answer("Never heard."))
        step = asyncio.create_task(batcher.step(0, frame(1)))
        await until(lambda: batcher._in_flight, "the tick did not take the frame")
        step.cancel()
        await asyncio.gather(step, return_exceptions=True)
        outcomes = batcher.close_spans(0, "session closed")
        gate.set()
        await held
        return [(o.injected, o.reason, o.text) for o in outcomes]

    assert run(batcher_for(batched, span_s=0.002), body) == [(False, "session closed", "Never heard.")]


def test_a_session_cancelled_before_it_reads_its_output_hears_of_the_span_at_close(batched: BatchedModel) -> None:
    """The output carrying the outcome is handed over, but the step is cancelled before it returns: the session is
    told at close, once, as what happened (injected)."""
    async def body(batcher: Batcher) -> tuple[list[tuple[bool, str]], list[str]]:
        await stepped(batcher, 0, 1)
        batcher.request_span(0, answer("Said at close."))
        step = asyncio.create_task(batcher.step(0, frame(1)))
        await until(lambda: batcher._in_flight, "the tick did not take the frame")
        output = batcher._in_flight[0].future
        await until(output.done, "the tick did not answer")  # polled each turn: the step has not resumed yet
        step.cancel()
        await asyncio.gather(step, return_exceptions=True)
        assert step.cancelled()
        outcomes = [(o.injected, o.text) for o in batcher.close_spans(0, "session closed")]
        return outcomes, [o.text for o in batcher.close_spans(0, "session closed")]

    assert run(batcher_for(batched, span_s=0.002), body) == ([(True, "Said at close.")], [])


def test_outcomes_a_session_has_read_are_not_told_again_at_close(batched: BatchedModel) -> None:
    async def body(batcher: Batcher) -> tuple[int, list[SpanOutcome]]:
        await stepped(batcher, 0, 1)
        batcher.request_span(0, answer("Read with its frame."))
        (output,) = await stepped(batcher, 1, 1)
        return len(output.spans), batcher.close_spans(0, "session closed")

    assert run(batcher_for(batched, span_s=0.002), body) == (1, [])


def test_an_answer_waiting_at_a_save_goes_in_once_on_the_slot_that_resumes_it_and_one_already_in_is_not_handed_over(
        batched: BatchedModel) -> None:
    """Slot 0 saves while its answer waits (a span that never fits a tick waits MAX_DEFERS ticks): the answer is
    handed over, not in the history; slot 1 resumes that history and injects the answer, once. Slot 0 then injects
    its own and saves again: nothing is handed over, and its history holds the span."""
    async def body(batcher: Batcher) -> tuple[list[SpanAnswer], list[SpanOutcome], list[SpanAnswer], int, int]:
        await stepped(batcher, 0, 2)
        batcher.request_span(0, answer("The meeting is at noon."))
        history, unplayed = await batcher.saved(0)
        now = time.perf_counter()
        await batcher.resume(1, SessionHistory.from_bytes(history), None)
        for waiting in unplayed:
            batcher.request_span(1, InFlight.of_answer(waiting, 30.0, now).answer(30.0, time.perf_counter()))
        resumed = [s for i in range(2, MAX_DEFERS + 4) for s in (await batcher.step(1, frame(i))).spans]
        batcher.release(1)
        await stepped(batcher, 2, MAX_DEFERS + 1)
        after, unplayed_after = await batcher.saved(0)
        return (unplayed, resumed, unplayed_after, SessionHistory.from_bytes(history).offset,
                SessionHistory.from_bytes(after).offset)

    unplayed, resumed, unplayed_after, before, after = run(batcher_for(batched, span_s=1.0), body)  # type: ignore[misc]
    assert [a.text for a in unplayed] == ["The meeting is at noon."]
    (span,) = resumed
    assert (span.injected, span.text, span.request.answer.question) == (True, "The meeting is at noon.", "what is on?")
    assert unplayed_after == [], "injected on slot 0 before its second save: not handed over again"
    assert after == before + MAX_DEFERS + 1 + span.frames, "the second save's history holds the span"
