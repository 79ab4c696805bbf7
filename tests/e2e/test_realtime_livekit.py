"""LiveKit Agents' OpenAI realtime plugin (`livekit-plugins-openai`, unmodified) against a real server on loopback:
`AgentSession` itself with an `Agent` and its function tool, the room's audio replaced by a microphone and a
speaker of the test's own (no LiveKit server runs here), and its `RealtimeSession` driven as `AgentSession` drives it
for what a test must time exactly."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from frontend_model.frame import FRAME_S, FRAME_SAMPLES, SAMPLE_RATE
from tests.support.speech import silence, speak

from .servers import RunningServer, recorded_spans, start_server, stop_server, weather_tool_server

pytest.importorskip("livekit.plugins.openai", reason="livekit-plugins-openai is a test extra")

from livekit import rtc
from livekit.agents import Agent, AgentSession, function_tool
from livekit.agents import llm as livekit_llm
from livekit.agents.voice import io as livekit_io
from livekit.plugins import openai as livekit_openai

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
    with weather_tool_server(tmp_path_factory.mktemp("tools"), KEY) as running:
        yield running


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


class Microphone(livekit_io.AudioInput):
    """What a room's track gives AgentSession: 80 ms frames in real time, the speech and then silence."""

    def __init__(self, speech: np.ndarray) -> None:
        super().__init__(label="test microphone")
        self.pcm, self.at = (speech * 32767).astype("<i2"), 0

    async def __anext__(self) -> rtc.AudioFrame:
        await asyncio.sleep(FRAME_S)
        chunk, self.at = self.pcm[self.at:self.at + FRAME_SAMPLES], self.at + FRAME_SAMPLES
        data = chunk.tobytes() if len(chunk) == FRAME_SAMPLES else bytes(2 * FRAME_SAMPLES)
        return rtc.AudioFrame(data, SAMPLE_RATE, 1, FRAME_SAMPLES)


class Speaker(livekit_io.AudioOutput):
    """A sink that plays at once: it counts the agent's samples and ends each segment it was given."""

    def __init__(self) -> None:
        super().__init__(label="test speaker", capabilities=livekit_io.AudioOutputCapabilities(pause=False),
                         sample_rate=SAMPLE_RATE)
        self.samples, self.segment = 0, 0

    async def capture_frame(self, frame: rtc.AudioFrame) -> None:
        await super().capture_frame(frame)
        self.samples += frame.samples_per_channel
        self.segment += frame.samples_per_channel

    def flush(self) -> None:
        super().flush()
        self._finished(interrupted=False)

    def clear_buffer(self) -> None:
        self._finished(interrupted=True)

    def _finished(self, interrupted: bool) -> None:
        if self.segment:
            self.on_playback_finished(playback_position=self.segment / SAMPLE_RATE, interrupted=interrupted)
            self.segment = 0


def test_an_agent_session_asks_its_function_tool_and_the_answer_is_said_with_no_error(tool_server: RunningServer,
                                                                                       tmp_path: Path) -> None:
    """An `Agent` with a function tool in an `AgentSession` over /v1/realtime, as a LiveKit user writes it: the
    user's spoken question is transcribed, the session runs the tool the backend chose, and its output is injected
    as a span under the deployed deadlines; interruptions (`response.cancel` whether or not a response is open)
    raise no error."""
    speech = np.concatenate([silence(1.0), speak("What is the weather like in Paris today?", tmp_path / "q.wav"),
                             silence(1.0)])
    places: list[str] = []
    heard: list[str] = []
    errors: list[str] = []
    before = len(recorded_spans(tool_server))

    class WeatherAgent(Agent):
        def __init__(self) -> None:
            super().__init__(instructions="You are a helpful weather assistant.")

        @function_tool
        async def get_weather(self, place: str) -> str:
            """The weather now in a place."""
            places.append(place)
            await asyncio.sleep(2.0)  # a real tool: an HTTP call
            return "Sunny and 21 degrees."

    async def converse() -> int:
        model = livekit_openai.realtime.RealtimeModel(base_url=f"{tool_server.http}/v1", api_key=KEY,
                                                      model="contextspan")
        session = AgentSession(llm=model)
        speaker = Speaker()
        session.input.audio, session.output.audio = Microphone(speech), speaker
        session.on("user_input_transcribed", lambda event: heard.append(event.transcript) if event.is_final else None)
        session.on("error", lambda event: errors.append(str(event.error)))
        await session.start(WeatherAgent(), record=False)
        try:
            deadline = time.monotonic() + 90  # Whisper on a busy 2-core host, then the tool
            while len(recorded_spans(tool_server)) == before and time.monotonic() < deadline:
                await asyncio.sleep(0.5)
            return speaker.samples
        finally:
            await session.aclose()

    played = asyncio.run(converse())
    assert not errors
    assert heard and "weather" in heard[-1].lower()
    assert places == ["Paris"]
    (span,) = recorded_spans(tool_server)[before:]
    assert span["type"] == "span.injected" and str(span["text"]).startswith("Sunny and twenty-one degrees"), span
    assert span["source"] == "client:get_weather"
    assert played > 0  # the agent's voice reached the session's output
