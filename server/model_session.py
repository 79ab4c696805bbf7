"""The model side of one session: codec + engine on a slot's model. Every method runs on the worker thread."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from frontend_model.block import Block, Prefix
from frontend_model.chunked_prefill import SpanPrefill
from frontend_model.codec import FrameCodec
from frontend_model.engine import DEFAULT_MAX_SPAN_FRAMES, Engine, PrefillCost
from frontend_model.loading import LoadedModel
from frontend_model.span_block import SpanBuild, build_prefix
from server import protocol as p
from server.frame_clock import InputFrame


class PersonaError(ValueError):
    """The requested persona or voice cannot be prefilled; the message says why."""


@dataclass(frozen=True)
class SpanRequest:
    """A span waiting for the next frame boundary, already normalised and tokenised (off the frame path)."""

    text: str
    source: str | None
    requested: float  # time.perf_counter() when retrieval started (the `<ret>`): the span deadline counts from it
    built: SpanBuild
    build_s: float
    question: str | None = None
    tool: str | None = None
    timings_ms: dict[str, float] = field(default_factory=dict)


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
    span: SpanOutcome | None
    deferred: SpanRequest | None = None  # a span that did not fit this tick's budget: offer it with the next frame


def build_persona_block(model: LoadedModel, persona: str, voice: str | None, max_frames: int) -> Prefix | None:
    """The prefix prefilled before the handshake: tokenising, and the voice prompt (read at load) if any."""
    prompt = None
    if voice:
        prompt = model.voice_prompts.get(voice)
        if prompt is None:
            known = ", ".join(sorted(model.voice_prompts)) or "none for this model"
            raise PersonaError(f"unknown voice {voice!r} (known: {known})")
    try:
        prefix = build_prefix(persona, model.tokenizer, model.span, prompt, model.lm.delays)
    except ValueError as exc:
        raise PersonaError(str(exc)) from exc
    if prefix is not None and prefix.frames > max_frames:
        raise PersonaError(f"persona and voice take {prefix.frames} frames; at most {max_frames} fit")
    return prefix


class ModelSession:
    """Owns the slot's model between `open` and `close`; `step` runs one frame, injecting a span first."""

    def __init__(
        self,
        model: LoadedModel,
        span_deadline_s: float,
        cost: PrefillCost | None = None,
        frame_budget_s: float = 0.08,
        max_span_frames: int = DEFAULT_MAX_SPAN_FRAMES,
    ) -> None:
        """`cost` (calibrated at startup) lets the engine cap a span so its prefill fits `frame_budget_s`."""
        self.model = model
        self.span_deadline_s = span_deadline_s
        self.codec = FrameCodec(model.mimi)
        self.engine = Engine(model, cost=cost, frame_budget_s=frame_budget_s, max_span_frames=max_span_frames,
                             prefill=SpanPrefill.FASTER)

    def open(self, prefix: Prefix | None) -> float:
        """Start the streams and prefill the persona; returns the prefill time in seconds."""
        self.codec.open()
        self.engine.start()
        if prefix is None:
            return 0.0
        start = time.perf_counter()
        self.engine.prefill(prefix)
        return time.perf_counter() - start

    def span_request(self, text: str, source: str | None, requested: float | None = None,
                     question: str | None = None, tool: str | None = None,
                     timings_ms: dict[str, float] | None = None) -> SpanRequest:
        return span_request(self.engine, text, source, requested, question, tool, timings_ms)

    def step(self, frame: InputFrame, span: SpanRequest | None) -> FrameOutput:
        start = time.perf_counter()
        outcome = self._inject(span) if span is not None else None
        user_codes = self.codec.encode(frame.pcm)
        result = self.engine.step(user_codes)
        agent_pcm = self.codec.decode(result.agent_codes) if result.agent_codes is not None else None
        return FrameOutput(frame, agent_pcm, result.text_token, time.perf_counter() - start, outcome)

    def _inject(self, request: SpanRequest) -> SpanOutcome:
        return inject_span(request, self.span_deadline_s, self.engine.steps, lambda: self.engine.offset,
                           self.engine.inject)

    def close(self) -> None:
        self.engine.close()
        self.codec.close()


def span_request(engine: Engine, text: str, source: str | None, requested: float | None = None,
                 question: str | None = None, tool: str | None = None,
                 timings_ms: dict[str, float] | None = None) -> SpanRequest:
    """Build the block now, on the caller's thread, so the tick that injects it only runs the forward pass."""
    start = time.perf_counter()
    built = engine.prepare_span(text)
    return SpanRequest(text, source, requested or start, built, time.perf_counter() - start, question, tool,
                       timings_ms or {})


def inject_span(request: SpanRequest, deadline_s: float, steps: int, offset: Callable[[], int],
                inject: Callable[[Block], None], deferred_ticks: int = 0) -> SpanOutcome:
    """Inject a span at this frame boundary, or say why not: too late, before the first frame, nothing to say."""
    now = time.perf_counter()
    if now - request.requested > deadline_s:
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
    request = outcome.request
    latency_ms = round((outcome.done - request.requested) * 1e3, 2)
    if not outcome.injected:
        return p.SpanDropped(t=t, text=outcome.text, source=request.source, tool=request.tool,
                             question=request.question, reason=outcome.reason or "dropped", latency_ms=latency_ms)
    return p.SpanInjected(
        t=t, text=outcome.text, source=request.source, tool=request.tool, question=request.question,
        frames=outcome.frames, prefill_ms=round(outcome.prefill_s * 1e3, 2), latency_ms=latency_ms,
        truncated=outcome.truncated, dropped_text=outcome.dropped_text, offset_before=outcome.offsets[0],
        offset_after=outcome.offsets[1], step=outcome.step, deferred_ticks=outcome.deferred_ticks,
        timings_ms={**request.timings_ms, "build_ms": round(request.build_s * 1e3, 3)},
    )
