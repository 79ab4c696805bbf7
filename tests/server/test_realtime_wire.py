"""The Realtime wire without a socket: client events in, the event sequences the SDKs and plugins expect out."""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any

import numpy as np
import pytest

from frontend_model.frame import FRAME_SAMPLES
from server.session.realtime_wire import TURN_END_FRAMES, RealtimeWire
from server.session.wire import AudioIn, ClearInput
from server.wire import protocol as p
from server.wire import realtime as rt
from server.wire.outbound import OutboundQueue

LOUD = np.full(FRAME_SAMPLES, 0.2, np.float32)
QUIET = np.zeros(FRAME_SAMPLES, np.float32)


def wire(dialect: rt.Dialect = "ga") -> tuple[RealtimeWire, OutboundQueue]:
    queue = OutboundQueue(1000)
    return RealtimeWire(queue, dialect, "tiny", ["alice"]), queue


def sent(queue: OutboundQueue) -> list[dict[str, Any]]:
    """What the wire queued since the last call, decoded."""

    async def drain() -> list[dict[str, Any]]:
        return [json.loads(str((await queue.get()).data)) for _ in range(len(queue))]

    return asyncio.run(drain())


def types(events: list[dict[str, Any]]) -> list[str]:
    return [e["type"] for e in events]


def message(event: dict[str, Any] | str) -> dict[str, Any]:
    return {"type": "websocket.receive", "text": event if isinstance(event, str) else json.dumps(event)}


def test_an_agent_turn_is_one_response_from_the_first_sound_to_the_silence_after_it() -> None:
    w, queue = wire()
    w.audio(QUIET)
    assert sent(queue) == []  # the model listening in silence is no response
    w.audio(LOUD)
    w.agent_text(" Hello")
    for _ in range(TURN_END_FRAMES):
        w.audio(QUIET)
    events = sent(queue)
    assert types(events)[:4] == ["response.created", "response.output_item.added", "conversation.item.added",
                                 "response.content_part.added"]
    assert types(events)[-6:] == ["response.output_audio.done", "response.output_audio_transcript.done",
                                  "response.content_part.done", "response.output_item.done",
                                  "conversation.item.done", "response.done"]
    deltas = [e for e in events if e["type"] == "response.output_audio.delta"]
    assert len(deltas) == 1 + TURN_END_FRAMES  # every frame of the turn, the trailing silence included
    assert len(base64.b64decode(deltas[0]["delta"])) == 2 * FRAME_SAMPLES
    done = events[-1]["response"]
    assert done["status"] == "completed" and done["output"][0]["content"][0]["transcript"] == " Hello"
    assert {e["response_id"] for e in deltas} == {done["id"]}


def test_beta_clients_get_the_beta_names() -> None:
    w, queue = wire("beta")
    w.audio(LOUD)
    w.agent_text("Hi")
    names = types(sent(queue))
    assert "response.audio.delta" in names and "response.audio_transcript.delta" in names
    assert "conversation.item.created" in names and "conversation.item.added" not in names


def test_cancel_ends_the_turn_and_mutes_the_rest_of_it() -> None:
    w, queue = wire()
    w.audio(LOUD)
    sent(queue)
    assert w.inbound(message({"type": "response.cancel"})) == []
    assert sent(queue)[-1]["response"]["status"] == "cancelled"
    w.audio(LOUD)
    w.agent_text("still talking")
    assert sent(queue) == []
    for _ in range(TURN_END_FRAMES + 1):
        w.audio(QUIET)
    w.audio(LOUD)  # a new turn after the silence
    assert types(sent(queue))[0] == "response.created"


def test_response_create_makes_nothing_up_and_its_metadata_rides_on_the_next_turn() -> None:
    w, queue = wire()
    w.inbound(message({"type": "response.create", "response": {"metadata": {"client_event_id": "x"}}}))
    assert sent(queue) == []
    w.audio(LOUD)
    assert sent(queue)[0]["response"]["metadata"] == {"client_event_id": "x"}


def test_session_update_maps_instructions_voice_tools_and_temperature_and_reports_the_rest() -> None:
    w, queue = wire()
    (update,) = w.inbound(message({"type": "session.update", "session": {
        "type": "realtime", "instructions": "Be brief.", "temperature": 0.6, "max_output_tokens": 100,
        "audio": {"input": {"format": {"type": "audio/pcm", "rate": 24000}, "turn_detection": {"type": "server_vad"}},
                  "output": {"voice": "alice", "speed": 1.2}},
        "tools": [{"type": "function", "name": "get_weather", "parameters": {"type": "object"}}],
        "tracing": "auto"}}))
    assert isinstance(update, p.SessionUpdate)
    assert (update.persona, update.voice) == ("Be brief.", "alice")
    assert update.sampling == p.SamplingUpdate(text_temperature=0.6, audio_temperature=0.6)
    assert [t.name for t in update.tools or []] == ["get_weather"]
    w.event(p.SessionUpdated(t=0.0))
    (updated,) = sent(queue)
    assert set(updated["contextspan"]["unsupported"]) == {"max_output_tokens", "audio.input.turn_detection",
                                                          "audio.output.speed", "tracing"}
    assert updated["session"]["instructions"] == "Be brief." and updated["session"]["tools"][0]["name"] == "get_weather"


def test_an_unknown_voice_is_reported_and_the_voice_stays() -> None:
    w, queue = wire()
    (update,) = w.inbound(message({"type": "session.update", "session": {"voice": "alloy"}}))
    assert isinstance(update, p.SessionUpdate) and update.voice is None
    w.event(p.SessionUpdated(t=0.0))
    assert "alloy" in sent(queue)[0]["contextspan"]["unsupported"]["voice"]


@pytest.mark.parametrize(("event", "code", "param"), [
    ({"type": "nope", "event_id": "e1"}, "unknown_event", "type"),
    ({"type": "input_audio_buffer.append", "audio": "***", "event_id": "e1"}, "invalid_audio", "audio"),
    ({"type": "input_audio_buffer.append", "audio": "AAAA", "event_id": "e1"}, "invalid_audio", "audio"),
    ({"type": "input_audio_buffer.append", "audio": "A" * (rt.MAX_APPEND_BASE64 + 4), "event_id": "e1"},
     "audio_too_large", "audio"),
    ({"type": "session.update", "session": {"input_audio_format": "g711_alaw"}, "event_id": "e1"},
     "unsupported_audio_format", "session.audio.input.format"),
    ({"type": "session.update", "session": {"temperature": 9}, "event_id": "e1"}, "invalid_value",
     "session.temperature"),
    ({"type": "conversation.item.create", "item": {"type": "message", "role": "assistant", "content": []},
      "event_id": "e1"}, "unsupported_item", "item"),
    ({"type": "response.cancel", "event_id": "e1"}, "no_active_response", "response_id"),
])
def test_bad_events_are_errors_naming_the_event_and_the_field(event: dict[str, Any], code: str, param: str) -> None:
    w, queue = wire()
    with pytest.raises(p.ProtocolError) as raised:
        w.inbound(message(event))
    assert raised.value.code == code
    w.event(p.ErrorEvent(t=0.0, code=code, message=str(raised.value)))
    (error,) = sent(queue)
    assert error["type"] == "error"
    assert (error["error"]["code"], error["error"]["event_id"], error["error"]["param"]) == (code, "e1", param)


def test_audio_appends_become_pcm_and_commit_and_clear_are_answered() -> None:
    w, queue = wire()
    pcm = np.array([0.5, -0.5, 0.0], np.float32)
    (audio,) = w.inbound(message({"type": "input_audio_buffer.append", "audio": rt.encode_audio(pcm)}))
    assert isinstance(audio, AudioIn) and np.allclose(audio.pcm, pcm, atol=1e-4)
    assert w.inbound(message({"type": "input_audio_buffer.commit"})) == []
    committed = sent(queue)
    assert types(committed) == ["conversation.item.added", "input_audio_buffer.committed"]
    assert committed[1]["item_id"] == committed[0]["item"]["id"]
    assert w.inbound(message({"type": "input_audio_buffer.clear"})) == [ClearInput()]
    assert types(sent(queue)) == ["input_audio_buffer.cleared"]


def test_a_text_item_becomes_a_span_request_and_a_function_output_a_tool_result() -> None:
    w, queue = wire()
    (span,) = w.inbound(message({"type": "conversation.item.create", "item": {
        "type": "message", "role": "user", "content": [{"type": "input_text", "text": "Booked for 8."}]}}))
    assert span == p.SpanInject(type="span.inject", text="Booked for 8.", source="conversation.item")
    (result,) = w.inbound(message({"type": "conversation.item.create", "item": {
        "type": "function_call_output", "call_id": "call_1", "output": "Sunny."}}))
    assert result == p.ToolResult(type="tool.result", call_id="call_1", output="Sunny.")
    assert types(sent(queue)) == ["conversation.item.added", "conversation.item.done"] * 2


def test_a_tool_call_goes_out_as_a_response_with_one_function_call_item() -> None:
    w, queue = wire()
    w.event(p.ToolCall(t=1.0, call_id="call_1", name="get_weather", arguments='{"place": "Paris"}'))
    events = sent(queue)
    assert types(events) == ["response.created", "response.output_item.added", "conversation.item.added",
                             "response.function_call_arguments.delta", "response.function_call_arguments.done",
                             "response.output_item.done", "conversation.item.done", "response.done"]
    done = events[4]
    assert (done["call_id"], done["name"], json.loads(done["arguments"])) == ("call_1", "get_weather",
                                                                            {"place": "Paris"})
    assert events[-1]["response"]["output"][0]["type"] == "function_call"


def test_user_transcripts_become_one_item_with_deltas_then_completed() -> None:
    w, queue = wire()
    w.event(p.UserTranscript(t=1.0, text="What is", final=False))
    w.event(p.UserTranscript(t=1.5, text="What is the time", final=False))
    w.event(p.UserTranscript(t=2.0, text="What is the time?", final=True))
    events = sent(queue)
    assert types(events) == ["conversation.item.added"] + ["conversation.item.input_audio_transcription.delta"] * 2 \
        + ["conversation.item.input_audio_transcription.completed"]
    assert [e.get("delta") for e in events[1:3]] == ["What is", " the time"]
    assert {e.get("item_id") for e in events[1:]} == {events[0]["item"]["id"]}
