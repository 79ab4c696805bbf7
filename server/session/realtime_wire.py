"""`/v1/realtime`: the OpenAI Realtime protocol over the same session as `/api/chat`.

A full-duplex model listens and speaks at once and decides itself when to speak, so the request/response shape of
the Realtime API maps onto it like this. The input buffer streams into the model as it arrives (80 ms frames; commit
ends the utterance, clear is answered; turns are the model's own). The model's output never stops either: every frame
goes out as one `response.output_audio.delta`, silence included, at the frame clock. So a response is always open,
and a delta never comes outside one (LiveKit's plugin asserts that): the first opens with the session; once the agent
has spoken and then been silent for `TURN_END_FRAMES`, the open response is done (its turn has ended) and the next
one opens at once. One response is the silence before an agent turn and that turn; a turn longer than
`MAX_RESPONSE_FRAMES` goes on in the next response. `response.create` makes nothing up: at the next frame the open
response is done and one carrying the request's metadata opens, which the agent's next turn fills (LiveKit waits for
that `response.created`). `response.cancel` ends the open response as cancelled; the rest of that speech is not sent,
and the next response opens at the agent's first silent frame. A client tool call is a `function_call` item that ends
the open response, and the client's turn begins: a client runs its tools once the response is done and its speech
played, then sends the output and `response.create` (LiveKit's AgentSession sends the output only once no response
is open: "most realtime models don't support generating multiple responses at the same time"). So no response opens
until the output is in and `response.create` comes; the agent's frames from the output on are held and open the
next response, at `response.create` or `OUTPUT_WAIT_FRAMES` after the output (a client that never asks, as a
Pipecat pipeline without its aggregators); what the agent said before the output (filler while the tool ran) is not
sent. A call whose output never comes ends the wait at the client tool deadline. `usage` counts 80 ms frames as
tokens.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
from pydantic import BaseModel
from starlette.types import Message

from frontend_model.frame import FRAME_S, FRAME_SAMPLES
from server.session.wire import AudioIn, ClearInput, CommitInput, Inbound
from server.wire import protocol as p
from server.wire import realtime as rt
from server.wire.outbound import MessageKind, OutboundQueue, Outgoing

logger = logging.getLogger(__name__)

# An agent frame quieter than this (about -50 dBFS RMS) is silence; after this many silent frames in a row, the
# agent's next sound starts its next turn.
SILENCE_RMS = 10 ** (-50 / 20)
TURN_END_FRAMES = 10
# A response the agent speaks in for this long (30 s) without pausing is done, and its turn goes on in the next: a
# client waits for `response.done` (Pipecat's end of an LLM response, LiveKit's generation).
MAX_RESPONSE_FRAMES = 375
# After a client tool's output is in, the agent's frames are held this long (1 s) for the client's `response.create`.
OUTPUT_WAIT_FRAMES = 13
# What a full-duplex model does not take from `session.update`, and why: reported in `session.updated`.
NOT_HONOURED = {
    "turn_detection": "the model hears and speaks at once and takes turns itself; speech_started / speech_stopped "
                      "come from the server's own VAD, which is not configurable",
    "max_output_tokens": "the model speaks until it stops; a turn has no token budget",
    "max_response_output_tokens": "the model speaks until it stops; a turn has no token budget",
    "tool_choice": "the backend's LLM chooses tools with the server's llm_tool_choice",
    "transcription": "user speech is transcribed by the server's Whisper (faster-whisper), always",
    "input_audio_transcription": "user speech is transcribed by the server's Whisper (faster-whisper), always",
    "noise_reduction": "not available: the model hears the audio as sent",
    "speed": "the model speaks at its own pace",
    "output_modalities": "the agent always speaks: audio with its transcript",
    "modalities": "the agent always speaks: audio with its transcript",
    "output_format": "agent audio is always PCM16 24 kHz",
}
# The session's conditions that are no fault of the client's event: never `error` (Pipecat ends its session on most
# errors). A failed ASR is the protocol's own `...input_audio_transcription.failed`; the rest are logged.
NOT_THE_CLIENTS_FAULT = frozenset({"asr_failed", "tool_result_late", "app_spans_off", "span_rate_limited"})
# OpenAI's own words: LiveKit's AgentSession cancels on every interruption, open response or not, and ignores this
# error by its message (Pipecat by its code); in other words it is logged as the server's error.
CANCEL_NOT_ACTIVE = "Cancellation failed: no active response found"
SESSION_ID_PREFIX = "sess_"  # OpenAI's, before the session's own id (the one its logs and context store name)


@dataclass
class _Response:
    """The open response: one agent turn and the silence after it."""

    id: str
    item_id: str  # its assistant message, output 0
    metadata: dict[str, str] | None
    transcript: list[str] = field(default_factory=list)
    calls: list[rt.FunctionCallItem] = field(default_factory=list)  # client tool calls, outputs 1, 2, ...
    spoke: bool = False  # the agent has been heard in it
    frames: int = 0  # agent frames sent in it
    heard: int = 0  # user audio samples received while it was open


@dataclass
class _ToolWait:
    """The client's turn after its tool calls: from the calls until their outputs and its `response.create`."""

    calls: set[str]  # call ids whose output the client owes
    frames_left: int  # until the client tool deadline
    held: list[np.ndarray | str] = field(default_factory=list)  # agent frames and text since the outputs came in

    @property
    def answered(self) -> bool:
        return not self.calls


@dataclass
class _Config:
    """What the session runs with, as `session.created` and `.updated` report it."""

    instructions: str = ""
    voice: str | None = None
    tools: list[rt.FunctionTool] = field(default_factory=list)
    temperature: float | None = None


class _Saved(BaseModel):
    """`RealtimeWire.saved()` as a resume state brings it back."""

    temperature: float | None = None
    tools: list[rt.FunctionTool] = []


def is_silent(pcm: np.ndarray) -> bool:
    return float(np.sqrt(np.mean(np.square(pcm, dtype=np.float64)))) < SILENCE_RMS if pcm.size else True


class RealtimeWire:
    """Translates between Realtime events and the session; holds the response and item state the protocol needs."""

    protocol = "realtime"
    reprefills = True

    def __init__(self, outbound: OutboundQueue, dialect: rt.Dialect, model: str, voices: list[str],
                 max_persona_chars: int = 2000, client_tool_deadline_s: float = 10.0) -> None:
        """`model`: what `session.created` names; `voices`: the served model's voice prompts;
        `client_tool_deadline_s`: the longest a client's turn after a tool call lasts without its output."""
        self.outbound = outbound
        self.dialect = dialect
        self.model = model
        self.voices = voices
        self.max_persona_chars = max_persona_chars
        self.tool_wait_frames = max(1, round(client_tool_deadline_s / FRAME_S))
        self.session_id = ""  # named at session.ready after the session's own id, which a resume keeps
        self._audio_part: Literal["output_audio", "audio"] = "output_audio" if dialect == "ga" else "audio"
        self._response: _Response | None = None  # None before the session is ready, after a cancel or a tool call
        self._tool_wait: _ToolWait | None = None
        self._quiet = 0  # silent agent frames in a row
        self._requested: dict[str, str] | None = None  # metadata of a response.create, for the next response
        self._create_pending = False  # a response.create not yet answered: at the next frame
        self._ready = False
        self._last_item: str | None = None
        self._user_item: str | None = None
        self._user_partial = ""  # what the transcription deltas of the user item add up to
        self._failed: rt.RealtimeError | None = None
        self._event_id: str | None = None  # the client event being handled, for errors the session finds in it
        self._items: dict[str, rt.ConversationItem] = {}  # for conversation.item.retrieve
        self._taking: tuple[Inbound, rt.MessageItem] | None = None  # a message item, until the session takes it
        self._config = _Config()

    # out ----------------------------------------------------------------------------------------------------
    def _send(self, event: rt.ServerEvent, kind: MessageKind = "text") -> bool:
        text = rt.encode_event(event, self.dialect)
        return True if text is None else self.outbound.put(Outgoing(kind, text))

    def handshake(self) -> bytes | None:
        return None

    def audio(self, pcm: np.ndarray) -> bool:
        if self._create_pending:
            self._close_response("completed")
            self._open_response()
        silent = is_silent(pcm)
        if silent:
            self._quiet += 1
        else:
            self._heard()
        wait = self._tool_wait
        if wait is not None:
            wait.frames_left -= 1
            if wait.answered or wait.frames_left <= 0:
                wait.held.append(pcm)
            if wait.frames_left > 0 and len(wait.held) < OUTPUT_WAIT_FRAMES:
                return True  # the client's turn
            return self._open_response()  # the held frames, this one last, go out in it
        if self._response is None and silent and self._ready:
            self._open_response()  # the agent paused after a cancel
        response = self._response
        if response is None:
            return True  # the rest of a cancelled turn
        sent = self._delta(response, pcm)
        if response.spoke and (self._quiet == TURN_END_FRAMES or response.frames >= MAX_RESPONSE_FRAMES):
            self._close_response("completed")
            self._open_response()
        return sent

    def _delta(self, response: _Response, pcm: np.ndarray) -> bool:
        response.frames += 1
        return self._send(rt.ResponseOutputAudioDelta(response_id=response.id, item_id=response.item_id,
                                                      delta=rt.encode_audio(pcm)), "audio")

    def agent_text(self, piece: str) -> None:
        self._heard()
        if self._tool_wait is not None:
            if self._tool_wait.answered:
                self._tool_wait.held.append(piece)
            return
        response = self._response
        if response is None:
            return
        self._text(response, piece)

    def _text(self, response: _Response, piece: str) -> None:
        response.transcript.append(piece)
        self._send(rt.ResponseOutputAudioTranscriptDelta(response_id=response.id, item_id=response.item_id,
                                                         delta=piece))

    def _heard(self) -> None:
        """The agent makes itself heard (an audible frame or a text piece)."""
        self._quiet = 0
        if self._response is not None:
            self._response.spoke = True

    def _open_response(self) -> bool:
        """A response opens, with what the agent said while the client's turn ended; False where the send queue
        refused a frame of it."""
        response = self._response = _Response(rt.new_id("resp"), rt.new_id("item"), self._requested)
        self._requested, self._create_pending = None, False
        wait, self._tool_wait = self._tool_wait, None
        self._send(rt.ResponseCreated(response=rt.Response(id=response.id, status="in_progress",
                                                           metadata=response.metadata)))
        item = rt.MessageItem(id=response.item_id, role="assistant", status="in_progress", content=[])
        self._send(rt.ResponseOutputItemAdded(response_id=response.id, output_index=0, item=item))
        self._add_item(item)
        self._send(rt.ResponseContentPartAdded(response_id=response.id, item_id=response.item_id,
                                               part=rt.AudioPart(transcript="")))
        sent = True
        for held in wait.held if wait is not None else []:
            if isinstance(held, str):
                self._text(response, held)
            else:
                sent = self._delta(response, held) and sent
        return sent

    def _close_response(self, status: Literal["completed", "cancelled"],
                        details: rt.CancelledDetails | None = None) -> None:
        response, self._response = self._response, None
        if response is None:
            return
        transcript = "".join(response.transcript)
        self._send(rt.ResponseOutputAudioDone(response_id=response.id, item_id=response.item_id))
        self._send(rt.ResponseOutputAudioTranscriptDone(response_id=response.id, item_id=response.item_id,
                                                        transcript=transcript))
        self._send(rt.ResponseContentPartDone(response_id=response.id, item_id=response.item_id,
                                              part=rt.AudioPart(transcript=transcript)))
        item = rt.MessageItem(id=response.item_id, role="assistant",
                              status="completed" if status == "completed" else "incomplete",
                              content=[rt.AudioPart(type=self._audio_part, transcript=transcript)])
        self._send(rt.ResponseOutputItemDone(response_id=response.id, output_index=0, item=item))
        self._item_done(item)
        usage = rt.Usage.of(agent_frames=response.frames, text_pieces=len(response.transcript),
                            user_frames=round(response.heard / FRAME_SAMPLES))
        self._send(rt.ResponseDone(response=rt.Response(id=response.id, status=status, status_details=details,
                                                        output=[item, *response.calls], usage=usage,
                                                        metadata=response.metadata)))

    def _add_item(self, item: rt.ConversationItem) -> None:
        self._items[item.id] = item
        self._send(rt.ConversationItemAdded(previous_item_id=self._last_item, item=item))
        self._last_item = item.id

    def _item_done(self, item: rt.ConversationItem) -> None:
        self._items[item.id] = item
        self._send(rt.ConversationItemDone(item=item))

    def _tool_call(self, call: p.ToolCall) -> None:
        """A client tool call: a `function_call` item that ends the open response (after a cancel, or in the
        client's turn after another call, a response of its own); the client's turn lasts until its outputs and
        `response.create`."""
        response = self._response
        if response is None:
            response_id, output_index = rt.new_id("resp"), 0
            self._send(rt.ResponseCreated(response=rt.Response(id=response_id, status="in_progress")))
        else:
            response_id, output_index = response.id, 1 + len(response.calls)
        item = rt.FunctionCallItem(id=rt.new_id("item"), status="in_progress", call_id=call.call_id, name=call.name,
                                   arguments="")
        self._send(rt.ResponseOutputItemAdded(response_id=response_id, output_index=output_index, item=item))
        self._add_item(item)
        self._send(rt.ResponseFunctionCallArgumentsDelta(response_id=response_id, item_id=item.id,
                                                         output_index=output_index, call_id=call.call_id,
                                                         delta=call.arguments))
        self._send(rt.ResponseFunctionCallArgumentsDone(response_id=response_id, item_id=item.id,
                                                        output_index=output_index, call_id=call.call_id,
                                                        name=call.name, arguments=call.arguments))
        item = item.model_copy(update={"status": "completed", "arguments": call.arguments})
        self._send(rt.ResponseOutputItemDone(response_id=response_id, output_index=output_index, item=item))
        self._item_done(item)
        if response is None:
            self._send(rt.ResponseDone(response=rt.Response(id=response_id, status="completed", output=[item])))
        else:
            response.calls.append(item)
            self._close_response("completed")
        if self._tool_wait is None:
            self._tool_wait = _ToolWait(set(), self.tool_wait_frames)
        self._tool_wait.calls.add(call.call_id)

    def _user_utterance(self) -> str:
        """The user item that the utterance being transcribed becomes, added when it starts."""
        return self._user_item if self._user_item is not None else self._add_user_item(rt.new_id("item"))

    def _add_user_item(self, item_id: str) -> str:
        self._user_item, self._user_partial = item_id, ""
        self._add_item(rt.MessageItem(id=item_id, role="user", status="completed", content=[rt.InputAudioPart()]))
        return item_id

    def _speech(self, event: p.UserSpeech) -> None:
        """Server VAD, as OpenAI's: `speech_started` names the user item the utterance becomes (a new one, even when
        the last utterance had no transcript), added after it; `speech_stopped` names it again, and its
        transcription completes next."""
        if event.state == "started":
            item_id = rt.new_id("item")
            self._send(rt.InputAudioBufferSpeechStarted(audio_start_ms=round(event.at * 1e3), item_id=item_id))
            self._add_user_item(item_id)
        else:
            self._send(rt.InputAudioBufferSpeechStopped(audio_end_ms=round(event.at * 1e3),
                                                        item_id=self._user_utterance()))

    def _transcript(self, event: p.UserTranscript) -> None:
        item_id = self._user_utterance()
        if event.final:
            seconds = event.end - event.start if event.start is not None and event.end is not None else 0.0
            self._send(rt.InputAudioTranscriptionCompleted(item_id=item_id, transcript=event.text,
                                                           usage=rt.TranscriptionUsage(seconds=round(seconds, 3))))
            self._user_item, self._user_partial = None, ""
            return
        # Deltas only extend, as OpenAI's do: Whisper's partials are re-transcriptions, and one that changes text
        # already sent adds nothing until it extends that text again; `completed` carries the final text.
        if event.text.startswith(self._user_partial) and len(event.text) > len(self._user_partial):
            delta, self._user_partial = event.text[len(self._user_partial):], event.text
            self._send(rt.InputAudioTranscriptionDelta(item_id=item_id, delta=delta))

    def _session_object(self) -> rt.Session | rt.BetaSession:
        config = self._config
        if self.dialect == "beta":
            return rt.BetaSession(id=self.session_id, instructions=config.instructions, voice=config.voice,
                                  tools=config.tools, temperature=config.temperature)
        return rt.Session(id=self.session_id, model=self.model, instructions=config.instructions,
                          audio=rt.SessionAudio(output=rt.SessionAudioOutput(voice=config.voice)),
                          tools=config.tools, temperature=config.temperature)

    def saved(self) -> dict[str, object]:
        """The settings only `session.update` gave: instructions and voice are the session's persona and voice, and
        the session object's id is the session's, all kept by the session."""
        return {"temperature": self._config.temperature, "tools": [tool.model_dump() for tool in self._config.tools]}

    def restore(self, saved: dict[str, object]) -> None:
        kept = _Saved.model_validate(saved)
        self._config.temperature, self._config.tools = kept.temperature, kept.tools

    def event(self, event: p.ServerEvent) -> None:
        if isinstance(event, p.SessionReady):
            self.session_id = SESSION_ID_PREFIX + event.session_id
            self._config.instructions, self._config.voice = event.persona, event.voice
            self._send(rt.SessionCreated(session=self._session_object(), contextspan=rt.SessionResume(
                resume=event.resume, resumed_frames=event.resumed_frames)))
            self._send(rt.RateLimitsUpdated())
            self._ready = True
            self._open_response()
        elif isinstance(event, p.SessionUpdated):
            if event.prefix_frames is not None:  # session.updated went out with the update
                self._send(rt.Extension.of(event))
        elif isinstance(event, p.UserTranscript):
            self._transcript(event)
        elif isinstance(event, p.UserSpeech):
            self._speech(event)
        elif isinstance(event, p.ToolCall):
            self._tool_call(event)
        elif isinstance(event, p.ErrorEvent):
            self._error(event)
        elif isinstance(event, rt.SpanEvent):
            self._send(rt.Extension.of(event))

    def _error(self, event: p.ErrorEvent) -> None:
        """`error` for the client's own invalid event, with its `event_id`: the one the wire refused, or else the
        one being handled when the session refused what it asked."""
        failed, self._failed = self._failed, None
        if event.code in NOT_THE_CLIENTS_FAULT:
            logger.info("realtime session %s: %s (%s)", self.session_id, event.message, event.code)
            if event.code == "asr_failed":
                self._send(rt.InputAudioTranscriptionFailed(
                    item_id=self._user_utterance(), error=rt.TranscriptionError(code=event.code,
                                                                                message=event.message)))
                self._user_item, self._user_partial = None, ""
            return
        if failed is None or failed.code != event.code:
            failed = rt.RealtimeError(event.code, event.message, self._event_id)
        self._send(rt.ErrorEvent.of(failed))

    # in -----------------------------------------------------------------------------------------------------
    def inbound(self, message: Message) -> list[Inbound]:
        try:
            return self._inbound(message)
        except rt.RealtimeError as exc:
            self._failed = exc
            raise

    def _inbound(self, message: Message) -> list[Inbound]:
        text = message.get("text")
        if text is None:
            if message.get("bytes") is not None:
                raise rt.RealtimeError("unexpected_binary", "Realtime events are JSON text messages")
            return []
        self._event_id = None
        event = rt.parse_client_event(text)
        self._event_id = event.event_id
        try:
            return self._handle(event)
        except rt.RealtimeError as exc:
            exc.event_id = exc.event_id or event.event_id
            raise

    def _handle(self, event: rt.ClientEvent) -> list[Inbound]:
        if isinstance(event, rt.AppendEvent):
            pcm = rt.decode_audio(event.audio)
            if self._response is not None:
                self._response.heard += pcm.size
            return [AudioIn(pcm)]
        if isinstance(event, rt.SessionUpdateEvent):
            # Answered at once, as OpenAI's server does (LiveKit and Pipecat wait for it), not after a prefill
            update, unsupported = self._session_update(event)
            prefilling = update.persona is not None or update.voice is not None
            self._send(rt.SessionUpdated(session=self._session_object(), contextspan=rt.SessionExtension(
                unsupported=unsupported, prefilling=prefilling)))
            return [update]
        if isinstance(event, rt.CommitEvent):
            self._send(rt.InputAudioBufferCommitted(item_id=self._user_utterance()))
            return [CommitInput()]
        if isinstance(event, rt.ClearEvent):
            self._send(rt.InputAudioBufferCleared())
            return [ClearInput()]
        if isinstance(event, rt.ItemCreateEvent):
            return self._item_create(event)
        if isinstance(event, rt.ItemTruncateEvent):
            self._send(rt.ConversationItemTruncated(item_id=event.item_id, content_index=event.content_index,
                                                    audio_end_ms=event.audio_end_ms))
            return []
        if isinstance(event, rt.ItemDeleteEvent):
            self._send(rt.ConversationItemDeleted(item_id=event.item_id))
            return []
        if isinstance(event, rt.ItemRetrieveEvent):
            item = self._items.get(event.item_id)
            if item is None:
                raise rt.RealtimeError("item_retrieve_invalid_item_id",
                                       f"no item {event.item_id[:100]!r} in this conversation", param="item_id")
            self._send(rt.ConversationItemRetrieved(item=item))
            return []
        if isinstance(event, rt.ResponseCreateEvent):
            self._requested = event.response.metadata if event.response is not None else None
            # Before the session is ready the first response, opened then, carries it.
            self._create_pending = self._ready
            return []
        return self._cancel(event)

    def _cancel(self, event: rt.ResponseCancelEvent) -> list[Inbound]:
        response = self._response
        if response is None or (event.response_id is not None and event.response_id != response.id):
            raise rt.RealtimeError("response_cancel_not_active", CANCEL_NOT_ACTIVE, event.event_id,
                                   "response_id")
        self._close_response("cancelled", rt.CancelledDetails())
        return []

    def _item_create(self, event: rt.ItemCreateEvent) -> list[Inbound]:
        item = event.item
        item_id = item.id or rt.new_id("item")
        if item.type == "message" and item.role in ("user", "system"):
            # A user's text is their turn, answered; a system message is the app's context, said as a span. Either
            # is added once the session takes it (`accepted`): a refused one is no part of the conversation.
            text = rt.item_text(item)
            message: Inbound = (p.UserText(type="user.text", text=text) if item.role == "user"
                                else p.SpanInject(type="span.inject", text=text, source="conversation.item"))
            self._taking = (message, rt.MessageItem(id=item_id, role=item.role, status="completed",
                                                    content=[rt.InputTextPart(text=text)]))
            return [message]
        if item.type != "function_call_output":
            raise rt.RealtimeError("unsupported_item", "only user or system text messages and function_call_output "
                                   "items can be created", event.event_id, "item")
        if item.call_id is None or item.output is None:
            raise rt.RealtimeError("invalid_value", "a function_call_output item needs call_id and output",
                                   event.event_id, "item")
        # Added at once, even when too late for its span: the output is still the client's, in its conversation.
        if self._tool_wait is not None:
            self._tool_wait.calls.discard(item.call_id)
        added = rt.FunctionCallOutputItem(id=item_id, call_id=item.call_id, output=item.output)
        self._add_item(added)
        self._item_done(added)
        return [p.ToolResult(type="tool.result", call_id=item.call_id, output=item.output[:p.MAX_TOOL_OUTPUT_CHARS])]

    def accepted(self, item: Inbound) -> None:
        taking, self._taking = self._taking, None
        if taking is not None and taking[0] is item:
            self._add_item(taking[1])
            self._item_done(taking[1])

    def _session_update(self, event: rt.SessionUpdateEvent) -> tuple[p.SessionUpdate, dict[str, str]]:
        """What the session is to do, and the fields accepted but not applied, each with the reason."""
        session = event.session
        if session.instructions is not None and len(session.instructions) > self.max_persona_chars:
            raise rt.RealtimeError("bad_persona", f"instructions are over {self.max_persona_chars} characters",
                                   event.event_id, "session.instructions")
        problem = rt.input_format_problem(session)
        if problem is not None:
            raise rt.RealtimeError("unsupported_audio_format", f"input audio {problem} is not accepted: send "
                                   f"{' or '.join(rt.INPUT_FORMATS)}", event.event_id, "session.audio.input.format")
        unsupported = {name: why for name, why in NOT_HONOURED.items() if name in session.model_fields_set
                       or name in (session.model_extra or {})}
        audio = session.audio
        voice = session.voice
        if audio is not None:
            if audio.input is not None:
                unsupported |= {f"audio.input.{name}": NOT_HONOURED[name] for name in ("turn_detection",
                                "transcription", "noise_reduction") if name in audio.input.model_fields_set}
            if audio.output is not None:
                voice = audio.output.voice or voice
                if audio.output.speed is not None:
                    unsupported["audio.output.speed"] = NOT_HONOURED["speed"]
                if audio.output.format is not None and audio.output.format.type not in ("audio/pcm", "pcm16"):
                    unsupported["audio.output.format"] = NOT_HONOURED["output_format"]
        for name in session.model_extra or {}:
            unsupported.setdefault(name, "not a setting this server knows")
        if voice is not None and voice not in self.voices:
            unsupported["voice"] = (f"{voice!r} is not one of this model's voices ({', '.join(self.voices) or 'none'})"
                                    "; the voice stays as it was")
            voice = None
        sampling = None
        if session.temperature is not None:
            sampling = p.SamplingUpdate(text_temperature=session.temperature, audio_temperature=session.temperature)
            self._config.temperature = session.temperature
        tools = None
        if session.tools is not None:
            tools = [p.ClientTool(name=t.name, description=t.description, parameters=t.parameters)
                     for t in session.tools]
            self._config.tools = session.tools
        # Only a change is prefilled again (restarting the model's context): Pipecat and LiveKit send the same
        # instructions more than once.
        persona = session.instructions if session.instructions != self._config.instructions else None
        voice = voice if voice != self._config.voice else None
        if persona is not None:
            self._config.instructions = persona
        if voice is not None:
            self._config.voice = voice
        return p.SessionUpdate(type="session.update", persona=persona, voice=voice, tools=tools,
                               sampling=sampling), unsupported
