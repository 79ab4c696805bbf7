"""LiveKit Agents' OpenAI realtime plugin (`livekit-plugins-openai`, unmodified) against a real server on loopback:
its `RealtimeSession` driven as `AgentSession` drives it, without a LiveKit server (none runs here)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from frontend_model.frame import FRAME_S, FRAME_SAMPLES, SAMPLE_RATE
from tests.support.speech import silence, speak

from .servers import RunningServer, start_server, stop_server

pytest.importorskip("livekit.plugins.openai", reason="livekit-plugins-openai is a test extra")

from livekit import rtc
from livekit.agents import llm as livekit_llm
from livekit.plugins import openai as livekit_openai

from benchmarks.fakes.fake_openai import fake_openai

pytestmark = pytest.mark.slow
KEY = "livekit-key"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    running = start_server(tmp_path_factory.mktemp("server"), "--max-sessions", "1", "--api-keys", KEY, "--no-asr")
    yield running
    stop_server(running)


def test_generate_reply_gets_its_response_created_in_time_greeting_and_later_reply_alike(
        server: RunningServer, tmp_path: Path) -> None:
    """`generate_reply` (a greeting, a reply after a tool, client-side turn detection) fails after 10 s unless a
    `response.created` carries its `client_event_id`."""

    async def microphone(session: livekit_openai.realtime.RealtimeSession) -> None:
        """A room's track as AgentSession forwards it: a frame of (here silent) audio every 80 ms."""
        silent = bytes(2 * FRAME_SAMPLES)
        while True:
            session.push_audio(rtc.AudioFrame(silent, SAMPLE_RATE, 1, FRAME_SAMPLES))
            await asyncio.sleep(FRAME_S)

    async def converse() -> list[tuple[bool, str]]:
        model = livekit_openai.realtime.RealtimeModel(base_url=f"{server.http}/v1", api_key=KEY, model="contextspan")
        session = model.session()
        mic = asyncio.create_task(microphone(session))
        try:
            replies = []
            for _ in range(2):
                created = await asyncio.wait_for(session.generate_reply(), 15)
                replies.append((created.user_initiated, created.response_id))
                await asyncio.sleep(1.0)
            return replies
        finally:
            mic.cancel()
            await session.aclose()
            await model.aclose()

    (first, first_id), (second, second_id) = asyncio.run(converse())
    assert first and second and first_id != second_id


@pytest.fixture(scope="module")
def listening_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """Real Whisper; the agent silent while its user speaks, as a full-duplex model listens."""
    running = start_server(tmp_path_factory.mktemp("listening"), "--max-sessions", "1", "--api-keys", KEY,
                           faults="agent_listens@6")
    yield running
    stop_server(running)


def test_livekit_hears_the_user_start_and_stop_gets_the_transcript_and_interrupts_without_an_error(
        listening_server: RunningServer, tmp_path: Path) -> None:
    speech = np.concatenate([silence(0.5), speak("Hello there, how are you today?", tmp_path / "hi.wav"),
                             silence(2.0)])
    seen: list[str] = []
    finals: list[str] = []

    async def converse() -> list[str]:
        model = livekit_openai.realtime.RealtimeModel(base_url=f"{listening_server.http}/v1", api_key=KEY,
                                                      model="contextspan")
        session = model.session()
        for name in ("input_speech_started", "input_speech_stopped", "generation_created", "error"):
            session.on(name, lambda _event, name=name: seen.append(name))
        session.on("openai_server_event_received", lambda event: seen.append("cancelled") if event["type"] ==
                   "response.done" and event["response"]["status"] == "cancelled" else None)
        session.on("input_audio_transcription_completed",
                   lambda event: finals.append(event.transcript) if event.is_final else None)
        try:
            pcm = (speech * 32767).astype("<i2")
            for i in range(len(pcm) // FRAME_SAMPLES):
                chunk = pcm[i * FRAME_SAMPLES:(i + 1) * FRAME_SAMPLES].tobytes()
                session.push_audio(rtc.AudioFrame(chunk, SAMPLE_RATE, 1, FRAME_SAMPLES))
                await asyncio.sleep(FRAME_S)
            silent = bytes(2 * FRAME_SAMPLES)
            for _ in range(int(30 / FRAME_S)):  # until the final transcript, on a busy host's Whisper
                if finals:
                    break
                session.push_audio(rtc.AudioFrame(silent, SAMPLE_RATE, 1, FRAME_SAMPLES))
                await asyncio.sleep(FRAME_S)
            session.interrupt()  # the user barges in: response.cancel
            for _ in range(int(5 / FRAME_S)):
                session.push_audio(rtc.AudioFrame(silent, SAMPLE_RATE, 1, FRAME_SAMPLES))
                await asyncio.sleep(FRAME_S)
                if "cancelled" in seen:
                    break
            return seen
        finally:
            await session.aclose()
            await model.aclose()

    events = asyncio.run(converse())
    assert "error" not in events
    assert events.index("input_speech_started") < events.index("input_speech_stopped")
    assert finals and "how are you" in finals[-1].lower()
    assert events[-1] == "cancelled", events


@pytest.fixture(scope="module")
def tool_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """Deployed deadlines (2.5 s for a span, 10 s for a client's tool); a question in the user's final transcript
    starts a retrieval, and the backend's LLM (a fake on loopback) always picks the client's weather tool."""
    with fake_openai() as (url, script):
        script.mode, script.tool, script.arguments = "tool_call", "get_weather", {"place": "Paris"}
        running = start_server(tmp_path_factory.mktemp("tools"), "--max-sessions", "1", "--api-keys", KEY,
                               "--trigger", "asr", "--llm-base-url", url, "--llm-model", "fake",
                               faults="agent_listens@6")
        yield running
        stop_server(running)


def test_a_livekit_function_tool_that_takes_4_s_and_a_typed_question_are_answered(tool_server: RunningServer,
                                                                                  tmp_path: Path) -> None:
    """As AgentSession does it: the tool runs once its response is done, its output goes in with
    `update_chat_ctx`, then `generate_reply`; a typed message (`update_chat_ctx` with a user message) is the user's
    turn, asked of the backend as a spoken question is (here the LLM picks the tool again)."""
    speech = np.concatenate([silence(0.5), speak("What is the weather like in Paris today?", tmp_path / "q.wav"),
                             silence(1.0)])
    injected: list[str] = []
    calls: list[str] = []
    typed: list[str] = []

    @livekit_llm.function_tool
    async def get_weather(place: str) -> str:
        """The weather now in a place."""
        return "unused: the test answers as AgentSession would"

    async def converse() -> None:
        model = livekit_openai.realtime.RealtimeModel(base_url=f"{tool_server.http}/v1", api_key=KEY,
                                                      model="contextspan")
        session = model.session()
        tasks: list[asyncio.Task[None]] = []

        async def run_tools(generation: livekit_llm.GenerationCreatedEvent) -> None:
            async for call in generation.function_stream:
                calls.append(call.name)
                await asyncio.sleep(4.0)  # a real tool: an HTTP call, a database
                chat_ctx = session.chat_ctx.copy()
                chat_ctx.items.append(livekit_llm.FunctionCallOutput(
                    call_id=call.call_id, name=call.name, output="Sunny and 21 degrees.", is_error=False))
                await session.update_chat_ctx(chat_ctx)
                await session.generate_reply()

        session.on("generation_created", lambda generation: tasks.append(asyncio.create_task(run_tools(generation))))
        session.on("openai_server_event_received", lambda event: injected.append(event["text"])
                   if event["type"] == "contextspan.span.injected" else None)
        try:
            await session.update_tools([get_weather])
            pcm = (speech * 32767).astype("<i2")
            silent = bytes(2 * FRAME_SAMPLES)
            for i in range(int(60 / FRAME_S)):
                chunk = pcm[i * FRAME_SAMPLES:(i + 1) * FRAME_SAMPLES].tobytes() if i * FRAME_SAMPLES < len(
                    pcm) - FRAME_SAMPLES else silent
                session.push_audio(rtc.AudioFrame(chunk, SAMPLE_RATE, 1, FRAME_SAMPLES))
                await asyncio.sleep(FRAME_S)
                if len(injected) == 1 and not typed:
                    chat_ctx = session.chat_ctx.copy()
                    typed.append(chat_ctx.add_message(role="user", content="And what about Lyon tomorrow?").id)
                    await session.update_chat_ctx(chat_ctx)
                if len(injected) == 2:
                    break
        finally:
            for task in tasks:
                task.cancel()
            await session.aclose()
            await model.aclose()

    asyncio.run(converse())
    assert calls == ["get_weather", "get_weather"]
    assert len(injected) == 2 and all(text.startswith("Sunny and twenty-one degrees") for text in injected)
