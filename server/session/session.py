"""One WebSocket conversation: connect -> prefix prefill -> handshake -> stream -> close.

The event loop owns I/O, Opus and session state; the model runs in the batcher's ticks on the worker. Six tasks
run while streaming: the receiver (decode audio, cut frames), the frame loop (one frame at a time into the next
batched tick, in order), the sender (drains the bounded outbound queue), the once-a-second stats, the duration cap
and the wait for an `end` (a drain, a worker restart). Spans are the batcher's from the answer on: the retrieval hands
its answer straight to it, and their outcomes come back with the frame outputs. Teardown returns the slot; a tick in
flight finishes before the slot's next session is prefilled.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import secrets
import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Literal

import numpy as np
from opentelemetry import trace
from starlette.types import Message
from starlette.websockets import WebSocket, WebSocketState

from backend_agent.context_store import Profile
from frontend_model.engine.history import SessionHistory
from frontend_model.frame import FRAME_SAMPLES, SAMPLE_RATE
from frontend_model.loading.loader import LoadedModel
from frontend_model.moshi_internals.row_sampling import RowSampling, SamplingConfig
from frontend_model.span.block import Prefix
from server.batching.batcher import Batcher
from server.guard.auth import RecordingSigner
from server.guard.limits import AbuseCounter, RateLimiter
from server.ops.heap import trim_heap
from server.ops.metrics import Metrics
from server.ops.recording import SessionRecording
from server.session.backend import Backend
from server.session.client_tools import ClientTools
from server.session.persona import PersonaError, build_persona_block, persona_and_voice
from server.session.resume import SPANS_KEPT, Resumes, ResumeState, StoreUnavailable
from server.session.retrieval import InFlight, Retrieval, SpanAnswer
from server.session.spans import FrameOutput, SpanOutcome, span_event
from server.session.trigger import Trigger
from server.session.wire import AudioIn, ClearInput, CommitInput, Inbound, MoshiWire, SessionWire
from server.settings import ServerSettings
from server.wire import protocol as p
from server.wire.frame_clock import FrameAssembler, InputFrame, phase_pad
from server.wire.leveller import UserLeveller
from server.wire.outbound import OutboundQueue

logger = logging.getLogger(__name__)
tracer = trace.get_tracer("contextspan.server")


def new_session_id() -> str:
    return f"{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{secrets.token_hex(4)}"


class SessionEnd(Exception):
    """Ends a session with this close code and reason: a limit reached, a drain, a worker restart."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason


@dataclass
class SessionOptions:
    """What the client chose at connect time (query parameters) and later (`session.update`)."""

    events: bool = False
    persona: str | None = None  # None: the checkpoint's default (server/session/persona.py)
    voice: str | None = None
    profile: p.UserProfile | None = None
    notes: str | None = None
    sampling: p.SamplingQuery = field(default_factory=p.SamplingQuery)

    @classmethod
    def from_query(cls, query: dict[str, str], default_persona: str) -> SessionOptions:
        """Raises ValueError for sampling parameters out of range, saying which and why. A persona given, even empty,
        is the one in effect; none given and no server default leaves the checkpoint's."""
        events = query.get("events", "").lower() in ("1", "true", "json", "yes")
        persona = query.get("persona", query.get("text_prompt", default_persona or None))
        voice = query.get("voice", query.get("voice_prompt")) or None
        return cls(events=events, persona=persona, voice=voice, sampling=p.SamplingQuery.parse(query))


def resolve_sampling(defaults: SamplingConfig, query: p.SamplingQuery) -> RowSampling:
    """The query's settings over the checkpoint's defaults; a seed not given is drawn, and reported."""
    return replace(RowSampling.from_config(defaults, query.text_seed, query.audio_seed), **query.chosen())


@dataclass
class _SecondStats:
    frames_in: int = 0
    frames_out: int = 0
    latencies_ms: list[float] = field(default_factory=list)
    deadline_misses: int = 0


@dataclass
class _Preparing:
    """Where a session's preparation stands, for `session.preparing`."""

    started: float
    stage: Literal["prefix", "prefill"] = "prefix"
    prefix_frames: int | None = None
    done: asyncio.Event = field(default_factory=asyncio.Event)
    early: list[Message] = field(default_factory=list)  # what the client sent before the handshake


class Session:
    """One client's conversation on one slot of the batched model, from the prefill to the release of the slot."""

    def __init__(
        self,
        websocket: WebSocket,
        settings: ServerSettings,
        model: LoadedModel,
        batcher: Batcher,
        slot: int,
        metrics: Metrics,
        options: SessionOptions,
        backend: Backend | None = None,
        user_id: str | None = None,
        signer: RecordingSigner | None = None,
        trigger: Trigger = "ret",
        app_spans: bool = False,
        wire: Callable[[OutboundQueue], SessionWire] | None = None,
        resumes: Resumes | None = None,
        resumed: ResumeState | None = None,
    ) -> None:
        """`trigger` as resolved at load (server/session/trigger.py); `app_spans` whether `span.inject` is accepted;
        `wire` makes the protocol's half over the outbound queue (default: `/api/chat`'s, MoshiWire); `resumes` saves
        its state as it goes, `resumed` the state it continues (its history replaces the prefill)."""
        self.id = resumed.session_id if resumed is not None else new_session_id()
        self.ws = websocket
        self.settings = settings
        self.model = model
        self.batcher = batcher
        self.slot = slot
        self.metrics = metrics
        self.options = options
        self.backend = backend
        self.user = user_id  # as the client named it: what its resume token is bound to
        self.user_id = user_id or self.id
        self.resumes = resumes
        self.resumed = resumed
        self._spans_told: deque[str] = deque(maxlen=SPANS_KEPT)
        self.client_close_code: int | None = None  # the client's close code, once it has closed
        self.retrieval: Retrieval | None = None
        self._unfinished: InFlight | None = None  # the retrieval going on when it closed: a hand-over saves it
        self.outbound = OutboundQueue(settings.send_queue_frames)
        self.wire = wire(self.outbound) if wire is not None else MoshiWire(self.outbound, options.events)
        # A resumed leg records under an id of its own: the first leg's files may be on this replica too.
        self.recording_id = new_session_id() if resumed is not None else self.id
        self.recording = SessionRecording(settings.recordings_dir, self.recording_id) if settings.recordings else None
        # Frames, and the events' stream time, go on from where the resumed session's last save was.
        self.assembler = FrameAssembler(round(resumed.stream_time * SAMPLE_RATE / FRAME_SAMPLES) if resumed else 0)
        self.leveller = UserLeveller() if settings.level_user_audio else None
        self.client_tools = ClientTools(self.emit, lambda: self.assembler.stream_time,
                                        settings.client_tool_deadline_s)
        self._reprefill = False  # a new persona or voice waits for the next frame boundary
        self._frames: deque[InputFrame] = deque()
        self._frame_ready = asyncio.Event()
        self.sampling: RowSampling | None = None  # in effect, from the prefill on
        self._second = _SecondStats()
        self.input_dropped = 0
        self.signer = signer
        self.trigger = trigger
        self.app_spans = app_spans
        self._last_app_span = float("-inf")
        self.limiter = RateLimiter(settings.max_messages_per_s, 2 * settings.max_messages_per_s)
        self.abuse = AbuseCounter(settings.max_protocol_errors)
        self._end_requested = asyncio.Event()
        self._end = (p.CLOSE_NORMAL, "")  # raised as a fresh SessionEnd: one kept here would hold its traceback
        self._phase_set = False

    # public API for the backend ----------------------------------------------------------------------------
    def request_span(self, answer: SpanAnswer) -> None:
        """Inject `answer` as a Context Span at the next frame boundary (a newer request replaces a pending one).

        The batcher builds the block now and injects it in the tick that steps the next frame, or a later one if
        that tick's budget is full; a `span.injected` or `span.dropped` event reports frames and prefill time.
        """
        self.batcher.request_span(self.slot, answer)

    def emit(self, event: p.ServerEvent) -> None:
        """Record an event in the transcript and hand it to the wire, which sends it in its protocol's terms."""
        self._record(event)
        self.wire.event(event)

    def _record(self, event: p.ServerEvent) -> None:
        if self.recording is not None:
            self.recording.transcript.write(p.event_record(event, time.time()))

    def notify_ending(self, reason: str, in_s: float) -> None:
        self.emit(p.SessionEnding(t=self.assembler.stream_time, reason=reason, in_s=round(in_s, 3)))  # type: ignore[arg-type]

    def end(self, code: int, reason: str) -> None:
        """Ask the running session to close with `code` (from the event loop); teardown runs as for any close."""
        self._end = (code, reason)
        self._end_requested.set()

    # lifecycle ---------------------------------------------------------------------------------------------
    async def run(self) -> None:
        """Prefill, handshake, then stream until the client leaves; always ends with everything released."""
        attributes = {"session_id": self.id, "profile": self.model.profile, "user": self.user_id}
        with tracer.start_as_current_span("conversation", attributes=attributes):
            try:
                await self._run()
            finally:
                self.client_tools.detach()

    async def _run(self) -> None:
        preparing = _Preparing(time.perf_counter())
        announcer = asyncio.create_task(self._announce_preparing(preparing)) if self.options.events else None
        holder = asyncio.create_task(self._hold_early_messages(preparing.early))
        try:
            if self.resumed is not None:
                history = SessionHistory.from_bytes(self.resumed.history)
                self._restore(self.resumed)
            # Reading the profile, tokenising: off the event loop, and off the worker that steps the others.
            persona, voice, prefix = await asyncio.to_thread(self._prefix)
            preparing.stage, preparing.prefix_frames = "prefill", prefix.frames if prefix else 0
            if self.resumed is None:
                sampling = self.sampling = resolve_sampling(self.batcher.sampling, self.options.sampling)
                prefill_s = await self.batcher.open(self.slot, prefix, sampling)
            else:  # the prefix's replayed embeddings (a PersonaPlex voice) are no columns; its window keeps it
                sampling = self.sampling = history.sampling
                prefill_s = await self.batcher.resume(self.slot, history, prefix)
        finally:
            preparing.done.set()
            holder.cancel()  # a read cancelled while waiting takes nothing off uvicorn's queue
            await asyncio.wait([holder])
            if announcer is not None:
                await announcer  # it stops between two sends: nothing of an event is cut off by the handshake
        if not holder.cancelled() and (error := holder.exception()) is not None:
            raise error
        if (hello := self.wire.handshake()) is not None:
            await self.ws.send_bytes(hello)
        logger.info("session %s ready (prefix %d frames, prefill %.1f ms)", self.id,
                    prefix.frames if prefix else 0, prefill_s * 1e3)
        self.emit(p.SessionReady(
            t=self.assembler.stream_time, session_id=self.id, profile=self.model.profile,
            random_weights=self.model.random_weights,
            description=self.model.description, prefix_frames=prefix.frames if prefix else 0,
            prefill_ms=round(prefill_s * 1e3, 2), persona=persona, voice=voice, trigger=self.trigger,
            app_spans=self.app_spans,
            sampling=p.Sampling(**asdict(sampling)), unsupported=self.options.sampling.unsupported(),
            recording=self._recording_links() if self.recording else None,
            resume=self.resumes.token(self.id, self.user) if self.resumes is not None else None,
            resumed_frames=history.offset if self.resumed is not None else None,
        ))
        if self.backend is not None:
            # Answers go straight to the batcher, which holds the span until its outcome comes with a frame output.
            self.retrieval = self.backend.retrieval_for(
                self.id, self.user_id, functools.partial(self.batcher.request_span, self.slot), self.emit,
                lambda: self.assembler.stream_time, self._on_backend_error, self.trigger, self.model.span.contract)
            if self.client_tools.declared:  # a resumed session's
                self._rebuild_agent(self.backend)
        if self.resumed is not None:
            self._go_on(self.resumed.in_flight)
        try:
            error = await self._stream(preparing.early)
            if error is not None:
                raise error
        finally:
            error = None  # this frame is in the error's traceback: no cycle through the local
            # Dropped once closed: the retrieval calls back into this session, a cycle only the collector would free.
            retrieval, self.retrieval = self.retrieval, None
            if retrieval is not None:
                self._unfinished = retrieval.unfinished(time.perf_counter())
                await retrieval.close()

    def _prefix(self) -> tuple[str, str | None, Prefix | None]:
        """The persona and voice in effect, and their prefix; a named user's name and place (from the context store)
        join the persona."""
        backend = self.backend
        profile = backend.store.get_profile(self.user_id) if backend is not None and self.user_id != self.id else None
        persona, voice = persona_and_voice(self.model, self.options.persona, self.options.voice, profile)
        return persona, voice, build_persona_block(self.model, persona, voice, self.batcher.max_prefix_frames)

    async def _hold_early_messages(self, early: list[Message]) -> None:
        """Reads what a client sends before the handshake, to be handled first once streaming. Unread, one message
        stops uvicorn reading the socket, pongs included, and a prefill longer than `keepalive_s` +
        `keepalive_timeout_s` would close the socket 1011. Past `input_backlog_frames` messages reading stops
        (the client is held back by TCP, as before)."""
        while len(early) < self.settings.input_backlog_frames:
            early.append(message := await self.ws.receive())
            if message["type"] == "websocket.disconnect":
                return

    async def _announce_preparing(self, preparing: _Preparing) -> None:
        """`session.preparing` every `keepalive_s` until the prefix is in, sent directly: the sender task that
        drains the outbound queue starts with the stream. A quick prefill sends none."""
        while True:
            try:
                await asyncio.wait_for(preparing.done.wait(), self.settings.keepalive_s)
                return
            except TimeoutError:
                pass
            event = p.SessionPreparing(t=0.0, stage=preparing.stage, prefix_frames=preparing.prefix_frames,
                                       elapsed_s=round(time.perf_counter() - preparing.started, 2))
            self._record(event)
            await self.ws.send_text(p.encode_event(event))

    async def _stream(self, early: list[Message]) -> BaseException | None:
        """Run the session's tasks until one ends, then stop them all; returns what ended it, if an error did.

        Returned, not raised: the tasks hold the error and this frame holds the tasks, so a raise from here would
        put the frame in the error's traceback, a cycle that keeps the whole session until the collector runs."""
        tasks = [asyncio.create_task(self._receive_loop(early)), asyncio.create_task(self._send_loop()),
                 asyncio.create_task(self._frame_loop()), asyncio.create_task(self._stats_loop()),
                 asyncio.create_task(self._duration_loop()), asyncio.create_task(self._wait_for_end())]
        if self.resumes is not None:
            tasks.append(asyncio.create_task(self._save_loop()))
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        for task in done:
            if (error := task.exception()) is not None:
                return error
        return None

    # resume ------------------------------------------------------------------------------------------------
    async def _save_loop(self) -> None:
        """Saves until the session ends; a save that fails for any reason but the store's is logged once and the
        conversation goes on (this task ending would end it)."""
        assert self.resumes is not None
        logged = False
        while True:
            await asyncio.sleep(self.resumes.save_s)
            try:
                await self.save()
            except Exception:
                if not logged:
                    logger.exception("session %s: its resume state could not be saved", self.id)
                logged = True

    async def save(self) -> bool:
        """Write this session's state to the resume store, between ticks; False when the store is unavailable (the
        session goes on)."""
        resumes = self.resumes
        if resumes is None:
            return False
        history, unplayed = await self.batcher.saved(self.slot)
        now = time.perf_counter()  # the answers and the retrieval as the history stands: nothing injected twice
        in_flight = [InFlight.of_answer(answer, self.settings.span_deadline_s, now) for answer in unplayed]
        unfinished = self.retrieval.unfinished(now) if self.retrieval is not None else self._unfinished
        if unfinished is not None:
            in_flight.append(unfinished)
        store = self.backend.store if self.backend is not None else None
        state = ResumeState(
            self.id, self.user, self.options.persona, self.options.voice, self.options.events, history,
            turns=[(turn.role, turn.text) for turn in store.turns(self.id)] if store is not None else [],
            profile=store.get_profile(self.user).model_dump() if store is not None and self.user else None,
            notes=self.options.notes, spans=list(self._spans_told), stream_time=self.assembler.stream_time,
            protocol=self.wire.protocol, tools=[tool.model_dump() for tool in self.client_tools.declared.values()],
            wire=self.wire.saved(), in_flight=in_flight)
        try:
            await resumes.store.save(state, resumes.ttl_s)
        except StoreUnavailable as exc:
            resumes.answered(exc)
            return False
        resumes.answered(None)
        return True

    def _restore(self, state: ResumeState) -> None:
        """The client tools and the protocol's own state back, and the backend's plain data into this replica's
        context store, unless it already holds this session's turns (a store both replicas share)."""
        self.options.notes = state.notes
        self._spans_told.extend(state.spans)
        self.client_tools.declare([p.ClientTool.model_validate(tool) for tool in state.tools])
        self.wire.restore(state.wire)
        store = self.backend.store if self.backend is not None else None
        if store is None or store.turns(self.id, limit=1):
            return
        if state.profile is not None and self.user:
            store.save_profile(Profile.model_validate(state.profile))
        if state.notes:
            store.add_note(self.user_id, state.notes)
        for role, text in state.turns:
            store.add_turn(self.user_id, self.id, role, text)  # type: ignore[arg-type]

    def _go_on(self, in_flight: list[InFlight]) -> None:
        """What the resumed session had in flight, at the first frame boundary after the replay: an answer goes in
        (the batcher holds it from now), a question goes to this replica's backend again (its turns are restored, so
        follow-ups resolve); each with the deadline it had left."""
        now = time.perf_counter()
        for item in in_flight:
            if item.stage == "answered":
                self.request_span(item.answer(self.settings.span_deadline_s, now))
            elif self.retrieval is not None:
                self.retrieval.resume(item)
            else:
                self.emit(p.SpanDropped(t=self.assembler.stream_time, text="", question=item.question,
                                        reason="retrieval is off on this server", latency_ms=0.0))
        if in_flight:
            logger.info("session %s: %s in flight, going on here", self.id,
                        ", ".join(f"{item.trigger} {item.stage}" for item in in_flight))

    async def settle(self, code: int, reason: str) -> tuple[int, str]:
        """What becomes of the kept state as the session ends, before its slot is released; returns the close code
        and reason. A hand-over saves it last and puts the fresh resume token in the reason; a normal end (the
        client's 1000, the duration cap) drops it; anything else keeps it for the client to resume."""
        resumes = self.resumes
        if resumes is None:
            return code, reason
        if code == p.CLOSE_RESUME_ELSEWHERE:
            if await self.save():
                return code, p.close_reason("resume_elsewhere", resumes.token(self.id, self.user, resumes.ttl_s))
            return p.CLOSE_GOING_AWAY, p.close_reason("server_shutdown", "the server is shutting down")
        if code == p.CLOSE_NORMAL and self.client_close_code in (None, p.CLOSE_NORMAL):
            with contextlib.suppress(StoreUnavailable):
                await resumes.store.drop(self.id)
        return code, reason

    def _recording_links(self) -> dict[str, str]:
        name = self.recording_id
        query = f"?sig={self.signer.sign(name)}" if self.signer is not None else ""
        return {"wav": f"/api/recordings/{name}.wav{query}", "transcript": f"/api/recordings/{name}.jsonl{query}"}

    async def _wait_for_end(self) -> None:
        await self._end_requested.wait()
        raise SessionEnd(*self._end)

    async def _duration_loop(self) -> None:
        cap, warning = self.settings.max_session_s, self.settings.session_end_warning_s
        warn_at = max(0.0, cap - warning)
        await asyncio.sleep(warn_at)
        self.notify_ending("max_duration", cap - warn_at)
        await asyncio.sleep(cap - warn_at)
        raise SessionEnd(p.CLOSE_NORMAL, p.close_reason("max_duration", f"sessions last at most {cap:g} s"))

    def release(self) -> None:
        """Return the slot (a tick in flight finishes first on the worker) and finish the recording; never raises."""
        for outcome in self.batcher.close_spans(self.slot, "session closed"):
            self._emit_span(outcome)
        self._emit_stats()  # the last partial second, for the transcript

        # The recording is finished before the slot is free, so a free slot means nothing of this session is pending.
        if self.recording is not None:
            try:
                self.recording.close()
            except OSError:
                logger.exception("session %s: could not finish the recording", self.id)
        self.batcher.release(self.slot)
        asyncio.get_running_loop().run_in_executor(None, trim_heap)

    async def close(self, code: int, reason: str = "") -> None:
        if self.ws.application_state == WebSocketState.CONNECTED:
            with contextlib.suppress(Exception):
                await self.ws.close(code, reason)

    # receive -----------------------------------------------------------------------------------------------
    async def _receive_loop(self, early: list[Message]) -> None:
        """`early`: the messages read before the handshake, handled first."""
        for message in early:
            if not await self._on_message(message):
                return
        early.clear()  # up to `input_backlog_frames` messages of up to `max_message_bytes`: not kept all session
        while await self._on_message(await self.ws.receive()):
            pass

    async def _on_message(self, message: Message) -> bool:
        """Handles one ASGI message; False once the client has gone."""
        if message["type"] == "websocket.disconnect":
            self.client_close_code = message.get("code")
            return False
        if not self.limiter.allow():
            self.metrics.protocol_errors.labels("rate_limited").inc()
            raise SessionEnd(p.CLOSE_POLICY, p.close_reason(
                "rate_limited", f"over {self.settings.max_messages_per_s:g} messages a second"))
        try:
            for item in self.wire.inbound(message):
                await self._on_inbound(item)
                self.wire.accepted(item)
        except p.ProtocolError as exc:
            self._protocol_error(exc)
        return True

    async def _on_inbound(self, item: Inbound) -> None:
        if isinstance(item, AudioIn):
            self._on_audio(item.pcm)
        elif isinstance(item, ClearInput):
            self.assembler.clear()
        elif isinstance(item, CommitInput):
            if self.retrieval is not None:
                self.retrieval.commit()
        elif isinstance(item, p.SpanInject):
            self._inject_app_span(item)
        elif isinstance(item, p.ToolResult):
            self.client_tools.answer(item.call_id, item.output)
        elif isinstance(item, p.UserText):
            self._ask(item.text)
        else:
            await self._update(item)

    def _on_audio(self, pcm: np.ndarray) -> None:
        if pcm.size and not self._phase_set:
            self._set_phase(pcm.size)
        for frame in self.assembler.push(pcm):
            if self.leveller is not None:
                frame = replace(frame, pcm=self.leveller.process(frame.pcm))
            if len(self._frames) >= self.settings.input_backlog_frames:
                self._frames.popleft()
                self.input_dropped += 1
                self.metrics.frames_dropped.labels("input_backlog").inc()
            self._frames.append(frame)
            self._second.frames_in += 1
            if self.retrieval is not None:
                self.retrieval.feed(frame.pcm)
        self._frame_ready.set()

    def _set_phase(self, chunk: int) -> None:
        """On the first audio: silence ahead of it so that this session's frames end with the others' (phase_pad)."""
        self._phase_set = True
        until = self.batcher.until_grid_s(self.slot) if self.settings.align_phases else None
        pad = phase_pad(chunk, until) if until is not None else 0
        if pad:
            self.assembler.pad(pad)
            logger.info("session %s: %.0f ms of silence ahead of its audio, to end frames with the other sessions",
                        self.id, pad / SAMPLE_RATE * 1e3)

    def _inject_app_span(self, message: p.SpanInject) -> None:
        """App text becomes a span exactly as a retrieval answer does: same scrubber, cap, deadline and events.

        At most one a frame: one frame boundary injects one span, and building a block (normalising, tokenising)
        runs on the event loop, which a client sending 100 a second would otherwise keep busy."""
        if not self.app_spans:
            raise p.ProtocolError("app_spans_off", "this session does not accept span.inject (the server's "
                                  "app_spans setting; by default only sessions opened with a token may)")
        now = time.perf_counter()
        if now - self._last_app_span < FRAME_SAMPLES / SAMPLE_RATE:
            raise p.ProtocolError("span_rate_limited", "at most one span.inject a frame (80 ms)")
        self._last_app_span = now
        self.request_span(SpanAnswer(message.text, message.source or "app", "app", None, now, trigger="app"))

    async def _update(self, update: p.SessionUpdate) -> None:
        if update.persona is not None or update.voice is not None:
            if not self.wire.reprefills:
                raise p.ProtocolError(
                    "persona_locked", "persona and voice are prefilled before the handshake: pass them as the "
                    "`persona` and `voice` query parameters of /api/chat")
            self._change_persona(update)
        if update.tools is not None:
            self.client_tools.declare(update.tools)
        if update.profile is not None:
            self.options.profile = update.profile
        if update.notes is not None:
            self.options.notes = update.notes
        if self.backend is not None:
            self._store_profile(self.backend, update)
        if update.sampling is not None and self.sampling is not None:
            self.sampling = replace(self.sampling, **update.sampling.chosen())
            restart = update.sampling.text_seed is not None or update.sampling.audio_seed is not None
            await self.batcher.set_sampling(self.slot, self.sampling, restart)
        if self._reprefill:
            return  # reported once the new prefix is in
        self.emit(self._updated())

    def _updated(self, prefix_frames: int | None = None, prefill_s: float | None = None) -> p.SessionUpdated:
        return p.SessionUpdated(
            t=self.assembler.stream_time, profile=self.options.profile, notes=self.options.notes,
            sampling=p.Sampling(**asdict(self.sampling)) if self.sampling else None,
            tools=sorted(self.client_tools.declared) or None, prefix_frames=prefix_frames,
            prefill_ms=round(prefill_s * 1e3, 2) if prefill_s is not None else None)

    def _change_persona(self, update: p.SessionUpdate) -> None:
        """A new persona or voice is prefilled at the next frame boundary (the model's context starts again); the
        wire has checked them (a known voice, a persona within `max_persona_chars`)."""
        if update.persona is not None:
            self.options.persona = update.persona
        if update.voice is not None:
            self.options.voice = update.voice
        self._reprefill = True

    async def _prefill_again(self) -> None:
        """Between two frames of this session: the slot restarts with the new prefix and the sampling in effect."""
        self._reprefill = False
        try:
            _, _, prefix = await asyncio.to_thread(self._prefix)
        except PersonaError as exc:  # the session goes on with the prefix it has
            self.emit(p.ErrorEvent(t=self.assembler.stream_time, code="bad_persona", message=str(exc)))
            return
        prefill_s = await self.batcher.open(self.slot, prefix, self.sampling)
        self.emit(self._updated(prefix.frames if prefix else 0, prefill_s))

    def _protocol_error(self, exc: p.ProtocolError) -> None:
        """Report a bad message and go on: Moshi clients may send kinds this server does not use (Kyutai's
        server ignores them too). Only a stream of them closes the socket: that client is broken or hostile."""
        self.metrics.protocol_errors.labels(exc.code).inc()
        logger.info("session %s: %s (%s)", self.id, exc, exc.code)
        self.emit(p.ErrorEvent(t=self.assembler.stream_time, code=exc.code, message=str(exc)))
        if self.abuse.record():
            message = f"over {self.abuse.limit} bad messages in {self.abuse.window_s:g} s, last: {exc.code}"
            raise SessionEnd(p.abuse_close_code(exc.code), p.close_reason("too_many_errors", message))

    # frames ------------------------------------------------------------------------------------------------
    async def _frame_loop(self) -> None:
        while True:
            while not self._frames:
                self._frame_ready.clear()
                await self._frame_ready.wait()
            if self._reprefill:
                await self._prefill_again()
            frame = self._frames.popleft()
            self._on_output(await self.batcher.step(self.slot, frame))

    def _on_output(self, out: FrameOutput) -> None:
        latency = time.perf_counter() - out.frame.arrived
        self.metrics.step_latency.observe(out.compute_s)
        self.metrics.frame_latency.observe(latency)
        second = self._second
        second.latencies_ms.append(round(latency * 1e3, 2))
        if latency * 1e3 > self.settings.deadline_ms:
            second.deadline_misses += 1
            self.metrics.deadline_misses.inc()
        t = (out.frame.index + 1) * FRAME_SAMPLES / SAMPLE_RATE
        for outcome in out.spans:
            self._emit_span(outcome)
        if out.agent_pcm is not None:
            if not self.wire.audio(out.agent_pcm):
                self.metrics.frames_dropped.labels("slow_client").inc()
            second.frames_out += 1
        if out.frame.index == self.settings.force_ret_frame:
            self._retrieve(out.frame.index, t)
        if out.text_token is not None:
            self._on_text_token(out.text_token, out.frame.index, t)
        if self.recording is not None:
            agent = out.agent_pcm if out.agent_pcm is not None else np.zeros(FRAME_SAMPLES, np.float32)
            self.recording.wav.write(out.frame.pcm, agent)

    def _on_text_token(self, token: int, frame: int, t: float) -> None:
        span = self.model.span
        if token == span.ret_id:
            self._retrieve(frame, t)
            return
        piece = self.model.agent_text.piece(token)
        if piece is None:
            return
        self.wire.agent_text(piece)
        self.emit(p.AgentText(t=t, text=piece, frame=frame))
        if self.retrieval is not None:
            self.retrieval.on_agent_text(piece)

    # retrieval ---------------------------------------------------------------------------------------------
    def _retrieve(self, frame: int, t: float) -> None:
        self.emit(p.Retrieval(t=t, frame=frame))
        if self.retrieval is None:
            self.emit(p.SpanDropped(t=t, text="", reason="retrieval is off on this server", latency_ms=0.0))
            return
        self.retrieval.trigger()

    def _ask(self, text: str) -> None:
        """A typed user turn is answered as a spoken question would be: by the backend, as a span."""
        if self.retrieval is None:
            self.emit(p.SpanDropped(t=self.assembler.stream_time, text="", question=text,
                                    reason="retrieval is off on this server", latency_ms=0.0))
            return
        self.retrieval.ask(text)

    def _on_backend_error(self, exc: Exception) -> None:
        self.emit(p.ErrorEvent(t=self.assembler.stream_time, code="asr_failed", message=f"{type(exc).__name__}: {exc}"))

    def _store_profile(self, backend: Backend, update: p.SessionUpdate) -> None:
        """Profile and notes go to the context store; the agent is rebuilt for the user's timezone."""
        store = backend.store
        if update.profile is not None:
            known = store.get_profile(self.user_id)
            changes = {k: v for k, v in update.profile.model_dump().items() if v is not None}
            try:
                store.save_profile(Profile.model_validate(known.model_dump() | changes))
            except ValueError as exc:
                raise p.ProtocolError("bad_profile", str(exc)) from exc
        if update.notes:
            store.add_note(self.user_id, update.notes)
        self._rebuild_agent(backend)

    def _rebuild_agent(self, backend: Backend) -> None:
        """The agent for the user's profile (its timezone) with the client tools declared."""
        if self.retrieval is not None:
            self.retrieval.agent = backend.agent_for(backend.store.get_profile(self.user_id),
                                                     self.client_tools.catalogue())

    def _emit_span(self, outcome: SpanOutcome) -> None:
        event = span_event(outcome, self.assembler.stream_time)
        self.metrics.span_injections.labels("injected" if outcome.injected else "dropped").inc()
        if outcome.injected:
            self.metrics.span_latency.observe(event.latency_ms / 1e3)
            self._spans_told.append(outcome.text)
        self.emit(event)

    # send and stats ----------------------------------------------------------------------------------------
    async def _send_loop(self) -> None:
        while True:
            item = await self.outbound.get()
            if isinstance(item.data, str):
                await self.ws.send_text(item.data)
            else:
                await self.ws.send_bytes(item.data)

    async def _stats_loop(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            self._emit_stats()
            if self.recording is not None:
                self.recording.tick()

    def _emit_stats(self) -> None:
        second, self._second = self._second, _SecondStats()
        self.emit(p.Stats(
            t=self.assembler.stream_time, frames_in=second.frames_in, frames_out=second.frames_out,
            latency_ms=second.latencies_ms, deadline_misses=second.deadline_misses,
            audio_dropped=self.outbound.audio_dropped, input_dropped=self.input_dropped,
            send_queue=len(self.outbound),
        ))

