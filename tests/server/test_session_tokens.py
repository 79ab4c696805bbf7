"""Redeeming session tokens as the replicas do (`routes.redeem`): a token opens one session across all the replicas
that share the secret and the store, and a store that cannot answer refuses it (fail closed)."""

from __future__ import annotations

import asyncio

from server.app.routes import ServerState, redeem
from server.guard.auth import TokenCheck
from server.settings import ServerSettings
from tests.support.redis_server import RedisServer


def replica(store: str = "memory", secret: str | None = "shared") -> ServerState:
    return ServerState(ServerSettings(api_keys=["k"], resume_store=store, resume_secret=secret))


async def test_a_token_opens_one_session_on_the_replica_that_issued_it() -> None:
    a = replica()
    token = a.tokens.issue()
    assert await redeem(a, token) is TokenCheck.OK
    assert await redeem(a, token) is TokenCheck.UNKNOWN, "spent twice"
    assert await redeem(replica(secret=None), a.tokens.issue()) is TokenCheck.UNKNOWN, "another deployment's"
    assert await redeem(a, None) is TokenCheck.MISSING


async def test_with_resume_off_a_token_is_still_spent_once() -> None:
    a = replica(store="off")
    token = a.tokens.issue()
    assert [await redeem(a, token), await redeem(a, token)] == [TokenCheck.OK, TokenCheck.UNKNOWN]


async def test_a_token_issued_by_one_replica_opens_one_session_on_any_replica_sharing_redis(
        redis: RedisServer) -> None:
    a, b, c = (replica(redis.url) for _ in range(3))
    try:
        token = a.tokens.issue()
        assert sorted((await asyncio.gather(redeem(b, token), redeem(c, token))), key=lambda check: check.value) == [
            TokenCheck.OK, TokenCheck.UNKNOWN], "two replicas at once: one wins"
        assert await redeem(a, token) is TokenCheck.UNKNOWN
        assert await redeem(a, b.tokens.issue()) is TokenCheck.OK
    finally:
        for server in (a, b, c):
            assert server.resumes is not None
            await server.resumes.store.aclose()


async def test_with_redis_down_a_token_is_refused_not_let_through(redis: RedisServer) -> None:
    a = replica(redis.url)
    assert a.resumes is not None
    try:
        token = a.tokens.issue()
        redis.stop()
        assert await redeem(a, token) is TokenCheck.STORE_UNAVAILABLE
        assert a.resumes.status()["available"] is False, "the store's health says so once"
        assert await redeem(a, "forged.1.x") is TokenCheck.UNKNOWN, "what needs no store is still answered"
    finally:
        await a.resumes.store.aclose()
