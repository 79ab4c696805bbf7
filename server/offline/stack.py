"""The single-session model stack `contextspan infer` runs: codec + engine, stepped on the caller's thread."""

from __future__ import annotations

import time

from frontend_model.engine.chunked_prefill import SpanPrefill
from frontend_model.engine.codec import FrameCodec
from frontend_model.engine.costs import PrefillCost
from frontend_model.engine.engine import DEFAULT_MAX_SPAN_FRAMES, Engine
from frontend_model.loading.loader import LoadedModel
from frontend_model.moshi_internals.row_sampling import RowSampling
from frontend_model.span.block import Prefix
from frontend_model.span.build import SpanBuild
from server.session.spans import FrameOutput, SpanOutcome, SpanRequest, inject_span
from server.wire.frame_clock import InputFrame


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

    def open(self, prefix: Prefix | None, sampling: RowSampling | None = None) -> float:
        """Start the streams with `sampling` (the engine's default, with fresh seeds, when None) and prefill the
        persona; returns the prefill time in seconds."""
        self.codec.open()
        self.engine.start()
        if sampling is not None and self.engine.sampler is not None:
            self.engine.sampler.set_row(0, sampling)
        if prefix is None:
            return 0.0
        start = time.perf_counter()
        self.engine.prefill(prefix)
        return time.perf_counter() - start

    def prepare_span(self, text: str) -> SpanBuild:
        return self.engine.prepare_span(text)

    def step(self, frame: InputFrame, span: SpanRequest | None) -> FrameOutput:
        start = time.perf_counter()
        outcome = self._inject(span) if span is not None else None
        user_codes = self.codec.encode(frame.pcm)
        result = self.engine.step(user_codes)
        agent_pcm = self.codec.decode(result.agent_codes) if result.agent_codes is not None else None
        return FrameOutput(frame, agent_pcm, result.text_token, time.perf_counter() - start,
                           (outcome,) if outcome is not None else ())

    def _inject(self, request: SpanRequest) -> SpanOutcome:
        return inject_span(request, self.span_deadline_s, self.engine.steps, lambda: self.engine.offset,
                           self.engine.inject)

    def close(self) -> None:
        self.engine.close()
        self.codec.close()
