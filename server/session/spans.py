"""A span's life after the backend (or an app) answers: built off the frame path, injected at a frame boundary,
reported. The batcher holds a slot's span from the answer to its outcome (server/batching/batcher.py)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from frontend_model.span.block import Block
from frontend_model.span.build import SpanBuild
from server.session.retrieval import SpanAnswer
from server.wire import protocol as p
from server.wire.frame_clock import InputFrame


@dataclass(frozen=True)
class SpanRequest:
    """An answer waiting for a frame boundary, its block already built (normalised, tokenised) off the frame path."""

    answer: SpanAnswer
    built: SpanBuild
    build_s: float

    @property
    def text(self) -> str:
        return self.answer.text

    @property
    def requested(self) -> float:
        """time.perf_counter() when retrieval started (the `<ret>`): latency counts from it."""
        return self.answer.triggered


@dataclass(frozen=True)
class SpanOutcome:
    request: SpanRequest
    injected: bool
    text: str
    frames: int = 0
    prefill_s: float = 0.0
    truncated: bool = False
    dropped_text: str = ""
    reason: str | None = None
    done: float = 0.0  # time.perf_counter() when injected or dropped
    offsets: tuple[int, int] = (0, 0)  # engine frames consumed before and after the injection
    step: int = 0  # frames the session had stepped when the span went in: the frame boundary
    deferred_ticks: int = 0  # ticks it was put off because it did not fit what was left of a frame's budget


@dataclass(frozen=True)
class FrameOutput:
    frame: InputFrame
    agent_pcm: np.ndarray | None  # None while the model's delays fill (the first frame)
    text_token: int | None
    compute_s: float
    spans: tuple[SpanOutcome, ...] = ()  # the slot's spans settled since its previous frame: injected or dropped


def span_request(answer: SpanAnswer, prepare: Callable[[str], SpanBuild]) -> SpanRequest:
    """Build the block now, on the caller's thread, so the tick that injects it only runs the forward pass."""
    start = time.perf_counter()
    built = prepare(answer.text)
    return SpanRequest(answer, built, time.perf_counter() - start)


def dropped(request: SpanRequest, reason: str) -> SpanOutcome:
    """A span that never reached its frame boundary: superseded by a newer one, its session closed, ..."""
    return SpanOutcome(request, False, request.text, reason=reason, done=time.perf_counter())


def inject_span(request: SpanRequest, deadline_s: float, steps: int, offset: Callable[[], int],
                inject: Callable[[Block], None], deferred_ticks: int = 0) -> SpanOutcome:
    """Inject a span at this frame boundary, or say why not: too late, before the first frame, nothing to say."""
    now = time.perf_counter()
    if now - request.answer.deadline_from > deadline_s:
        return SpanOutcome(request, False, request.text, reason="late", done=now)
    if steps == 0:
        return SpanOutcome(request, False, request.text, reason="before the first frame", done=now)
    built = request.built
    if built.block is None:
        return SpanOutcome(request, False, built.text, reason=built.reason, done=now)
    before = offset()
    inject(built.block)
    done = time.perf_counter()
    return SpanOutcome(request, True, built.text, built.frames, done - now, built.truncated,
                       built.dropped_text, done=done, offsets=(before, offset()), step=steps,
                       deferred_ticks=deferred_ticks)


def span_event(outcome: SpanOutcome, t: float) -> p.SpanInjected | p.SpanDropped:
    """The event reporting a span's fate; latency counts from the request (the `<ret>`) to injection or drop."""
    request, answer = outcome.request, outcome.request.answer
    latency_ms = round((outcome.done - request.requested) * 1e3, 2)
    if not outcome.injected:
        return p.SpanDropped(t=t, text=outcome.text, source=answer.source, tool=answer.tool,
                             question=answer.question, reason=outcome.reason or "dropped", latency_ms=latency_ms)
    return p.SpanInjected(
        t=t, text=outcome.text, source=answer.source, tool=answer.tool, question=answer.question,
        frames=outcome.frames, prefill_ms=round(outcome.prefill_s * 1e3, 2), latency_ms=latency_ms,
        truncated=outcome.truncated, dropped_text=outcome.dropped_text, offset_before=outcome.offsets[0],
        offset_after=outcome.offsets[1], step=outcome.step, deferred_ticks=outcome.deferred_ticks,
        timings_ms={**answer.timings_ms, "build_ms": round(request.build_s * 1e3, 3)},
    )
