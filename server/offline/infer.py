"""`contextspan infer`: a WAV through the same engine, ASR and agent at the frame clock, for offline evaluation.

Frames are stepped back to back (faster than real time where the machine allows) or paced at 80 ms with
`realtime`; the backend runs concurrently in wall time, and an answer is injected at the first frame boundary after
it arrives, exactly as in a live session (the checkpoint's persona and voice prefilled, the user's audio levelled).
While a retrieval is in flight the frames are paced at 80 ms from its `<ret>` whatever the mode, so the answer lands
as many frames after the question as it would live; where the input ends first, silence follows, as a caller
who waits on the line, until the answer is in and said (`SAY_S`) or the span deadline has passed.
Output: a stereo WAV like a recording (left user, right agent) and the events, each stamped with stream time.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from frontend_model.engine.calibration import calibrate_prefill, no_span_budget_warning
from frontend_model.frame import FRAME_S, FRAME_SAMPLES
from frontend_model.loading.loader import LoadedModel
from frontend_model.moshi_internals.row_sampling import RowSampling
from frontend_model.span.build import MIN_SPAN_FRAMES
from server.offline.stack import ModelSession
from server.ops.recording import StereoWavWriter
from server.session.backend import Backend
from server.session.persona import build_persona_block, persona_and_voice
from server.session.retrieval import SpanAnswer
from server.session.spans import SpanOutcome, SpanRequest, dropped, span_event, span_request
from server.session.trigger import resolve_trigger
from server.settings import ServerSettings
from server.wire import protocol as p
from server.wire.frame_clock import FrameAssembler
from server.wire.leveller import UserLeveller

logger = logging.getLogger(__name__)

INPUT_ENDED = "input ended before the span could be injected"
SAY_S = 6.0  # silence stepped after a span injected past the input's end: time for the model to say it



@dataclass
class OfflineResult:
    events: list[Any] = field(default_factory=list)
    frames: int = 0
    tail_frames: int = 0  # silence stepped past the input while an answer was awaited or said
    wall_s: float = 0.0
    spans: list[tuple[SpanOutcome, float]] = field(default_factory=list)  # outcome, answer-ready perf_counter

    @property
    def realtime_factor(self) -> float:
        return self.frames * FRAME_S / self.wall_s if self.wall_s else 0.0


class OfflineSession:
    def __init__(self, model: LoadedModel, backend: Backend, settings: ServerSettings,
                 ret_frames: set[int] | None = None, realtime: bool = False,
                 sampling: RowSampling | None = None) -> None:
        """`sampling` with its seeds repeats a live session's draws (the checkpoint's, with fresh seeds, when None)."""
        self.model = model
        self.sampling = sampling
        self.backend = backend
        self.settings = settings
        self.ret_frames = ret_frames or set()
        self.realtime = realtime
        budget_s = settings.deadline_ms / 1e3
        cost = calibrate_prefill(model, settings.max_span_frames) if settings.span_cap == "calibrated" else None
        self.model_session = ModelSession(model, settings.span_deadline_s, cost, budget_s, settings.max_span_frames)
        if cost is not None and self.model_session.engine.span_frame_cap < MIN_SPAN_FRAMES:
            logger.warning(no_span_budget_warning(cost, budget_s))
        self.assembler = FrameAssembler()
        self.result = OfflineResult()
        self._span: SpanRequest | None = None
        self._answered: dict[int, float] = {}
        self._triggered = 0.0  # time.perf_counter() of the latest retrieval started
        self._triggered_frame = 0
        self._say_until = 0  # frames to step, past the input, for the model to say a span injected there

    def emit(self, event: Any) -> None:
        self.result.events.append(event)

    def _on_answer(self, answer: SpanAnswer) -> None:
        self._span = span_request(answer, self.model_session.prepare_span)
        self._answered[id(self._span)] = time.perf_counter()

    async def run(self, pcm: np.ndarray, out_wav: Path | None = None) -> OfflineResult:
        wav = StereoWavWriter(out_wav) if out_wav else None
        trigger = resolve_trigger(self.settings.trigger, self.model.layout, forced_ret=bool(self.ret_frames))
        retrieval = self.backend.retrieval_for("offline", "offline", self._on_answer, self.emit,
                                               lambda: self.assembler.stream_time, lambda exc: None, trigger.trigger,
                                               self.model.span.contract)
        loop = asyncio.get_running_loop()
        persona, voice = persona_and_voice(self.model, self.settings.persona or None, None)
        self.model_session.open(build_persona_block(self.model, persona, voice,
                                                    self.model_session.engine.max_span_frames), self.sampling)
        leveller = UserLeveller() if self.settings.level_user_audio else None
        frames = self.assembler.push(pcm)
        given = len(frames)
        start = time.perf_counter()
        try:
            i = 0
            while i < given or self._waiting(retrieval.in_flight) or i < self._say_until:
                if i == len(frames):
                    frames += self.assembler.push(np.zeros(FRAME_SAMPLES, np.float32))
                    self.result.tail_frames += 1
                frame = frames[i]
                if leveller is not None:
                    frame = replace(frame, pcm=leveller.process(frame.pcm))
                await self._pace(start, i, retrieval.in_flight)
                retrieval.feed(frame.pcm)
                span, self._span = self._span, None
                out = await loop.run_in_executor(None, self.model_session.step, frame, span)
                t = (i + 1) * FRAME_S
                for outcome in out.spans:
                    self.result.spans.append((outcome, self._answered.pop(id(outcome.request))))
                    self.emit(span_event(outcome, t))
                    if i >= given:
                        self._say_until = i + round(SAY_S / FRAME_S)
                token = out.text_token
                if i in self.ret_frames or (token is not None and token == self.model.span.ret_id):
                    self.emit(p.Retrieval(t=t, frame=i))
                    if retrieval.trigger():
                        self._triggered, self._triggered_frame = time.perf_counter(), i + 1
                piece = self.model.agent_text.piece(token) if token is not None else None
                if piece is not None:
                    self.emit(p.AgentText(t=t, text=piece, frame=i))
                if wav is not None:
                    agent = out.agent_pcm if out.agent_pcm is not None else np.zeros(FRAME_SAMPLES, np.float32)
                    wav.write(frame.pcm, agent)
                self.result.frames += 1
                i += 1
                await asyncio.sleep(0)
            self._report_unfinished(retrieval.in_flight)
        finally:
            self.result.wall_s = time.perf_counter() - start
            await retrieval.close()
            self.model_session.close()
            if wav is not None:
                wav.close()
        return self.result

    def _waiting(self, retrieving: bool) -> bool:
        """An answer to inject at the next frame (late ones are dropped there, as live), or a retrieval still within
        the span deadline."""
        in_time = time.perf_counter() - self._triggered <= self.settings.span_deadline_s
        return self._span is not None or (retrieving and in_time)

    async def _pace(self, start: float, frame: int, retrieving: bool) -> None:
        """Frame `frame` no earlier than a live session would step it: always with `realtime`, else while an answer
        is awaited (counted from the `<ret>`, so the backend gets the stream time it would get live)."""
        if self.realtime:
            ahead = start + (frame + 1) * FRAME_S - time.perf_counter()
        elif retrieving or self._span is not None:
            ahead = self._triggered + (frame - self._triggered_frame) * FRAME_S - time.perf_counter()
        else:
            return
        await asyncio.sleep(max(0.0, ahead))

    def _report_unfinished(self, retrieving: bool) -> None:
        """A retrieval still without an answer when the wait after the input's end ran past the span deadline:
        reported as dropped, so that no `<ret>` goes unanswered in the events."""
        t = self.result.frames * FRAME_S
        now = time.perf_counter()
        if self._span is not None:
            self.emit(span_event(dropped(self._span, INPUT_ENDED), t))
        elif retrieving:
            self.emit(p.SpanDropped(t=t, text="", reason=INPUT_ENDED,
                                    latency_ms=round((now - self._triggered) * 1e3, 2)))


def write_events(path: Path, events: list[Any]) -> None:
    path.write_text(json.dumps([json.loads(p.encode_event(e)) for e in events], indent=1) + "\n")


def infer(settings: ServerSettings, source: Path, out: Path, events: Path | None, ret_frames: set[int],
          realtime: bool) -> int:
    import torch

    from contextspan_client import load_wav
    from frontend_model.loading.loader import load_model
    from frontend_model.training.profile import profile_checkpoint

    torch.set_num_threads(settings.torch_threads)
    profile, checkpoint = settings.resolved_profile(torch.cuda.is_available())
    model = load_model(profile, profile_checkpoint(profile, checkpoint, settings.seed), settings.device,
                       seed=settings.seed)
    backend = Backend.create(settings)
    backend.warm_up()
    pcm = load_wav(str(source))

    async def run() -> OfflineResult:
        try:
            return await OfflineSession(model, backend, settings, ret_frames, realtime).run(pcm, out)
        finally:
            await backend.aclose()

    result = asyncio.run(run())
    if events is not None:
        write_events(events, result.events)
    injected = sum(1 for e in result.events if e.type == "span.injected")
    dropped = sum(1 for e in result.events if e.type == "span.dropped")
    waited = f", {result.tail_frames * FRAME_S:.1f} s of them silence after the input" if result.tail_frames else ""
    print(f"{result.frames} frames ({result.frames * FRAME_S:.1f} s{waited}) in {result.wall_s:.1f} s "
          f"({result.realtime_factor:.1f}x real time); {injected} span(s) injected, {dropped} dropped; wrote {out}")
    return 0
