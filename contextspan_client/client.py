"""The conversation: `connect` opens one (a session token goes in `Authorization: Bearer`), `Conversation` sends
microphone PCM as Ogg Opus and typed messages and yields what the server sends: decoded agent audio, agent text
pieces and the JSON events as server.wire.protocol's models (the ones docs/protocol.asyncapi.yaml describes).
`converse` does a whole exchange with callbacks. A refused or abnormally closed session raises a `ClientError`
subclass carrying the server's reason. The public names are `contextspan_client`'s `__all__`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import random
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import httpx
import numpy as np
import sphn
import websockets
from pydantic import ValidationError
from websockets.exceptions import InvalidStatus

from frontend_model.frame import FRAME_SAMPLES, SAMPLE_RATE
from server.wire import protocol as p

# Sending may run this far ahead of real time when asked to go "as fast as allowed": the server keeps
# input_backlog_frames (50 frames, 4 s, by default) unprocessed input before it drops the oldest.
FAST_LEAD_S = 2.0
MAX_MESSAGE_BYTES = 2**22


# errors ------------------------------------------------------------------------------------------------------


class ClientError(Exception):
    """Base of this client's errors. `error` is the server's machine-readable reason (`token_expired`,
    `at_capacity`, ...; empty when it gave none), `message` its explanation."""

    def __init__(self, error: str, message: str) -> None:
        super().__init__(error, message)
        self.error = error
        self.message = message

    def __str__(self) -> str:
        return f"{self.error}: {self.message}" if self.error else self.message


class Refused(ClientError):
    """The server refused the WebSocket upgrade with an HTTP status: no session was opened, no token spent unless
    the token itself was the problem."""

    def __init__(self, status: int, error: str, message: str) -> None:
        super().__init__(error, message)
        self.status = status

    def __str__(self) -> str:
        return f"HTTP {self.status} {super().__str__()}"


class Unauthorized(Refused):
    """401: the session token is missing, unknown, already spent or expired (`token_*`); get a fresh one."""


class Forbidden(Refused):
    """403: this Origin may not open sessions (`origin_not_allowed`)."""


class TooManyConnections(Refused):
    """429: too many connections from this address (`too_many_connections`)."""


class SessionClosed(ClientError):
    """The server closed the session with a code other than 1000 (normal); `code` is the WebSocket close code."""

    def __init__(self, code: int, error: str, message: str) -> None:
        super().__init__(error, message)
        self.code = code

    def __str__(self) -> str:
        return f"close {self.code} {super().__str__()}"


class GoingAway(SessionClosed):
    """1001: the server is shutting down (`server_shutdown`); reconnect, to another instance if there is one."""


class BadMessages(SessionClosed):
    """1003 or 1007: this client kept sending messages the server cannot use (`too_many_errors`)."""


class ConnectionLost(SessionClosed):
    """1006: the connection dropped without a close frame (network, a proxy, a killed server)."""


class PolicyViolation(SessionClosed):
    """1008: the request breaks a rule (`bad_persona`, `bad_sampling`, `rate_limited`); retrying as is won't help."""


class MessageTooBig(SessionClosed):
    """1009: a message over the server's max_message_bytes."""


class ServerError(SessionClosed):
    """1011: the session failed on the server (`internal`, `worker_restarted`)."""


class TryAgain(SessionClosed):
    """1013: `at_capacity`, `not_ready` or `draining`: retry after a random back-off of a few seconds."""


class NoHandshake(ClientError):
    """The server's first message was not the handshake: not a contextspan / Moshi server."""


REFUSALS: dict[int, type[Refused]] = {401: Unauthorized, 403: Forbidden, 429: TooManyConnections}
CLOSES: dict[int, type[SessionClosed]] = {
    p.CLOSE_GOING_AWAY: GoingAway, p.CLOSE_UNSUPPORTED: BadMessages, 1006: ConnectionLost,
    p.CLOSE_BAD_DATA: BadMessages, p.CLOSE_POLICY: PolicyViolation, p.CLOSE_TOO_BIG: MessageTooBig,
    p.CLOSE_INTERNAL: ServerError, p.CLOSE_TRY_AGAIN: TryAgain,
}


def _error_and_message(text: str) -> tuple[str, str]:
    """The server's reasons are JSON `{"error": ..., "message": ...}`; anything else is kept as the message."""
    with contextlib.suppress(ValueError):
        data = json.loads(text)
        if isinstance(data, dict) and isinstance(data.get("error"), str):
            return data["error"], str(data.get("message", ""))
    return "", text


def refusal_error(status: int, body: bytes) -> Refused:
    error, message = _error_and_message(body.decode("utf-8", "replace"))
    return REFUSALS.get(status, Refused)(status, error, message or f"HTTP {status}")


def close_error(code: int, reason: str) -> SessionClosed:
    error, message = _error_and_message(reason)
    return CLOSES.get(code, SessionClosed)(code, error, message or f"closed with {code}")


def _closed(exc: websockets.ConnectionClosed) -> SessionClosed:
    """The server's close frame, else ours, else 1006 (the connection just dropped)."""
    frame = exc.rcvd or exc.sent
    return close_error(frame.code, frame.reason) if frame is not None else close_error(1006, "")


# what arrives ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AudioChunk:
    """The agent's voice from one audio message, decoded: 24 kHz mono float32 (usually 80 ms; empty while the
    Opus decoder fills)."""

    pcm: np.ndarray


@dataclass(frozen=True)
class TextPiece:
    """A piece of the agent's text (binary kind 0x02, what every Moshi client gets; `agent.text` events add the
    frame)."""

    text: str


Received = AudioChunk | TextPiece | p.ServerEvent


def decode_event_text(text: str) -> p.ServerEvent | None:
    """A JSON event as its model; None for an event type this client does not know, and fields it does not know
    are dropped: a newer server may add both (the protocol asks clients to ignore them)."""
    try:
        return p.decode_event(text)
    except ValidationError as exc:
        errors = exc.errors()
        if any(e["type"] == "union_tag_invalid" for e in errors):
            return None
        if not all(e["type"] == "extra_forbidden" and len(e["loc"]) == 2 for e in errors):
            raise
        data = json.loads(text)
        for e in errors:
            data.pop(e["loc"][1], None)
        return p.decode_event(json.dumps(data))


# connecting --------------------------------------------------------------------------------------------------


def chat_address(url: str, events: bool = True, query: Mapping[str, str] | None = None) -> str:
    """The /api/chat WebSocket URL from the server's base URL (http(s) or ws(s)), or from a chat URL, plus query
    parameters: `persona`, `voice`, `user`, sampling (see docs/protocol.md)."""
    parts = urlsplit(url)
    scheme = {"http": "ws", "https": "wss"}.get(parts.scheme, parts.scheme)
    path = parts.path if parts.path.endswith("/api/chat") else parts.path.rstrip("/") + "/api/chat"
    params = {**dict(parse_qsl(parts.query)), **(query or {}), **({"events": "1"} if events else {})}
    return urlunsplit((scheme, parts.netloc, path, urlencode(params), ""))


def chat_url(base: str, events: bool = False, **query: str) -> str:
    """`chat_address` with the query as keywords and the JSON events off unless asked for."""
    return chat_address(base, events, query)


async def session_token(url: str, api_key: str, timeout: float = 10.0) -> str:
    """What an app's backend does: trade the operator API key for a single-use session token (POST /api/token)
    that the device spends on one conversation. Raises `Refused` (`Unauthorized` for a bad key)."""
    parts = urlsplit(url)
    scheme = {"ws": "http", "wss": "https"}.get(parts.scheme, parts.scheme)
    async with httpx.AsyncClient(timeout=timeout) as http:
        response = await http.post(urlunsplit((scheme, parts.netloc, "/api/token", "", "")),
                                   headers={"Authorization": f"Bearer {api_key}"})
    if response.status_code != 200:
        raise refusal_error(response.status_code, response.content)
    return str(response.json()["token"])


# Closes after which the session may go on elsewhere: the reason of 4000 carries a fresh token; after the others the
# token from `session.ready` is tried (a replica killed or restarted, a connection lost).
RESUMABLE = frozenset({p.CLOSE_RESUME_ELSEWHERE, p.CLOSE_GOING_AWAY, 1006, p.CLOSE_INTERNAL})
# Resuming may first meet a replica still draining or loading (1013: a load balancer has not yet seen its /readyz
# fail or pass), a load balancer with no replica up (502-504), a replica gone (refused, 1001, 1006) or the old socket
# not yet closed on the server (4409): the addresses are tried again after a growing, jittered pause, for
# `resume_within_s` (the server keeps the state for minutes). Any other refusal ends the session, and so does one
# round of refusals after 1001: a server closes so only where it could not hand the session over (no shared store).
RESUME_WITHIN_S = 60.0
# A model fault (1011) that comes again this soon after the session resumed from one is the replayed history's own:
# resuming once more would replay it into the same fault, for ever.
FAULT_AGAIN_S = 10.0
RESUME_FIRST_PAUSE_S = 0.25
RESUME_MAX_PAUSE_S = 4.0
RETRY_CLOSES = frozenset({p.CLOSE_TRY_AGAIN, p.CLOSE_RESUME_IN_USE, p.CLOSE_GOING_AWAY, 1006})
RETRY_STATUSES = frozenset({502, 503, 504})


def _worth_retrying(exc: Exception) -> bool:
    if isinstance(exc, SessionClosed):
        return exc.code in RETRY_CLOSES
    if isinstance(exc, Refused):
        return exc.status in RETRY_STATUSES
    return isinstance(exc, OSError | TimeoutError)


@dataclass(frozen=True)
class _Route:
    """How to open the conversation's socket again: its addresses (the first one it opened, then the failovers),
    its query and its timeouts."""

    urls: tuple[str, ...]
    events: bool
    query: Mapping[str, str]
    headers: Mapping[str, str] | None
    open_timeout: float
    handshake_timeout: float
    resume_within_s: float = RESUME_WITHIN_S

    async def open(self, url: str, **more: str) -> tuple[websockets.ClientConnection, list[p.SessionPreparing]]:
        """The socket, once its handshake arrived: before it the server prefills (or replays) the session."""
        try:
            ws = await websockets.connect(chat_address(url, self.events, {**self.query, **more}),
                                          max_size=MAX_MESSAGE_BYTES, open_timeout=self.open_timeout,
                                          additional_headers=self.headers)
        except InvalidStatus as exc:
            raise refusal_error(exc.response.status_code, exc.response.body or b"") from None
        preparing: list[p.SessionPreparing] = []
        try:
            first = await asyncio.wait_for(ws.recv(), timeout=self.handshake_timeout)
            # A long prefill: with events on, `session.preparing` every few seconds until the handshake.
            while isinstance(first, str) and isinstance(event := decode_event_text(first), p.SessionPreparing):
                preparing.append(event)
                first = await asyncio.wait_for(ws.recv(), timeout=self.handshake_timeout)
        except websockets.ConnectionClosed as exc:
            raise _closed(exc) from None
        except BaseException:
            await ws.close()
            raise
        if first != p.handshake():
            await ws.close()
            raise NoHandshake("no_handshake", f"expected the handshake 0x00 first, got {first[:20]!r}")
        return ws, preparing


class Conversation:
    """One open session. Send with `send_audio` / `stream_audio` / `send`; iterate to receive, until the session
    closes: normally (1000, also after `close()`) the iteration ends, otherwise it raises the `SessionClosed`
    subclass of the close code. A session handed over by a draining server (4000), or cut off (1001, 1006, 1011),
    is resumed on its own where the server keeps sessions (`session.ready` `resume`): the next address first, a new
    `session.ready` arrives, and `resumes` counts it."""

    def __init__(self, ws: websockets.ClientConnection, preparing: Sequence[p.SessionPreparing] = (),
                 route: _Route | None = None) -> None:
        self._ws = ws
        self._route = route
        self._writer = sphn.OpusStreamWriter(SAMPLE_RATE)
        self._reader = sphn.OpusStreamReader(SAMPLE_RATE)
        self._reconnecting = asyncio.Lock()
        self._at = 0  # which of the route's addresses the socket went to
        self.ready: p.SessionReady | None = None  # the `session.ready` event, once received (events on)
        self.preparing = list(preparing)  # the `session.preparing` events that came before the handshake
        self.resumes = 0
        self._fault_resumed_at: float | None = None  # time.monotonic() of the last resume after a model fault

    @property
    def close_code(self) -> int | None:
        return self._ws.close_code

    @property
    def close_reason(self) -> str:
        return self._ws.close_reason or ""

    async def send_audio(self, pcm: np.ndarray) -> None:
        """Encode 24 kHz mono float32 PCM and send the Ogg pages it completes, now: pacing is the caller's."""
        pages = self._writer.append_pcm(np.asarray(pcm, dtype=np.float32))
        if pages:
            await self._send(p.audio_message(pages))

    async def stream_audio(self, pcm: np.ndarray, lead_s: float = 0.0, page_samples: int = FRAME_SAMPLES) -> None:
        """Send `pcm` a page at a time on the real-time schedule: the wire is the model's clock, one step per 80 ms
        received. `lead_s` lets sending run that far ahead (FAST_LEAD_S: as fast as the server keeps it all)."""
        pages = math.ceil(len(pcm) / page_samples)
        padded = np.zeros(pages * page_samples, np.float32)
        padded[: len(pcm)] = pcm
        start = time.perf_counter()
        for i in range(pages):
            await asyncio.sleep(max(0.0, start + i * page_samples / SAMPLE_RATE - lead_s - time.perf_counter()))
            await self.send_audio(padded[i * page_samples : (i + 1) * page_samples])

    async def send(self, message: p.SessionUpdate | p.SpanInject | p.UserText | str) -> None:
        """A typed client message (`session.update`, `span.inject`, `user.text`), or a JSON text as it is."""
        await self._send(message if isinstance(message, str) else message.model_dump_json(exclude_none=True))

    async def close(self) -> None:
        """End the conversation normally (1000)."""
        await self._ws.close()

    async def _send(self, data: bytes | str) -> None:
        ws = self._ws
        try:
            await ws.send(data)
        except websockets.ConnectionClosed as exc:
            await self._resume_after(ws, exc)  # what was being sent is lost with the last second or so

    async def __aiter__(self) -> AsyncIterator[Received]:
        while True:
            ws = self._ws
            try:
                message = await ws.recv()
            except websockets.ConnectionClosed as exc:
                if _closed(exc).code == p.CLOSE_NORMAL:
                    return
                await self._resume_after(ws, exc)
                continue
            item = self._decode(message)
            if item is not None:
                yield item

    async def _resume_after(self, ws: websockets.ClientConnection, exc: websockets.ConnectionClosed) -> None:
        """Reconnect with the session's resume token, address after address from the next one, again after a pause
        while a refusal may pass (`_worth_retrying`); raises the close as a `SessionClosed` where it cannot. Sending
        and receiving may both see the close: the first one reconnects."""
        async with self._reconnecting:
            if self._ws is not ws:
                return
            error = _closed(exc)
            token = error.message if error.code == p.CLOSE_RESUME_ELSEWHERE else self.ready and self.ready.resume
            if self._route is None or error.code not in RESUMABLE or not token:
                raise error
            if error.code == p.CLOSE_INTERNAL:
                now = time.monotonic()
                if self._fault_resumed_at is not None and now - self._fault_resumed_at < FAULT_AGAIN_S:
                    raise error
                self._fault_resumed_at = now
            urls = self._route.urls
            deadline = time.monotonic() + self._route.resume_within_s
            pause = RESUME_FIRST_PAUSE_S
            while True:
                passing = False  # whether a refusal may pass: worth another round
                for step in range(1, len(urls) + 1):
                    at = (self._at + step) % len(urls)
                    try:
                        self._ws, preparing = await self._route.open(urls[at], resume=token)
                    except (ClientError, OSError, TimeoutError) as exc:
                        passing = passing or _worth_retrying(exc)
                        continue
                    self._at, self.preparing, self.resumes = at, preparing, self.resumes + 1
                    self._writer = sphn.OpusStreamWriter(SAMPLE_RATE)  # the new session reads a new Ogg stream
                    self._reader = sphn.OpusStreamReader(SAMPLE_RATE)
                    return
                wait = pause * random.uniform(0.5, 1.0)  # jittered: a drained replica's calls do not return at once
                if not passing or error.code == p.CLOSE_GOING_AWAY or time.monotonic() + wait > deadline:
                    raise error
                await asyncio.sleep(wait)
                pause = min(pause * 2, RESUME_MAX_PAUSE_S)

    def _decode(self, message: bytes | str) -> Received | None:
        """Unknown binary kinds and event types are skipped, as the protocol asks of clients."""
        if isinstance(message, str):
            event = decode_event_text(message)
            if isinstance(event, p.SessionReady):
                self.ready = event
            return event
        try:
            kind, payload = p.decode_binary(message)
        except p.ProtocolError:
            return None
        if kind == p.Kind.AUDIO:
            return AudioChunk(np.asarray(self._reader.append_bytes(payload), dtype=np.float32).reshape(-1))
        if kind == p.Kind.TEXT:
            return TextPiece(payload.decode("utf-8"))
        return None


@contextlib.asynccontextmanager
async def connect(url: str, token: str | None = None, events: bool = True, open_timeout: float = 30.0,
                  handshake_timeout: float = 120.0, failover: Sequence[str] = (),
                  resume_within_s: float = RESUME_WITHIN_S, **query: str) -> AsyncIterator[Conversation]:
    """Open a conversation and wait for the handshake (the server prefills the persona first); closes it (1000) on
    exit. `url`: the server's base URL or its chat URL. `token`: a session token (`session_token`), sent as
    `Authorization: Bearer`. `events`: the JSON events too (resuming needs them: `session.ready` has the token).
    `failover`: other replicas' URLs, tried in turn when the session must resume elsewhere (behind a load balancer
    `url` alone is enough). `resume_within_s`: how long a resume keeps trying while replicas drain or load.
    `query`: `persona`, `voice`, `user`, sampling."""
    headers = {"Authorization": f"Bearer {token}"} if token else None
    route = _Route((url, *failover), events, query, headers, open_timeout, handshake_timeout, resume_within_s)
    ws, preparing = await route.open(url)
    conversation = Conversation(ws, preparing, route)
    try:
        yield conversation
    finally:
        await conversation.close()


def load_wav(path: str) -> np.ndarray:
    """Any audio file -> 24 kHz mono float32."""
    data, _ = sphn.read(path, sample_rate=SAMPLE_RATE)
    return np.asarray(data, dtype=np.float32).mean(axis=0)


@dataclass
class Reply:
    """Everything the server sent in one conversation."""

    audio: np.ndarray  # the agent's voice, 24 kHz mono float32
    text: str  # the agent's text pieces, joined
    events: list[p.ServerEvent]
    close_code: int | None
    close_reason: str

    def of_type(self, kind: str) -> list[Any]:
        return [e for e in self.events if e.type == kind]


async def converse(url: str, audio: np.ndarray | str | Path, token: str | None = None, lead_s: float = 0.0,
                   tail_s: float = 2.0, catch_up_s: float = 10.0,
                   on_audio: Callable[[np.ndarray], None] | None = None,
                   on_text: Callable[[str], None] | None = None,
                   on_event: Callable[[p.ServerEvent], None] | None = None,
                   messages: Sequence[p.SessionUpdate | p.SpanInject] = (), **query: str) -> Reply:
    """Say `audio` (24 kHz mono float32 PCM, or an audio file of any rate) to the agent and collect its reply:
    `messages` are sent first, the audio is streamed (`lead_s` ahead of real time at most), then `tail_s` of
    silence lets the agent finish. The server answers each 80 ms frame with 80 ms of voice: the close (1000) waits
    until that voice has come for all but the last frame sent, at most `catch_up_s` (a server behind its clock, or
    audio sent ahead, is still answering). The callbacks see each piece as it arrives. Raises a `ClientError` if
    the server refuses or ends it."""
    pcm = load_wav(str(audio)) if isinstance(audio, str | Path) else np.asarray(audio, dtype=np.float32)
    said = np.concatenate([pcm, np.zeros(round(tail_s * SAMPLE_RATE), np.float32)])
    answered_at = (math.ceil(len(said) / FRAME_SAMPLES) - 1) * FRAME_SAMPLES
    heard = 0
    voice: list[np.ndarray] = []
    text: list[str] = []
    events: list[p.ServerEvent] = []
    async with connect(url, token=token, **query) as conversation:

        async def talk() -> None:
            for message in messages:
                await conversation.send(message)
            await conversation.stream_audio(said, lead_s=lead_s)
            give_up = time.monotonic() + catch_up_s
            while heard < answered_at and time.monotonic() < give_up:
                await asyncio.sleep(0.05)
            await conversation.close()

        talker = asyncio.create_task(talk())
        try:
            async for item in conversation:
                if isinstance(item, AudioChunk):
                    voice.append(item.pcm)
                    heard += item.pcm.size
                    if on_audio is not None:
                        on_audio(item.pcm)
                elif isinstance(item, TextPiece):
                    text.append(item.text)
                    if on_text is not None:
                        on_text(item.text)
                else:
                    events.append(item)
                    if on_event is not None:
                        on_event(item)
        finally:
            talker.cancel()
            await asyncio.gather(talker, return_exceptions=True)
    return Reply(np.concatenate(voice) if voice else np.zeros(0, np.float32), "".join(text), events,
                 conversation.close_code, conversation.close_reason)
