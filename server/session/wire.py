"""The protocol-specific half of a session: what the client's messages mean, and how output goes out.

A `Session` runs the same conversation for every protocol (frames into the batch, spans, retrieval, tools); a
`SessionWire` turns the client's WebSocket messages into `Inbound` items and the session's output (agent audio and
text, events) into messages on the bounded outbound queue. `MoshiWire` speaks `/api/chat` (Kyutai's kind-byte
messages, Ogg Opus, opt-in JSON events); `server/session/realtime_wire.py` speaks the OpenAI Realtime protocol.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np
from starlette.types import Message

from server.wire import protocol as p
from server.wire.opus import OpusDecoder, OpusEncoder
from server.wire.outbound import OutboundQueue, Outgoing


@dataclass(frozen=True)
class AudioIn:
    """User PCM (float32, 24 kHz mono) of any length: the session cuts it into frames."""

    pcm: np.ndarray


@dataclass(frozen=True)
class ClearInput:
    """Drop the user audio not yet cut into a frame (what a frame already holds, the model has heard)."""


@dataclass(frozen=True)
class CommitInput:
    """The user is done speaking (a push-to-talk client's commit): the utterance going on ends without waiting for
    the silence that would end it."""


Inbound = AudioIn | ClearInput | CommitInput | p.SessionUpdate | p.SpanInject | p.ToolResult | p.UserText


class SessionWire(Protocol):
    protocol: str  # the endpoint's name in a resume state: a session resumes on its own endpoint only
    reprefills: bool  # whether persona and voice may change mid-session (prefilled again at a frame boundary)

    def handshake(self) -> bytes | None:
        """Sent once the prefix is in, before anything else; None where the protocol has none."""

    def inbound(self, message: Message) -> list[Inbound]:
        """One WebSocket message's meaning; raises ProtocolError for a message the session cannot accept."""

    def accepted(self, item: Inbound) -> None:
        """The session took `item` (it raised no ProtocolError): what the protocol confirms only then."""

    def audio(self, pcm: np.ndarray) -> bool:
        """One frame of agent audio out; False when the queue dropped older audio for it (a slow client)."""

    def agent_text(self, piece: str) -> None:
        """A text piece the agent speaks (one a frame at most)."""

    def event(self, event: p.ServerEvent) -> None:
        """A session event (already recorded) for the client, in the protocol's terms."""

    def saved(self) -> dict[str, object]:
        """What the protocol keeps of its own for a resume, as plain data."""

    def restore(self, saved: dict[str, object]) -> None:
        """A resumed session's `saved()`, before its `session.ready`."""


class MoshiWire:
    """`/api/chat`: Kyutai's binary messages for audio and text; JSON events for clients that asked for them."""

    protocol = "chat"
    reprefills = False

    def __init__(self, outbound: OutboundQueue, events: bool) -> None:
        self.outbound = outbound
        self.events = events
        self.decoder = OpusDecoder()
        self.encoder = OpusEncoder()
        self._audio_messages_sent = 0

    def handshake(self) -> bytes | None:
        return p.handshake()

    def inbound(self, message: Message) -> list[Inbound]:
        data = message.get("bytes")
        if data is not None:
            kind, payload = p.decode_binary(data)
            if kind != p.Kind.AUDIO:
                raise p.ProtocolError("unexpected_kind", f"clients may only send audio (0x01), got 0x{kind:02x}")
            return [AudioIn(self.decoder.decode(payload))]
        if message.get("text") is not None:
            self.events = True  # a client that sends text reads text: JSON events (and errors) from now on
            return [p.parse_client_text(message["text"])]
        return []

    def accepted(self, item: Inbound) -> None:
        pass  # /api/chat confirms nothing

    def audio(self, pcm: np.ndarray) -> bool:
        ogg = self.encoder.encode(pcm)
        if not ogg:
            return True
        # The first page carries the Opus headers: never drop it.
        kind = "audio" if self._audio_messages_sent else "binary"
        self._audio_messages_sent += 1
        return self.outbound.put(Outgoing(kind, p.audio_message(ogg)))

    def agent_text(self, piece: str) -> None:
        self.outbound.put(Outgoing("binary", p.text_message(piece)))

    def event(self, event: p.ServerEvent) -> None:
        if self.events:
            self.outbound.put(Outgoing("text", p.encode_event(event)))

    def saved(self) -> dict[str, object]:
        return {}  # all of an /api/chat session is the session's own state

    def restore(self, saved: dict[str, object]) -> None:
        pass
