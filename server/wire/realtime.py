"""The OpenAI Realtime wire, as pure functions and pydantic models: client events in, server events out.

`/v1/realtime` speaks this protocol for the `openai` SDKs and the Realtime plugins of LiveKit and Pipecat. GA event
names by default; a client that sends `OpenAI-Beta: realtime=v1` gets the beta names (`response.audio.delta` for
`response.output_audio.delta`, `conversation.item.created` for `.added`, ...). Client events of both versions are
accepted: they share names, and the beta session fields (`voice`, `input_audio_format`, ...) sit beside the GA ones.
Audio is base64 PCM16, 24 kHz mono, little-endian, both ways.
"""

from __future__ import annotations

import base64
import binascii
import json
import secrets
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    TypeAdapter,
    ValidationError,
    model_serializer,
)

from frontend_model.frame import SAMPLE_RATE
from server.wire.protocol import (
    MAX_APP_SPAN_CHARS,
    MAX_TEMPERATURE,
    MAX_USER_TEXT_CHARS,
    ProtocolError,
    Question,
    Retrieval,
    SessionEnding,
    SpanDropped,
    SpanInjected,
)
from server.wire.protocol import SessionUpdated as Prefilled

Dialect = Literal["ga", "beta"]
# Server events whose beta name differs; the others are spelled the same in both versions.
BETA_NAMES = {
    "response.output_audio.delta": "response.audio.delta",
    "response.output_audio.done": "response.audio.done",
    "response.output_audio_transcript.delta": "response.audio_transcript.delta",
    "response.output_audio_transcript.done": "response.audio_transcript.done",
    "conversation.item.added": "conversation.item.created",
}
GA_ONLY = frozenset({"conversation.item.done"})  # no beta counterpart: beta clients do not get it
# One append holds at most this much audio, under the server's WebSocket message cap (256 KiB by default): a
# bigger one is refused with `audio_too_large` before the socket would close 1009. Clients send 20 to 100 ms.
MAX_APPEND_SECONDS = 2.0
MAX_APPEND_BASE64 = 4 * -(-int(MAX_APPEND_SECONDS * SAMPLE_RATE * 2) // 3)
INPUT_FORMATS = ("audio/pcm at 24000 Hz", "pcm16 (beta)")


def dialect_of(headers: dict[str, str]) -> Dialect:
    return "beta" if "realtime=v1" in headers.get("openai-beta", "").replace(" ", "") else "ga"


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(8)}"


class RealtimeError(ProtocolError):
    """A bad client event, answered with an `error` event naming the event (its `event_id`) and the field."""

    def __init__(self, code: str, message: str, event_id: str | None = None, param: str | None = None) -> None:
        super().__init__(code, message)
        self.event_id = event_id
        self.param = param


# audio ------------------------------------------------------------------------------------------------------


def decode_audio(text: str) -> np.ndarray:
    """Base64 PCM16 -> float32 in [-1, 1); raises RealtimeError for oversize, bad base64 or an odd byte count."""
    if len(text) > MAX_APPEND_BASE64:
        raise RealtimeError("audio_too_large", f"one append holds at most {MAX_APPEND_SECONDS:g} s of audio "
                            f"({MAX_APPEND_BASE64} base64 characters); send smaller chunks", param="audio")
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise RealtimeError("invalid_audio", "input_audio_buffer.append audio is not valid base64",
                            param="audio") from None
    if len(raw) % 2:
        raise RealtimeError("invalid_audio", "PCM16 audio must be a whole number of 2-byte samples", param="audio")
    return np.frombuffer(raw, "<i2").astype(np.float32) / 32768.0


def encode_audio(pcm: np.ndarray) -> str:
    """float32 PCM -> base64 PCM16 (clipped)."""
    samples = np.clip(np.round(pcm * 32767.0), -32768, 32767).astype("<i2")
    return base64.b64encode(samples.tobytes()).decode("ascii")


# client -> server -------------------------------------------------------------------------------------------


class _Open(BaseModel):
    """Realtime objects grow fields between API versions: unknown ones are kept (`model_extra`) and reported."""

    model_config = ConfigDict(extra="allow")


class AudioFormat(_Open):
    type: str
    rate: int | None = None


class AudioInput(_Open):
    format: AudioFormat | None = None
    turn_detection: Any = None
    transcription: Any = None
    noise_reduction: Any = None


class AudioOutput(_Open):
    format: AudioFormat | None = None
    voice: str | None = Field(None, max_length=200)
    speed: float | None = None


class AudioConfig(_Open):
    input: AudioInput | None = None
    output: AudioOutput | None = None


class FunctionTool(BaseModel):
    """A tool the client runs itself: the backend's LLM may choose it; the call goes to the client."""

    model_config = ConfigDict(extra="ignore")

    type: Literal["function"] = "function"
    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: str = Field("", max_length=2000)
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})


class RealtimeSession(_Open):
    """`session.update`'s `session`: GA fields and the beta ones beside them."""

    type: str | None = None
    model: str | None = None
    instructions: str | None = Field(None, max_length=8000)
    voice: str | None = Field(None, max_length=200)  # beta; GA: audio.output.voice
    audio: AudioConfig | None = None
    input_audio_format: str | None = None  # beta; GA: audio.input.format
    output_audio_format: str | None = None  # beta; GA: audio.output.format
    tools: list[FunctionTool] | None = Field(None, max_length=64)
    tool_choice: Any = None
    temperature: float | None = Field(None, ge=0, le=MAX_TEMPERATURE, allow_inf_nan=False)


class SessionUpdateEvent(BaseModel):
    type: Literal["session.update"]
    event_id: str | None = None
    session: RealtimeSession


class AppendEvent(BaseModel):
    type: Literal["input_audio_buffer.append"]
    event_id: str | None = None
    audio: str


class CommitEvent(BaseModel):
    type: Literal["input_audio_buffer.commit"]
    event_id: str | None = None


class ClearEvent(BaseModel):
    type: Literal["input_audio_buffer.clear"]
    event_id: str | None = None


class ContentPart(_Open):
    type: str
    text: str | None = None


class Item(_Open):
    id: str | None = None
    type: Literal["message", "function_call_output", "function_call"]
    role: Literal["user", "system", "assistant"] | None = None
    content: list[ContentPart] = Field(default_factory=list)
    call_id: str | None = None
    output: str | None = None


class ItemCreateEvent(BaseModel):
    type: Literal["conversation.item.create"]
    event_id: str | None = None
    previous_item_id: str | None = None
    item: Item


class ItemTruncateEvent(_Open):
    type: Literal["conversation.item.truncate"]
    event_id: str | None = None
    item_id: str
    content_index: int = 0
    audio_end_ms: int = 0


class ItemDeleteEvent(_Open):
    type: Literal["conversation.item.delete"]
    event_id: str | None = None
    item_id: str


class ItemRetrieveEvent(_Open):
    type: Literal["conversation.item.retrieve"]
    event_id: str | None = None
    item_id: str


class ResponseRequest(_Open):
    metadata: dict[str, str] | None = Field(None, max_length=16)


class ResponseCreateEvent(_Open):
    type: Literal["response.create"]
    event_id: str | None = None
    response: ResponseRequest | None = None


class ResponseCancelEvent(_Open):
    type: Literal["response.cancel"]
    event_id: str | None = None
    response_id: str | None = None


ClientEvent = Annotated[
    SessionUpdateEvent | AppendEvent | CommitEvent | ClearEvent | ItemCreateEvent | ItemTruncateEvent
    | ItemDeleteEvent | ItemRetrieveEvent | ResponseCreateEvent | ResponseCancelEvent,
    Field(discriminator="type"),
]
_client_adapter: TypeAdapter[ClientEvent] = TypeAdapter(ClientEvent)
CLIENT_TYPES = ("session.update", "input_audio_buffer.append", "input_audio_buffer.commit",
                "input_audio_buffer.clear", "conversation.item.create", "conversation.item.truncate",
                "conversation.item.delete", "conversation.item.retrieve", "response.create", "response.cancel")


def parse_client_event(text: str) -> ClientEvent:
    try:
        data = json.loads(text)
    except (json.JSONDecodeError, RecursionError, ValueError):
        raise RealtimeError("invalid_json", "a client event must be a JSON object") from None
    if not isinstance(data, dict) or not isinstance(data.get("type"), str):
        raise RealtimeError("invalid_event", "a client event must be a JSON object with a string 'type'")
    event_id = data.get("event_id") if isinstance(data.get("event_id"), str) else None
    if data["type"] not in CLIENT_TYPES:
        raise RealtimeError("unknown_event", f"unknown client event type {data['type'][:80]!r}", event_id, "type")
    try:
        return _client_adapter.validate_python(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        param = ".".join(map(str, first["loc"][1:]))
        raise RealtimeError("invalid_value", f"invalid {data['type']}: {param}: {first['msg']}", event_id,
                            param) from None


def item_text(item: Item) -> str:
    """The text of a user message (a typed turn) or a system one (a span); input_audio parts are refused (audio goes
    through the buffer)."""
    texts = []
    for part in item.content:
        if part.type not in ("input_text", "text"):
            raise RealtimeError("unsupported_content", f"content of type {part.type!r} is not taken in a message: send "
                                "text parts (input_text); audio goes through input_audio_buffer.append")
        texts.append(part.text or "")
    text = " ".join(t.strip() for t in texts if t.strip())
    if not text:
        raise RealtimeError("empty_item", "the item holds no text", param="item.content")
    if item.role == "user" and len(text) > MAX_USER_TEXT_CHARS:
        raise RealtimeError("text_too_long", f"user message text is over {MAX_USER_TEXT_CHARS} characters",
                            param="item.content")
    if len(text) > MAX_APP_SPAN_CHARS:
        raise RealtimeError("span_too_long", f"item text is over {MAX_APP_SPAN_CHARS} characters", param="item.content")
    return text


def input_format_problem(session: RealtimeSession) -> str | None:
    """Why the audio format asked for cannot be served, or None (PCM16 at 24 kHz is all this server reads)."""
    fmt = session.audio.input.format if session.audio and session.audio.input else None
    if fmt is not None and not (fmt.type in ("audio/pcm", "pcm16") and fmt.rate in (None, SAMPLE_RATE)):
        return f"{fmt.type} at {fmt.rate} Hz"
    if session.input_audio_format is not None and session.input_audio_format != "pcm16":
        return session.input_audio_format
    return None


# server -> client -------------------------------------------------------------------------------------------
# Every event the server sends is one of these models, under its GA name; `encode_event` names it for the dialect.
# Their shapes are OpenAI's (tests/e2e/test_realtime_sdk.py parses what a real session sends with the `openai` SDK's
# own server-event types); fields are sent even when null, as OpenAI's server sends them.


class ServerEvent(BaseModel):
    """Base of every server event: its GA `type` and a fresh `event_id`."""

    model_config = ConfigDict(extra="forbid")

    type: str
    event_id: str = Field(default_factory=lambda: new_id("event"))


class PcmFormat(BaseModel):
    type: Literal["audio/pcm"] = "audio/pcm"
    rate: int = SAMPLE_RATE


class Transcription(BaseModel):
    model: Literal["faster-whisper"] = "faster-whisper"  # the server's ASR transcribes user speech, always


class SessionAudioInput(BaseModel):
    format: PcmFormat = Field(default_factory=PcmFormat)
    turn_detection: None = None  # the model takes turns itself
    transcription: Transcription = Field(default_factory=Transcription)


class SessionAudioOutput(BaseModel):
    format: PcmFormat = Field(default_factory=PcmFormat)
    voice: str | None


class SessionAudio(BaseModel):
    input: SessionAudioInput = Field(default_factory=SessionAudioInput)
    output: SessionAudioOutput


class Session(BaseModel):
    """The session in effect, as `session.created` / `.updated` report it to GA clients."""

    object: Literal["realtime.session"] = "realtime.session"
    type: Literal["realtime"] = "realtime"
    id: str
    model: str
    instructions: str
    output_modalities: list[Literal["audio"]] = ["audio"]
    audio: SessionAudio
    tools: list[FunctionTool]
    tool_choice: Literal["auto"] = "auto"
    temperature: float | None
    max_output_tokens: Literal["inf"] = "inf"


class BetaSession(BaseModel):
    """The same in the beta shape; its `model` may only name OpenAI's models, so it is left out."""

    object: Literal["realtime.session"] = "realtime.session"
    id: str
    instructions: str
    modalities: list[Literal["audio", "text"]] = ["audio", "text"]
    voice: str | None
    input_audio_format: Literal["pcm16"] = "pcm16"
    output_audio_format: Literal["pcm16"] = "pcm16"
    input_audio_transcription: Transcription = Field(default_factory=Transcription)
    turn_detection: None = None
    tools: list[FunctionTool]
    tool_choice: Literal["auto"] = "auto"
    temperature: float | None
    max_response_output_tokens: Literal["inf"] = "inf"


ItemStatus = Literal["in_progress", "completed", "incomplete"]


class AudioPart(BaseModel):
    """Agent audio and its transcript: `output_audio` in a GA item, `audio` in a beta item and in content parts."""

    type: Literal["output_audio", "audio"] = "audio"
    transcript: str


class InputAudioPart(BaseModel):
    type: Literal["input_audio"] = "input_audio"
    transcript: str | None = None  # the transcript comes in its own events


class InputTextPart(BaseModel):
    type: Literal["input_text"] = "input_text"
    text: str


class MessageItem(BaseModel):
    id: str
    object: Literal["realtime.item"] = "realtime.item"
    type: Literal["message"] = "message"
    role: Literal["assistant", "user", "system"]
    status: ItemStatus
    content: list[Annotated[AudioPart | InputAudioPart | InputTextPart, Field(discriminator="type")]]


class FunctionCallItem(BaseModel):
    id: str
    object: Literal["realtime.item"] = "realtime.item"
    type: Literal["function_call"] = "function_call"
    status: ItemStatus
    call_id: str
    name: str
    arguments: str


class FunctionCallOutputItem(BaseModel):
    id: str
    object: Literal["realtime.item"] = "realtime.item"
    type: Literal["function_call_output"] = "function_call_output"
    call_id: str
    output: str


ConversationItem = Annotated[MessageItem | FunctionCallItem | FunctionCallOutputItem, Field(discriminator="type")]


class CancelledDetails(BaseModel):
    type: Literal["cancelled"] = "cancelled"
    reason: Literal["client_cancelled"] = "client_cancelled"


class TokenDetails(BaseModel):
    text_tokens: int = 0
    audio_tokens: int = 0


class InputTokenDetails(TokenDetails):
    cached_tokens: int = 0


class Usage(BaseModel):
    """A response's usage, in 80 ms frames: a full-duplex model steps one frame at a time, hearing and speaking.
    Output: the agent's frames (audio) and its text pieces (text); input: the user's frames heard meanwhile."""

    total_tokens: int
    input_tokens: int
    output_tokens: int
    input_token_details: InputTokenDetails
    output_token_details: TokenDetails

    @classmethod
    def of(cls, agent_frames: int, text_pieces: int, user_frames: int) -> Usage:
        output = agent_frames + text_pieces
        return cls(total_tokens=output + user_frames, input_tokens=user_frames, output_tokens=output,
                   input_token_details=InputTokenDetails(audio_tokens=user_frames),
                   output_token_details=TokenDetails(text_tokens=text_pieces, audio_tokens=agent_frames))


class Response(BaseModel):
    id: str
    object: Literal["realtime.response"] = "realtime.response"
    status: Literal["in_progress", "completed", "cancelled"]
    status_details: CancelledDetails | None = None
    output: list[ConversationItem] = Field(default_factory=list)
    output_modalities: list[Literal["audio"]] = ["audio"]
    usage: Usage | None = None  # at response.done
    metadata: dict[str, str] | None = Field(None, description="the `response.create` metadata it answers")


class SessionResume(BaseModel):
    """`session.created` `contextspan`: how to resume this session, as `/api/chat`'s `session.ready` says it."""

    resume: str | None = Field(None, description="this session's resume token: `/v1/realtime?resume=<token>` on any "
                               "replica continues it after a drain or a crash; none when resume is off")
    resumed_frames: int | None = Field(None, description="set when this session was resumed: the stream positions "
                                       "its history replayed")


class SessionCreated(ServerEvent):
    type: Literal["session.created"] = "session.created"
    session: Session | BetaSession
    contextspan: SessionResume = Field(default_factory=SessionResume)


class SessionExtension(BaseModel):
    """`session.updated` `contextspan`: what this server did with the update beyond OpenAI's fields."""

    unsupported: dict[str, str] = Field(description="fields accepted but not applied, each with the reason")
    prefilling: bool = Field(False, description="new instructions or voice are being prefilled (the model's context "
                             "restarts from them); `contextspan.session.updated` says when they are in")


class SessionUpdated(ServerEvent):
    type: Literal["session.updated"] = "session.updated"
    session: Session | BetaSession
    contextspan: SessionExtension


class RateLimitsUpdated(ServerEvent):
    type: Literal["rate_limits.updated"] = "rate_limits.updated"
    rate_limits: tuple[()] = ()  # always empty: this server limits messages a second, not tokens


class InputAudioBufferCommitted(ServerEvent):
    type: Literal["input_audio_buffer.committed"] = "input_audio_buffer.committed"
    previous_item_id: str | None = None
    item_id: str


class InputAudioBufferSpeechStarted(ServerEvent):
    """Server VAD: the user started speaking; `item_id` is the user item the utterance becomes."""

    type: Literal["input_audio_buffer.speech_started"] = "input_audio_buffer.speech_started"
    audio_start_ms: int = Field(description="stream milliseconds where the speech starts, 300 ms of lead-in included")
    item_id: str


class InputAudioBufferSpeechStopped(ServerEvent):
    type: Literal["input_audio_buffer.speech_stopped"] = "input_audio_buffer.speech_stopped"
    audio_end_ms: int = Field(description="stream milliseconds where it ends, the silence that ended it included")
    item_id: str


class InputAudioBufferCleared(ServerEvent):
    type: Literal["input_audio_buffer.cleared"] = "input_audio_buffer.cleared"


class ConversationItemAdded(ServerEvent):
    type: Literal["conversation.item.added"] = "conversation.item.added"
    previous_item_id: str | None
    item: ConversationItem


class ConversationItemDone(ServerEvent):
    type: Literal["conversation.item.done"] = "conversation.item.done"
    item: ConversationItem


class ConversationItemTruncated(ServerEvent):
    type: Literal["conversation.item.truncated"] = "conversation.item.truncated"
    item_id: str
    content_index: int
    audio_end_ms: int


class ConversationItemRetrieved(ServerEvent):
    type: Literal["conversation.item.retrieved"] = "conversation.item.retrieved"
    item: ConversationItem


class ConversationItemDeleted(ServerEvent):
    type: Literal["conversation.item.deleted"] = "conversation.item.deleted"
    item_id: str


class InputAudioTranscriptionDelta(ServerEvent):
    type: Literal["conversation.item.input_audio_transcription.delta"] = (
        "conversation.item.input_audio_transcription.delta")
    item_id: str
    content_index: int = 0
    delta: str


class TranscriptionUsage(BaseModel):
    type: Literal["duration"] = "duration"
    seconds: float = Field(description="the utterance's duration")


class TranscriptionError(BaseModel):
    type: Literal["server_error"] = "server_error"
    code: str
    message: str


class InputAudioTranscriptionFailed(ServerEvent):
    """The server's ASR failed on this utterance: the protocol's own event, which no client takes as fatal."""

    type: Literal["conversation.item.input_audio_transcription.failed"] = (
        "conversation.item.input_audio_transcription.failed")
    item_id: str
    content_index: int = 0
    error: TranscriptionError


class InputAudioTranscriptionCompleted(ServerEvent):
    type: Literal["conversation.item.input_audio_transcription.completed"] = (
        "conversation.item.input_audio_transcription.completed")
    item_id: str
    content_index: int = 0
    transcript: str
    usage: TranscriptionUsage


class ResponseCreated(ServerEvent):
    type: Literal["response.created"] = "response.created"
    response: Response


class ResponseDone(ServerEvent):
    type: Literal["response.done"] = "response.done"
    response: Response


class ResponseOutputItemAdded(ServerEvent):
    type: Literal["response.output_item.added"] = "response.output_item.added"
    response_id: str
    output_index: int
    item: ConversationItem


class ResponseOutputItemDone(ServerEvent):
    type: Literal["response.output_item.done"] = "response.output_item.done"
    response_id: str
    output_index: int
    item: ConversationItem


class _AudioContent(ServerEvent):
    """Events about a response's audio: its message is output 0 and the audio its content 0."""

    response_id: str
    item_id: str
    output_index: int = 0
    content_index: int = 0


class ResponseContentPartAdded(_AudioContent):
    type: Literal["response.content_part.added"] = "response.content_part.added"
    part: AudioPart


class ResponseContentPartDone(_AudioContent):
    type: Literal["response.content_part.done"] = "response.content_part.done"
    part: AudioPart


class ResponseOutputAudioDelta(_AudioContent):
    type: Literal["response.output_audio.delta"] = "response.output_audio.delta"
    delta: str = Field(description="one frame: 80 ms of base64 PCM16")


class ResponseOutputAudioDone(_AudioContent):
    type: Literal["response.output_audio.done"] = "response.output_audio.done"


class ResponseOutputAudioTranscriptDelta(_AudioContent):
    type: Literal["response.output_audio_transcript.delta"] = "response.output_audio_transcript.delta"
    delta: str


class ResponseOutputAudioTranscriptDone(_AudioContent):
    type: Literal["response.output_audio_transcript.done"] = "response.output_audio_transcript.done"
    transcript: str


class _FunctionCallArguments(ServerEvent):
    response_id: str
    item_id: str
    output_index: int
    call_id: str


class ResponseFunctionCallArgumentsDelta(_FunctionCallArguments):
    type: Literal["response.function_call_arguments.delta"] = "response.function_call_arguments.delta"
    delta: str


class ResponseFunctionCallArgumentsDone(_FunctionCallArguments):
    type: Literal["response.function_call_arguments.done"] = "response.function_call_arguments.done"
    name: str
    arguments: str


class ErrorDetail(BaseModel):
    type: Literal["invalid_request_error"] = "invalid_request_error"
    code: str
    message: str
    param: str | None = None
    event_id: str | None = Field(None, description="the client event at fault")


class ErrorEvent(ServerEvent):
    type: Literal["error"] = "error"
    error: ErrorDetail

    @classmethod
    def of(cls, exc: RealtimeError) -> ErrorEvent:
        return cls(error=ErrorDetail(code=exc.code, message=str(exc), param=exc.param, event_id=exc.event_id))


# The `/api/chat` events that Realtime clients get too, as extension events (OpenAI's clients pass on event types
# they do not know); `session.updated` there once a new persona or voice is prefilled.
SpanEvent = Retrieval | Question | SpanInjected | SpanDropped | SessionEnding | Prefilled
EXTENSION_PREFIX = "contextspan."


class Extension(ServerEvent):
    """An `/api/chat` event under its type prefixed `contextspan.`, with its fields as they are there."""

    event: SpanEvent = Field(exclude=True)

    @classmethod
    def of(cls, event: SpanEvent) -> Extension:
        return cls(type=EXTENSION_PREFIX + event.type, event=event)

    @model_serializer(mode="wrap")
    def _flat(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        return handler(self) | self.event.model_dump(mode="json", exclude_none=True, exclude={"type"})


def encode_event(event: ServerEvent, dialect: Dialect) -> str | None:
    """One server event as JSON text under the dialect's name; None where the dialect has no such event."""
    if dialect == "beta" and event.type in GA_ONLY:
        return None
    data = event.model_dump(mode="json")
    if dialect == "beta":
        data["type"] = BETA_NAMES.get(event.type, event.type)
    return json.dumps(data, separators=(",", ":"))
