"""Sessions that outlive their replica, with real servers: two replicas (two `contextspan serve` processes sharing a
real redis-server on loopback and the resume secret). A conversation on A (a typed question answered by the built-in
router, so a span goes in and the backend stores turns), A drained or killed -9, the client resumes on B by itself:
the same session id, its history replayed past the span, the transcript going on, the turns in B's context store;
the same for a /v1/realtime session, with what its session.update set; a question whose answer the backend's LLM (a
fake on loopback) still held when A drained, answered and injected on B, once (and, on one server, an answer saved
while it waited for its frame, injected once after the resume). Then the refusals (bad, other user's,
expired, unknown tokens, on both endpoints), a session token that one replica issued and another spends once, and
Redis going down."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import sphn
import websockets
from websockets.exceptions import InvalidStatus

from backend_agent.context_store import ContextStore
from benchmarks.fakes.fake_openai import Script, fake_openai
from benchmarks.harness import stream
from contextspan_client import AudioChunk, SessionClosed, chat_url, connect
from frontend_model.frame import FRAME_SAMPLES, SAMPLE_RATE
from frontend_model.loading.loader import load_model
from server.guard.auth import ResumeSigner
from server.session.resume import RedisResumeStore, ResumeState
from server.session.retrieval import SpanAnswer
from server.session.session import Session
from server.wire import protocol as p
from server.wire import realtime as rt
from tests.support.redis_server import RedisServer, redis_server

from .servers import RunningServer, in_process_server, pinned_settings, start_server, stop_server

pytestmark = pytest.mark.slow
SECRET = "replicas-share-this"
USER = "ada"
QUESTION = "What is twelve times twelve?"
API_KEY = "operator-key-for-tests"


def replica(tmp: Path, redis: RedisServer, *flags: str) -> RunningServer:
    return start_server(tmp, "--no-asr", "--max-sessions", "1", "--resume-store", redis.url, "--resume-secret",
                        SECRET, "--context-store", str(tmp / "context.db"), "--shutdown-grace-s", "5", *flags)


@pytest.fixture(scope="module")
def redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    with redis_server(tmp_path_factory.mktemp("redis")) as server:
        yield server


@pytest.fixture(scope="module")
def b(tmp_path_factory: pytest.TempPathFactory, redis: RedisServer) -> Iterator[RunningServer]:
    server = replica(tmp_path_factory.mktemp("b"), redis)
    yield server
    stop_server(server)


Events = list[tuple[int, object]]  # every event, with how many times the client had resumed when it arrived


async def span_saved(events: Events, receiver: asyncio.Task[None]) -> None:
    """Until the typed question's span is in and a save holds it."""
    deadline = time.monotonic() + 10
    while not any(getattr(e, "type", "") == "span.injected" for _, e in events):
        assert time.monotonic() < deadline and not receiver.done(), events
        await asyncio.sleep(0.05)
    await asyncio.sleep(1.5)


async def across(a: RunningServer, b: RunningServer, cut: Callable[[RunningServer], None],
                 ready: Callable[[Events, asyncio.Task[None]], Awaitable[None]] = span_saved,
                 question: str = QUESTION) -> Events:
    """A conversation opened on A with B as its failover, asking a typed `question`; `cut` ends A once `ready`
    returns."""
    events: Events = []
    async with connect(a.http, failover=[b.http], user=USER) as conversation:
        sender = asyncio.create_task(conversation.stream_audio(np.zeros(7 * SAMPLE_RATE, np.float32)))

        async def receive() -> None:
            async for item in conversation:
                if not isinstance(item, AudioChunk):
                    events.append((conversation.resumes, item))

        receiver = asyncio.create_task(receive())
        await asyncio.sleep(1.0)
        await conversation.send(p.UserText(type="user.text", text=question))
        await ready(events, receiver)
        cut(a)
        await sender
        await asyncio.sleep(1.0)
        assert not receiver.done() or receiver.exception() is None, receiver.exception()
        receiver.cancel()
    return events


def check_resumed(events: Events, b: RunningServer) -> None:
    ready = [(n, e) for n, e in events if isinstance(e, p.SessionReady)]
    assert [n for n, _ in ready] == [0, 1], "one session.ready on A, one on B"
    (_, first), (_, second) = ready
    assert second.session_id == first.session_id and second.resume and second.resume != first.resume
    span = next(e for _, e in events if isinstance(e, p.SpanInjected))
    assert second.resumed_frames is not None and second.resumed_frames >= span.offset_after, "the span is in"
    assert second.t > span.t - 1.0, "the stream time goes on from the last save"
    assert any(n == 1 and isinstance(e, p.AgentText) for n, e in events), "the transcript goes on on B"
    store = ContextStore(b.recordings.parent / "context.db")
    try:
        turns = [(t.role, t.text) for t in store.turns(first.session_id)]
    finally:
        store.close()
    assert ("user", QUESTION) in turns, turns


def test_a_drained_replica_hands_its_session_over(tmp_path: Path, redis: RedisServer, b: RunningServer) -> None:
    a = replica(tmp_path, redis)
    try:
        events = asyncio.run(across(a, b, lambda server: server.process.send_signal(signal.SIGTERM)))
        a.process.wait(timeout=30)
    finally:
        stop_server(a)
    check_resumed(events, b)
    assert "session(s) over to other replicas" in a.log.read_text()


def test_a_replica_killed_9_loses_at_most_the_last_second(tmp_path: Path, redis: RedisServer,
                                                          b: RunningServer) -> None:
    a = replica(tmp_path, redis)
    try:
        events = asyncio.run(across(a, b, lambda server: server.process.kill()))
    finally:
        stop_server(a)
    check_resumed(events, b)


HELD = "Who founded the museum?"  # no built-in tool's intent: the LLM answers it
ANSWER = "The museum was founded by Ada Lovelace."


def held_by(script: Script) -> Callable[[Events, asyncio.Task[None]], Awaitable[None]]:
    """Until the LLM holds A's question (it answers the next asker at once: B)."""
    async def ready(events: Events, receiver: asyncio.Task[None]) -> None:
        deadline = time.monotonic() + 10
        while not script.requests:
            assert time.monotonic() < deadline and not receiver.done(), events
            await asyncio.sleep(0.01)
        script.mode, script.content = "content", ANSWER

    return ready


def test_a_question_in_flight_when_its_replica_drains_is_answered_on_the_next_once(
        tmp_path_factory: pytest.TempPathFactory, redis: RedisServer) -> None:
    with fake_openai() as (url, script):
        script.mode = "hang"
        flags = ("--llm-base-url", url, "--llm-model", "fake", "--span-deadline-s", "10")
        a, b = (replica(tmp_path_factory.mktemp(name), redis, *flags) for name in ("held-a", "held-b"))
        try:
            events = asyncio.run(across(a, b, lambda server: server.process.send_signal(signal.SIGTERM),
                                        held_by(script), HELD))
            a.process.wait(timeout=30)
        finally:
            stop_server(a)
            stop_server(b)
        asked = len(script.requests)
    spans = [(n, e) for n, e in events if isinstance(e, p.SpanInjected | p.SpanDropped)]
    assert [(n, type(e).__name__, e.question) for n, e in spans] == [(1, "SpanInjected", HELD)], \
        "injected on B, once, for A's question"
    assert "Lovelace" in spans[0][1].text, "B's answer"
    assert [n for n, e in events if isinstance(e, p.Question)] == [0], "the question is told once, by A"
    assert asked == 2, "A asked the LLM, then B asked it again"
    assert "typed asked in flight, going on here" in b.log.read_text()


async def refused(b: RunningServer, token: str, user: str = USER, endpoint: str = "/api/chat?events=1&"
                  ) -> tuple[int | None, str]:
    async with websockets.connect(f"{b.ws}{endpoint}user={user}&resume={token}") as ws:
        with pytest.raises(websockets.ConnectionClosed):
            await asyncio.wait_for(ws.recv(), timeout=10)
    return ws.close_code, ws.close_reason or ""


def test_bad_other_users_expired_and_unknown_tokens_are_refused(b: RunningServer) -> None:
    signer = ResumeSigner(SECRET.encode())
    token = signer.issue("20261204T000000Z-0badcafe", USER, 600)
    past = ResumeSigner(SECRET.encode(), clock=lambda: time.time() - 3600).issue("20261204T000000Z-0badcafe", USER,
                                                                                  60)
    forged = ResumeSigner(b"not-the-secret").issue("20261204T000000Z-0badcafe", USER, 600)
    cases = {"bad": (forged, USER), "other": (token, "mallory"), "expired": (past, USER), "unknown": (token, USER)}
    closes = {name: asyncio.run(refused(b, *case)) for name, case in cases.items()}
    assert {name: code for name, (code, _) in closes.items()} == {
        "bad": p.CLOSE_RESUME_BAD_TOKEN, "other": p.CLOSE_RESUME_OTHER_USER, "expired": p.CLOSE_RESUME_EXPIRED,
        "unknown": p.CLOSE_RESUME_UNKNOWN}
    assert all(token not in reason and forged not in reason for _, reason in closes.values())
    assert token not in b.log.read_text(), "tokens are never logged"


async def realtime_across(a: RunningServer, b: RunningServer) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """A /v1/realtime session on A set up by session.update (instructions, a tool, a temperature) that asks a typed
    question; A drains once the span is in and saved, and the session goes on on B with the token of close 4000.
    Every event A sent, then every event B sent in the 2 s of audio after the resume."""
    seen: list[dict[str, Any]] = []
    frame = rt.encode_audio(np.zeros(FRAME_SAMPLES, np.float32))

    async def listen(ws: websockets.ClientConnection, into: list[dict[str, Any]]) -> None:
        with contextlib.suppress(websockets.ConnectionClosed):  # how it closed is checked below
            async for text in ws:
                into.append(json.loads(text))

    async def talk(ws: websockets.ClientConnection, frames: int) -> None:
        for _ in range(frames):
            await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": frame}))
            await asyncio.sleep(FRAME_SAMPLES / SAMPLE_RATE)

    async with websockets.connect(f"{a.ws}/v1/realtime?user={USER}", max_size=None) as ws:
        listener = asyncio.create_task(listen(ws, seen))
        await ws.send(json.dumps({"type": "session.update", "session": {
            "type": "realtime", "instructions": "You are a careful calculator.", "temperature": 0.6,
            "tools": [{"type": "function", "name": "get_weather", "parameters": {"type": "object"}}]}}))
        talker = asyncio.create_task(talk(ws, 15 * 12))
        await asyncio.sleep(1.0)
        await ws.send(json.dumps({"type": "conversation.item.create", "item": {
            "type": "message", "role": "user", "content": [{"type": "input_text", "text": QUESTION}]}}))
        deadline = time.monotonic() + 10
        while not any(e["type"] == "contextspan.span.injected" for e in seen):
            assert time.monotonic() < deadline and not listener.done(), [e["type"] for e in seen]
            await asyncio.sleep(0.05)
        await asyncio.sleep(1.5)  # a save with the span in it
        a.process.send_signal(signal.SIGTERM)
        await asyncio.wait_for(listener, timeout=10)
        talker.cancel()
    assert (ws.close_code, json.loads(ws.close_reason or "{}").get("error")) == (
        p.CLOSE_RESUME_ELSEWHERE, "resume_elsewhere")
    token = json.loads(ws.close_reason or "{}")["message"]
    after: list[dict[str, Any]] = []
    async with websockets.connect(f"{b.ws}/v1/realtime?user={USER}&resume={token}", max_size=None) as ws:
        listener = asyncio.create_task(listen(ws, after))
        await talk(ws, 25)
        await ws.close()
        await listener
    return seen, after


def test_a_realtime_session_drained_on_one_replica_goes_on_on_another(tmp_path: Path, redis: RedisServer,
                                                                     b: RunningServer) -> None:
    a = replica(tmp_path, redis)
    try:
        seen, after = asyncio.run(realtime_across(a, b))
        a.process.wait(timeout=30)
    finally:
        stop_server(a)
    first = next(e for e in seen if e["type"] == "session.created")
    updated = [e for e in seen if e["type"] == "session.updated"][-1]["session"]
    second = next(e for e in after if e["type"] == "session.created")
    assert second["session"]["id"] == first["session"]["id"] and first["contextspan"]["resume"]
    assert second["session"]["instructions"] == updated["instructions"] == "You are a careful calculator."
    assert second["session"]["temperature"] == 0.6 and [t["name"] for t in second["session"]["tools"]] == [
        "get_weather"], "what session.update set, kept"
    span = next(e for e in seen if e["type"] == "contextspan.span.injected")
    assert second["contextspan"]["resumed_frames"] >= span["offset_after"], "the history is replayed past the span"
    assert sum(e["type"] == "response.output_audio.delta" for e in after) >= 20, "the agent goes on on B"
    store = ContextStore(b.recordings.parent / "context.db")
    try:
        turns = store.turns(first["session"]["id"].removeprefix("sess_"))
        assert ("user", QUESTION) in [(t.role, t.text) for t in turns], \
            "the turns are in B's context store"
    finally:
        store.close()


def test_a_session_token_from_one_replica_opens_one_session_on_any(tmp_path_factory: pytest.TempPathFactory,
                                                                   redis: RedisServer) -> None:
    """As behind a load balancer: the backend's POST /api/token lands on A, the page's WebSocket on C."""
    a, c = (replica(tmp_path_factory.mktemp(name), redis, "--api-keys", API_KEY) for name in ("a", "c"))
    try:
        response = httpx.post(f"{a.http}/api/token", headers={"Authorization": f"Bearer {API_KEY}"}, timeout=10)
        token = response.json()["token"]

        async def spend(server: RunningServer) -> bytes | tuple[int, str]:
            try:
                async with websockets.connect(chat_url(server.ws), additional_headers={
                        "Authorization": f"Bearer {token}"}, open_timeout=10) as ws:
                    return await asyncio.wait_for(ws.recv(), timeout=30)
            except InvalidStatus as refusal:
                return refusal.response.status_code, json.loads(refusal.response.body or b"{}")["error"]

        assert asyncio.run(spend(c)) == p.handshake(), "a session on C"
        assert asyncio.run(spend(a)) == (401, "token_unknown"), "the same token again, on A"
    finally:
        stop_server(a)
        stop_server(c)
    assert token not in a.log.read_text() + c.log.read_text(), "tokens are never logged"


def test_realtime_resumes_are_refused_as_chat_ones_and_a_chat_session_is_not_resumed_as_realtime(
        redis: RedisServer, b: RunningServer) -> None:
    signer = ResumeSigner(SECRET.encode())
    chat = "20261204T000000Z-0c4a7000"
    store = RedisResumeStore(redis.url)

    async def keep() -> None:
        try:
            await store.save(ResumeState(chat, USER, None, None, True, b"", protocol="chat"), ttl_s=60)
        finally:
            await store.aclose()

    asyncio.run(keep())
    forged = ResumeSigner(b"not-the-secret").issue(chat, USER, 600)
    cases = {"bad": (forged, USER), "other": (signer.issue(chat, USER, 600), "mallory"),
             "chat": (signer.issue(chat, USER, 600), USER)}
    closes = {name: asyncio.run(refused(b, token, user, "/v1/realtime?")) for name, (token, user) in cases.items()}
    assert {name: code for name, (code, _) in closes.items()} == {
        "bad": p.CLOSE_RESUME_BAD_TOKEN, "other": p.CLOSE_RESUME_OTHER_USER, "chat": p.CLOSE_RESUME_UNKNOWN}
    assert "other endpoint" in closes["chat"][1]


def test_with_redis_down_sessions_go_on_and_resume_is_unavailable(redis: RedisServer, b: RunningServer) -> None:
    """Last in this module: it stops the module's Redis."""
    redis.stop()
    deadline = time.monotonic() + 10  # /readyz answers at once with the store's latest answer, and pings it anew
    while (info := httpx.get(f"{b.http}/readyz", timeout=10)).json()["resume"]["available"]:
        assert info.status_code == 200 and time.monotonic() < deadline
        time.sleep(0.2)
    assert info.status_code == 200, "the replica still serves new sessions"

    async def session() -> p.SessionReady:
        async with connect(b.http, user=USER) as conversation:
            await conversation.stream_audio(np.zeros(SAMPLE_RATE, np.float32))
            async for item in conversation:
                if isinstance(item, p.SessionReady):
                    return item
        raise AssertionError(f"no session.ready: {conversation.close_code} {conversation.close_reason}")

    ready = asyncio.run(session())
    assert ready.resume is not None
    deadline = time.monotonic() + 10  # its teardown tries to drop the state, which takes the store's timeout
    while httpx.get(f"{b.http}/api/info", timeout=10).json()["sessions"]:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    code, reason = asyncio.run(refused(b, ready.resume))
    assert code == p.CLOSE_RESUME_UNAVAILABLE and "resume_unavailable" in reason


def test_the_default_memory_store_resumes_a_lost_connection_on_the_same_server(tmp_path: Path) -> None:
    """No Redis: a connection that drops resumes on the same process; a session closed normally does not."""
    settings = pinned_settings(recordings_dir=tmp_path, max_sessions=1, asr=False)
    pcm = np.zeros(SAMPLE_RATE, np.float32)
    with in_process_server(settings, load_model("tiny")) as server:
        async def run() -> tuple[p.SessionReady, p.SessionReady, SessionClosed]:
            async with websockets.connect(chat_url(server.ws, events=True, user=USER)) as ws:
                first = next(p.decode_event(m) for m in [await ws.recv() for _ in range(2)] if isinstance(m, str))
                await asyncio.sleep(1.5)  # a save
                ws.transport.abort()  # the connection drops: 1006
            assert isinstance(first, p.SessionReady) and first.resume
            deadline = time.monotonic() + 10
            while server.state.sessions:
                assert time.monotonic() < deadline
                await asyncio.sleep(0.05)
            again = await stream(chat_url(server.ws, events=True, user=USER, resume=first.resume), pcm)
            (second,) = again.of_type("session.ready")
            with pytest.raises(SessionClosed) as closed:  # that one ended normally: nothing is kept
                await stream(chat_url(server.ws, events=True, user=USER, resume=second.resume), pcm)
            return first, second, closed.value

        first, second, closed = asyncio.run(run())
    assert second.session_id == first.session_id and second.resumed_frames is not None
    assert (closed.code, closed.error) == (p.CLOSE_RESUME_UNKNOWN, "resume_unknown")


def test_an_answer_waiting_for_its_frame_when_the_connection_drops_goes_in_once_after_the_resume(
        tmp_path: Path) -> None:
    """A session whose client stops sending audio steps no frame, so an answer handed to it then waits for its frame
    boundary: a save holds it (Session.save), the connection drops, and the resumed session injects it at its first
    frame."""
    settings = pinned_settings(recordings_dir=tmp_path, max_sessions=1, asr=False)

    async def hold_and_save(session: Session) -> ResumeState | None:
        session.request_span(SpanAnswer("(tool result) It opens at nine.", "kb", "knowledge_base", "Is it open?",
                                        time.perf_counter()))
        assert session.resumes is not None and await session.save()
        return await session.resumes.store.load(session.id)

    with in_process_server(settings, load_model("tiny")) as server:
        async def run() -> tuple[ResumeState | None, list[Any], list[Any]]:
            async with websockets.connect(chat_url(server.ws, events=True, user=USER)) as ws:
                first = next(p.decode_event(m) for m in [await ws.recv() for _ in range(2)] if isinstance(m, str))
                (session,) = server.state.sessions.values()
                writer = sphn.OpusStreamWriter(SAMPLE_RATE)
                for _ in range(12):
                    await ws.send(p.audio_message(writer.append_pcm(np.zeros(FRAME_SAMPLES, np.float32))))
                deadline = time.monotonic() + 10
                while server.state.batcher.model.frames_stepped[session.slot] < 5:  # type: ignore[union-attr]
                    assert time.monotonic() < deadline, "the session stepped no frame"
                    await asyncio.sleep(0.05)
                saved = await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(hold_and_save(session),
                                                                                   server.loop))
                ws.transport.abort()
            assert isinstance(first, p.SessionReady) and first.resume
            deadline = time.monotonic() + 10
            while server.state.sessions:
                assert time.monotonic() < deadline
                await asyncio.sleep(0.05)
            again = await stream(chat_url(server.ws, events=True, user=USER, resume=first.resume),
                                 np.zeros(SAMPLE_RATE, np.float32))
            return saved, again.of_type("span.injected"), again.of_type("span.dropped")

        saved, injected, dropped = asyncio.run(run())
    assert saved is not None
    assert [(i.stage, i.question, i.text) for i in saved.in_flight] == [
        ("answered", "Is it open?", "(tool result) It opens at nine.")]
    assert [(e.question, e.text) for e in injected] == [("Is it open?", "(tool result) It opens at nine.")]
    # at the resumed session's first frame boundary, or as many later as the frame's budget put it off (a slow host)
    assert injected[0].step == 1 + injected[0].deferred_ticks
    assert dropped == []
