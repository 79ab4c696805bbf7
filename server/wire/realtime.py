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
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from frontend_model.frame import SAMPLE_RATE
from server.wire.protocol import MAX_APP_SPAN_CHARS, MAX_TEMPERATURE, ProtocolError

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


class ResponseCreateEvent(_Open):
    type: Literal["response.create"]
    event_id: str | None = None
    response: dict[str, Any] | None = None


class ResponseCancelEvent(_Open):
    type: Literal["response.cancel"]
    event_id: str | None = None
    response_id: str | None = None


ClientEvent = Annotated[
    SessionUpdateEvent | AppendEvent | CommitEvent | ClearEvent | ItemCreateEvent | ItemTruncateEvent
    | ItemDeleteEvent | ResponseCreateEvent | ResponseCancelEvent,
    Field(discriminator="type"),
]
_client_adapter: TypeAdapter[ClientEvent] = TypeAdapter(ClientEvent)
CLIENT_TYPES = ("session.update", "input_audio_buffer.append", "input_audio_buffer.commit",
                "input_audio_buffer.clear", "conversation.item.create", "conversation.item.truncate",
                "conversation.item.delete", "response.create", "response.cancel")


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
    """The text of a user or system message item; input_audio parts are refused (audio goes through the buffer)."""
    texts = []
    for part in item.content:
        if part.type not in ("input_text", "text"):
            raise RealtimeError("unsupported_content", f"content of type {part.type!r} cannot become a span: send "
                                "text parts (input_text); audio goes through input_audio_buffer.append")
        texts.append(part.text or "")
    text = " ".join(t.strip() for t in texts if t.strip())
    if not text:
        raise RealtimeError("empty_item", "the item holds no text")
    if len(text) > MAX_APP_SPAN_CHARS:
        raise RealtimeError("span_too_long", f"item text is over {MAX_APP_SPAN_CHARS} characters")
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


def server_event(dialect: Dialect, type_: str, **fields: Any) -> str | None:
    """One server event as JSON text under the dialect's name (None: the event does not exist in that dialect)."""
    if dialect == "beta":
        if type_ in GA_ONLY:
            return None
        type_ = BETA_NAMES.get(type_, type_)
    return json.dumps({"type": type_, "event_id": new_id("event"), **fields}, separators=(",", ":"))


def error_fields(exc: ProtocolError) -> dict[str, Any]:
    event_id = exc.event_id if isinstance(exc, RealtimeError) else None
    param = exc.param if isinstance(exc, RealtimeError) else None
    return {"error": {"type": "invalid_request_error", "code": exc.code, "message": str(exc), "param": param,
                      "event_id": event_id}}


def assistant_item(item_id: str, status: str, transcript: str | None, dialect: Dialect) -> dict[str, Any]:
    part_type = "output_audio" if dialect == "ga" else "audio"
    content = [] if transcript is None else [{"type": part_type, "transcript": transcript}]
    return {"id": item_id, "object": "realtime.item", "type": "message", "role": "assistant", "status": status,
            "content": content}


def user_item(item_id: str, transcript: str | None) -> dict[str, Any]:
    return {"id": item_id, "object": "realtime.item", "type": "message", "role": "user", "status": "completed",
            "content": [{"type": "input_audio", "transcript": transcript}]}


def function_call_item(item_id: str, call_id: str, name: str, arguments: str, status: str) -> dict[str, Any]:
    return {"id": item_id, "object": "realtime.item", "type": "function_call", "status": status, "call_id": call_id,
            "name": name, "arguments": arguments}


def response(response_id: str, status: str, output: list[dict[str, Any]],
             status_details: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"id": response_id, "object": "realtime.response", "status": status, "status_details": status_details,
            "output": output, "output_modalities": ["audio"], "usage": None}
