"""The auth rules as pure functions: tokens, keys, where clients put them, origins, the bind rule, signed links."""

from __future__ import annotations

import pytest

from server.guard import auth


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_session_token_is_checked_by_any_replica_with_the_secret_until_it_expires() -> None:
    clock = FakeClock()
    tokens = auth.SessionTokens(b"shared", ttl_s=60, clock=clock)
    first, second = tokens.issue(), tokens.issue()
    assert first != second and len(first) >= 32
    claim = auth.SessionTokens(b"shared", ttl_s=5, clock=clock).check(first)
    assert claim.check is auth.TokenCheck.OK, "another replica, same secret"
    assert claim.key and claim.key not in second and claim.left_s == pytest.approx(60, abs=0.01)
    clock.now += 60
    assert tokens.check(second) == auth.TokenClaim(auth.TokenCheck.EXPIRED)


def test_a_forged_or_tampered_session_token_is_unknown() -> None:
    clock = FakeClock()
    tokens = auth.SessionTokens(b"shared", ttl_s=60, clock=clock)
    token = tokens.issue()
    nonce, expiry, signature = token.split(".")
    later = f"{nonce}.{int(expiry) + 3_600_000}.{signature}"
    other = auth.SessionTokens(b"not-the-secret", ttl_s=60, clock=clock).issue()
    resume = auth.ResumeSigner(b"shared", clock).issue("s1", None, 60)
    for bad in (later, other, resume, f"x{token}", "never-issued", "a.1.b", token + "0"):
        assert tokens.check(bad) == auth.TokenClaim(auth.TokenCheck.UNKNOWN), bad
    assert tokens.check(None).check is auth.TokenCheck.MISSING and tokens.check("").check is auth.TokenCheck.MISSING


def test_api_keys() -> None:
    assert auth.api_key_ok("k2", ["k1", "k2"])
    assert not auth.api_key_ok("k3", ["k1", "k2"])
    assert not auth.api_key_ok("k1x", ["k1"]) and not auth.api_key_ok("", ["k1"]) and not auth.api_key_ok(None, [])


@pytest.mark.parametrize(("headers", "query", "expected"), [
    ({"authorization": "Bearer abc"}, {}, "abc"),
    ({"authorization": "bearer  abc "}, {}, "abc"),
    ({"authorization": "Basic abc"}, {}, None),
    ({"sec-websocket-protocol": "contextspan, bearer.tok-1_x"}, {}, "tok-1_x"),
    ({}, {"token": "q"}, "q"),
    ({"sec-websocket-protocol": "bearer.s", "authorization": "Bearer h"}, {"token": "q"}, "s"),
    ({}, {}, None),
])
def test_where_clients_put_the_token(headers: dict[str, str], query: dict[str, str], expected: str | None) -> None:
    assert auth.session_token(query, headers) == expected


def test_subprotocol_is_echoed_only_when_offered() -> None:
    assert auth.accepted_subprotocol({"sec-websocket-protocol": "contextspan, bearer.x"}) == "contextspan"
    assert auth.accepted_subprotocol({"sec-websocket-protocol": "bearer.x"}) is None
    assert auth.accepted_subprotocol({}) is None


@pytest.mark.parametrize(("origin", "host", "allowed", "ok"), [
    (None, "example.com", [], True),  # not a browser
    ("http://127.0.0.1:8998", "127.0.0.1:8998", [], True),  # the served demo page
    ("https://evil.example", "127.0.0.1:8998", [], False),
    ("http://127.0.0.1:9999", "127.0.0.1:8998", [], False),  # another port is another origin
    ("https://app.example", "voice.example", ["https://app.example"], True),
    ("https://app.example/", "voice.example", ["https://app.example"], True),
    ("https://other.example", "voice.example", ["https://app.example"], False),
    ("https://any.example", "voice.example", ["*"], True),
])
def test_origins(origin: str | None, host: str, allowed: list[str], ok: bool) -> None:
    assert auth.origin_allowed(origin, host, allowed) is ok


def test_public_bind_needs_auth_or_an_explicit_flag() -> None:
    for host in ("127.0.0.1", "localhost", "::1", "127.0.0.2"):
        assert auth.public_bind_problem(host, [], False) is None
    problem = auth.public_bind_problem("0.0.0.0", [], False)
    assert problem is not None and "CONTEXTSPAN_API_KEYS" in problem and "--allow-public-without-auth" in problem
    assert auth.public_bind_problem("192.168.1.5", [], False) is not None
    assert auth.public_bind_problem("0.0.0.0", ["k"], False) is None
    assert auth.public_bind_problem("0.0.0.0", [], True) is None


def test_recording_links_are_signed_per_session_and_per_server() -> None:
    signer = auth.RecordingSigner(b"s" * 32)
    signature = signer.sign("session-a")
    assert signer.verify("session-a", signature)
    assert not signer.verify("session-b", signature)
    assert not signer.verify("session-a", None) and not signer.verify("session-a", "")
    assert not auth.RecordingSigner().verify("session-a", signature), "another server's secret"


@pytest.mark.parametrize(("setting", "authenticated", "allowed"), [
    ("auto", True, True), ("auto", False, False), ("on", False, True), ("on", True, True), ("off", True, False),
])
def test_who_may_push_spans(setting: str, authenticated: bool, allowed: bool) -> None:
    assert auth.app_spans_allowed(setting, authenticated) is allowed
