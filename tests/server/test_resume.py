"""The resume machinery without a server: tokens (signed, bound to a user, expiring), the state's bytes (with the
retrievals in flight, and as older servers wrote them), both stores (a real redis-server on loopback for Redis, and
Redis killed), and a history that went through Redis resuming a batch slot with the uninterrupted session's logits."""

from __future__ import annotations

import asyncio
import json
import struct

import pytest
import torch

from frontend_model.engine.batch_engine import BatchEngine
from frontend_model.engine.engine import SAMPLED
from frontend_model.engine.history import SessionHistory, replay, start_recording
from frontend_model.moshi_internals.row_sampling import RowSampling
from server.guard.auth import ResumeCheck, ResumeSigner
from server.session.resume import (
    MemoryResumeStore,
    RedisResumeStore,
    Resumes,
    ResumeState,
    StoreUnavailable,
    open_store,
)
from server.session.retrieval import InFlight
from server.settings import ServerSettings
from tests.support.engine import span_like_block, tiny_model, user_frames
from tests.support.redis_server import RedisServer


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def test_a_token_resumes_its_session_for_its_user_only_until_it_expires() -> None:
    clock = Clock()
    signer = ResumeSigner(b"shared", clock)
    token = signer.issue("20261204T000000Z-abcd1234", "ada", 60)
    assert len(token) < 90, "it fits a close reason (123 bytes) with room for the JSON around it"
    assert "ada" not in token
    assert signer.check(token, "ada") == (ResumeCheck.OK, "20261204T000000Z-abcd1234")
    assert ResumeSigner(b"shared", clock).check(token, "ada")[0] is ResumeCheck.OK, "another replica, same secret"
    assert signer.check(token, "bob") == (ResumeCheck.OTHER_USER, "")
    assert signer.check(token, None) == (ResumeCheck.OTHER_USER, "")
    assert ResumeSigner(b"other", clock).check(token, "ada") == (ResumeCheck.MALFORMED, "")
    session, expiry, who, mac = token.split(".")
    forged = f"{session[:-1]}5.{expiry}.{who}.{mac}"
    later = f"{session}.{int(expiry) + 3600}.{who}.{mac}"
    for bad in (forged, later, "", "x", "a.b.c.d", token + "0"):
        assert signer.check(bad, "ada") == (ResumeCheck.MALFORMED, ""), bad
    clock.now += 60
    assert signer.check(token, "ada")[0] is ResumeCheck.EXPIRED


def state(session_id: str = "s1", history: bytes = b"CSHI\x01history") -> ResumeState:
    return ResumeState(session_id, "ada", "You are Ada.", None, True, history, turns=[("user", "hi"),
                       ("agent", "hello")], profile={"user_id": "ada", "name": "Ada"}, notes="likes tea",
                       spans=["(tool result) It is noon."], stream_time=3.2, saved_at=1.5, protocol="realtime",
                       tools=[{"name": "get_weather", "description": "", "parameters": {"type": "object"}}],
                       wire={"temperature": 0.6, "tools": []})


def test_a_state_goes_through_bytes() -> None:
    saved = state()
    assert ResumeState.from_bytes(saved.to_bytes()) == saved
    assert ResumeState.from_bytes(saved.to_bytes()).in_flight == [], "nothing in flight"
    with pytest.raises(ValueError):
        ResumeState.from_bytes(b"\x05\x00")
    with pytest.raises(ValueError):
        ResumeState.from_bytes(b"\x02\x00\x00\x00{}")


def test_a_state_with_retrievals_in_flight_goes_through_bytes_as_plain_data() -> None:
    asked = InFlight("asked", "typed", "What is twelve times twelve?", 0.4, 2.1)
    answered = InFlight("answered", "ret", "Is it open?", 0.9, 1.6, "(tool result) It opens at nine.", "kb",
                        "knowledge_base", "tool", {"llm_ms": 310.0})
    saved = ResumeState("s1", "ada", None, None, True, b"CSHI", in_flight=[answered, asked])
    blob = saved.to_bytes()
    (length,) = struct.unpack_from("<I", blob)
    header = json.loads(blob[4:4 + length])
    assert header["in_flight"][1] == {"stage": "asked", "trigger": "typed", "question": "What is twelve times twelve?",
                                      "elapsed_s": 0.4, "deadline_left_s": 2.1, "text": None, "source": None,
                                      "tool": None, "outcome": "tool", "timings_ms": {}}
    assert ResumeState.from_bytes(blob) == saved


def test_a_state_saved_before_retrievals_travelled_still_loads_with_nothing_in_flight() -> None:
    saved = state()
    blob = saved.to_bytes()
    (length,) = struct.unpack_from("<I", blob)
    header = json.loads(blob[4:4 + length])
    del header["in_flight"]
    old = json.dumps(header).encode()
    loaded = ResumeState.from_bytes(struct.pack("<I", len(old)) + old + saved.history)
    assert loaded == saved and loaded.in_flight == []


async def test_the_memory_store_keeps_a_state_for_its_ttl() -> None:
    clock = Clock()
    store = MemoryResumeStore(clock)
    await store.save(state(), ttl_s=10)
    assert await store.load("s1") == state()
    clock.now += 10
    assert await store.load("s1") is None
    await store.save(state(), ttl_s=10)
    await store.drop("s1")
    assert await store.load("s1") is None


async def test_the_redis_store_shares_states_with_a_ttl(redis: RedisServer) -> None:
    a, b = RedisResumeStore(redis.url), RedisResumeStore(redis.url)  # two replicas
    try:
        await a.ping()
        await a.save(state(), ttl_s=0.3)
        assert await b.load("s1") == state()
        await asyncio.sleep(0.4)
        assert await b.load("s1") is None
        await a.save(state(), ttl_s=10)
        await b.drop("s1")
        assert await a.load("s1") is None
    finally:
        await a.aclose()
        await b.aclose()


async def test_a_redis_that_is_down_is_unavailable_not_a_crash(redis: RedisServer) -> None:
    resumes = Resumes.from_settings(ServerSettings(resume_store=redis.url), b"secret")
    assert resumes is not None and resumes.shared
    try:
        await resumes.check()
        assert resumes.status() == {"store": "redis", "available": True, "error": None}
        redis.stop()
        with pytest.raises(StoreUnavailable):
            await resumes.store.save(state(), ttl_s=10)
        with pytest.raises(StoreUnavailable):
            await resumes.store.spend("nonce", ttl_s=10)
        await resumes.check()
        assert resumes.status()["available"] is False and "redis" in str(resumes.status()["error"])
    finally:
        await resumes.store.aclose()


async def test_the_memory_store_lets_a_token_be_spent_once_until_it_would_have_expired() -> None:
    clock = Clock()
    store = MemoryResumeStore(clock)
    assert await store.spend("nonce", ttl_s=10) is True
    assert await store.spend("nonce", ttl_s=10) is False, "spent twice"
    assert await store.spend("other", ttl_s=10) is True
    clock.now += 10
    assert await store.spend("nonce", ttl_s=10) is True, "the mark lasts as long as the token could"


async def test_a_token_spent_through_redis_is_spent_on_every_replica_sharing_it(redis: RedisServer) -> None:
    a, b = RedisResumeStore(redis.url), RedisResumeStore(redis.url)  # two replicas
    try:
        assert sorted(await asyncio.gather(a.spend("nonce", 10), b.spend("nonce", 10))) == [False, True], \
            "of two replicas spending it at once, one wins"
        assert await a.spend("nonce", 10) is False
        assert await b.spend("short", 0.2) is True
        await asyncio.sleep(0.3)
        assert await a.spend("short", 10) is True, "the mark expires with the token"
    finally:
        await a.aclose()
        await b.aclose()


def test_the_setting_names_the_store() -> None:
    assert open_store("off") is None
    assert isinstance(open_store("memory"), MemoryResumeStore)
    assert isinstance(open_store("redis://127.0.0.1:1/0"), RedisResumeStore)
    with pytest.raises(ValueError, match="resume_store"):
        open_store("postgres://user:secret@db")
    resumes = Resumes.from_settings(ServerSettings(), b"secret")
    assert resumes is not None and not resumes.shared, "memory by default: one process"


@pytest.mark.slow
async def test_bytes_that_went_through_redis_resume_a_slot_exactly(redis: RedisServer) -> None:
    """Slot 1 of a batch records a conversation (steps, a span, steps); its state goes through Redis and is replayed
    into slot 0 of another batch, whose next steps give the same text logits (float32) and tokens."""
    model = tiny_model(8)
    seeds = RowSampling.from_config(SAMPLED, text_seed=7, audio_seed=11)
    user = user_frames(40, seed=4)
    active = torch.tensor([True, True])  # whole rows: the logits of both are computed
    store = RedisResumeStore(redis.url)
    try:
        with BatchEngine(model, 2, SAMPLED, max_span_frames=64) as original:
            start_recording(original)
            original.reset_slot(0)
            original.reset_slot(1, seeds)
            for i in range(20):
                original.step_slots(torch.stack([user[i], user[i]]), active)
            original.inject_slot(1, span_like_block(original, 12, seed=2))
            for i in range(20, 25):
                original.step_slots(torch.stack([user[i], user[i]]), active)
            await store.save(state(history=SessionHistory.of(original, 1).to_bytes()), ttl_s=600)
            expected = []
            for i in range(25, 35):
                out = original.step_slots(torch.stack([user[i], user[i]]), active)[1]
                expected.append((original.last_text_logits[1].clone(), out.text_token, out.agent_codes.tolist()))
        saved = await store.load("s1")
    finally:
        await store.aclose()
    assert saved is not None
    with BatchEngine(model, 2, SAMPLED, max_span_frames=64) as resumed:
        start_recording(resumed)
        resumed.reset_slot(0)
        resumed.reset_slot(1)
        replay(resumed, SessionHistory.from_bytes(saved.history), slot=0)
        for i, (logits, text, codes) in zip(range(25, 35), expected, strict=True):
            out = resumed.step_slots(torch.stack([user[i], user[i]]), active)[0]
            assert (resumed.last_text_logits[0] - logits).abs().max().item() <= 1e-4
            assert (out.text_token, out.agent_codes.tolist()) == (text, codes)
