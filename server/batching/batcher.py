"""Every session's frames go through one batched model: slots, the tick loop, and span scheduling per tick.

Sessions hand their next frame to `step` and await its output. A span (a retrieval's answer, an app's text) goes
to `request_span`: from then on the batcher alone holds it, as its slot's span, until it is injected or dropped, and
reports that outcome with the slot's next frame output. The tick loop, on the event loop, decides with the
TickScheduler when to run a tick over the frames waiting and which spans fit its budget, and runs it on the model
worker; a span that does not fit stays the slot's span for a later tick. A newer span replaces one still waiting
(reported superseded). A failure in one slot's own work (its frame, its span) fails that session only, and so does a
failure of its row inside the batched step (BatchEngine isolates it: the other sessions get their frames, their
state untouched). Only a failure no single row explains (the step fails for any rows, the codec fails) fails every
session in that tick. A session about to pass the model's context has its window rolled first, in its tick, its
persona prefix kept (server/batching/window_policy.py decides when and how much).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from dataclasses import dataclass, field, replace

import numpy as np

from frontend_model.engine.batch_engine import RowFault
from frontend_model.engine.batch_model import BatchedModel
from frontend_model.engine.costs import TickCost
from frontend_model.engine.history import SessionHistory
from frontend_model.frame import FRAME_S, FRAME_SAMPLES
from frontend_model.moshi_internals.row_sampling import RowSampling, SamplingConfig
from frontend_model.span.block import Prefix
from server.batching.tick_scheduler import Capacity, TickScheduler, Waiting
from server.batching.window_keeper import keep_window
from server.batching.window_policy import WindowMode, WindowPolicy
from server.batching.worker import ModelWorker
from server.ops.metrics import Metrics
from server.session.retrieval import SpanAnswer
from server.session.spans import FrameOutput, SpanOutcome, SpanRequest, dropped, inject_span, span_request
from server.wire.frame_clock import InputFrame

logger = logging.getLogger(__name__)


class BadFrame(ValueError):
    """A frame the model must not see (wrong size, not finite): its session fails, the others go on."""


@dataclass
class _Pending:
    frame: InputFrame
    future: asyncio.Future[FrameOutput]


@dataclass
class _SlotSpans:
    """A slot's span waiting for a frame boundary, the ticks it was put off, and the outcomes its session has not
    been told yet: settled outside a tick, going in with the tick running now (`in_tick`), or handed to a `step`
    that has not returned them yet (`handed`: its session may be cancelled before it reads them)."""

    waiting: SpanRequest | None = None
    deferred_ticks: int = 0
    settled: list[SpanOutcome] = field(default_factory=list)
    in_tick: SpanRequest | None = None
    handed: tuple[SpanOutcome, ...] = ()


@dataclass(frozen=True)
class _SlotResult:
    output: FrameOutput | None
    error: BaseException | None = None


def _report_end(task: asyncio.Task[None]) -> None:
    """The tick loop only ends when stopped; anything else is a bug that would leave every session waiting."""
    if not task.cancelled() and task.exception() is not None:
        logger.error("the tick loop died", exc_info=task.exception())


class Batcher:
    def __init__(self, model: BatchedModel, worker: ModelWorker, cost: TickCost, capacity: Capacity,
                 budget_s: float, span_deadline_s: float, metrics: Metrics, window: WindowPolicy | None = None
                 ) -> None:
        """`window`: how sessions past the context keep their prefix (server/batching/window_policy.py), on a
        `model` that records; None: moshi's ring slides."""
        self.model = model
        self.window = window
        self.worker = worker
        self.cost = cost
        self.capacity = capacity
        self.span_deadline_s = span_deadline_s
        self.metrics = metrics
        self.scheduler = TickScheduler(budget_s, cost.tick, cost.span, model.slots, model.compact)
        self._free = list(range(model.slots - 1, -1, -1))
        self._active: set[int] = set()
        self._pending: dict[int, _Pending] = {}
        self._in_flight: dict[int, _Pending] = {}
        self._spans: dict[int, _SlotSpans] = {}  # slot -> its spans, while a session holds the slot
        self._arrivals: dict[int, float] = {}  # slot -> when its latest frame arrived
        self._prefix_frames: dict[int, int] = {}  # slot -> its session's prefix, kept by its window
        self._span_starts: dict[int, int] = {}  # slot -> where its last span began, kept whole by its window
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    @property
    def size(self) -> int:
        return self.model.slots

    @property
    def window_mode(self) -> WindowMode:
        return "slide" if self.window is None else "keep-prefix"

    @property
    def window_refill(self) -> str | None:
        """How a kept window is refilled: built ahead on the shadow row, or in the tick that rolls (None: slides)."""
        if self.window is None:
            return None
        return "ahead" if self.model.window_ahead is not None else "in-tick"

    @property
    def free(self) -> int:
        return len(self._free)

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop())
        self._task.add_done_callback(_report_end)

    async def stop(self, reason: BaseException) -> None:
        """Stop ticking; every session waiting on a frame gets `reason` raised (its model state is gone)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for pending in [*self._pending.values(), *self._in_flight.values()]:
            if not pending.future.done():
                pending.future.set_exception(reason)
        self._pending.clear()
        self._in_flight.clear()

    # slots --------------------------------------------------------------------------------------------------
    def acquire(self) -> int | None:
        return self._free.pop() if self._free else None

    @property
    def sampling(self) -> SamplingConfig:
        """The checkpoint's sampling, for the settings a session leaves out."""
        return self.model.sampling

    async def open(self, slot: int, prefix: Prefix | None, sampling: RowSampling | None = None) -> float:
        """Fresh state for `slot` with its sampling and its persona prefilled, on the worker between ticks; returns
        prefill seconds."""
        prefill_s = await self.worker.run(lambda: self.model.open_slot(slot, prefix, sampling))
        self._active.add(slot)
        self._spans[slot] = _SlotSpans()
        self._prefix_frames[slot] = prefix.frames if prefix is not None else 0
        self._span_starts.pop(slot, None)
        return prefill_s

    async def resume(self, slot: int, history: SessionHistory, prefix: Prefix | None) -> float:
        """As `open`, with a resumed session's history replayed instead of its prefix (the prefix rebuilt from its
        persona and voice: its replayed embeddings, and the frames its window keeps); returns replay seconds."""
        embeddings = prefix.embeddings if prefix is not None else None
        replay_s = await self.worker.run(lambda: self.model.resume_slot(slot, history, embeddings))
        self._active.add(slot)
        self._spans[slot] = _SlotSpans()
        self._prefix_frames[slot] = prefix.frames if prefix is not None else 0
        self._span_starts.pop(slot, None)
        return replay_s

    async def saved(self, slot: int) -> tuple[bytes, list[SpanAnswer]]:
        """`slot`'s session history as bytes, and the answers not in it yet (waiting for a frame boundary, or taken
        by a tick queued behind the read): a resume injects those, and only those. The history is read on the worker
        between ticks and packed off it (a long session's is a few hundred kB, and the worker's time is every
        session's); the answers are read as the read returns, before any later tick: ticks run on the worker in
        order, and each hands its outcomes over (`_hand_over`) before the read's caller resumes."""
        history = await self.worker.run(lambda: self.model.history(slot))
        spans = self._spans.get(slot)
        unplayed = [] if spans is None else [r.answer for r in (spans.in_tick, spans.waiting) if r is not None]
        return await asyncio.to_thread(history.to_bytes), unplayed

    async def set_sampling(self, slot: int, sampling: RowSampling, restart: bool) -> None:
        """New sampling for `slot` from its next frame on, set on the worker between ticks."""
        await self.worker.run(lambda: self.model.set_sampling(slot, sampling, restart))

    def release(self, slot: int) -> None:
        """The session is gone: its slot stops counting for ticks and is free for the next session, whose `open`
        queues behind any tick in flight on the worker."""
        self._active.discard(slot)
        self._spans.pop(slot, None)
        self._arrivals.pop(slot, None)
        self._prefix_frames.pop(slot, None)
        self._span_starts.pop(slot, None)
        pending = self._pending.pop(slot, None)
        if pending is not None:
            pending.future.cancel()
        self._free.append(slot)
        self._wake.set()

    # spans --------------------------------------------------------------------------------------------------
    def request_span(self, slot: int, answer: SpanAnswer) -> None:
        """`answer` becomes `slot`'s span, injected in the next tick that steps the slot's frame and has room for it
        (a newer answer replaces one still waiting). The block is built now, on the event loop; the outcome comes
        with one of the slot's frame outputs (`FrameOutput.spans`). Nothing happens for a slot no session holds."""
        spans = self._spans.get(slot)
        if spans is None:
            return
        request = span_request(answer, self.model.prepare_span)
        if spans.waiting is not None:
            spans.settled.append(dropped(spans.waiting, "superseded"))
        spans.waiting, spans.deferred_ticks = request, 0
        self._wake.set()  # the next tick's plan may change with it

    def close_spans(self, slot: int, reason: str) -> list[SpanOutcome]:
        """The outcomes `slot`'s session has not been told yet, its span waiting or going in with the tick running
        now dropped with `reason` among them; the slot takes no more spans until it is opened again."""
        spans = self._spans.pop(slot, None)
        if spans is None:
            return []
        unheard = [*spans.handed, *spans.settled]
        unheard += [dropped(request, reason) for request in (spans.in_tick, spans.waiting) if request is not None]
        return unheard

    @property
    def max_prefix_frames(self) -> int:
        return self.model.max_span_frames

    # frames -------------------------------------------------------------------------------------------------
    def until_grid_s(self, slot: int) -> float | None:
        """Seconds from now to the next moment the other sessions' frames end (the latest of them to have
        arrived, a frame period on), for `phase_pad`; None while no other session streams."""
        others = [arrived for other, arrived in self._arrivals.items() if other != slot]
        if not others:
            return None
        return (max(others) - time.perf_counter()) % FRAME_S

    async def step(self, slot: int, frame: InputFrame) -> FrameOutput:
        """The output for `frame`, computed in the next tick that takes it (with the slot's span before it, if it
        fits); one frame per slot at a time."""
        if slot in self._pending:
            raise RuntimeError(f"slot {slot} already has a frame waiting")
        self._pending[slot] = _Pending(frame, asyncio.get_running_loop().create_future())
        self._arrivals[slot] = frame.arrived
        self._wake.set()
        # No local may hold the future: its error's traceback holds this frame.
        output = await self._pending[slot].future
        if (spans := self._spans.get(slot)) is not None:
            spans.handed = ()  # read by the session now: `close_spans` must not tell them again
        return output

    async def _loop(self) -> None:
        while True:
            waiting = [self._waiting(slot, p) for slot, p in self._pending.items()]
            wait = self.scheduler.wait_s(time.perf_counter(), waiting, len(self._active))
            if wait > 0:
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), None if math.isinf(wait) else wait)
                continue
            await self._run_tick(waiting)
            # Let the sessions just answered hand in their next frames before the next tick is planned: a session
            # with a backlog has one ready, and a tick planned without it would run for fewer sessions than it
            # could, which under load is how a backlog feeds itself.
            await asyncio.sleep(0)

    async def _run_tick(self, waiting: list[Waiting]) -> None:
        """One tick over the frames waiting, on the worker, and its outputs delivered. Its own frame, so that what
        it took (frames, spans, outputs) is not held by the tick loop while the server idles: a session gone must
        leave nothing behind."""
        taken, self._pending = self._pending, {}
        self._in_flight = taken
        plan = self.scheduler.plan_spans(time.perf_counter(), waiting)
        if plan.defer:
            self.metrics.spans_deferred.inc(len(plan.defer))
        frames = {slot: (p.frame, self._take_span(slot, slot in plan.defer)) for slot, p in taken.items()}
        try:
            results = await self.worker.run(lambda f=frames: self._tick(f))
        except Exception as exc:  # the batched forward failed, or the worker was restarted under it
            self._in_flight = {}
            for pending in taken.values():
                if not pending.future.done():
                    pending.future.set_exception(exc)
            return
        # Not on cancellation: `stop` answers what was in flight.
        self._in_flight = {}
        for slot, pending in taken.items():
            result = results[slot]
            if pending.future.done():  # released, or its session ending, while the tick ran
                if result.output is not None:
                    self._hand_over(slot, result.output)  # a span that went in is told so at `close_spans`
                continue
            if result.error is not None:
                pending.future.set_exception(result.error)
            else:
                pending.future.set_result(self._hand_over(slot, result.output))  # type: ignore[arg-type]

    def _waiting(self, slot: int, pending: _Pending) -> Waiting:
        spans = self._spans.get(slot)
        span = spans.waiting if spans is not None else None
        if spans is None or span is None:
            return Waiting(slot, pending.frame.arrived)
        return Waiting(slot, pending.frame.arrived, span.built.frames, span.requested, spans.deferred_ticks)

    def _take_span(self, slot: int, defer: bool) -> tuple[SpanRequest, int] | None:
        """The span going in before `slot`'s frame this tick, with the ticks it was put off; None when it has none
        or it is put off once more."""
        spans = self._spans.get(slot)
        if spans is None or spans.waiting is None:
            return None
        if defer:
            spans.deferred_ticks += 1
            return None
        taken = (spans.waiting, spans.deferred_ticks)
        spans.in_tick, spans.waiting, spans.deferred_ticks = spans.waiting, None, 0
        return taken

    def _hand_over(self, slot: int, output: FrameOutput) -> FrameOutput:
        """The slot's output with the outcomes settled outside the tick (superseded spans) before its own, held as
        handed until `step` returns them."""
        spans = self._spans.get(slot)
        if spans is None:
            return output
        output = replace(output, spans=(*spans.settled, *output.spans))
        spans.settled, spans.in_tick, spans.handed = [], None, output.spans
        return output

    # on the worker thread -----------------------------------------------------------------------------------
    def _tick(self, frames: dict[int, tuple[InputFrame, tuple[SpanRequest, int] | None]]) -> dict[int, _SlotResult]:
        """`frames`: slot -> its frame and the span going in before it (with the ticks it was put off)."""
        start, start_cpu = time.perf_counter(), time.thread_time()
        failed: dict[int, _SlotResult] = {}
        outcomes: dict[int, tuple[SpanOutcome, ...]] = {}
        pcm: dict[int, np.ndarray] = {}
        offsets = self.model.offsets() if self.window is not None else []
        for slot, (frame, span) in frames.items():
            try:
                pcm[slot] = self._slot_frame(frame)
                if self.window is not None:
                    span_frames = span[0].built.frames if span is not None else 0
                    self._keep_window(self.window, slot, offsets[slot], span_frames)
                outcomes[slot] = (self._slot_span(slot, *span),) if span is not None else ()
                if outcomes[slot] and outcomes[slot][0].injected:
                    self._span_starts[slot] = outcomes[slot][0].offsets[0]
            except Exception as exc:
                logger.exception("slot %d failed before the tick", slot)
                # Logged with its traceback; handed on without it: the traceback's frames (this one by f_back)
                # hold the results that hold the error, a cycle that keeps the session until the collector runs.
                failed[slot] = _SlotResult(None, exc.with_traceback(None))
        outputs = self.model.tick(pcm) if pcm else {}
        compute_s = time.perf_counter() - start
        self.metrics.batch_size.observe(len(pcm))
        self.metrics.tick_seconds.observe(compute_s)
        self.metrics.tick_cpu_seconds.observe(time.thread_time() - start_cpu)
        results = dict(failed)
        for slot, out in outputs.items():
            if isinstance(out, RowFault):
                logger.error("slot %d failed in the batched step: %s", slot, out)
                results[slot] = _SlotResult(None, out)
                continue
            results[slot] = _SlotResult(FrameOutput(frames[slot][0], out.agent_pcm, out.text_token, compute_s,
                                                    outcomes[slot]))
        return results

    def _keep_window(self, window: WindowPolicy, slot: int, offset: int, span_frames: int) -> None:
        """Roll `slot`'s window before its span and step if they would pass the context (window_keeper.py)."""
        start = time.perf_counter()
        prefix_frames = self._prefix_frames.get(slot, 0)
        span_start = self._span_starts.get(slot)
        work = keep_window(self.model, window, slot, offset, prefix_frames, span_frames + 1,
                           lambda s: s in self._active, span_start)
        if work.rolled and span_start is not None:
            if span_start - work.shift >= prefix_frames:
                self._span_starts[slot] = span_start - work.shift  # it moved with the window
            else:
                del self._span_starts[slot]
        if work.build_s is not None:
            self.metrics.window_build_seconds.observe(work.build_s)
        if work.rolled:
            self.metrics.window_rolls.observe(time.perf_counter() - start)
        if work.in_tick:
            self.metrics.window_rolls_in_tick.inc()

    def _slot_frame(self, frame: InputFrame) -> np.ndarray:
        pcm = frame.pcm
        if pcm.shape != (FRAME_SAMPLES,) or not np.isfinite(pcm).all():
            raise BadFrame(f"frame {frame.index}: expected {FRAME_SAMPLES} finite samples")
        return pcm

    def _slot_span(self, slot: int, span: SpanRequest, deferred_ticks: int) -> SpanOutcome:
        return inject_span(span, self.span_deadline_s, self.model.frames_stepped[slot],
                           lambda: self.model.slot_offset(slot), lambda block: self.model.inject(slot, block),
                           deferred_ticks)
