"""The Python client of /api/chat: the public library for app authors, and what the e2e tests and benchmarks use.

`connect` opens one conversation (a session token goes in `Authorization: Bearer`), `Conversation` sends
microphone PCM as Ogg Opus and typed messages and yields what the server sends: decoded agent audio, agent text
pieces and the JSON events as server.wire.protocol's models (the ones docs/protocol.asyncapi.yaml describes). `converse`
does a whole exchange with callbacks; `contextspan client` is its command line. A refused or abnormally closed
session raises a `ClientError` subclass carrying the server's reason. It needs numpy, sphn, websockets, httpx and
pydantic, not torch. docs/client.md shows it in use.

The helpers at the end (`stream`, `start_server`, `speak`, ...) drive servers from the tests and benchmarks.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
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

DRAIN_LIMIT_S = 60.0
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


class Conversation:
    """One open session. Send with `send_audio` / `stream_audio` / `send`; iterate to receive, until the session
    closes: normally (1000, also after `close()`) the iteration ends, otherwise it raises the `SessionClosed`
    subclass of the close code."""

    def __init__(self, ws: websockets.ClientConnection, preparing: Sequence[p.SessionPreparing] = ()) -> None:
        self._ws = ws
        self._writer = sphn.OpusStreamWriter(SAMPLE_RATE)
        self._reader = sphn.OpusStreamReader(SAMPLE_RATE)
        self.ready: p.SessionReady | None = None  # the `session.ready` event, once received (events on)
        self.preparing = list(preparing)  # the `session.preparing` events that came before the handshake

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

    async def send(self, message: p.SessionUpdate | p.SpanInject | str) -> None:
        """A typed client message (`session.update`, `span.inject`), or a JSON text as it is."""
        await self._send(message if isinstance(message, str) else message.model_dump_json(exclude_none=True))

    async def close(self) -> None:
        """End the conversation normally (1000)."""
        await self._ws.close()

    async def _send(self, data: bytes | str) -> None:
        try:
            await self._ws.send(data)
        except websockets.ConnectionClosed as exc:
            raise _closed(exc) from None

    async def __aiter__(self) -> AsyncIterator[Received]:
        while True:
            try:
                message = await self._ws.recv()
            except websockets.ConnectionClosed as exc:
                error = _closed(exc)
                if error.code == p.CLOSE_NORMAL:
                    return
                raise error from None
            item = self._decode(message)
            if item is not None:
                yield item

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
                  handshake_timeout: float = 120.0, **query: str) -> AsyncIterator[Conversation]:
    """Open a conversation and wait for the handshake (the server prefills the persona first); closes it (1000) on
    exit. `url`: the server's base URL or its chat URL. `token`: a session token (`session_token`), sent as
    `Authorization: Bearer`. `events`: the JSON events too. `query`: `persona`, `voice`, `user`, sampling."""
    headers = {"Authorization": f"Bearer {token}"} if token else None
    try:
        ws = await websockets.connect(chat_address(url, events, query), max_size=MAX_MESSAGE_BYTES,
                                      open_timeout=open_timeout, additional_headers=headers)
    except InvalidStatus as exc:
        raise refusal_error(exc.response.status_code, exc.response.body or b"") from None
    async with ws:
        preparing: list[p.SessionPreparing] = []
        try:
            first = await asyncio.wait_for(ws.recv(), timeout=handshake_timeout)
            # A long prefill: with events on, `session.preparing` every few seconds until the handshake.
            while isinstance(first, str) and isinstance(event := decode_event_text(first), p.SessionPreparing):
                preparing.append(event)
                first = await asyncio.wait_for(ws.recv(), timeout=handshake_timeout)
        except websockets.ConnectionClosed as exc:
            raise _closed(exc) from None
        if first != p.handshake():
            raise NoHandshake("no_handshake", f"expected the handshake 0x00 first, got {first[:20]!r}")
        yield Conversation(ws, preparing)


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


def client_main(argv: Sequence[str]) -> int:
    """`contextspan client FILE`: say a recording to a server, write the agent's voice, print text and events."""
    parser = argparse.ArgumentParser(prog="contextspan client", description=client_main.__doc__)
    parser.add_argument("input", type=Path, help="audio file (any rate, mixed to 24 kHz mono)")
    parser.add_argument("--url", default="http://127.0.0.1:8998", help="the server's base URL")
    parser.add_argument("--token", default=None, help="a session token from POST /api/token")
    parser.add_argument("--api-key", default=None, help="or an operator API key, traded for a token first")
    parser.add_argument("--out", type=Path, default=Path("reply.wav"), help="the agent's voice, 24 kHz mono WAV")
    parser.add_argument("--fast", action="store_true", help=f"send up to {FAST_LEAD_S:g} s ahead of real time")
    parser.add_argument("--tail-s", type=float, default=3.0, help="silence after the file, for the agent's answer")
    for name in ("persona", "voice", "user"):
        parser.add_argument(f"--{name}", default=None, help=f"the `{name}` query parameter")
    args = parser.parse_args(argv)
    query = {name: value for name in ("persona", "voice", "user") if (value := getattr(args, name)) is not None}

    def show(event: p.ServerEvent) -> None:
        print(event.model_dump_json(exclude_none=True), flush=True)

    async def run() -> Reply:
        token = args.token or (await session_token(args.url, args.api_key) if args.api_key else None)
        return await converse(args.url, args.input, token=token, lead_s=FAST_LEAD_S if args.fast else 0,
                              tail_s=args.tail_s, on_event=show, **query)

    try:
        reply = asyncio.run(run())
    except ClientError as exc:
        print(f"contextspan client: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    sphn.write_wav(str(args.out), reply.audio, SAMPLE_RATE)
    print(f"agent: {reply.text.strip()}", file=sys.stderr)
    print(f"wrote {reply.audio.size / SAMPLE_RATE:.2f} s of the agent's voice to {args.out}", file=sys.stderr)
    return 0


# test and benchmark helpers ----------------------------------------------------------------------------------


@dataclass
class StreamResult:
    handshake_s: float | None = None  # seconds from connect to the handshake
    frames_sent: int = 0
    audio_messages: int = 0
    output_samples: int = 0
    text_pieces: list[str] = field(default_factory=list)
    events: list[Any] = field(default_factory=list)
    close_code: int | None = None
    close_reason: str = ""

    @property
    def output_seconds(self) -> float:
        return self.output_samples / SAMPLE_RATE

    def of_type(self, kind: str) -> list[Any]:
        return [e for e in self.events if e.type == kind]


def free_port() -> int:
    """A loopback port free right now, for servers started by tests and benchmarks."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def stream(
    url: str,
    pcm: np.ndarray,
    tail_s: float = 0.6,
    pause_reading_s: tuple[float, float] | None = None,
    token: str | None = None,
    page_samples: int = FRAME_SAMPLES,
    start_at: float | None = None,
    until: Callable[[StreamResult], bool] | None = None,
    until_timeout_s: float = 30.0,
    texts: Sequence[tuple[float, str]] = (),
) -> StreamResult:
    """For tests and benchmarks: send `pcm` (24 kHz float32) as Ogg Opus, `page_samples` at a time (default one
    80 ms frame; a divisor of it, at least 960, for shorter pages), paced by an absolute schedule, and collect
    everything the server sends until its audio has been quiet for `tail_s` after the last frame (a server behind
    real time on a slow host is still answering: at most DRAIN_LIMIT_S more), or until the server closes (its close
    code is in the result, not raised).

    `pause_reading_s=(start, length)` stops reading for `length` seconds from `start`, as a stalled client.
    `token` is a session token from POST /api/token, sent as an app does: `Authorization: Bearer`.
    `start_at` (a `time.perf_counter()` value) starts sending then instead of right after the handshake.
    `until`: after `pcm`, keep the session going with silence until `until(result)` holds (at most
    `until_timeout_s`), e.g. until an answer the client waits for has come, however long this host takes.
    `texts` are (seconds into the audio, JSON text message) pairs, e.g. a `span.inject`, sent at those times.
    """
    if FRAME_SAMPLES % page_samples or page_samples < 960:
        raise ValueError(f"page_samples must divide {FRAME_SAMPLES} and be at least 960 (sphn's Opus page)")
    pages_per_frame = FRAME_SAMPLES // page_samples
    result = StreamResult()
    frames = len(pcm) // FRAME_SAMPLES
    t0 = time.perf_counter()
    async with connect(url, token=token, events=False) as conversation:
        result.handshake_s = time.perf_counter() - t0
        result.events.extend(conversation.preparing)

        async def send() -> None:
            start = time.perf_counter() if start_at is None else start_at
            silence = np.zeros(page_samples, np.float32)
            pending = sorted(texts)
            give_up = math.inf
            i = 0
            while True:
                if i < frames * pages_per_frame:
                    page = pcm[i * page_samples : (i + 1) * page_samples].astype(np.float32)
                elif until is not None and not until(result) and time.perf_counter() < give_up:
                    give_up = min(give_up, time.perf_counter() + until_timeout_s)
                    page = silence
                else:
                    return
                await asyncio.sleep(max(0.0, start + i * page_samples / SAMPLE_RATE - time.perf_counter()))
                try:
                    while pending and pending[0][0] <= i * page_samples / SAMPLE_RATE:
                        await conversation.send(pending.pop(0)[1])
                    await conversation.send_audio(page)
                except SessionClosed:
                    return  # the server ended the session: what it sent, and its close code, are the result
                i += 1
                if i % pages_per_frame == 0:
                    result.frames_sent += 1

        last_audio = time.perf_counter()

        async def receive() -> None:
            nonlocal last_audio
            start = time.perf_counter()
            paused = False
            with contextlib.suppress(SessionClosed):
                async for item in conversation:
                    if pause_reading_s and not paused and time.perf_counter() - start >= pause_reading_s[0]:
                        paused = True
                        await asyncio.sleep(pause_reading_s[1])
                    if isinstance(item, AudioChunk):
                        last_audio = time.perf_counter()
                        result.audio_messages += 1
                        result.output_samples += item.pcm.size
                    elif isinstance(item, TextPiece):
                        result.text_pieces.append(item.text)
                    else:
                        result.events.append(item)

        receiver = asyncio.create_task(receive())
        try:
            await send()
            sent = time.perf_counter()
            while conversation.close_code is None and time.perf_counter() - sent < DRAIN_LIMIT_S:
                quiet_until = max(last_audio, sent) + tail_s
                if time.perf_counter() >= quiet_until:
                    break
                await asyncio.sleep(quiet_until - time.perf_counter())
        finally:
            receiver.cancel()
            await asyncio.gather(receiver, return_exceptions=True)
    result.close_code = conversation.close_code
    result.close_reason = conversation.close_reason
    return result


def load_wav(path: str) -> np.ndarray:
    """Any audio file -> 24 kHz mono float32."""
    data, _ = sphn.read(path, sample_rate=SAMPLE_RATE)
    return np.asarray(data, dtype=np.float32).mean(axis=0)


def speak(text: str, wav: Path) -> np.ndarray:
    """espeak-ng says `text` into `wav`; returns it as 24 kHz mono float32."""
    subprocess.run(["espeak-ng", "-w", str(wav), text], check=True)
    return load_wav(str(wav))


def start_server(workdir: Path, *flags: str, ready_timeout: float = 300.0, module: str = "server.cli",
                 env: dict[str, str] | None = None) -> tuple[subprocess.Popen[bytes], str]:
    """`python -m module serve *flags` (`contextspan serve`) on a free loopback port, from the repository root,
    logging to workdir/server.log; returns the process and its http:// URL once /readyz says ready.
    Fails as soon as the process exits or /readyz reports a model load error."""
    port = free_port()
    cmd = [sys.executable, "-m", module, "serve", "--port", str(port), *flags]
    log = workdir / "server.log"
    with log.open("wb") as out:
        process = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=Path(__file__).resolve().parents[1],
                                   env=dict(os.environ, NO_TORCH_COMPILE="1", **(env or {})))
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + ready_timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"server exited with {process.returncode}: {log.read_text()[-2000:]}")
        try:
            ready = httpx.get(f"{url}/readyz", timeout=1)
        except httpx.HTTPError:
            ready = None
        if ready is not None and ready.status_code == 200:
            return process, url
        if ready is not None and ready.json().get("load_error"):  # the model will not load: waiting cannot help
            stop_server(process)
            raise RuntimeError(f"server could not load its model: {ready.json()['load_error']}")
        time.sleep(0.3)
    stop_server(process)
    raise RuntimeError(f"server not ready within {ready_timeout:.0f} s: {log.read_text()[-2000:]}")


def stop_server(process: subprocess.Popen[bytes], timeout: float = 30.0) -> None:
    """SIGTERM lets uvicorn close the sessions and the ASR process; SIGKILL only if that hangs."""
    process.terminate()
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
