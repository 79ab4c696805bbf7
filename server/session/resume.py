"""Where live sessions' state waits to be resumed: in this process, or in Redis shared by the replicas.

A session saves its `ResumeState` every `resume_save_s` (and once more when a drain hands it over): the model's
token history (frontend_model/engine/history.py, about 425 bytes a second) and what the server needs besides to go
on, as plain data: the protocol it speaks, the persona and voice in effect, its events choice, the client tools it
declared, the backend's turns, the user's profile and notes, the latest injected spans' text, the retrievals in flight
(retrieval.InFlight: a question the backend had not answered, an answer not yet injected), and what its protocol keeps
of its own (a Realtime session's id and settings). Any replica that reads it replays the history into a free slot.
Each save renews the TTL, so a state outlives its session by `resume_ttl_s`; a session the client ended normally
drops its state. A store that is unreachable makes saves and resumes fail, never the sessions.

The same store keeps which single-use session tokens (auth.SessionTokens) were spent, so that with Redis a token
opens one session across all the replicas, not one on each.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import struct
import time
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from typing import TypeVar

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from server.guard.auth import ResumeSigner
from server.session.retrieval import InFlight
from server.settings import ServerSettings

logger = logging.getLogger(__name__)

_HEAD = struct.Struct("<I")  # JSON header length; the history blob follows
KEY_PREFIX = "contextspan:resume:"
SPENT_PREFIX = "contextspan:spent:"
T = TypeVar("T")
SPANS_KEPT = 20  # the latest injected spans' text kept with the state (what the model was told)


class StoreUnavailable(Exception):
    """The store could not be reached; the message says why, never with a credential."""


@dataclass
class ResumeState:
    """One session's state to resume it elsewhere: the options it was opened with, the backend's plain data, and the
    model history blob."""

    session_id: str
    user: str | None  # the `user` it was opened with: the identity its resume token is bound to
    persona: str | None
    voice: str | None
    events: bool
    history: bytes
    turns: list[tuple[str, str]] = field(default_factory=list)  # (role, text), oldest first
    profile: dict[str, object] | None = None
    notes: str | None = None
    spans: list[str] = field(default_factory=list)
    stream_time: float = 0.0
    saved_at: float = field(default_factory=time.time)
    protocol: str = "chat"  # the wire's (SessionWire.protocol): a session resumes on its own endpoint only
    tools: list[dict[str, object]] = field(default_factory=list)  # the client tools declared (p.ClientTool)
    wire: dict[str, object] = field(default_factory=dict)  # SessionWire.saved()
    in_flight: list[InFlight] = field(default_factory=list)  # what the history does not hold yet; older states: none

    def to_bytes(self) -> bytes:
        header = {k: v for k, v in asdict(self).items() if k != "history"}
        encoded = json.dumps(header, separators=(",", ":")).encode()
        return _HEAD.pack(len(encoded)) + encoded + self.history

    @classmethod
    def from_bytes(cls, blob: bytes) -> ResumeState:
        """ValueError for anything `to_bytes` did not write."""
        if len(blob) < _HEAD.size:
            raise ValueError("a resume state is longer than its header")
        (length,) = _HEAD.unpack_from(blob)
        try:
            header = json.loads(blob[_HEAD.size : _HEAD.size + length])
            header["turns"] = [(str(role), str(text)) for role, text in header["turns"]]
            header["in_flight"] = [InFlight(**item) for item in header.get("in_flight", [])]
            return cls(**header, history=blob[_HEAD.size + length :])
        except (TypeError, KeyError) as exc:
            raise ValueError(f"corrupt resume state: {exc}") from exc


class ResumeStore(ABC):
    """Saved sessions by id, each with a TTL. Every method raises StoreUnavailable when the store cannot answer."""

    kind: str

    @abstractmethod
    async def save(self, state: ResumeState, ttl_s: float) -> None: ...

    @abstractmethod
    async def load(self, session_id: str) -> ResumeState | None: ...

    @abstractmethod
    async def drop(self, session_id: str) -> None: ...

    @abstractmethod
    async def spend(self, key: str, ttl_s: float) -> bool:
        """Marks `key` spent for `ttl_s`: True for the first caller only, among all that share the store."""

    @abstractmethod
    async def ping(self) -> None:
        """Returns when the store answers."""

    @abstractmethod
    async def aclose(self) -> None:
        """Release connections."""


class MemoryResumeStore(ResumeStore):
    """One process's sessions: a restart or another replica cannot resume them (the default, no service needed)."""

    kind = "memory"

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._states: dict[str, tuple[float, bytes]] = {}
        self._spent: dict[str, float] = {}

    async def save(self, state: ResumeState, ttl_s: float) -> None:
        now = self._clock()
        for stale in [k for k, (expiry, _) in self._states.items() if expiry <= now]:
            del self._states[stale]
        self._states[state.session_id] = (now + ttl_s, state.to_bytes())

    async def load(self, session_id: str) -> ResumeState | None:
        kept = self._states.get(session_id)
        if kept is None or kept[0] <= self._clock():
            return None
        return ResumeState.from_bytes(kept[1])

    async def drop(self, session_id: str) -> None:
        self._states.pop(session_id, None)

    async def spend(self, key: str, ttl_s: float) -> bool:
        now = self._clock()
        for stale in [k for k, expiry in self._spent.items() if expiry <= now]:
            del self._spent[stale]
        if key in self._spent:
            return False
        self._spent[key] = now + ttl_s
        return True

    async def ping(self) -> None:
        return None

    async def aclose(self) -> None:
        self._states.clear()
        self._spent.clear()


class RedisResumeStore(ResumeStore):
    """Shared by every replica that points at the same Redis: a session resumes on any of them."""

    kind = "redis"
    TIMEOUT_S = 1.0  # a save is at most this late; a Redis that does not answer is down for this purpose

    def __init__(self, url: str) -> None:
        self._redis = aioredis.Redis.from_url(url, socket_timeout=self.TIMEOUT_S, socket_connect_timeout=self.TIMEOUT_S)

    async def _call(self, call: Awaitable[T]) -> T:
        try:
            return await asyncio.wait_for(call, self.TIMEOUT_S * 2)
        except (RedisError, OSError, TimeoutError) as exc:
            raise StoreUnavailable(f"redis: {type(exc).__name__}") from None

    async def save(self, state: ResumeState, ttl_s: float) -> None:
        await self._call(self._redis.set(KEY_PREFIX + state.session_id, state.to_bytes(), px=int(ttl_s * 1000)))

    async def load(self, session_id: str) -> ResumeState | None:
        blob = await self._call(self._redis.get(KEY_PREFIX + session_id))
        return None if blob is None else ResumeState.from_bytes(blob)

    async def drop(self, session_id: str) -> None:
        await self._call(self._redis.delete(KEY_PREFIX + session_id))

    async def spend(self, key: str, ttl_s: float) -> bool:
        """`SET NX`: of two replicas spending the same token at once, Redis lets exactly one set it."""
        first = await self._call(self._redis.set(SPENT_PREFIX + key, 1, nx=True, px=max(1, math.ceil(ttl_s * 1000))))
        return bool(first)

    async def ping(self) -> None:
        await self._call(self._redis.ping())

    async def aclose(self) -> None:
        await self._redis.aclose()


def open_store(setting: str) -> ResumeStore | None:
    """The store `--resume-store` names: memory, a redis:// (or rediss://) URL, or off (None)."""
    if setting == "off":
        return None
    if setting == "memory":
        return MemoryResumeStore()
    if setting.startswith(("redis://", "rediss://", "unix://")):
        return RedisResumeStore(setting)
    raise ValueError(f"resume_store must be memory, off or a redis:// URL, got {setting.split('://')[0]}://...")


@dataclass
class Resumes:
    """A server's resume machinery: its store, the token signer, and the store's health as sessions last saw it."""

    store: ResumeStore
    signer: ResumeSigner
    ttl_s: float
    save_s: float
    token_life_s: float  # a token in session.ready outlives the longest session by the TTL
    error: str | None = None  # why the store failed its latest call; None while it answers
    _checking: asyncio.Task[None] | None = field(default=None, init=False, repr=False)

    @classmethod
    def from_settings(cls, settings: ServerSettings, secret: bytes) -> Resumes | None:
        """`secret`: the deployment's shared secret (`resume_secret`), which signs session tokens too."""
        store = open_store(settings.resume_store)
        if store is None:
            return None
        return cls(store, ResumeSigner(secret), settings.resume_ttl_s, settings.resume_save_s,
                   settings.max_session_s + settings.resume_ttl_s)

    @property
    def shared(self) -> bool:
        """Whether another process can resume this one's sessions: a drain hands sessions over only then."""
        return self.store.kind != "memory"

    def token(self, session_id: str, user: str | None, life_s: float | None = None) -> str:
        return self.signer.issue(session_id, user, self.token_life_s if life_s is None else life_s)

    def answered(self, error: StoreUnavailable | None) -> None:
        """Record the store's latest answer; a change is logged once, not once a session a second."""
        message = None if error is None else str(error)
        if message != self.error:
            if message is None:
                logger.info("resume store %s answers again", self.store.kind)
            else:
                logger.warning("resume store %s unavailable (%s): sessions go on, resume is off", self.store.kind,
                               message)
        self.error = message

    async def check(self) -> None:
        """Ping the store (for /readyz)."""
        try:
            await self.store.ping()
        except StoreUnavailable as exc:
            self.answered(exc)
            return
        self.answered(None)

    def refresh(self) -> None:
        """Ping the store in the background (at most one ping at a time): /readyz answers at once with what the
        latest call said, never waiting on a Redis that does not answer."""
        if self._checking is None or self._checking.done():
            self._checking = asyncio.get_running_loop().create_task(self.check())

    def status(self) -> dict[str, object]:
        return {"store": self.store.kind, "available": self.error is None, "error": self.error}
