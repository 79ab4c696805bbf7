"""The wire format, as pure functions: Moshi kind-byte binary messages and opt-in JSON events.

Binary messages (both directions) start with one kind byte; this module encodes and decodes them and the JSON
text messages, so that everything about the format can be tested without a socket.
"""

from __future__ import annotations

import json
from enum import IntEnum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, TypeAdapter, ValidationError

PROTOCOL_VERSION = 1
# The Moshi wire: 24 kHz mono audio, one model frame per 80 ms. Kept here so that clients need no torch.


class Kind(IntEnum):
    HANDSHAKE = 0x00
    AUDIO = 0x01
    TEXT = 0x02


class ProtocolError(ValueError):
    """A client message the server cannot accept; `code` is the machine-readable reason sent back."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


# binary -----------------------------------------------------------------------------------------------------


def handshake() -> bytes:
    return bytes([Kind.HANDSHAKE])


def audio_message(ogg_bytes: bytes) -> bytes:
    return bytes([Kind.AUDIO]) + ogg_bytes


def text_message(piece: str) -> bytes:
    return bytes([Kind.TEXT]) + piece.encode("utf-8")


def decode_binary(message: bytes) -> tuple[Kind, bytes]:
    """Split a binary message into its kind and payload; unknown kinds and empty messages are errors."""
    if not message:
        raise ProtocolError("empty_message", "binary message without a kind byte")
    try:
        kind = Kind(message[0])
    except ValueError:
        raise ProtocolError("unknown_kind", f"unknown message kind 0x{message[0]:02x}") from None
    return kind, bytes(message[1:])


# connect-time query parameters ---------------------------------------------------------------------------------

MAX_TEMPERATURE = 5.0
SEED_LIMIT = 2**32
# Kyutai's web client sends these too; accepted, not applied, and named in `session.ready` `unsupported`.
UNSUPPORTED_SAMPLING = ("pad_mult", "repetition_penalty_context", "repetition_penalty")


class SamplingUpdate(BaseModel):
    """Sampling settings a session chooses; one left out keeps its value (at connect: the checkpoint's default)."""

    model_config = ConfigDict(extra="forbid")

    text_temperature: float | None = Field(None, ge=0, le=MAX_TEMPERATURE, allow_inf_nan=False)
    text_topk: int | None = Field(None, ge=0)
    audio_temperature: float | None = Field(None, ge=0, le=MAX_TEMPERATURE, allow_inf_nan=False)
    audio_topk: int | None = Field(None, ge=0)
    text_seed: int | None = Field(None, ge=0, lt=SEED_LIMIT)
    audio_seed: int | None = Field(None, ge=0, lt=SEED_LIMIT)

    def chosen(self) -> dict[str, float | int]:
        return {name: value for name in SamplingUpdate.model_fields if (value := getattr(self, name)) is not None}


class SamplingQuery(SamplingUpdate):
    """The sampling query parameters of Kyutai's clients; one left out takes the checkpoint's default."""

    model_config = ConfigDict(extra="ignore")

    pad_mult: float | None = Field(None, allow_inf_nan=False)
    repetition_penalty_context: float | None = Field(None, allow_inf_nan=False)
    repetition_penalty: float | None = Field(None, allow_inf_nan=False)

    @classmethod
    def parse(cls, query: dict[str, str]) -> SamplingQuery:
        """Raises ValueError with every bad parameter and why, for the `bad_sampling` close reason."""
        try:
            return cls.model_validate({name: value for name, value in query.items() if name in cls.model_fields})
        except ValidationError as exc:
            raise ValueError("; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())) from None

    def unsupported(self) -> dict[str, float]:
        return {name: value for name in UNSUPPORTED_SAMPLING if (value := getattr(self, name)) is not None}


class Sampling(BaseModel):
    """The sampling a session runs with. Temperature 0 or top-k 1 is greedy; top-k 0 keeps the whole vocabulary."""

    text_temperature: float
    text_topk: int
    audio_temperature: float
    audio_topk: int
    text_seed: int = Field(description="the same seeds and settings repeat the same output for the same input")
    audio_seed: int


# client -> server JSON ---------------------------------------------------------------------------------------


class UserProfile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str | None = Field(None, max_length=200)
    location: str | None = Field(None, max_length=200)
    timezone: str | None = Field(None, max_length=64)


class ClientTool(BaseModel):
    """A function tool the client runs itself: it joins the backend's catalogue; when the LLM picks it the server
    sends `tool.call` and the client's `tool.result` becomes the span, inside the span deadline."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: str = Field("", max_length=2000)
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}},
                                       description="JSON Schema of the arguments, as in OpenAI function calling")


class SessionUpdate(BaseModel):
    """Persona and voice only take effect before the handshake (they are prefilled); profile and notes anytime."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["session.update"]
    persona: str | None = Field(None, max_length=8000)
    voice: str | None = Field(None, max_length=200)
    profile: UserProfile | None = None
    notes: str | None = Field(None, max_length=8000)
    sampling: SamplingUpdate | None = Field(
        None, description="from the next frame on; new seeds restart the session's draws from them")
    tools: list[ClientTool] | None = Field(
        None, max_length=64, description="client-run tools; replaces those declared before ([] removes them)")


# Longer app text would be cut to the span's frame cap anyway (a few hundred characters at most on any machine).
MAX_APP_SPAN_CHARS = 2000


class SpanInject(BaseModel):
    """App-provided text to inject as a Context Span at the next frame boundary (where the server allows it)."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["span.inject"]
    text: str = Field(min_length=1, max_length=MAX_APP_SPAN_CHARS)
    source: str | None = Field(None, max_length=200)


MAX_TOOL_OUTPUT_CHARS = MAX_APP_SPAN_CHARS


class ToolResult(BaseModel):
    """The client's answer to a `tool.call`: its text becomes the span, if it arrives within the span deadline."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["tool.result"]
    call_id: str = Field(max_length=100)
    output: str = Field(max_length=MAX_TOOL_OUTPUT_CHARS)


# A typed user turn goes to the backend's LLM as the user's words; a spoken one ends at 15 s (some 50 words), and
# longer text is no question.
MAX_USER_TEXT_CHARS = 1000


class UserText(BaseModel):
    """A typed user turn, taken as a spoken one that was transcribed: stored as the user's turn and the question of
    a retrieval started at once, whose answer the model says as a span."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["user.text"]
    text: Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=MAX_USER_TEXT_CHARS)]


ClientMessage = Annotated[SessionUpdate | SpanInject | ToolResult | UserText, Field(discriminator="type")]
_client_adapter: TypeAdapter[ClientMessage] = TypeAdapter(ClientMessage)
_CLIENT_TYPES = ("session.update", "span.inject", "tool.result", "user.text")


def parse_client_text(text: str) -> ClientMessage:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ProtocolError("invalid_json", f"text message is not JSON: {exc.msg} at {exc.pos}") from None
    except (RecursionError, ValueError):  # nesting past the recursion limit; integers over 4300 digits
        raise ProtocolError("invalid_json", "text message nests too deeply or holds too large a number") from None
    if not isinstance(data, dict) or "type" not in data:
        raise ProtocolError("invalid_message", "a JSON message must be an object with a 'type'")
    if data["type"] not in _CLIENT_TYPES:
        raise ProtocolError("unknown_type", f"unknown message type {data['type']!r}")
    try:
        return _client_adapter.validate_python(data)
    except ValidationError as exc:
        errors = exc.errors()
        if data["type"] == "span.inject" and any(e["type"] == "string_too_long" and e["loc"][-1:] == ("text",)
                                                 for e in errors):
            raise ProtocolError("span_too_long", f"span.inject text is over {MAX_APP_SPAN_CHARS} characters") from None
        if data["type"] == "user.text" and [e["loc"] for e in errors] == [("user.text", "text")]:
            raise ProtocolError("invalid_text", f"user.text text must hold 1 to {MAX_USER_TEXT_CHARS} characters "
                                "(surrounding whitespace aside)") from None
        detail = "; ".join(f"{'.'.join(map(str, e['loc'][1:]))}: {e['msg']}" for e in errors)
        raise ProtocolError("invalid_message", f"invalid {data['type']}: {detail}") from None


# server -> client JSON ---------------------------------------------------------------------------------------


class ServerEvent(BaseModel):
    """Base of every server -> client JSON event."""

    model_config = ConfigDict(extra="forbid")

    t: float = Field(description="seconds of stream time (frames received x 80 ms) when the event happened")


class SessionReady(ServerEvent):
    type: Literal["session.ready"] = "session.ready"
    session_id: str
    protocol: int = PROTOCOL_VERSION
    profile: str
    random_weights: bool
    description: str
    prefix_frames: int
    prefill_ms: float
    persona: str = Field("", description="the persona text prefilled: the one asked for, else the checkpoint's "
                         "default, with the user's name and place for Context Spanning checkpoints")
    voice: str | None = Field(None, description="the voice prompt prefilled: the one asked for, else the "
                              "checkpoint's default; none for checkpoints without voices")
    trigger: Literal["ret", "asr"] = Field(
        description="what starts a retrieval here: the model's `<ret>`, or a question in the user's final transcript")
    app_spans: bool = Field(description="whether this session accepts `span.inject`")
    sampling: Sampling = Field(description="the sampling in effect: the query parameters over the checkpoint's")
    unsupported: dict[str, float] = Field(
        default_factory=dict, description="sampling query parameters received but not applied, with their values")
    recording: dict[str, str] | None = None
    resume: str | None = Field(None, description="this session's resume token: `/api/chat?resume=<token>` on any "
                               "replica continues it after a drain or a crash; none when resume is off")
    resumed_frames: int | None = Field(None, description="set when this session was resumed: the stream positions "
                                       "its history replayed")


class SessionPreparing(ServerEvent):
    """The session is accepted but not ready: sent every `keepalive_s` until the handshake, so that a client's idle
    timer does not fire during a long prefill. Only to events clients; binary ones get WebSocket pings."""

    type: Literal["session.preparing"] = "session.preparing"
    stage: Literal["prefix", "prefill"] = Field(
        description="prefix: tokenising the persona and reading the voice prompt; prefill: the model writes it")
    elapsed_s: float = Field(description="seconds since the session was accepted")
    prefix_frames: int | None = Field(None, description="frames to prefill, once the prefix is built")


class SessionUpdated(ServerEvent):
    type: Literal["session.updated"] = "session.updated"
    profile: UserProfile | None = None
    notes: str | None = None
    sampling: Sampling | None = Field(None, description="the sampling in effect (before the handshake: null)")
    tools: list[str] | None = Field(None, description="the client tools declared, by name")
    prefix_frames: int | None = Field(
        None, description="a new persona or voice was prefilled at a frame boundary (Realtime sessions): its frames")
    prefill_ms: float | None = None


class AgentText(ServerEvent):
    type: Literal["agent.text"] = "agent.text"
    text: str
    frame: int


class UserTranscript(ServerEvent):
    type: Literal["user.transcript"] = "user.transcript"
    text: str
    final: bool
    start: float | None = None
    end: float | None = None


class UserSpeech(ServerEvent):
    """The user started or stopped speaking, as the voice-activity detection that cuts speech into utterances hears
    it: `started` before the utterance's transcripts, `stopped` before its final one."""

    type: Literal["user.speech"] = "user.speech"
    state: Literal["started", "stopped"]
    at: float = Field(description="stream seconds where the speech starts (300 ms of lead-in included) or ends (the "
                      "silence that ended it included; or where a Realtime client committed its input)")


class Retrieval(ServerEvent):
    """The model emitted `<ret>`: it wants facts it does not hold."""

    type: Literal["retrieval"] = "retrieval"
    frame: int


class Question(ServerEvent):
    type: Literal["question"] = "question"
    text: str


class SpanInjected(ServerEvent):
    type: Literal["span.injected"] = "span.injected"
    text: str
    source: str | None = None
    tool: str | None = None
    question: str | None = None
    frames: int
    prefill_ms: float
    latency_ms: float = Field(description="end to end: from `<ret>` (or the span request) to the end of injection")
    truncated: bool
    dropped_text: str = ""
    offset_before: int = Field(description="frames the model had consumed before the span")
    offset_after: int = Field(description="frames consumed after it: offset_before + frames")
    step: int = Field(0, description="frames this session had stepped when the span went in: the frame boundary")
    deferred_ticks: int = Field(0, description="ticks it waited because it did not fit a frame's budget")
    timings_ms: dict[str, float] = Field(default_factory=dict, description="question pick, ASR, LLM, tool, build")


class SpanDropped(ServerEvent):
    type: Literal["span.dropped"] = "span.dropped"
    text: str
    source: str | None = None
    tool: str | None = None
    question: str | None = None
    reason: str
    latency_ms: float
    timings_ms: dict[str, float] = Field(default_factory=dict, description="what the retrieval spent before failing")


class ToolCall(ServerEvent):
    """The backend's LLM chose a tool the client declared: run it and answer with `tool.result` and this call_id."""

    type: Literal["tool.call"] = "tool.call"
    call_id: str
    name: str
    arguments: str = Field(description="the arguments as a JSON object in a string, as the LLM wrote them")


class ErrorEvent(ServerEvent):
    type: Literal["error"] = "error"
    code: str
    message: str


class SessionEnding(ServerEvent):
    """The server will close this session in `in_s` seconds: the duration cap, or a server shutting down."""

    type: Literal["session.ending"] = "session.ending"
    reason: Literal["max_duration", "server_shutdown"]
    in_s: float


class Stats(ServerEvent):
    """Once a second: what happened in the last second, and running totals."""

    type: Literal["stats"] = "stats"
    frames_in: int
    frames_out: int
    latency_ms: list[float] = Field(description="server latency of each frame of the last second, arrival to output")
    deadline_misses: int
    audio_dropped: int
    input_dropped: int
    send_queue: int


Event = Annotated[
    SessionReady | SessionPreparing | SessionUpdated | AgentText | UserTranscript | UserSpeech | Retrieval
    | Question | SpanInjected | SpanDropped | ToolCall | ErrorEvent | SessionEnding | Stats,
    Field(discriminator="type"),
]
_event_adapter: TypeAdapter[Event] = TypeAdapter(Event)


def encode_event(event: ServerEvent) -> str:
    return event.model_dump_json(exclude_none=True)


def decode_event(text: str) -> Event:
    """For clients and tests: one JSON text message back into its typed event."""
    return _event_adapter.validate_json(text)


def event_record(event: ServerEvent, wall_time: float) -> dict[str, Any]:
    """One transcript line: the event plus the wall-clock time it was emitted."""
    return {"wall": round(wall_time, 3), **event.model_dump(exclude_none=True)}


# close codes -------------------------------------------------------------------------------------------------

CLOSE_NORMAL = 1000
CLOSE_GOING_AWAY = 1001
CLOSE_UNSUPPORTED = 1003
CLOSE_BAD_DATA = 1007
CLOSE_POLICY = 1008
CLOSE_TOO_BIG = 1009
CLOSE_INTERNAL = 1011
CLOSE_TRY_AGAIN = 1013
# Resume (docs/operations.md, Sessions that outlive their replica): private-use codes, the reason's `error` says more.
CLOSE_RESUME_ELSEWHERE = 4000  # a drain handed the session over: reconnect with ?resume=<the reason's message>
CLOSE_RESUME_BAD_TOKEN = 4401  # not a resume token, or not signed with this deployment's secret
CLOSE_RESUME_OTHER_USER = 4403  # a token of a session opened for another `user`
CLOSE_RESUME_UNKNOWN = 4404  # no state kept for that session: ended normally, or its TTL ran out
CLOSE_RESUME_IN_USE = 4409  # that session is still live on this replica
CLOSE_RESUME_EXPIRED = 4410
CLOSE_RESUME_UNAVAILABLE = 4503  # resume is off, or its store cannot be reached: open a new session


# Error codes about what kind of message was sent; the others are about a message's content.
_UNSUPPORTED_CODES = frozenset({"empty_message", "unknown_kind", "unexpected_kind", "unknown_type"})


def abuse_close_code(error_code: str) -> int:
    """The close code for a client that keeps sending bad messages, by the kind of the last one."""
    return CLOSE_UNSUPPORTED if error_code in _UNSUPPORTED_CODES else CLOSE_BAD_DATA


def close_reason(code: str, message: str) -> str:
    """A JSON close reason that fits the 123-byte limit of a WebSocket close frame."""
    message = message[:123]
    reason = json.dumps({"error": code, "message": message}, separators=(",", ":"))
    while len(reason.encode()) > 123 and message:
        message = message[:-8]
        reason = json.dumps({"error": code, "message": message + "..."}, separators=(",", ":"))
    return reason
