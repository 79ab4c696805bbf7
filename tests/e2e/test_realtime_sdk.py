"""`/v1/realtime` driven by the official `openai` SDK's realtime client, unmodified, against a real server on
loopback (tiny profile, real Whisper, a fake OpenAI-compatible LLM that picks the client's tool), in real time.

The server's agent listens (`agent_listens`, benchmarks/fakes/faulty_server.py): silent while the user speaks, as a
full-duplex model is, so turns end and the silence between them goes over the wire too."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import numpy as np
import pytest
import websockets
from openai import AsyncOpenAI

from benchmarks.fakes.fake_openai import Script, fake_openai
from contextspan_client import connect, session_token
from frontend_model.frame import FRAME_S, FRAME_SAMPLES, SAMPLE_RATE
from server.session.realtime_wire import is_silent
from server.wire import protocol as p
from server.wire import realtime as rt
from tests.support.openai_realtime import as_sdk_event, server_event_models
from tests.support.speech import silence, speak

from .servers import RunningServer, start_server, stop_server

pytestmark = pytest.mark.slow
KEY = "realtime-key"
# Whisper on a busy 2-core host once took over 10 s to finish an utterance: no outcome here may hinge on its speed.
DEADLINE_S = 30.0
QUESTION = "What is the weather like in Paris today?"
SPEECH_S = 3.3  # what espeak-ng takes to say QUESTION at 150 words a minute, and a little more
LEAD_FRAMES = 12
TOOL_TAKES_S = 4.0  # a client's tool: longer than the span deadline (2.5 s), within its own (10 s)
WEATHER_TOOL = {"type": "function", "name": "get_weather", "description": "The weather now in a place.",
                "parameters": {"type": "object", "properties": {"place": {"type": "string"}},
                               "required": ["place"]}}


@pytest.fixture(scope="module")
def llm() -> Iterator[tuple[str, Script]]:
    """The backend's LLM always picks the client's weather tool."""
    with fake_openai() as (url, script):
        script.mode, script.tool, script.arguments = "tool_call", "get_weather", {"place": "Paris"}
        yield url, script


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, llm: tuple[str, Script]) -> Iterator[RunningServer]:
    # A question in the user's final transcript starts the retrieval (the tiny model's `<ret>` means nothing).
    running = start_server(tmp_path_factory.mktemp("server"), "--max-sessions", "2", "--api-keys", KEY,
                           "--trigger", "asr", "--llm-base-url", llm[0], "--llm-model", "fake",
                           "--span-deadline-s", str(DEADLINE_S), faults="agent_listens@6")
    yield running
    stop_server(running)


@pytest.fixture(scope="module")
def default_deadlines_server(tmp_path_factory: pytest.TempPathFactory,
                             llm: tuple[str, Script]) -> Iterator[RunningServer]:
    """The server as deployed: the span deadline 2.5 s from the question, a client's tool 10 s from its call."""
    running = start_server(tmp_path_factory.mktemp("server"), "--max-sessions", "1", "--api-keys", KEY,
                           "--trigger", "asr", "--llm-base-url", llm[0], "--llm-model", "fake",
                           faults="agent_listens@6")
    yield running
    stop_server(running)


@pytest.fixture(scope="module")
def question(tmp_path_factory: pytest.TempPathFactory) -> np.ndarray:
    speech = speak(QUESTION, tmp_path_factory.mktemp("speech") / "q.wav")
    assert len(speech) <= SPEECH_S * SAMPLE_RATE
    return np.concatenate([silence(0.3), speech])


@dataclass
class Seen:
    events: list[Any] = field(default_factory=list)  # as the SDK parses them
    raw: list[dict[str, Any]] = field(default_factory=list)  # as sent
    audio_samples: int = 0  # agent audio received
    silent_samples: int = 0  # of which silence
    sent_samples: int = 0  # user audio sent
    clients_turn: bool = False  # a response ended with a tool call and none has opened since: no agent audio comes
    withheld_samples: int = 0  # user audio sent meanwhile, to which no agent audio answers

    def of(self, type_: str) -> list[Any]:
        return [e for e in self.events if e.type == type_]


def pcm16(pcm: np.ndarray) -> str:
    return base64.b64encode((np.clip(pcm, -1, 1) * 32767).astype("<i2").tobytes()).decode()


async def listen(connection: Any, seen: Seen) -> None:
    with contextlib.suppress(websockets.ConnectionClosed):
        while True:
            data = await connection.recv_bytes()
            seen.raw.append(json.loads(data))
            event = connection.parse_event(data)
            seen.events.append(event)
            if event.type == "response.done":
                seen.clients_turn = [item.type for item in event.response.output or []][-1:] == ["function_call"]
            elif event.type == "response.created":
                seen.clients_turn = False
            if event.type == "response.output_audio.delta":
                pcm = np.frombuffer(base64.b64decode(event.delta), "<i2").astype(np.float32) / 32768
                seen.audio_samples += pcm.size
                seen.silent_samples += pcm.size if is_silent(pcm) else 0


async def converse(server: RunningServer, pcm: np.ndarray, on_event: Any = None, until: Any = None,
                   session: dict[str, Any] | None = None, extra: list[tuple[float, dict[str, Any] | str]] = (),
                   max_s: float = 60.0) -> Seen:
    """Streams `pcm` in 80 ms appends on a real-time schedule, then silence until `until(seen)` (or `max_s`);
    `extra` events go out at their times; `on_event(connection, event)` answers events as they come.

    The schedule also waits for the agent's audio to be at most `LEAD_FRAMES` behind: a host too loaded to step a
    frame in 80 ms would otherwise drop input past the server's backlog, and what this checks is the protocol. In the
    client's turn after a tool call no agent audio comes: the frames sent then are not waited for."""
    client = AsyncOpenAI(base_url=f"{server.http}/v1", api_key=KEY)
    seen = Seen()
    async with client.realtime.connect(model="contextspan-tiny") as connection:
        if session is not None:
            await connection.session.update(session=session)  # type: ignore[arg-type]
        listener = asyncio.create_task(listen(connection, seen))
        pending = sorted(extra, key=lambda x: x[0])
        start = time.perf_counter()
        frame = handled = 0
        while True:
            t = frame * FRAME_S
            chunk = pcm[frame * FRAME_SAMPLES:(frame + 1) * FRAME_SAMPLES]
            if chunk.size == 0 and (until is None or until(seen) or t >= max_s):
                break
            while pending and pending[0][0] <= t:
                message = pending.pop(0)[1]
                await connection.send_raw(message if isinstance(message, str) else json.dumps(message))
            if chunk.size < FRAME_SAMPLES:
                chunk = np.concatenate([chunk, silence((FRAME_SAMPLES - chunk.size) / SAMPLE_RATE)])
            await connection.input_audio_buffer.append(audio=pcm16(chunk))
            seen.withheld_samples += FRAME_SAMPLES if seen.clients_turn else 0
            while on_event is not None and handled < len(seen.events):
                await on_event(connection, seen.events[handled])
                handled += 1
            frame += 1
            await asyncio.sleep(max(0.0, start + frame * FRAME_S - time.perf_counter()))
            while (seen.audio_samples + seen.withheld_samples < (frame - LEAD_FRAMES) * FRAME_SAMPLES
                   and time.perf_counter() - start < 300):
                await asyncio.sleep(0.02)
        sent = frame * FRAME_SAMPLES
        deadline = time.monotonic() + 20  # a hang guard: a loaded host answers late, not less
        while seen.audio_samples + seen.withheld_samples < sent - 2 * FRAME_SAMPLES and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        seen.sent_samples = sent
        listener.cancel()
    return seen


def span_for(seen: Seen, tool: str) -> list[Any]:
    return [e for e in seen.events if e.type in ("contextspan.span.injected", "contextspan.span.dropped")
            and getattr(e, "tool", None) == tool]


def outside_the_open_response(seen: Seen) -> list[str]:
    """The events that name a response other than the one open when they came; two open at once fail."""
    open_id, outside = None, []
    for event in seen.raw:
        if event["type"] == "response.created":
            assert open_id is None, "two responses open at once"
            open_id = event["response"]["id"]
        elif event["type"] == "response.done":
            assert event["response"]["id"] == open_id
            open_id = None
        elif "response_id" in event and event["response_id"] != open_id:
            outside.append(event["type"])
    return outside


@pytest.fixture(scope="module")
def conversation(server: RunningServer, question: np.ndarray) -> Seen:
    """The whole flow over the SDK: the client's tool declared, the spoken question, a system item and the input
    buffer's and items' other events, until the tool call, answered by the client, is injected and the agent has
    spoken."""
    async def answer_tools(connection: Any, event: Any) -> None:
        if event.type == "response.function_call_arguments.done":
            assert event.name == "get_weather" and json.loads(event.arguments) == {"place": "Paris"}
            await connection.conversation.item.create(item={
                "type": "function_call_output", "call_id": event.call_id,
                "output": "Sunny and twenty degrees in Paris."})
            await connection.response.create()  # as OpenAI's function-calling guide has it: the client's turn ends

    item = {"type": "conversation.item.create",
            "item": {"id": "item_booked", "type": "message", "role": "system",
                     "content": [{"type": "input_text", "text": "Your table is booked for 8 pm."}]}}
    # The commit comes before the question: one during it would end the utterance there (push to talk).
    others = [(0.1, {"type": "input_audio_buffer.commit"}), (0.6, {"type": "input_audio_buffer.clear"}),
              (1.2, {"type": "conversation.item.truncate", "item_id": "item_0", "content_index": 0,
                     "audio_end_ms": 0}),
              (1.3, {"type": "conversation.item.delete", "item_id": "item_0"}),
              (1.4, {"type": "conversation.item.retrieve", "item_id": "item_booked"})]
    session = {"type": "realtime", "instructions": "You are a helpful assistant.", "tools": [WEATHER_TOOL],
               "audio": {"input": {"format": {"type": "audio/pcm", "rate": 24000}, "turn_detection": None}}}
    # Until the agent has also said something: on a quick host the whole tool call can be over before the agent's
    # first word, which comes only after its user has finished (`agent_listens`).
    return asyncio.run(converse(server, question, answer_tools, session=session, extra=[(1.0, item), *others],
                                until=lambda s: bool(span_for(s, "get_weather")
                                                     and s.of("response.output_audio_transcript.delta"))))


@pytest.fixture(scope="module")
def bad_inputs(server: RunningServer) -> Seen:
    """A session of silence with one bad input of each kind."""
    bad = [
        (0.2, {"type": "no.such.event", "event_id": "evt_1"}),
        (0.3, {"type": "input_audio_buffer.append", "audio": "not base64 !", "event_id": "evt_2"}),
        (0.4, {"type": "input_audio_buffer.append", "audio": "A" * (rt.MAX_APPEND_BASE64 + 4)}),
        (0.5, {"type": "session.update", "session": {"audio": {"input": {"format": {"type": "audio/pcmu"}}}}}),
        (0.6, {"type": "session.update", "session": {"input_audio_format": "g711_ulaw"}}),
        (0.7, "{not json"),
    ]
    return asyncio.run(converse(server, silence(2.0), extra=bad))


def test_the_sdk_converses_with_audio_transcripts_a_system_item_and_a_client_tool(
        conversation: Seen, llm: tuple[str, Script]) -> None:
    seen = conversation
    assert not seen.of("error"), [e.error for e in seen.of("error")]
    (retrieved,) = seen.of("conversation.item.retrieved")
    assert retrieved.item.id == "item_booked" and retrieved.item.content[0].text == "Your table is booked for 8 pm."
    (created,) = seen.of("session.created")
    assert created.session.audio.input.format.rate == SAMPLE_RATE
    updated = seen.of("session.updated")
    assert updated and [t.name for t in updated[-1].session.tools] == ["get_weather"]
    assert "audio.input.turn_detection" in updated[-1].contextspan["unsupported"]
    assert seen.of("response.created") and seen.of("response.output_audio_transcript.delta")
    finals = seen.of("conversation.item.input_audio_transcription.completed")
    assert finals and "paris" in finals[0].transcript.lower()
    (text_span,) = [e for e in seen.events
                    if e.type.startswith("contextspan.span.") and getattr(e, "source", None) == "conversation.item"]
    assert text_span.type == "contextspan.span.injected" and "booked for eight p m" in text_span.text
    assert seen.of("response.function_call_arguments.done")
    (tool_span,) = span_for(seen, "get_weather")
    assert tool_span.type == "contextspan.span.injected", tool_span.reason
    assert "Sunny and twenty degrees in Paris" in tool_span.text and tool_span.source == "client:get_weather"
    assert tool_span.latency_ms <= DEADLINE_S * 1e3
    offered = [t["function"]["name"] for t in llm[1].requests[-1]["tools"]]
    assert "get_weather" in offered and "arithmetic" in offered  # beside the server's own tools


@pytest.fixture(scope="module")
def no_app_spans(tmp_path_factory: pytest.TempPathFactory, llm: tuple[str, Script]) -> Iterator[RunningServer]:
    """The same server where no session may push a span of its own: what a typed user turn must not need."""
    running = start_server(tmp_path_factory.mktemp("no-app-spans"), "--api-keys", KEY, "--app-spans", "off",
                           "--trigger", "asr", "--llm-base-url", llm[0], "--llm-model", "fake",
                           "--span-deadline-s", str(DEADLINE_S), faults="agent_listens@6")
    yield running
    stop_server(running)


def text_item(event_id: str, item_id: str, role: str, text: str) -> dict[str, Any]:
    return {"type": "conversation.item.create", "event_id": event_id, "item": {
        "id": item_id, "type": "message", "role": role, "content": [{"type": "input_text", "text": text}]}}


def test_a_typed_user_question_is_answered_by_the_backend_as_a_span_that_needs_no_app_spans(
        no_app_spans: RunningServer, llm: tuple[str, Script]) -> None:
    llm[1].queue.append({"content": "William Shakespeare wrote Hamlet."})
    typed = [(0.2, text_item("evt_context", "item_context", "system", "Your table is booked.")),
             (0.3, text_item("evt_empty", "item_empty", "user", "  ")),
             # Once agent audio has come (`converse` waits for it by then): a span goes in after the first frame.
             (1.2, text_item("evt_typed", "item_typed", "user", "Who wrote Hamlet?"))]
    seen = asyncio.run(converse(no_app_spans, silence(1.0), extra=typed, max_s=DEADLINE_S + 10,
                                until=lambda s: any(e.type.startswith("contextspan.span.") for e in s.events)))
    (question,) = seen.of("contextspan.question")
    assert question.text == "Who wrote Hamlet?"
    assert llm[1].requests[-1]["messages"][-1] == {"role": "user", "content": "Who wrote Hamlet?"}
    (span,) = span_for(seen, "llm")
    assert span.type == "contextspan.span.injected", span.reason
    assert "Shakespeare wrote Hamlet" in span.text and span.question == "Who wrote Hamlet?"
    added = [e.item.id for e in seen.of("conversation.item.added")]
    assert "item_typed" in added and "item_context" not in added and "item_empty" not in added
    (error,) = [e.error for e in seen.of("error")]
    assert (error.code, error.event_id, error.param) == ("empty_item", "evt_empty", "item.content")


def test_an_api_chat_client_types_a_question_and_hears_the_backends_answer_without_app_spans(
        no_app_spans: RunningServer, llm: tuple[str, Script]) -> None:
    llm[1].queue.append({"content": "William Shakespeare wrote Hamlet."})

    async def run() -> list[p.ServerEvent]:
        events: list[p.ServerEvent] = []
        typed = False
        async with connect(no_app_spans.http, token=await session_token(no_app_spans.http, KEY)) as conversation:
            talker = asyncio.create_task(conversation.stream_audio(silence(DEADLINE_S + 10)))
            try:
                async with asyncio.timeout(DEADLINE_S + 10):
                    async for item in conversation:
                        if isinstance(item, p.ServerEvent):
                            events.append(item)
                        elif not typed:
                            # Agent audio: the session has stepped its first frame, where a span can go in.
                            await conversation.send(p.UserText(type="user.text", text="Who wrote Hamlet?"))
                            typed = True
                        if isinstance(item, p.SpanInjected | p.SpanDropped):
                            break
            finally:
                talker.cancel()
        return events

    events = asyncio.run(run())
    (question,) = [e for e in events if isinstance(e, p.Question)]
    span = events[-1]
    assert question.text == "Who wrote Hamlet?" and isinstance(span, p.SpanInjected), span
    assert "Shakespeare wrote Hamlet" in span.text and span.tool == "llm"


def about_the_user_item(seen: Seen, item_id: str) -> list[str]:
    """The types of the events that name the user item, in the order they came."""
    return [e.type for e in seen.events if getattr(e, "item_id", None) == item_id
            or getattr(getattr(e, "item", None), "id", None) == item_id]


def test_the_server_vad_says_the_user_started_then_stopped_speaking_and_the_transcript_completes_after(
        conversation: Seen) -> None:
    (started,) = conversation.of("input_audio_buffer.speech_started")
    (stopped,) = conversation.of("input_audio_buffer.speech_stopped")
    (completed,) = conversation.of("conversation.item.input_audio_transcription.completed")
    assert started.item_id == stopped.item_id == completed.item_id and "paris" in completed.transcript.lower()
    events = [e for e in about_the_user_item(conversation, started.item_id) if not e.endswith(".delta")]
    assert events == ["input_audio_buffer.speech_started", "conversation.item.added",
                      "input_audio_buffer.speech_stopped", "conversation.item.input_audio_transcription.completed"]
    # The question starts 0.3 s in (300 ms of lead-in before it); 0.6 s of silence after it ends it.
    assert 0 <= started.audio_start_ms <= 300 and stopped.audio_end_ms >= 300 + 600 + started.audio_start_ms


async def push_to_talk(server: RunningServer, pcm: np.ndarray) -> Seen:
    """Streams `pcm` in 80 ms appends in real time, then commits and sends nothing more, until the utterance's
    transcript completes (or `DEADLINE_S`)."""
    client = AsyncOpenAI(base_url=f"{server.http}/v1", api_key=KEY)
    seen = Seen()
    async with client.realtime.connect(model="contextspan-tiny") as connection:
        listener = asyncio.create_task(listen(connection, seen))
        start = time.perf_counter()
        for frame in range(len(pcm) // FRAME_SAMPLES):
            chunk = pcm[frame * FRAME_SAMPLES:(frame + 1) * FRAME_SAMPLES]
            await connection.input_audio_buffer.append(audio=pcm16(chunk))
            await asyncio.sleep(max(0.0, start + (frame + 1) * FRAME_S - time.perf_counter()))
        await connection.input_audio_buffer.commit()
        deadline = time.monotonic() + DEADLINE_S
        while not seen.of("conversation.item.input_audio_transcription.completed") and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        listener.cancel()
    seen.sent_samples = len(pcm) // FRAME_SAMPLES * FRAME_SAMPLES
    return seen


def test_push_to_talk_a_commit_ends_the_utterance_before_any_silence_and_its_transcript_completes(
        server: RunningServer, question: np.ndarray) -> None:
    seen = asyncio.run(push_to_talk(server, question))  # the question ends 0.4 s after its last word, under 0.6
    (started,) = seen.of("input_audio_buffer.speech_started")
    (committed,) = seen.of("input_audio_buffer.committed")
    (stopped,) = seen.of("input_audio_buffer.speech_stopped")
    completed = seen.of("conversation.item.input_audio_transcription.completed")
    assert completed, "no transcript: the utterance waits for a silence that never comes"
    assert started.item_id == committed.item_id == stopped.item_id == completed[0].item_id
    assert [e for e in about_the_user_item(seen, started.item_id) if not e.endswith(".delta")] == [
        "input_audio_buffer.speech_started", "conversation.item.added", "input_audio_buffer.committed",
        "input_audio_buffer.speech_stopped", "conversation.item.input_audio_transcription.completed"]
    assert stopped.audio_end_ms <= seen.sent_samples / SAMPLE_RATE * 1e3  # ended where the audio did: by the commit
    assert "paris" in completed[0].transcript.lower()


def test_agent_audio_comes_at_the_frame_clock_for_the_whole_input_silence_included(conversation: Seen) -> None:
    assert conversation.audio_samples >= 0.9 * conversation.sent_samples
    assert conversation.silent_samples >= 2.0 * SAMPLE_RATE  # the agent listened to the question: sent too


def test_each_agent_turn_and_the_silence_after_it_is_one_response_and_a_tool_call_ends_it_for_the_clients_turn(
        conversation: Seen) -> None:
    created, done = conversation.of("response.created"), conversation.of("response.done")
    assert len(created) >= 2 and [d.response.id for d in done] == [c.response.id for c in created[:len(done)]]
    assert {d.response.status for d in done} == {"completed"}
    if len(done) == len(created):  # none open at the end: the client's turn after its tool call
        assert [item.type for item in done[-1].response.output][-1] == "function_call"
    else:
        assert len(done) == len(created) - 1
    assert outside_the_open_response(conversation) == []


def test_every_event_type_the_server_sends_is_one_of_the_sdks_own_server_events(
        conversation: Seen, bad_inputs: Seen) -> None:
    """Parsed strictly with the model the `openai` SDK has for its type, as it arrived (the SDK itself is lenient);
    `contextspan.` events are this server's extensions."""
    ours = [e for e in conversation.raw + bad_inputs.raw if not e["type"].startswith(rt.EXTENSION_PREFIX)]
    for event in ours:
        as_sdk_event(event)
    asr_failing = {"conversation.item.input_audio_transcription.failed"}  # the wire's unit tests send it
    assert {e["type"] for e in ours} == set(server_event_models()) - asr_failing


def answered_then_heard(seen: Seen) -> bool:
    """The client's function output was taken in and agent audio has come after it."""
    types = [e["type"] if e["type"] != "conversation.item.done" else e["item"]["type"] for e in seen.raw]
    return "function_call_output" in types and "response.output_audio.delta" in types[
        types.index("function_call_output"):]


def test_a_client_tool_answered_after_the_span_deadline_but_within_its_own_is_injected(
        default_deadlines_server: RunningServer, question: np.ndarray) -> None:
    """LiveKit runs a tool once its response is done, and a real one (an HTTP call, a database) takes seconds."""
    answered: list[str] = []
    running: list[asyncio.Task[None]] = []

    async def answer_later(connection: Any, call_id: str) -> None:
        await asyncio.sleep(TOOL_TAKES_S)
        answered.append(call_id)
        await connection.conversation.item.create(item={"type": "function_call_output", "call_id": call_id,
                                                        "output": "Sunny and twenty degrees in Paris."})

    async def run_the_tool(connection: Any, event: Any) -> None:
        if event.type == "response.function_call_arguments.done":
            running.append(asyncio.create_task(answer_later(connection, event.call_id)))

    seen = asyncio.run(converse(default_deadlines_server, question, run_the_tool,
                                until=lambda s: bool(span_for(s, "get_weather")),
                                session={"type": "realtime", "tools": [WEATHER_TOOL]}, max_s=DEADLINE_S + 30))
    assert answered and not seen.of("error"), [e.error for e in seen.of("error")]
    (tool_span,) = span_for(seen, "get_weather")
    assert tool_span.type == "contextspan.span.injected", tool_span.reason
    assert "Sunny and twenty degrees in Paris" in tool_span.text
    assert tool_span.latency_ms >= TOOL_TAKES_S * 1e3, "past the span deadline (2.5 s) of the question"


def test_a_late_tool_answer_is_dropped_and_is_no_error(default_deadlines_server: RunningServer,
                                                       question: np.ndarray) -> None:
    """The client tool's deadline passing is no fault of the client's: an `error` would end a Pipecat session."""
    calls: list[str] = []

    async def remember(connection: Any, event: Any) -> None:
        if event.type == "response.function_call_arguments.done":
            calls.append(event.call_id)
        if event.type == "contextspan.span.dropped" and "no answer within" in event.reason:
            await connection.conversation.item.create(item={"type": "function_call_output", "call_id": calls[0],
                                                            "output": "Too late."})

    seen = asyncio.run(converse(default_deadlines_server, question, remember, until=answered_then_heard,
                                session={"type": "realtime", "tools": [WEATHER_TOOL]}, max_s=DEADLINE_S + 30))
    assert calls
    assert any(e.reason == "late: tool get_weather gave no answer within 10.00 s of its call"
               for e in seen.of("contextspan.span.dropped"))
    assert not seen.of("contextspan.span.injected")
    assert answered_then_heard(seen) and not seen.of("error")


def test_each_bad_input_gets_a_clear_error_and_the_session_goes_on(bad_inputs: Seen) -> None:
    errors = [e.error for e in bad_inputs.of("error")]
    assert [e.code for e in errors] == ["unknown_event", "invalid_audio", "audio_too_large",
                                        "unsupported_audio_format", "unsupported_audio_format", "invalid_json"]
    assert errors[0].event_id == "evt_1" and errors[1].event_id == "evt_2" and errors[1].param == "audio"
    assert "24000" in errors[3].message
    assert bad_inputs.audio_samples >= 0.9 * bad_inputs.sent_samples


def test_a_client_secret_minted_by_a_backend_opens_one_session(server: RunningServer) -> None:
    async def run() -> tuple[str, int]:
        backend = AsyncOpenAI(base_url=f"{server.http}/v1", api_key=KEY)
        secret = await backend.realtime.client_secrets.create(session={"type": "realtime"})
        device = AsyncOpenAI(base_url=f"{server.http}/v1", api_key=secret.value)
        async with device.realtime.connect(model="contextspan-tiny") as connection:
            first = await connection.recv()
        return first.type, secret.expires_at

    kind, expires_at = asyncio.run(run())
    assert kind == "session.created" and expires_at > time.time()
    refused = httpx.post(f"{server.http}/v1/realtime/client_secrets", headers={"Authorization": "Bearer nope"},
                         timeout=5)
    assert refused.status_code == 401


def ticks_and_frames(server: RunningServer) -> tuple[float, float]:
    """Batched ticks run so far, and the session frames they stepped (from /metrics)."""
    values = dict(re.findall(r"^contextspan_batch_size_(count|sum) (\S+)$", server.metrics(), re.M))
    return float(values["count"]), float(values["sum"])


async def api_chat_with_a_client_tool(server: RunningServer, pcm: np.ndarray) -> list[p.ServerEvent]:
    """An `/api/chat` events client that declares the weather tool and answers its `tool.call`."""
    events: list[p.ServerEvent] = []
    tool = p.ClientTool(name="get_weather", description="The weather now in a place.",
                        parameters=WEATHER_TOOL["parameters"])  # type: ignore[arg-type]
    async with connect(server.http, token=await session_token(server.http, KEY)) as conversation:
        await conversation.send(p.SessionUpdate(type="session.update", tools=[tool]))
        talker = asyncio.create_task(conversation.stream_audio(np.concatenate([pcm, silence(DEADLINE_S + 20)])))
        try:
            async with asyncio.timeout(DEADLINE_S + 30):
                async for item in conversation:
                    if not isinstance(item, p.ServerEvent):
                        continue
                    events.append(item)
                    if isinstance(item, p.ToolCall):
                        result = p.ToolResult(type="tool.result", call_id=item.call_id, output="Rain in Paris.")
                        await conversation.send(result.model_dump_json())
                    if isinstance(item, p.SpanInjected | p.SpanDropped) and item.tool == "get_weather":
                        break
        finally:
            talker.cancel()
    return events


def test_an_api_chat_client_runs_its_tool_in_one_batch_with_a_realtime_session(
        server: RunningServer, question: np.ndarray) -> None:
    ticks_before, frames_before = ticks_and_frames(server)

    async def both() -> tuple[list[p.ServerEvent], Seen]:
        return await asyncio.gather(api_chat_with_a_client_tool(server, question), converse(server, silence(8.0)))

    events, realtime = asyncio.run(both())
    ticks, frames = (a - b for a, b in zip(ticks_and_frames(server), (ticks_before, frames_before), strict=True))
    assert not [e for e in events if e.type == "error"]
    (call,) = [e for e in events if isinstance(e, p.ToolCall)]
    assert call.name == "get_weather" and json.loads(call.arguments) == {"place": "Paris"}
    (span,) = [e for e in events if isinstance(e, p.SpanInjected)]
    assert span.tool == "get_weather" and span.text == "Rain in Paris." and span.source == "client:get_weather"
    assert realtime.audio_samples >= 0.9 * realtime.sent_samples
    assert ticks < frames, f"{ticks:.0f} ticks for {frames:.0f} frames: the two protocols never shared a tick"
