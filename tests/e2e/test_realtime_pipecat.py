"""Pipecat's OpenAI Realtime service (`pipecat-ai`, unmodified, headless: no transport, no media server) converses
with a real server on loopback: its pipeline sends the user's audio and turns our events into its frames, and it
validates every event it knows against its own pydantic models, so a field it expects and we lack fails here."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from frontend_model.frame import FRAME_S, FRAME_SAMPLES, SAMPLE_RATE
from tests.support.speech import silence, speak

from .servers import RunningServer, recorded_spans, start_server, stop_server, weather_tool_server

pytest.importorskip("pipecat", reason="pipecat-ai is a test extra")

from pipecat.frames.frames import (
    ErrorFrame,
    InputAudioRawFrame,
    LLMFullResponseEndFrame,
    TranscriptionFrame,
    TTSAudioRawFrame,
    TTSTextFrame,
)
from pipecat.pipeline.worker import PipelineParams
from pipecat.services.openai.realtime.llm import OpenAIRealtimeLLMService
from pipecat.tests.utils import SleepFrame, run_test

pytestmark = pytest.mark.slow
KEY = "pipecat-key"


def paced(speech: np.ndarray) -> list[object]:
    """The user's audio as a transport hands it to the pipeline: a frame every 80 ms."""
    frames: list[object] = []
    for i in range(len(speech) // FRAME_SAMPLES):
        pcm = (speech[i * FRAME_SAMPLES:(i + 1) * FRAME_SAMPLES] * 32767).astype("<i2").tobytes()
        frames += [InputAudioRawFrame(audio=pcm, sample_rate=SAMPLE_RATE, num_channels=1), SleepFrame(FRAME_S)]
    return frames


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    # The agent listens while the user speaks (as a full-duplex model does): Pipecat sees turns end, and silence.
    running = start_server(tmp_path_factory.mktemp("server"), "--max-sessions", "1", "--api-keys", KEY,
                           faults="agent_listens@6")
    yield running
    stop_server(running)


def test_pipecats_realtime_service_hears_the_user_and_plays_the_agent(server: RunningServer, tmp_path: Path) -> None:
    speech = np.concatenate([silence(0.3), speak("Hello there, how are you today?", tmp_path / "hi.wav"),
                             silence(4.0)])
    frames = paced(speech)
    frames.append(SleepFrame(20.0))  # the agent's last frames, and the final transcript from a busy host's Whisper
    llm = OpenAIRealtimeLLMService(api_key=KEY, base_url=f"{server.ws}/v1/realtime?model=contextspan")
    down, up = asyncio.run(run_test(llm, frames_to_send=frames, pipeline_params=PipelineParams(
        audio_in_sample_rate=SAMPLE_RATE, audio_out_sample_rate=SAMPLE_RATE), start_timeout=30.0))

    errors = [f.error for f in [*down, *up] if isinstance(f, ErrorFrame)]
    assert not errors, errors
    agent_samples = sum(len(f.audio) // 2 for f in down if isinstance(f, TTSAudioRawFrame))
    assert agent_samples >= 0.5 * len(speech)  # real time both ways, but the host may lag a little behind
    assert [f for f in down if isinstance(f, TTSTextFrame)], "the agent's transcript"
    assert [f for f in down if isinstance(f, LLMFullResponseEndFrame)], "a turn that ended (response.done)"
    finals = [f.text for f in up if isinstance(f, TranscriptionFrame)]
    assert finals and "how are you" in " ".join(finals).lower()


@pytest.fixture(scope="module")
def failing_asr_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """Whisper fails on every utterance, and app text is refused (`--app-spans off`)."""
    running = start_server(tmp_path_factory.mktemp("failing"), "--max-sessions", "1", "--api-keys", KEY,
                           "--app-spans", "off", faults="agent_listens@6,asr_raise")
    yield running
    stop_server(running)


def test_pipecats_session_survives_every_condition_that_is_not_its_fault(failing_asr_server: RunningServer,
                                                                        tmp_path: Path) -> None:
    """Pipecat ends its session on any `error` but two codes and a failed lookup of its own: a failed
    transcription, app text the server refuses, two in one frame and a lookup of the refused item must leave its
    pipeline running, the agent still heard after them."""
    from pipecat.services.openai.realtime import events

    speech = np.concatenate([silence(0.3), speak("Hello there, how are you today?", tmp_path / "hi.wav"),
                             silence(3.0)])
    frames = paced(speech)
    quiet = silence(6.0)  # the user's, after the conditions
    tail = paced(quiet)
    llm = OpenAIRealtimeLLMService(api_key=KEY, base_url=f"{failing_asr_server.ws}/v1/realtime?model=contextspan")

    looked_up: list[bool] = []

    async def conditions() -> None:
        await asyncio.sleep(4.0)
        note = events.ConversationItem(id="item_note", type="message", role="system",
                                       content=[events.ItemContent(type="input_text", text="The table is booked.")])
        for _ in range(2):  # refused (app spans off), then also over one a frame
            await llm.send_client_event(events.ConversationItemCreateEvent(item=note))
        # Refused, so never added: Pipecat's own lookup gets OpenAI's error for an unknown item, which it answers
        # with an exception to its caller, not the end of its session.
        with contextlib.suppress(Exception):
            await asyncio.wait_for(llm.retrieve_conversation_item("item_note"), 10)
        looked_up.append(True)

    async def run() -> tuple[list[object], list[object]]:
        task = asyncio.create_task(conditions())
        down, up = await run_test(llm, frames_to_send=[*frames, *tail], pipeline_params=PipelineParams(
            audio_in_sample_rate=SAMPLE_RATE, audio_out_sample_rate=SAMPLE_RATE), start_timeout=30.0)
        await task
        return down, up

    down, up = asyncio.run(run())
    errors = [f.error for f in [*down, *up] if isinstance(f, ErrorFrame)]
    assert not errors, errors
    assert looked_up
    played = [f for f in down if isinstance(f, TTSAudioRawFrame)]
    assert sum(len(f.audio) // 2 for f in played) >= 0.5 * (len(speech) + len(quiet))
    log = failing_asr_server.log.read_text()
    assert "injected ASR fault" in log or "asr_failed" in log
    assert "app_spans_off" in log


@pytest.fixture(scope="module")
def tool_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    with weather_tool_server(tmp_path_factory.mktemp("tools"), KEY) as running:
        yield running


def test_a_pipecat_function_is_called_and_its_result_said_as_a_span(tool_server: RunningServer,
                                                                     tmp_path: Path) -> None:
    """A function registered with `register_function`, its schema in the session's tools, as a Pipecat user writes
    it: the backend's call reaches the handler with its arguments, and the dict the handler gives Pipecat's callback
    (sent as JSON) is injected as a span of its words; no ErrorFrame."""
    from pipecat.adapters.llm.schemas.function_schema import FunctionSchema
    from pipecat.adapters.llm.schemas.tools_schema import ToolsSchema
    from pipecat.services.llm_service import FunctionCallParams
    from pipecat.services.openai.realtime.events import SessionProperties

    speech = np.concatenate([silence(0.5), speak("What is the weather like in Paris today?", tmp_path / "q.wav"),
                             silence(1.0)])
    # The microphone goes on (the wire is the server's clock): the final transcript from a busy host's Whisper,
    # then the tool, then the span.
    frames = paced(np.concatenate([speech, silence(25.0)]))
    weather = FunctionSchema(name="get_weather", description="The weather now in a place.",
                             properties={"place": {"type": "string"}}, required=["place"])
    llm = OpenAIRealtimeLLMService(api_key=KEY, base_url=f"{tool_server.ws}/v1/realtime?model=contextspan",
                                   settings=OpenAIRealtimeLLMService.Settings(session_properties=SessionProperties(
                                       tools=ToolsSchema(standard_tools=[weather]))))
    places: list[str] = []

    async def get_weather(params: FunctionCallParams) -> None:
        places.append(params.arguments["place"])
        await asyncio.sleep(2.0)  # a real tool: an HTTP call
        await params.result_callback({"conditions": "Sunny", "temperature": "21 degrees"})

    llm.register_function("get_weather", get_weather)
    down, up = asyncio.run(run_test(llm, frames_to_send=frames, pipeline_params=PipelineParams(
        audio_in_sample_rate=SAMPLE_RATE, audio_out_sample_rate=SAMPLE_RATE), start_timeout=30.0))

    errors = [f.error for f in [*down, *up] if isinstance(f, ErrorFrame)]
    assert not errors, errors
    assert places == ["Paris"]
    spans = recorded_spans(tool_server)
    assert [(span["type"], span["source"]) for span in spans] == [("span.injected", "client:get_weather")], spans
    assert str(spans[0]["text"]).startswith("conditions: Sunny; temperature: twenty-one degrees"), spans
