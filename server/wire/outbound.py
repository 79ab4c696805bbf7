"""The bounded send path: a slow client loses its oldest audio, never the server's memory."""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass
from typing import Literal

MessageKind = Literal["audio", "binary", "text"]


@dataclass(frozen=True)
class Outgoing:
    kind: MessageKind  # audio: droppable agent audio; binary: other kind-byte messages; text: a JSON event
    data: bytes | str


class OutboundQueue:
    """Holds at most `max_audio` audio messages and `max_other` others; on overflow the oldest of that class
    goes, and `audio_dropped` / `other_dropped` count what a slow client missed."""

    def __init__(self, max_audio: int, max_other: int = 512) -> None:
        self.max_audio = max_audio
        self.max_other = max_other
        self._items: deque[Outgoing] = deque()
        self._audio = 0
        self._ready = asyncio.Event()
        self.audio_dropped = 0
        self.other_dropped = 0

    def put(self, message: Outgoing) -> bool:
        """Queue a message; returns False when that dropped an older audio message."""
        dropped_audio = False
        if message.kind == "audio":
            if self._audio >= self.max_audio:
                self._drop_oldest(audio=True)
                dropped_audio = True
            self._audio += 1
        elif len(self._items) - self._audio >= self.max_other:
            self._drop_oldest(audio=False)
        self._items.append(message)
        self._ready.set()
        return not dropped_audio

    def _drop_oldest(self, audio: bool) -> None:
        for item in self._items:
            if (item.kind == "audio") == audio:
                self._items.remove(item)
                if audio:
                    self._audio -= 1
                    self.audio_dropped += 1
                else:
                    self.other_dropped += 1
                return

    async def get(self) -> Outgoing:
        while not self._items:
            self._ready.clear()
            await self._ready.wait()
        item = self._items.popleft()
        if item.kind == "audio":
            self._audio -= 1
        return item

    def __len__(self) -> int:
        return len(self._items)
