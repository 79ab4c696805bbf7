"""`/v1/realtime`: the OpenAI Realtime protocol over the same session as `/api/chat`.

A full-duplex model listens and speaks at once and decides itself when to speak, so the request/response shape of
the Realtime API maps onto it like this: the input buffer streams into the model as it arrives (80 ms frames; commit
and clear are answered, and turn detection is the model's own); an agent turn runs from the first audible frame or
text piece to `TURN_END_FRAMES` of silence and is one response (`response.created` ... `response.done`), its audio
sent frame by frame at the frame clock; `response.create` makes nothing up: it is answered by the model's next
turn, which carries its metadata; `response.cancel` ends the turn in progress as cancelled and mutes the rest of it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
from starlette.types import Message

from frontend_model.frame import SAMPLE_RATE
from server.session.wire import AudioIn, ClearInput, Inbound
from server.wire import protocol as p
from server.wire import realtime as rt
from server.wire.outbound import OutboundQueue, Outgoing

# An agent frame quieter than this (about -50 dBFS RMS) is silence; this many silent frames in a row end a turn.
SILENCE_RMS = 10 ** (-50 / 20)
TURN_END_FRAMES = 10
SPAN_EVENTS = ("retrieval", "question", "span.injected", "span.dropped", "session.ending")
# What a full-duplex model does not take from `session.update`, and why: reported in `session.updated`.
NOT_HONOURED = {
    "turn_detection": "the model hears and speaks at once and takes turns itself; there is no VAD to configure",
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


@dataclass
class _Turn:
    response_id: str
    item_id: str
    metadata: Any = None
    transcript: list[str] = field(default_factory=list)
    silent: int = 0


def is_silent(pcm: np.ndarray) -> bool:
    return float(np.sqrt(np.mean(np.square(pcm, dtype=np.float64)))) < SILENCE_RMS if pcm.size else True


class RealtimeWire:
    """Translates between Realtime events and the session; holds the turn and item state the protocol needs."""

    reprefills = True

    def __init__(self, outbound: OutboundQueue, dialect: rt.Dialect, model: str, voices: list[str],
                 max_persona_chars: int = 2000) -> None:
        """`model`: what `session.created` names; `voices`: the served model's voice prompts."""
        self.outbound = outbound
        self.dialect = dialect
        self.model = model
        self.voices = voices
        self.max_persona_chars = max_persona_chars
        self.session_id = rt.new_id("sess")
        self._turn: _Turn | None = None
        self._muted = 0  # > 0: a cancelled turn still going, silent frames counted to its end
        self._requested: Any = None  # metadata of a response.create waiting for the model's next turn
        self._last_item: str | None = None
        self._user_item: str | None = None
        self._user_partial = ""
        self._failed: rt.RealtimeError | None = None
        self._config: dict[str, Any] = {"instructions": "", "voice": None, "tools": [], "temperature": None}
        self._unsupported: dict[str, str] = {}

    # out ----------------------------------------------------------------------------------------------------
    def _send(self, type_: str, kind: str = "text", **fields: Any) -> bool:
        text = rt.server_event(self.dialect, type_, **fields)
        return True if text is None else self.outbound.put(Outgoing(kind, text))  # type: ignore[arg-type]

    def handshake(self) -> bytes | None:
        return None

    def audio(self, pcm: np.ndarray) -> bool:
        silent = is_silent(pcm)
        if self._muted:
            self._muted = self._muted + 1 if silent else 1
            if self._muted > TURN_END_FRAMES:
                self._muted = 0
            return True
        if self._turn is None and silent:
            return True
        turn = self._turn or self._open_turn()
        kept = self._send("response.output_audio.delta", "audio", response_id=turn.response_id,
                          item_id=turn.item_id, output_index=0, content_index=0, delta=rt.encode_audio(pcm))
        turn.silent = turn.silent + 1 if silent else 0
        if turn.silent >= TURN_END_FRAMES:
            self._close_turn("completed")
        return kept

    def agent_text(self, piece: str) -> None:
        if self._muted:
            self._muted = 1
            return
        turn = self._turn or self._open_turn()
        turn.silent = 0
        turn.transcript.append(piece)
        self._send("response.output_audio_transcript.delta", response_id=turn.response_id, item_id=turn.item_id,
                   output_index=0, content_index=0, delta=piece)

    def _open_turn(self) -> _Turn:
        turn = self._turn = _Turn(rt.new_id("resp"), rt.new_id("item"), self._requested)
        self._requested = None
        created = rt.response(turn.response_id, "in_progress", [])
        if turn.metadata is not None:
            created["metadata"] = turn.metadata
        self._send("response.created", response=created)
        item = rt.assistant_item(turn.item_id, "in_progress", None, self.dialect)
        self._send("response.output_item.added", response_id=turn.response_id, output_index=0, item=item)
        self._add_item(item)
        self._send("response.content_part.added", response_id=turn.response_id, item_id=turn.item_id,
                   output_index=0, content_index=0, part={"type": "audio", "transcript": ""})
        return turn

    def _close_turn(self, status: str, details: dict[str, Any] | None = None) -> None:
        turn, self._turn = self._turn, None
        if turn is None:
            return
        ids = {"response_id": turn.response_id, "item_id": turn.item_id, "output_index": 0, "content_index": 0}
        transcript = "".join(turn.transcript)
        self._send("response.output_audio.done", **ids)
        self._send("response.output_audio_transcript.done", **ids, transcript=transcript)
        self._send("response.content_part.done", **ids, part={"type": "audio", "transcript": transcript})
        item = rt.assistant_item(turn.item_id, "completed" if status == "completed" else "incomplete", transcript,
                                 self.dialect)
        self._send("response.output_item.done", response_id=turn.response_id, output_index=0, item=item)
        self._send("conversation.item.done", item=item)
        done = rt.response(turn.response_id, status, [item], details)
        if turn.metadata is not None:
            done["metadata"] = turn.metadata
        self._send("response.done", response=done)

    def _add_item(self, item: dict[str, Any]) -> None:
        self._send("conversation.item.added", previous_item_id=self._last_item, item=item)
        self._last_item = item["id"]

    def _tool_call(self, call: p.ToolCall) -> None:
        """A client tool call as its own response holding one function_call item, as the SDKs expect it."""
        response_id, item_id = rt.new_id("resp"), rt.new_id("item")
        ids = {"response_id": response_id, "item_id": item_id, "output_index": 0, "call_id": call.call_id}
        self._send("response.created", response=rt.response(response_id, "in_progress", []))
        item = rt.function_call_item(item_id, call.call_id, call.name, "", "in_progress")
        self._send("response.output_item.added", response_id=response_id, output_index=0, item=item)
        self._add_item(item)
        self._send("response.function_call_arguments.delta", **ids, delta=call.arguments)
        self._send("response.function_call_arguments.done", **ids, name=call.name, arguments=call.arguments)
        item = rt.function_call_item(item_id, call.call_id, call.name, call.arguments, "completed")
        self._send("response.output_item.done", response_id=response_id, output_index=0, item=item)
        self._send("conversation.item.done", item=item)
        self._send("response.done", response=rt.response(response_id, "completed", [item]))

    def _transcript(self, event: p.UserTranscript) -> None:
        if self._user_item is None:
            self._user_item = rt.new_id("item")
            self._add_item(rt.user_item(self._user_item, None))
        item_id = self._user_item
        if event.final:
            self._send("conversation.item.input_audio_transcription.completed", item_id=item_id, content_index=0,
                       transcript=event.text)
            self._user_item, self._user_partial = None, ""
            return
        # Whisper's partials are re-transcriptions: the delta is what this one adds, or all of it when it changed.
        delta = event.text[len(self._user_partial):] if event.text.startswith(self._user_partial) else event.text
        self._user_partial = event.text
        if delta:
            self._send("conversation.item.input_audio_transcription.delta", item_id=item_id, content_index=0,
                       delta=delta)

    def _session_object(self) -> dict[str, Any]:
        config = self._config
        return {
            "object": "realtime.session", "type": "realtime", "id": self.session_id, "model": self.model,
            "instructions": config["instructions"], "output_modalities": ["audio"],
            "audio": {"input": {"format": {"type": "audio/pcm", "rate": SAMPLE_RATE}, "turn_detection": None,
                                "transcription": {"model": "faster-whisper"}},
                      "output": {"format": {"type": "audio/pcm", "rate": SAMPLE_RATE}, "voice": config["voice"]}},
            "tools": config["tools"], "tool_choice": "auto", "temperature": config["temperature"],
            "max_output_tokens": "inf",
        }

    def event(self, event: p.ServerEvent) -> None:
        if isinstance(event, p.SessionReady):
            self._send("session.created", session=self._session_object())
            self._send("rate_limits.updated", rate_limits=[])
        elif isinstance(event, p.SessionUpdated):
            extension: dict[str, Any] = {"unsupported": self._unsupported}
            if event.prefix_frames is not None:
                extension |= {"prefix_frames": event.prefix_frames, "prefill_ms": event.prefill_ms,
                              "context_restarted": True}
            self._send("session.updated", session=self._session_object(), contextspan=extension)
            self._unsupported = {}
        elif isinstance(event, p.UserTranscript):
            self._transcript(event)
        elif isinstance(event, p.ToolCall):
            self._tool_call(event)
        elif isinstance(event, p.ErrorEvent):
            failed, self._failed = self._failed, None
            if failed is None or failed.code != event.code:
                failed = rt.RealtimeError(event.code, event.message)
            self._send("error", **rt.error_fields(failed))
        elif event.type in SPAN_EVENTS:  # type: ignore[attr-defined]
            self._send(f"contextspan.{event.type}", **event.model_dump(exclude_none=True, exclude={"type"}))  # type: ignore[attr-defined]

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
        event = rt.parse_client_event(text)
        if isinstance(event, rt.AppendEvent):
            try:
                return [AudioIn(rt.decode_audio(event.audio))]
            except rt.RealtimeError as exc:
                exc.event_id = event.event_id
                raise
        if isinstance(event, rt.SessionUpdateEvent):
            return [self._session_update(event)]
        if isinstance(event, rt.CommitEvent):
            if self._user_item is None:
                self._user_item = rt.new_id("item")
                self._add_item(rt.user_item(self._user_item, None))
            self._send("input_audio_buffer.committed", previous_item_id=None, item_id=self._user_item)
            return []
        if isinstance(event, rt.ClearEvent):
            self._send("input_audio_buffer.cleared")
            return [ClearInput()]
        if isinstance(event, rt.ItemCreateEvent):
            return self._item_create(event)
        if isinstance(event, rt.ItemTruncateEvent):
            self._send("conversation.item.truncated", item_id=event.item_id, content_index=event.content_index,
                       audio_end_ms=event.audio_end_ms)
            return []
        if isinstance(event, rt.ItemDeleteEvent):
            self._send("conversation.item.deleted", item_id=event.item_id)
            return []
        if isinstance(event, rt.ResponseCreateEvent):
            self._requested = (event.response or {}).get("metadata") or {}
            return []
        return self._cancel(event)

    def _cancel(self, event: rt.ResponseCancelEvent) -> list[Inbound]:
        turn = self._turn
        if turn is None or (event.response_id is not None and event.response_id != turn.response_id):
            raise rt.RealtimeError("no_active_response", "no agent turn is in progress to cancel", event.event_id,
                                   "response_id")
        self._close_turn("cancelled", {"type": "cancelled", "reason": "client_cancelled"})
        self._muted = 1
        return []

    def _item_create(self, event: rt.ItemCreateEvent) -> list[Inbound]:
        item = event.item
        item_id = item.id or rt.new_id("item")
        if item.type == "function_call_output":
            if item.call_id is None or item.output is None:
                raise rt.RealtimeError("invalid_value", "a function_call_output item needs call_id and output",
                                       event.event_id, "item")
            inbound: Inbound = p.ToolResult(type="tool.result", call_id=item.call_id,
                                            output=item.output[:p.MAX_TOOL_OUTPUT_CHARS])
            added = {"id": item_id, "object": "realtime.item", "type": "function_call_output",
                     "call_id": item.call_id, "output": item.output}
        elif item.type == "message" and item.role in ("user", "system"):
            text = rt.item_text(item)
            inbound = p.SpanInject(type="span.inject", text=text, source="conversation.item")
            added = {"id": item_id, "object": "realtime.item", "type": "message", "role": item.role,
                     "status": "completed", "content": [{"type": "input_text", "text": text}]}
        else:
            raise rt.RealtimeError("unsupported_item", "only user or system text messages (they become spans) and "
                                   "function_call_output items can be created", event.event_id, "item")
        self._add_item(added)
        self._send("conversation.item.done", item=added)
        return [inbound]

    def _session_update(self, event: rt.SessionUpdateEvent) -> p.SessionUpdate:
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
        self._unsupported = unsupported
        sampling = None
        if session.temperature is not None:
            sampling = p.SamplingUpdate(text_temperature=session.temperature, audio_temperature=session.temperature)
            self._config["temperature"] = session.temperature
        tools = None
        if session.tools is not None:
            tools = [p.ClientTool(name=t.name, description=t.description, parameters=t.parameters)
                     for t in session.tools]
            self._config["tools"] = [t.model_dump() for t in session.tools]
        if session.instructions is not None:
            self._config["instructions"] = session.instructions
        if voice is not None:
            self._config["voice"] = voice
        return p.SessionUpdate(type="session.update", persona=session.instructions, voice=voice, tools=tools,
                               sampling=sampling)
