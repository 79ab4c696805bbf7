"""Who may connect: operator API keys, signed single-use session tokens, browser origins, and the bind-address rule.

Pure logic over headers and query strings, so that every case of the auth matrix is testable without a socket.
An API key never travels through a browser: the operator's backend trades it for a short-lived token
(`POST /api/token`) and hands that to the page or app, which spends it once on `/api/chat`.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import secrets
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from urllib.parse import urlsplit

# Browsers cannot set headers on a WebSocket: they offer the token as a subprotocol `bearer.<token>` next to
# `contextspan`, which the server echoes so the browser accepts the upgrade.
SUBPROTOCOL = "contextspan"
BEARER_SUBPROTOCOL_PREFIX = "bearer."


class TokenCheck(Enum):
    OK = "ok"
    MISSING = "missing"
    UNKNOWN = "unknown"  # not signed with this deployment's secret, or already spent
    EXPIRED = "expired"
    STORE_UNAVAILABLE = "store_unavailable"  # the shared spent set cannot say whether it was spent: refused


def mac(secret: bytes, message: str, length: int) -> str:
    """The one signing helper of tokens and links: HMAC-SHA256 of `message`, in hex, cut to `length`."""
    return hmac.new(secret, message.encode(), hashlib.sha256).hexdigest()[:length]


@dataclass(frozen=True)
class TokenClaim:
    """What a session token says once checked: the verdict, and for a genuine one the key that spending it marks
    and how long that mark must last (until the token expires anyway)."""

    check: TokenCheck
    key: str = ""
    left_s: float = 0.0


@dataclass(frozen=True)
class SessionTokens:
    """Single-use session tokens `<nonce>.<expiry ms>.<mac>`, signed with the secret the replicas share, so that any
    replica checks any replica's token with no shared state; that each opens one session is the spent set's part
    (`ResumeStore.spend`). The expiry is wall-clock time, which replicas agree on."""

    secret: bytes
    ttl_s: float
    clock: Callable[[], float] = time.time

    def _mac(self, head: str) -> str:
        return mac(self.secret, f"session-token:{head}", 32)  # never equal to a resume token's MAC of the same text

    def issue(self) -> str:
        head = f"{secrets.token_urlsafe(16)}.{int((self.clock() + self.ttl_s) * 1000)}"
        return f"{head}.{self._mac(head)}"

    def check(self, token: str | None) -> TokenClaim:
        """The signature first: a forged token is UNKNOWN whatever expiry it claims."""
        if not token:
            return TokenClaim(TokenCheck.MISSING)
        head, _, signature = token.rpartition(".")
        nonce, _, expiry = head.partition(".")
        if not nonce or not expiry.isdigit() or not hmac.compare_digest(self._mac(head), signature):
            return TokenClaim(TokenCheck.UNKNOWN)
        left_s = int(expiry) / 1000 - self.clock()
        if left_s <= 0:
            return TokenClaim(TokenCheck.EXPIRED)
        return TokenClaim(TokenCheck.OK, nonce, left_s)


def api_key_ok(given: str | None, keys: Sequence[str]) -> bool:
    """Constant-time in the key's content, so a timing probe learns nothing about a key's prefix."""
    if not given:
        return False
    return any(hmac.compare_digest(given.encode(), key.encode()) for key in keys)


def bearer(headers: Mapping[str, str]) -> str | None:
    value = headers.get("authorization", "")
    scheme, _, credential = value.partition(" ")
    if scheme.lower() != "bearer":
        return None
    return credential.strip() or None


def offered_subprotocols(headers: Mapping[str, str]) -> list[str]:
    return [p.strip() for p in headers.get("sec-websocket-protocol", "").split(",") if p.strip()]


def session_token(query: Mapping[str, str], headers: Mapping[str, str]) -> str | None:
    """Where clients put the token: `Authorization: Bearer` (apps), a `bearer.` subprotocol or `?token=` (pages)."""
    for protocol in offered_subprotocols(headers):
        if protocol.startswith(BEARER_SUBPROTOCOL_PREFIX):
            return protocol[len(BEARER_SUBPROTOCOL_PREFIX):]
    return bearer(headers) or query.get("token") or None


def accepted_subprotocol(headers: Mapping[str, str]) -> str | None:
    """Echo `contextspan` when offered; a browser that offered subprotocols fails the upgrade without one."""
    return SUBPROTOCOL if SUBPROTOCOL in offered_subprotocols(headers) else None


def origin_allowed(origin: str | None, host: str | None, allowed: Sequence[str]) -> bool:
    """Non-browser clients send no Origin; a page may connect from the server's own origin or an allowed one.

    This stops a page on another site from opening a WebSocket to a server on the user's machine or network.
    """
    if not origin:
        return True
    if "*" in allowed or origin.rstrip("/") in {a.rstrip("/") for a in allowed}:
        return True
    return bool(host) and urlsplit(origin).netloc.lower() == host.lower()


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def public_bind_problem(host: str, api_keys: Sequence[str], allow_public_without_auth: bool) -> str | None:
    """Why the server must not start on `host`, or None: an open voice agent on a network is a free GPU for all."""
    if is_loopback(host) or api_keys or allow_public_without_auth:
        return None
    return (f"refusing to listen on {host} without authentication: set CONTEXTSPAN_API_KEYS (or --api-keys), "
            "or pass --allow-public-without-auth when a proxy in front authenticates")


class RecordingSigner:
    """Recording links a session's own page can open without an API key: an HMAC of the session id."""

    def __init__(self, secret: bytes | None = None) -> None:
        self._secret = secret or secrets.token_bytes(32)

    def sign(self, session_id: str) -> str:
        return mac(self._secret, session_id, 32)

    def verify(self, session_id: str, signature: str | None) -> bool:
        return bool(signature) and hmac.compare_digest(self.sign(session_id), signature or "")


def app_spans_allowed(setting: str, authenticated: bool) -> bool:
    """May this session push its own span text (`span.inject`)? `auto`: only a session the operator's backend
    let in with a token; an anonymous page could otherwise put any text in the model's context."""
    return setting == "on" or (setting == "auto" and authenticated)


class ResumeCheck(Enum):
    OK = "ok"
    MALFORMED = "malformed"  # not a token this server's code writes, or not signed with the shared secret
    OTHER_USER = "other_user"
    EXPIRED = "expired"


class ResumeSigner:
    """Resume tokens `<session id>.<expiry>.<who>.<mac>`: `who` a keyed digest of the identity the session was opened
    with (its `user`: no name travels in the token), the MAC over all three under a secret the replicas share.
    Stateless, so any replica checks any replica's token; the token names the session, the store holds it."""

    def __init__(self, secret: bytes | None = None, clock: Callable[[], float] = time.time) -> None:
        self._secret = secret or secrets.token_bytes(32)
        self._clock = clock

    def _who(self, identity: str | None) -> str:
        return mac(self._secret, f"identity:{identity or ''}", 12)

    def issue(self, session_id: str, identity: str | None, ttl_s: float) -> str:
        head = f"{session_id}.{int(self._clock() + ttl_s)}.{self._who(identity)}"
        return f"{head}.{mac(self._secret, head, 24)}"

    def check(self, token: str, identity: str | None) -> tuple[ResumeCheck, str]:
        """(verdict, session id): the signature first, so that a forged token says nothing about any session."""
        head, _, signature = token.rpartition(".")
        parts = head.split(".")
        if len(parts) != 3 or not parts[1].isdigit() or not hmac.compare_digest(mac(self._secret, head, 24),
                                                                                 signature):
            return ResumeCheck.MALFORMED, ""
        session_id, expiry, who = parts
        if not hmac.compare_digest(who, self._who(identity)):
            return ResumeCheck.OTHER_USER, ""
        if self._clock() >= int(expiry):
            return ResumeCheck.EXPIRED, session_id
        return ResumeCheck.OK, session_id
