"""The `<ret>` -> span loop of one session: ASR feeds the context store; a trigger picks the question, asks the
agent and hands the answer to the session for injection at the next frame boundary. Never blocks the frame clock.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
from opentelemetry import trace
from opentelemetry.trace import StatusCode

from backend_agent.agent import Agent
from backend_agent.answer import Outcome
from backend_agent.asr.streaming import SpeechEdge, StreamingASR, Transcript
from backend_agent.context_store import ContextStore
from backend_agent.question import is_question
from backend_agent.request import Answered, Request, last_words
from backend_agent.router import request_text
from backend_agent.tools.base import ToolResult
from frontend_model.span.contract import SpanContract
from server.session.trigger import Trigger
from server.wire import protocol as p

logger = logging.getLogger(__name__)
tracer = trace.get_tracer("contextspan.server")
LATE_MARGIN_S = 0.25
Origin = Literal["ret", "asr", "typed", "app"]  # what asked for a span: the model's `<ret>`, a question heard, a typed
# question, an app's `span.inject`
Stage = Literal["hearing", "heard", "asked", "answered"]


@dataclass(frozen=True)
class SpanAnswer:
    """What becomes a span, with what the span events report about how it came to be; it travels whole from the
    retrieval (or an app's `span.inject`) to the span's outcome. `outcome` says where the text came from: a tool
    ("tool"), the LLM's own words ("llm"), or the checkpoint's abstain span (`SpanContract.abstain_text`) when a tool
    ran and found nothing ("empty") or nothing could answer ("none")."""

    text: str
    source: str
    tool: str
    question: str | None  # None for an app's span
    triggered: float  # time.perf_counter() of the `<ret>` (or the question, in asr mode; the request, for an app)
    timings_ms: dict[str, float] = field(default_factory=dict)
    outcome: Outcome = "tool"
    # time.perf_counter() the span deadline counts from when not `triggered`: the end of the question a `<ret>` heard
    # while the user spoke waited for, or when the agent returned the answer of a tool with a deadline of its own
    # (a client's tool), which that wait may have passed.
    waited_until: float | None = None
    trigger: Origin = "ret"

    @property
    def deadline_from(self) -> float:
        """When the span deadline starts."""
        return self.waited_until if self.waited_until is not None else self.triggered


@dataclass(frozen=True)
class InFlight:
    """A retrieval its session had not finished when it saved, as plain data another replica goes on with.

    `stage`: `hearing`, the user was still asking (`question` is what was heard of it so far, partials included);
    `heard`, the question was final but not yet put to the backend; `asked`, put to the backend (its `question` event
    sent) with no answer yet; `answered`, the answer (`text`, `source`, `tool`, `outcome`) waits for a frame
    boundary. Times are the conversation's, which stands still while no replica runs the session: the deadline left
    at the save counts again from the resume, and latencies go on from `elapsed_s`."""

    stage: Stage
    trigger: Origin
    question: str | None
    elapsed_s: float  # from the trigger to the save
    deadline_left_s: float | None  # None while the user was still asking: the deadline starts when they stop
    text: str | None = None
    source: str | None = None
    tool: str | None = None
    outcome: Outcome = "tool"
    timings_ms: dict[str, float] = field(default_factory=dict)

    @classmethod
    def of_answer(cls, answer: SpanAnswer, deadline_s: float, now: float) -> InFlight:
        """An answer received, not yet injected, at `now` (perf_counter)."""
        return cls("answered", answer.trigger, answer.question, now - answer.triggered,
                   deadline_s - (now - answer.deadline_from), answer.text, answer.source, answer.tool, answer.outcome,
                   dict(answer.timings_ms))

    def answer(self, deadline_s: float, now: float) -> SpanAnswer:
        """An `answered` item's span again, resumed at `now` (perf_counter): the deadline left and the latency go
        on from there."""
        left = deadline_s if self.deadline_left_s is None else self.deadline_left_s
        return SpanAnswer(self.text or "", self.source or "", self.tool or "", self.question, now - self.elapsed_s,
                          dict(self.timings_ms), self.outcome, now - (deadline_s - left), self.trigger)


@dataclass
class RetrievalConfig:
    deadline_s: float = 2.5
    question_wait_s: float = 3.0
    recent_audio_s: float = 10.0
    fresh_final_s: float = 10.0
    trigger: Trigger = "ret"  # the model's token, or a question in a final transcript (see server/session/trigger.py)
    context_turns: int = 12
    context_chars: int = 2000
    answered_kept: int = 5  # answered requests the agent sees (follow-ups, "that")
    contract: SpanContract = field(default_factory=SpanContract)  # the model's: tool prefix, abstain span


class _Bound:
    """A retrieval's time bound: the span deadline, counted from the `<ret>` or from the end of the question it
    waited for, reaching past a tool's own deadline once the agent calls one."""

    def __init__(self, timeout: asyncio.Timeout, deadline_s: float, start: float) -> None:
        self.timeout = timeout
        self.deadline_s = deadline_s
        self.reached = False
        self.held = False
        self.restart(start)

    def hold(self) -> None:
        """No deadline while the user is still asking: the question's end will start it."""
        self.held = True
        self.timeout.reschedule(None)

    def restart(self, start: float) -> None:
        """The span deadline counts from `start` (perf_counter): the `<ret>`, or the end of the question it waited
        for."""
        self.start = start
        self.held = False
        loop = asyncio.get_running_loop()
        self.timeout.reschedule(loop.time() + self.deadline_s + LATE_MARGIN_S - (time.perf_counter() - start))

    def remaining(self, now: float | None = None) -> float:
        return self.deadline_s - ((time.perf_counter() if now is None else now) - self.start)

    def reach(self, seconds: float) -> None:
        """The agent called a tool with `seconds` of its own: the bound reaches past them (never nearer), by the
        margin that lets the agent's reason win."""
        when = asyncio.get_running_loop().time() + seconds + LATE_MARGIN_S
        self.timeout.reschedule(max(when, self.timeout.when() or when))
        self.reached = True


@dataclass
class _Flight:
    """The retrieval going on, as far as it got: what `Retrieval.unfinished` saves."""

    trigger: Origin
    triggered: float  # perf_counter
    stage: Stage
    question: str | None  # once heard (or typed); while `hearing`, what other replicas heard of it
    bound: _Bound | None = None  # from the task's start


class Retrieval:
    """One retrieval in flight at a time; a late, empty or failed answer is reported, never injected."""

    def __init__(
        self,
        session_id: str,
        user_id: str,
        agent: Agent,
        store: ContextStore,
        asr: StreamingASR | None,
        on_answer: Callable[[SpanAnswer], None],
        emit: Callable[[Any], None],
        stream_time: Callable[[], float],
        config: RetrievalConfig | None = None,
    ) -> None:
        self.session_id = session_id
        self.user_id = user_id
        self.agent = agent
        self.store = store
        self.asr = asr
        self.on_answer = on_answer
        self.emit = emit
        self.stream_time = stream_time
        self.config = config or RetrievalConfig()
        self._task: asyncio.Task[None] | None = None
        self._last_question_at = 0.0
        self._agent_pieces: list[str] = []
        self._asked: str | None = None  # a typed question, or asr mode's final, for the retrieval just started
        self._partial = ""  # the latest partial transcript of the utterance going on
        self._flight: _Flight | None = None
        self._stopped = asyncio.Event()  # the user stopped speaking (set by `on_speech`)
        self._stopped_at = 0.0  # time.perf_counter() when they did

    def feed(self, pcm: np.ndarray) -> None:
        if self.asr is not None:
            self.asr.feed(pcm)

    def commit(self) -> None:
        """The client says the user is done (push to talk): the utterance going on ends without waiting for silence."""
        if self.asr is not None:
            self.asr.commit()

    def on_speech(self, edge: SpeechEdge) -> None:
        """ASR callback (event loop): the user started or stopped speaking."""
        if not edge.started:
            self._stopped_at = time.perf_counter()
            self._stopped.set()
        self.emit(p.UserSpeech(t=self.stream_time(), state="started" if edge.started else "stopped", at=edge.at_s))

    def on_transcript(self, transcript: Transcript) -> None:
        """ASR callback (event loop): report it, remember finals, and in asr mode treat questions as triggers."""
        self.emit(p.UserTranscript(t=self.stream_time(), text=transcript.text, final=transcript.final,
                                   start=transcript.start_s, end=transcript.end_s))
        if not transcript.final:
            self._partial = transcript.text
            return
        self._partial = ""
        self._flush_agent_turn()
        self.store.add_turn(self.user_id, self.session_id, "user", transcript.text)
        if self.config.trigger == "asr" and is_question(transcript.text):
            if not self.in_flight:
                self._asked = transcript.text  # the question is this final, whatever the user says next
            self.trigger("asr")

    def on_agent_text(self, piece: str) -> None:
        """The model speaks a text piece a frame: pieces gather into one agent turn, stored when the user speaks."""
        self._agent_pieces.append(piece)

    def _flush_agent_turn(self) -> None:
        text = "".join(self._agent_pieces).strip()
        self._agent_pieces.clear()
        if text:
            self.store.add_turn(self.user_id, self.session_id, "agent", text)

    @property
    def in_flight(self) -> bool:
        return self._task is not None and not self._task.done()

    def trigger(self, origin: Origin = "ret") -> bool:
        """Start a retrieval now; False (and a span-dropped event) if one is already in flight."""
        triggered = time.perf_counter()
        if self.in_flight:
            self.emit(p.SpanDropped(t=self.stream_time(), text="", reason="a retrieval is already in flight",
                                    latency_ms=0.0))
            return False
        stage: Stage = "heard" if self._asked is not None else "hearing"
        self._start(_Flight(origin, triggered, stage, self._asked), triggered)
        return True

    def resume(self, item: InFlight) -> None:
        """Go on with a retrieval another replica had in flight (not an `answered` one: its span goes straight to
        the batcher): the deadline left counts from now; a question heard is asked again (its `question` event not
        sent twice), one the user was still asking waits for the rest of it (`_rest_of`)."""
        now = time.perf_counter()
        left = self.config.deadline_s if item.deadline_left_s is None else item.deadline_left_s
        if item.stage != "hearing":
            self._asked = item.question or ""
        self._start(_Flight(item.trigger, now - item.elapsed_s, item.stage, item.question),
                    now - (self.config.deadline_s - left))

    def unfinished(self, now: float) -> InFlight | None:
        """The retrieval going on at `now` (perf_counter) as plain data, for a resume elsewhere; None when idle."""
        flight = self._flight
        if flight is None:
            return None
        bound = flight.bound
        if bound is None:  # its task has not started yet
            left: float | None = self.config.deadline_s - (now - flight.triggered)
        else:
            left = None if bound.held else bound.remaining(now)
        question = flight.question
        if flight.stage == "hearing":
            question = " ".join(text for text in (flight.question, self._partial) if text)
        return InFlight(flight.stage, flight.trigger, question, now - flight.triggered, left)

    def _start(self, flight: _Flight, deadline_from: float) -> None:
        self._flight = flight
        self._task = asyncio.get_running_loop().create_task(self._retrieve(flight, deadline_from), name="retrieval")

    def ask(self, text: str) -> bool:
        """A typed user turn: stored as the user's, as a final transcript is, and the question of a retrieval started
        now (there is no speech to wait on); False (and a span-dropped event) if one is already in flight."""
        self._flush_agent_turn()
        self.store.add_turn(self.user_id, self.session_id, "user", text)
        if not self.in_flight:
            self._asked = text
        return self.trigger("typed")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        asr, self.asr = self.asr, None  # its transcript callback leads back here: a cycle, once closed
        if asr is not None:
            await asr.close()
        if self.user_id == self.session_id:
            # Anonymous: nothing can ask for this history again (the session's transcript file keeps it), and a
            # server that took every anonymous session's turns to the grave grew without bound.
            self.store.forget_user(self.user_id)
        else:
            self._flush_agent_turn()

    async def _retrieve(self, flight: _Flight, deadline_from: float) -> None:
        try:
            with tracer.start_as_current_span("retrieval", attributes={"session_id": self.session_id}):
                await self._retrieve_traced(flight, deadline_from)
        finally:
            self._flight = None

    async def _retrieve_traced(self, flight: _Flight, deadline_from: float) -> None:
        """Bounded by the span deadline as a whole: a slow ASR or LLM ends in a prompt `span.dropped`, not in an
        answer that arrives (and is dropped) seconds later, or never. The agent times its own calls to the same
        deadline and names what was slow; the margin lets its reason win. A client's tool has a deadline of its own,
        counted from its call: the bound then reaches past it."""
        timings: dict[str, float] = {}
        deadline_s = self.config.deadline_s
        triggered = flight.triggered
        try:
            async with asyncio.timeout(None) as timeout:
                flight.bound = _Bound(timeout, deadline_s, deadline_from)
                await self._answer(flight, timings, flight.bound)
        except TimeoutError:
            self._dropped(f"late: no answer within {deadline_s:g} s of the request", triggered, timings,
                          flight.question if flight.stage == "asked" else None)

    async def _answer(self, flight: _Flight, timings: dict[str, float], bound: _Bound) -> None:
        triggered = flight.triggered
        try:
            started = time.perf_counter()
            with tracer.start_as_current_span("question"):
                question, asr_ms = await self._pick_question(flight, bound)
            timings["question_ms"] = (time.perf_counter() - started) * 1e3
            if asr_ms:
                timings["asr_ms"] = asr_ms
            if not question:
                self._dropped("no question heard", triggered, timings)
                return
            self._last_question_at = time.monotonic()
            if flight.stage != "asked":  # a question asked on another replica was told there
                self.emit(p.Question(t=self.stream_time(), text=question))
            flight.stage, flight.question = "asked", question
            context = self.store.working_context(self.user_id, self.session_id, self.config.context_turns,
                                                 self.config.context_chars)
            remaining = bound.remaining()
            if remaining <= 0:
                raise TimeoutError
            request = self._request(question)
            result = await self.agent.answer(question, context, remaining, request, bound.reach)
            waited_until = time.perf_counter() if bound.reached else (bound.start if bound.start > triggered else None)
            timings.update(result.timings_ms)
            contract = self.config.contract
            if result.answer is None:
                asked = is_question(question)
                if contract.abstain_text and result.outcome in ("empty", "none") and asked:
                    # A model trained with an abstain span says it does not know, instead of making something up;
                    # to a statement ("I had a long day."), a `<ret>` in chatter, it says nothing of the kind.
                    self.on_answer(SpanAnswer(contract.abstain_text, result.reason or "nothing found", "abstain",
                                              question, triggered, timings, result.outcome, waited_until,
                                              flight.trigger))
                    return
                reason = result.reason or "no answer"
                self._dropped(reason if asked else f"nothing asked ({reason})", triggered, timings, question)
                return
            answer = result.answer
            self.store.record_tool_result(self.user_id, self.session_id, answer.tool, answer.arguments,
                                          ToolResult(answer.text, answer.source), request_text(request))
            self.on_answer(SpanAnswer(contract.span_text(answer.text, answer.outcome == "tool"), answer.source,
                                      answer.tool, question, triggered, timings, answer.outcome, waited_until,
                                      flight.trigger))
        except (asyncio.CancelledError, TimeoutError):
            raise
        except Exception as exc:  # the backend failing must cost one span, never the session
            logger.exception("retrieval failed in session %s", self.session_id)
            self._dropped(f"backend error: {type(exc).__name__}: {exc}", triggered, timings)

    def _request(self, question: str) -> Request:
        """The request with the reference router's semantics, from the store: the user's turns since the last
        answered request (the picked question last), the agent's last words since the user's last turn (those still
        being spoken included), the answered history, the profile's place."""
        turns = self.store.turns(self.session_id, limit=self.config.context_turns)
        tools = [i for i, turn in enumerate(turns) if turn.role == "tool"]
        since = turns[tools[-1] + 1:] if tools else turns
        utterances = [turn.text for turn in since if turn.role == "user"]
        if question and (not utterances or utterances[-1] != question):
            utterances.append(question)
        users = [i for i, turn in enumerate(since) if turn.role == "user"]
        spoken = [turn.text for turn in since[users[-1] + 1 if users else 0:] if turn.role == "agent"]
        agent_words = last_words(" ".join([*spoken, "".join(self._agent_pieces)]))
        answered = tuple(Answered(r.question, r.tool, r.arguments, r.text)
                         for r in self.store.tool_results(self.session_id, self.config.answered_kept))
        location = self.store.get_profile(self.user_id).location
        return Request(tuple(utterances), agent_words, answered, location)

    async def _pick_question(self, flight: _Flight, bound: _Bound) -> tuple[str, float]:
        """The question typed (`ask`), in asr mode the final that started the retrieval, or the one a resumed
        retrieval was asking; else, when the user is speaking or being transcribed, that utterance's final (a model
        asks before the question ends: an older finished utterance is not the question); else a fresh final
        utterance; else transcribe the last seconds heard (a second `<ret>` with no new utterance hears the old
        question again); else, when those seconds hold no speech, the last question answered."""
        if self._asked is not None:
            asked, self._asked = self._asked, None
            return asked, 0.0
        if flight.question is not None:  # resumed while the user was still asking
            return await self._rest_of(flight.question, bound), 0.0
        if self.asr is None:
            return "", 0.0
        if self.asr.awaiting_final:
            if await self._question_ended(bound):
                # Its final, or (a busy loop woke this task late) the final that came meanwhile.
                final = await self.asr.next_final() or self._fresh_final()
                if final is not None:
                    return final.text, 0.0
        else:
            fresh = self._fresh_final()
            if fresh is not None:
                return fresh.text, 0.0
        started = time.perf_counter()
        text = await self.asr.transcribe_recent(self.config.recent_audio_s)
        if not text.strip():
            answered = self.store.tool_results(self.session_id, 1)
            text = answered[0].question if answered else text
        return text, (time.perf_counter() - started) * 1e3

    async def _rest_of(self, heard: str, bound: _Bound) -> str:
        """A question the user was still asking when the session moved to this replica: what the other one heard,
        then the rest (this replica's next final) if the user stops within `question_wait_s`; the deadline counts
        from when they stop, or from the end of the wait."""
        if self.asr is None:
            return heard
        bound.hold()
        self._stopped.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopped.wait(), self.config.question_wait_s)
        ended = self._stopped.is_set()
        bound.restart(self._stopped_at if ended else time.perf_counter())
        rest = (await self.asr.next_final() or self._fresh_final()) if ended else None
        return " ".join(text for text in (heard, rest.text if rest is not None else "") if text)

    async def _question_ended(self, bound: _Bound) -> bool:
        """Wait up to `question_wait_s` for a user still speaking to stop; the span deadline then counts from when
        they stopped (a person answers a question once it is finished). False: still speaking, the deadline counts
        from now and the last seconds heard are the question."""
        assert self.asr is not None
        if not self.asr.in_speech:
            return True
        bound.hold()
        self._stopped.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopped.wait(), self.config.question_wait_s)
        ended = not self.asr.in_speech
        bound.restart(max(self._stopped_at, bound.start) if ended else time.perf_counter())
        return ended

    def _fresh_final(self) -> Transcript | None:
        final = self.asr.latest_final if self.asr is not None else None
        if final is None or final.at <= self._last_question_at:
            return None
        if time.monotonic() - final.at > self.config.fresh_final_s:
            return None
        return final

    def _dropped(self, reason: str, triggered: float, timings: dict[str, float], question: str | None = None) -> None:
        trace.get_current_span().set_status(StatusCode.ERROR, reason)
        latency = round((time.perf_counter() - triggered) * 1e3, 2)
        self.emit(p.SpanDropped(t=self.stream_time(), text="", question=question, reason=reason, latency_ms=latency,
                                timings_ms=timings))
