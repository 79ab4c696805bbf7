"""End to end on loopback: a real uvicorn server (tiny profile) and a client streaming espeak-ng speech as Ogg
Opus in real time."""

from __future__ import annotations

import asyncio
import json
import time
import wave
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from benchmarks.harness import stream
from contextspan_client import chat_url
from frontend_model.frame import FRAME_SAMPLES, SAMPLE_RATE
from frontend_model.loading.loader import load_model
from frontend_model.moshi_internals.row_sampling import Stream
from server.wire import protocol as p

from .servers import RunningServer, app_answer, in_process_server, pinned_settings

pytestmark = pytest.mark.slow
FRAME_S = FRAME_SAMPLES / SAMPLE_RATE


def wait_for_wav(path: Path, seconds: float, timeout: float = 10.0) -> float:
    """The session's WAV duration once it has reached `seconds` or stopped growing."""
    deadline = time.monotonic() + timeout
    duration = -1.0
    while time.monotonic() < deadline:
        if path.exists():
            with wave.open(str(path)) as w:
                assert (w.getnchannels(), w.getframerate(), w.getsampwidth()) == (2, SAMPLE_RATE, 2)
                duration = w.getnframes() / SAMPLE_RATE
            if abs(duration - seconds) < 1e-6:
                return duration
        time.sleep(0.2)
    return duration


def test_stream_with_events(server: RunningServer, speech: np.ndarray) -> None:
    result = asyncio.run(stream(chat_url(server.ws, events=True), speech))
    frames = result.frames_sent
    assert result.handshake_s is not None
    assert frames == len(speech) // FRAME_SAMPLES
    assert abs(result.audio_messages - frames) <= 1, (result.audio_messages, frames)
    assert abs(result.output_seconds - frames * FRAME_S) <= FRAME_S + 1e-9, result.output_seconds
    assert result.text_pieces, "no agent text pieces arrived"

    ready = result.of_type("session.ready")
    assert len(ready) == 1 and ready[0].random_weights and ready[0].profile == "tiny"
    sampling = ready[0].sampling  # the checkpoint's defaults, with seeds drawn for this session
    assert (sampling.text_temperature, sampling.text_topk, sampling.audio_temperature, sampling.audio_topk) == (
        0.7, 25, 0.8, 250)
    assert ready[0].unsupported == {}
    assert result.of_type("agent.text")
    stats = result.of_type("stats")
    assert stats and sum(s.frames_in for s in stats) >= frames - 13
    assert all(s.audio_dropped == 0 for s in stats)

    session_id = ready[0].session_id
    wav_s = wait_for_wav(server.recordings / f"{session_id}.wav", frames * FRAME_S)
    assert abs(wav_s - frames * FRAME_S) < 1e-6, wav_s
    lines = (server.recordings / f"{session_id}.jsonl").read_text().splitlines()
    events = [json.loads(line) for line in lines]
    assert events[0]["type"] == "session.ready"
    assert {"agent.text", "stats"} <= {e["type"] for e in events}


def test_kyutai_client_sampling_parameters_are_applied_and_reported(server: RunningServer,
                                                                    speech: np.ndarray) -> None:
    """The query Kyutai's web client sends: each setting in effect, the ones not applied named with their values."""
    query = {"text_temperature": "0.5", "text_topk": "10", "audio_temperature": "0", "audio_topk": "100",
             "pad_mult": "0", "text_seed": "123", "audio_seed": "4294967295", "repetition_penalty_context": "64",
             "repetition_penalty": "1.1"}
    result = asyncio.run(stream(chat_url(server.ws, events=True, **query), speech[: SAMPLE_RATE]))
    ready = result.of_type("session.ready")
    assert len(ready) == 1 and result.text_pieces
    assert ready[0].sampling == p.Sampling(text_temperature=0.5, text_topk=10, audio_temperature=0.0,
                                           audio_topk=100, text_seed=123, audio_seed=4294967295)
    assert ready[0].unsupported == {"pad_mult": 0.0, "repetition_penalty_context": 64.0, "repetition_penalty": 1.1}


def test_session_update_changes_sampling_mid_stream(inproc_server: tuple[str, object, asyncio.AbstractEventLoop],
                                                    speech: np.ndarray) -> None:
    """`session.update` `sampling`: settings sent replace those in effect, the rest stay; the slot's sampler takes
    them from its next frame; a bad value is an error event and changes nothing."""
    url, state, _ = inproc_server
    updates = [{"text_temperature": 0, "audio_topk": 7}, {"audio_seed": 5}, {"text_topk": -1}]
    texts = [(0.5 + 0.2 * i, json.dumps({"type": "session.update", "sampling": u})) for i, u in enumerate(updates)]
    query = {"text_seed": "11", "audio_seed": "12"}
    asyncio.run(slot_free(state))
    result = asyncio.run(stream(chat_url(url, events=True, **query), speech[: 2 * SAMPLE_RATE], texts=texts))
    ready = result.of_type("session.ready")[0].sampling
    updated = [e.sampling for e in result.of_type("session.updated")]
    assert updated == [ready.model_copy(update={"text_temperature": 0.0, "audio_topk": 7}),
                       ready.model_copy(update={"text_temperature": 0.0, "audio_topk": 7, "audio_seed": 5})]
    errors = result.of_type("error")
    assert len(errors) == 1 and "text_topk" in errors[0].message, errors
    sampler = state.batcher.model.engine.sampler  # type: ignore[attr-defined]
    assert float(sampler.temperature[Stream.TEXT][0]) == 0.0
    assert int(sampler.topk[Stream.AUDIO][0]) == 7 and int(sampler.seed[Stream.AUDIO][0]) == 5
    assert int(sampler.topk[Stream.TEXT][0]) == ready.text_topk


def test_binary_only_moshi_flow(server: RunningServer, speech: np.ndarray) -> None:
    """What an unmodified Moshi client does: no query, binary messages only."""
    pcm = speech[: 3 * SAMPLE_RATE]
    result = asyncio.run(stream(chat_url(server.ws), pcm))
    frames = len(pcm) // FRAME_SAMPLES
    assert result.events == []
    assert abs(result.audio_messages - frames) <= 1
    assert abs(result.output_seconds - frames * FRAME_S) <= FRAME_S + 1e-9
    assert result.text_pieces


@pytest.fixture(scope="module")
def inproc_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, object, asyncio.AbstractEventLoop]]:
    settings = pinned_settings(recordings_dir=tmp_path_factory.mktemp("rec"), max_sessions=1)
    with in_process_server(settings, load_model("tiny")) as running:
        yield running.ws, running.state, running.loop


async def slot_free(state: object) -> None:
    """One slot: the previous test's session gives it back once its teardown has run, which a slow host takes a
    while to do; a test connecting before would be refused 1013."""
    deadline = time.monotonic() + 60
    while state.batcher.free != state.batcher.size or state.sessions:  # type: ignore[attr-defined]
        assert time.monotonic() < deadline, "the slot never came back"
        await asyncio.sleep(0.02)


def test_request_span_injects_at_next_frame(inproc_server: tuple[str, object, asyncio.AbstractEventLoop],
                                            speech: np.ndarray) -> None:
    """A span goes in at the first frame boundary after the request: before the session's next step, or the one
    after when a step was already on its way (its frame was taken without the span); later only for the ticks it
    was deferred because it did not fit a frame's budget, which the event reports. Counted in steps, so it holds
    however fast this host is."""
    url, state, loop = inproc_server
    batcher = state.batcher  # type: ignore[attr-defined]
    stepped_at_request: list[int] = []

    def request(session: object, text: str) -> None:
        stepped_at_request.append(batcher.model.frames_stepped[session.slot])  # type: ignore[attr-defined]
        session.request_span(app_answer(text, "kb"))  # type: ignore[attr-defined]

    def injected(result: object) -> bool:
        return bool(result.of_type("span.injected") or result.of_type("span.dropped"))  # type: ignore[attr-defined]

    async def run() -> object:
        await slot_free(state)
        client = asyncio.create_task(stream(chat_url(url, events=True), speech[: 3 * SAMPLE_RATE], until=injected,
                                            until_timeout_s=60))
        while not state.sessions:  # type: ignore[attr-defined]
            await asyncio.sleep(0.05)
        session = next(iter(state.sessions.values()))  # type: ignore[attr-defined]
        while not state.batcher.model.frames_stepped[session.slot]:  # type: ignore[attr-defined]
            await asyncio.sleep(0.05)  # stepping: before its first frame a span is dropped as "before the first frame"
        loop.call_soon_threadsafe(request, session, "The capital of France is Paris.")
        return await client

    result = asyncio.run(run())
    injected_events = result.of_type("span.injected")  # type: ignore[attr-defined]
    assert len(injected_events) == 1, result.events  # type: ignore[attr-defined]
    span = injected_events[0]
    assert span.source == "kb" and "capital of France" in span.text and span.frames >= 3
    assert span.offset_after == span.offset_before + span.frames
    assert 0 < span.prefill_ms < span.latency_ms
    waited = span.step - stepped_at_request[0] - span.deferred_ticks
    assert waited in (0, 1), (span.step, stepped_at_request, span.deferred_ticks)


def test_an_empty_span_is_dropped_with_its_reason(inproc_server: tuple[str, object, asyncio.AbstractEventLoop],
                                                  speech: np.ndarray) -> None:
    url, state, loop = inproc_server

    async def run() -> object:
        await slot_free(state)
        client = asyncio.create_task(stream(chat_url(url, events=True), speech[:SAMPLE_RATE],
                                            until=lambda r: bool(r.of_type("span.dropped")), until_timeout_s=60))
        while not state.sessions:  # type: ignore[attr-defined]
            await asyncio.sleep(0.05)
        session = next(iter(state.sessions.values()))  # type: ignore[attr-defined]
        while not state.batcher.model.frames_stepped[session.slot]:  # type: ignore[attr-defined]
            await asyncio.sleep(0.05)  # stepping: before its first frame a span is dropped as "before the first frame"
        loop.call_soon_threadsafe(session.request_span, app_answer(""))
        return await client

    dropped = asyncio.run(run()).of_type("span.dropped")  # type: ignore[attr-defined]
    assert len(dropped) == 1 and dropped[0].reason == "empty text"


def test_abrupt_disconnects_release_everything(inproc_server: tuple[str, object, asyncio.AbstractEventLoop],
                                               speech: np.ndarray) -> None:
    """Leaving right after connecting, and leaving with a span pending: the slot comes back each time."""
    import websockets

    url, state, loop = inproc_server
    pool = state.batcher  # type: ignore[attr-defined]
    recordings = state.settings.recordings_dir  # type: ignore[attr-defined]

    async def wait_until(condition: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + 5
        while not condition():
            assert time.monotonic() < deadline, what
            await asyncio.sleep(0.02)

    def slot_back() -> bool:
        return pool.free == pool.size and not state.sessions  # type: ignore[attr-defined]

    async def leave_at_once() -> None:
        # Depending on timing the server sees the abort during accept (no session), or while prefilling or
        # sending the handshake: either way the slot must come back.
        ws = await websockets.connect(chat_url(url))
        ws.transport.abort()
        await asyncio.sleep(0.5)
        await wait_until(slot_back, "slot not released after an abort")

    async def leave_mid_span() -> str:
        client = asyncio.create_task(stream(chat_url(url, events=True), speech[: 3 * SAMPLE_RATE]))
        await wait_until(lambda: bool(state.sessions), "the session did not start")  # type: ignore[attr-defined]
        session = next(iter(state.sessions.values()))  # type: ignore[attr-defined]
        # Audio is read only once the session is ready: wait for some, however slow the prefill was.
        await wait_until(lambda: session.assembler.stream_time > 0.3, "the session did not stream")
        loop.call_soon_threadsafe(session.request_span, app_answer("A fact that will never be read. " * 20))
        client.cancel()
        await asyncio.gather(client, return_exceptions=True)
        await wait_until(slot_back, "slot not released after leaving mid-span")
        return str(session.id)

    async def run() -> str:
        await leave_at_once()
        return await leave_mid_span()

    session_id = asyncio.run(run())
    types = [json.loads(line)["type"] for line in (recordings / f"{session_id}.jsonl").read_text().splitlines()]
    assert types[0] == "session.ready" and ("span.injected" in types or "span.dropped" in types)
    after = asyncio.run(stream(chat_url(url), speech[:SAMPLE_RATE]))
    assert after.audio_messages >= 11
