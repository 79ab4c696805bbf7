"""The Realtime wire without a socket: client events in, the event sequences the SDKs and plugins expect out."""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any

import numpy as np
import pytest

from frontend_model.frame import FRAME_S, FRAME_SAMPLES
from server.session.realtime_wire import MAX_RESPONSE_FRAMES, OUTPUT_WAIT_FRAMES, TURN_END_FRAMES, RealtimeWire
from server.session.wire import AudioIn, ClearInput, CommitInput
from server.wire import protocol as p
from server.wire import realtime as rt
from server.wire.outbound import OutboundQueue
from tests.support.openai_realtime import as_sdk_event, server_event_models

LOUD = np.full(FRAME_SAMPLES, 0.2, np.float32)
QUIET = np.zeros(FRAME_SAMPLES, np.float32)
READY = p.SessionReady(t=0.0, session_id="s", profile="tiny", random_weights=True, description="", prefix_frames=3,
                       prefill_ms=1.0, persona="Be kind.", voice="alice", trigger="asr", app_spans=True,
                       sampling=p.Sampling(text_temperature=0.7, text_topk=25, audio_temperature=0.8, audio_topk=250,
                                           text_seed=1, audio_seed=2))


def wire(dialect: rt.Dialect = "ga") -> tuple[RealtimeWire, OutboundQueue]:
    queue = OutboundQueue(1000)
    return RealtimeWire(queue, dialect, "tiny", ["alice"]), queue


def ready(dialect: rt.Dialect = "ga") -> tuple[RealtimeWire, OutboundQueue]:
    """A wire whose session is ready (its first response open), with what that sent drained."""
    w, queue = wire(dialect)
    w.event(READY)
    sent(queue)
    return w, queue


def sent(queue: OutboundQueue) -> list[dict[str, Any]]:
    """What the wire queued since the last call, decoded."""

    async def drain() -> list[dict[str, Any]]:
        return [json.loads(str((await queue.get()).data)) for _ in range(len(queue))]

    return asyncio.run(drain())


def types(events: list[dict[str, Any]]) -> list[str]:
    return [e["type"] for e in events]


def message(event: dict[str, Any] | str) -> dict[str, Any]:
    return {"type": "websocket.receive", "text": event if isinstance(event, str) else json.dumps(event)}


def turn(w: RealtimeWire, text: str = " Hello", frames: int = 3) -> None:
    """The agent speaks `frames` frames and a text piece, then is silent long enough to end its turn."""
    w.audio(LOUD)
    w.agent_text(text)
    for _ in range(frames - 1):
        w.audio(LOUD)
    for _ in range(TURN_END_FRAMES):
        w.audio(QUIET)


OPENED = ["response.created", "response.output_item.added", "conversation.item.added", "response.content_part.added"]
CLOSED = ["response.output_audio.done", "response.output_audio_transcript.done", "response.content_part.done",
          "response.output_item.done", "conversation.item.done", "response.done"]


def test_the_session_starts_with_its_first_response_open() -> None:
    w, queue = wire()
    w.event(READY)
    events = sent(queue)
    assert types(events) == ["session.created", "rate_limits.updated", *OPENED]
    session = events[0]["session"]
    assert (session["instructions"], session["audio"]["output"]["voice"]) == ("Be kind.", "alice")


def test_every_frame_is_an_audio_delta_of_the_open_response_silence_included() -> None:
    w, queue = ready()
    for pcm in (QUIET, QUIET, LOUD, QUIET):
        w.audio(pcm)
    deltas = sent(queue)
    assert types(deltas) == ["response.output_audio.delta"] * 4
    assert [len(base64.b64decode(e["delta"])) for e in deltas] == [2 * FRAME_SAMPLES] * 4
    assert len({e["response_id"] for e in deltas}) == 1


def test_a_response_is_done_when_the_agents_turn_ends_and_the_next_opens_at_once_for_the_silence() -> None:
    w, queue = ready()
    w.inbound(message({"type": "input_audio_buffer.append", "audio": base64.b64encode(
        bytes(6 * FRAME_SAMPLES)).decode()}))  # 3 frames of the user's
    w.audio(LOUD)
    w.agent_text(" Hello")
    w.audio(LOUD)
    for _ in range(TURN_END_FRAMES - 1):
        w.audio(QUIET)
    assert "response.done" not in types(sent(queue))
    w.audio(QUIET)  # the turn has ended
    events = sent(queue)
    assert types(events) == ["response.output_audio.delta", *CLOSED, *OPENED]
    done = events[6]["response"]
    assert done["status"] == "completed" and done["output"][0]["content"] == [
        {"type": "output_audio", "transcript": " Hello"}]
    frames = 2 + TURN_END_FRAMES
    assert done["usage"] == {"total_tokens": frames + 1 + 3, "input_tokens": 3, "output_tokens": frames + 1,
                             "input_token_details": {"text_tokens": 0, "audio_tokens": 3, "cached_tokens": 0},
                             "output_token_details": {"text_tokens": 1, "audio_tokens": frames}}
    following = events[7]["response"]["id"]
    for _ in range(20):
        w.audio(QUIET)  # the agent listens, in the next response
    w.audio(LOUD)  # and speaks in it
    events = sent(queue)
    assert types(events) == ["response.output_audio.delta"] * 21 and {e["response_id"] for e in events} == {
        following}


def test_a_turn_longer_than_a_response_may_be_goes_on_in_the_next_response() -> None:
    w, queue = ready()
    for _ in range(MAX_RESPONSE_FRAMES):
        w.audio(LOUD)
    events = sent(queue)
    assert types(events[-len(CLOSED) - len(OPENED):]) == [*CLOSED, *OPENED]
    w.audio(LOUD)
    assert sent(queue)[0]["response_id"] == events[-len(OPENED)]["response"]["id"]


def test_a_pause_shorter_than_a_turn_end_keeps_the_turn() -> None:
    w, queue = ready()
    w.audio(LOUD)
    for _ in range(TURN_END_FRAMES - 1):
        w.audio(QUIET)
    w.agent_text(" again")
    assert "response.done" not in types(sent(queue))


def test_beta_clients_get_the_beta_names_and_shapes() -> None:
    w, queue = wire("beta")
    w.event(READY)
    turn(w, "Hi")
    w.audio(LOUD)
    events = sent(queue)
    names = types(events)
    assert "response.audio.delta" in names and "response.audio_transcript.delta" in names
    assert "conversation.item.created" in names and "conversation.item.added" not in names
    assert "conversation.item.done" not in names  # GA only
    assert events[0]["session"]["voice"] == "alice" and "model" not in events[0]["session"]
    (done,) = [e for e in events if e["type"] == "response.done"]
    assert done["response"]["output"][0]["content"] == [{"type": "audio", "transcript": "Hi"}]


def test_cancel_ends_the_response_and_the_rest_of_that_speech_is_not_sent_until_the_agent_pauses() -> None:
    w, queue = ready()
    w.audio(LOUD)
    sent(queue)
    assert w.inbound(message({"type": "response.cancel"})) == []
    done = sent(queue)[-1]["response"]
    assert done["status"] == "cancelled" and done["status_details"] == {"type": "cancelled",
                                                                       "reason": "client_cancelled"}
    assert done["output"][0]["status"] == "incomplete"
    w.audio(LOUD)
    w.agent_text("still talking")
    assert sent(queue) == []
    w.audio(QUIET)  # it paused: a response opens, and that frame goes in it
    assert types(sent(queue)) == [*OPENED, "response.output_audio.delta"]


CREATE = {"type": "response.create", "response": {"metadata": {"client_event_id": "x"}}}


def test_response_create_is_answered_at_the_next_frame_by_a_response_with_its_metadata_that_the_next_turn_fills(
) -> None:
    w, queue = ready()
    w.audio(LOUD)
    sent(queue)
    w.inbound(message(CREATE))
    assert sent(queue) == []  # the frame clock answers
    w.audio(QUIET)
    events = sent(queue)
    assert types(events) == [*CLOSED, *OPENED, "response.output_audio.delta"]
    created = events[6]["response"]
    assert created["metadata"] == {"client_event_id": "x"} and events[-1]["response_id"] == created["id"]
    for _ in range(TURN_END_FRAMES):
        w.audio(QUIET)
    w.audio(LOUD)  # the agent's next turn: in the response created for it, not a new one
    w.agent_text(" Hi")
    assert types(sent(queue)) == ["response.output_audio.delta"] * (TURN_END_FRAMES + 1) + [
        "response.output_audio_transcript.delta"]
    turn(w)
    w.audio(LOUD)
    (done,) = [e["response"] for e in sent(queue) if e["type"] == "response.done"]
    assert done["id"] == created["id"] and done["metadata"] == {"client_event_id": "x"}


def test_a_response_create_before_the_session_is_ready_is_carried_by_its_first_response() -> None:
    w, queue = wire()
    w.inbound(message(CREATE))
    w.event(READY)
    (created,) = [e for e in sent(queue) if e["type"] == "response.created"]
    assert created["response"]["metadata"] == {"client_event_id": "x"}
    w.audio(QUIET)
    assert types(sent(queue)) == ["response.output_audio.delta"]


def test_a_second_cancel_is_refused_in_openais_words_which_livekits_agentsession_ignores() -> None:
    """AgentSession sends `response.cancel` on every interruption; its plugin drops the error only by this message."""
    w, queue = ready()
    w.inbound(message({"type": "response.cancel"}))
    sent(queue)
    with pytest.raises(p.ProtocolError) as raised:
        w.inbound(message({"type": "response.cancel", "event_id": "e2"}))
    w.event(p.ErrorEvent(t=0.0, code=raised.value.code, message=str(raised.value)))
    (error,) = sent(queue)
    assert error["error"]["code"] == "response_cancel_not_active"
    assert error["error"]["message"].startswith("Cancellation failed")


def test_after_a_cancel_a_response_create_opens_a_response_at_the_next_frame() -> None:
    w, queue = ready()
    w.inbound(message({"type": "response.cancel"}))
    w.inbound(message(CREATE))
    sent(queue)
    w.audio(QUIET)
    events = sent(queue)
    assert types(events) == [*OPENED, "response.output_audio.delta"]
    assert events[0]["response"]["metadata"] == {"client_event_id": "x"}


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
    (updated,) = sent(queue)  # at once: LiveKit and Pipecat wait for it
    w.event(p.SessionUpdated(t=0.0))  # the session applied it; nothing was prefilled
    assert sent(queue) == []
    assert set(updated["contextspan"]["unsupported"]) == {"max_output_tokens", "audio.input.turn_detection",
                                                          "audio.output.speed", "tracing"}
    assert updated["session"]["instructions"] == "Be brief." and updated["session"]["tools"][0]["name"] == "get_weather"


@pytest.mark.parametrize("dialect", ["ga", "beta"])
def test_a_resumed_wire_is_the_same_session_with_its_tools_and_temperature_and_says_how_to_resume(
        dialect: rt.Dialect) -> None:
    first, _ = wire(dialect)
    first.inbound(message({"type": "session.update", "session": {"temperature": 0.6, "tools": [
        {"type": "function", "name": "get_weather", "parameters": {"type": "object"}}]}}))
    again, queue = wire(dialect)
    again.restore(json.loads(json.dumps(first.saved())))  # as plain data, through the resume store
    again.event(READY.model_copy(update={"resume": "token-2", "resumed_frames": 40}))
    created = sent(queue)[0]
    assert created["type"] == "session.created" and as_sdk_event(created, dialect) is not None
    assert created["session"]["id"] == "sess_" + READY.session_id, "the session's own id, which a resume keeps"
    assert created["session"]["instructions"] == READY.persona, "the resumed session's persona"
    assert created["session"]["temperature"] == 0.6 and created["session"]["tools"][0]["name"] == "get_weather"
    assert created["contextspan"] == {"resume": "token-2", "resumed_frames": 40}


def test_a_session_without_resume_says_so_in_session_created() -> None:
    w, queue = wire()
    w.event(READY)
    assert sent(queue)[0]["contextspan"] == {"resume": None, "resumed_frames": None}


def test_unchanged_instructions_and_voice_change_nothing_and_a_change_is_prefilled() -> None:
    w, _ = ready()
    (same,) = w.inbound(message({"type": "session.update", "session": {
        "instructions": READY.persona, "audio": {"output": {"voice": READY.voice}}, "tools": []}}))
    assert (same.persona, same.voice, same.tools) == (None, None, [])
    (changed,) = w.inbound(message({"type": "session.update", "session": {"instructions": "Be brief."}}))
    assert changed.persona == "Be brief."
    (again,) = w.inbound(message({"type": "session.update", "session": {"instructions": "Be brief."}}))
    assert again.persona is None


def test_session_updated_does_not_wait_for_a_prefill_which_is_reported_when_it_is_in() -> None:
    w, queue = ready()
    w.inbound(message({"type": "session.update", "session": {"tools": []}}))
    assert sent(queue)[0]["contextspan"]["prefilling"] is False
    w.inbound(message({"type": "session.update", "session": {"instructions": "Be brief."}}))
    (updated,) = sent(queue)
    assert updated["type"] == "session.updated" and updated["contextspan"]["prefilling"] is True
    assert updated["session"]["instructions"] == "Be brief."
    w.event(p.SessionUpdated(t=1.0, prefix_frames=40, prefill_ms=12.5))
    (prefilled,) = sent(queue)
    assert prefilled["type"] == "contextspan.session.updated"
    assert (prefilled["prefix_frames"], prefilled["prefill_ms"]) == (40, 12.5)


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
    ({"type": "response.cancel", "event_id": "e1"}, "response_cancel_not_active", "response_id"),
    ({"type": "conversation.item.create", "item": {"type": "message", "role": "system", "content": [
        {"type": "input_text", "text": "x" * (p.MAX_APP_SPAN_CHARS + 1)}]}, "event_id": "e1"}, "span_too_long",
     "item.content"),
    ({"type": "conversation.item.create", "item": {"type": "message", "role": "user", "content": [
        {"type": "input_text", "text": "x" * (p.MAX_USER_TEXT_CHARS + 1)}]}, "event_id": "e1"}, "text_too_long",
     "item.content"),
    ({"type": "conversation.item.create", "item": {"type": "message", "role": "user", "content": [
        {"type": "input_text", "text": " "}]}, "event_id": "e1"}, "empty_item", "item.content"),
    ({"type": "conversation.item.retrieve", "item_id": "item_nope", "event_id": "e1"},
     "item_retrieve_invalid_item_id", "item_id"),
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


def test_an_error_the_session_finds_in_a_client_event_carries_that_events_id() -> None:
    w, queue = wire()
    w.inbound(message({"type": "conversation.item.create", "event_id": "e7", "item": {
        "type": "function_call_output", "call_id": "call_never", "output": "Sunny."}}))
    sent(queue)
    w.event(p.ErrorEvent(t=0.0, code="unknown_call", message="no tool call 'call_never' was made in this session"))
    (error,) = sent(queue)
    assert (error["type"], error["error"]["code"], error["error"]["event_id"]) == ("error", "unknown_call", "e7")


@pytest.mark.parametrize("code", ["tool_result_late", "app_spans_off", "span_rate_limited"])
def test_conditions_that_are_not_the_clients_fault_are_never_errors(code: str) -> None:
    w, queue = ready()
    w.inbound(message({"type": "conversation.item.create", "event_id": "e7", "item": {
        "type": "function_call_output", "call_id": "call_1", "output": "Sunny."}}))
    sent(queue)
    w.event(p.ErrorEvent(t=0.0, code=code, message="not the client's fault"))
    assert sent(queue) == []


def test_a_failed_transcription_is_the_protocols_own_event_on_that_user_item_and_the_next_one_is_new() -> None:
    w, queue = wire()
    w.event(p.UserTranscript(t=1.0, text="What is", final=False))
    w.event(p.ErrorEvent(t=1.5, code="asr_failed", message="RuntimeError: whisper died"))
    w.event(p.UserTranscript(t=3.0, text="Hello", final=False))
    added, _, failed, added_again, _ = sent(queue)
    assert failed["type"] == "conversation.item.input_audio_transcription.failed"
    assert failed["item_id"] == added["item"]["id"] != added_again["item"]["id"]
    assert (failed["error"]["code"], failed["error"]["message"]) == ("asr_failed", "RuntimeError: whisper died")


def test_a_conversation_item_is_retrieved_as_it_is_now() -> None:
    w, queue = ready()
    turn(w)
    w.audio(LOUD)
    (done,) = [e["item"] for e in sent(queue) if e["type"] == "conversation.item.done"]
    assert w.inbound(message({"type": "conversation.item.retrieve", "item_id": done["id"]})) == []
    (retrieved,) = sent(queue)
    assert (retrieved["type"], retrieved["item"]) == ("conversation.item.retrieved", done)


def test_audio_appends_become_pcm_and_commit_and_clear_are_answered() -> None:
    w, queue = wire()
    pcm = np.array([0.5, -0.5, 0.0], np.float32)
    (audio,) = w.inbound(message({"type": "input_audio_buffer.append", "audio": rt.encode_audio(pcm)}))
    assert isinstance(audio, AudioIn) and np.allclose(audio.pcm, pcm, atol=1e-4)
    assert w.inbound(message({"type": "input_audio_buffer.commit"})) == [CommitInput()]
    committed = sent(queue)
    assert types(committed) == ["conversation.item.added", "input_audio_buffer.committed"]
    assert committed[1]["item_id"] == committed[0]["item"]["id"]
    assert w.inbound(message({"type": "input_audio_buffer.clear"})) == [ClearInput()]
    assert types(sent(queue)) == ["input_audio_buffer.cleared"]


def text_item(role: str, text: str) -> dict[str, Any]:
    return {"type": "conversation.item.create", "event_id": "e3", "item": {
        "type": "message", "role": role, "content": [{"type": "input_text", "text": text}]}}


def test_a_user_text_item_is_the_users_question_and_not_a_span() -> None:
    w, _ = wire()
    (question,) = w.inbound(message(text_item("user", " What is twelve times seven? ")))
    assert question == p.UserText(type="user.text", text="What is twelve times seven?")


def test_a_system_text_item_becomes_a_span_request_and_a_function_output_a_tool_result() -> None:
    w, queue = wire()
    (span,) = w.inbound(message(text_item("system", "Booked for 8.")))
    assert span == p.SpanInject(type="span.inject", text="Booked for 8.", source="conversation.item")
    w.accepted(span)
    (result,) = w.inbound(message({"type": "conversation.item.create", "item": {
        "type": "function_call_output", "call_id": "call_1", "output": "Sunny."}}))
    assert result == p.ToolResult(type="tool.result", call_id="call_1", output="Sunny.")
    assert types(sent(queue)) == ["conversation.item.added", "conversation.item.done"] * 2


@pytest.mark.parametrize("role", ["user", "system"])
def test_a_text_item_is_added_once_the_session_takes_it_and_never_when_it_refuses_it(role: str) -> None:
    w, queue = wire()
    w.inbound(message(text_item(role, "Refused.")))  # the session raised (a span with app_spans off): not taken
    (taken,) = w.inbound(message(text_item(role, "Taken.")))
    assert sent(queue) == []
    w.accepted(taken)
    added, done = sent(queue)
    assert (added["type"], done["type"]) == ("conversation.item.added", "conversation.item.done")
    assert done["item"]["role"] == role and done["item"]["content"] == [{"type": "input_text", "text": "Taken."}]


def test_a_tool_call_is_a_function_call_item_that_ends_the_open_response_and_begins_the_clients_turn() -> None:
    """LiveKit's AgentSession sends a tool's output only once no response is open, then `response.create`."""
    w, queue = ready()
    w.audio(LOUD)
    first = sent(queue)[0]["response_id"]
    w.event(p.ToolCall(t=1.0, call_id="call_1", name="get_weather", arguments='{"place": "Paris"}'))
    events = sent(queue)
    assert types(events) == ["response.output_item.added", "conversation.item.added",
                             "response.function_call_arguments.delta", "response.function_call_arguments.done",
                             "response.output_item.done", "conversation.item.done", *CLOSED]
    done = events[3]
    assert (done["call_id"], done["name"], json.loads(done["arguments"])) == ("call_1", "get_weather",
                                                                            {"place": "Paris"})
    assert {e.get("output_index", 1) for e in events[:6]} == {1}  # after the agent's message, output 0
    response = events[-1]["response"]
    assert response["id"] == first and [item["type"] for item in response["output"]] == ["message", "function_call"]
    for _ in range(20):  # the tool runs: what the agent says meanwhile is not sent
        w.audio(LOUD)
        w.agent_text(" wait")
    assert sent(queue) == []


def test_the_agent_is_heard_again_from_the_tools_output_in_the_response_the_client_creates() -> None:
    w, queue = ready()
    w.event(p.ToolCall(t=1.0, call_id="call_1", name="get_weather", arguments="{}"))
    w.audio(LOUD)
    w.inbound(message({"type": "conversation.item.create", "item": {
        "type": "function_call_output", "call_id": "call_1", "output": "Sunny."}}))
    w.audio(LOUD)  # the answer begins: held for the client's response.create
    w.agent_text(" Sunny")
    sent(queue)
    w.inbound(message({"type": "response.create", "response": {"metadata": {"client_event_id": "r1"}}}))
    assert sent(queue) == []
    w.audio(QUIET)
    events = sent(queue)
    assert types(events) == [*OPENED, "response.output_audio.delta", "response.output_audio_transcript.delta",
                             "response.output_audio.delta"]
    assert events[0]["response"]["metadata"] == {"client_event_id": "r1"}
    assert base64.b64decode(events[4]["delta"]) != base64.b64decode(events[6]["delta"])  # held frame, then this one


def test_a_client_that_never_asks_hears_the_agent_a_second_after_its_output_and_one_without_output_at_its_deadline(
) -> None:
    w, queue = ready()
    w.event(p.ToolCall(t=1.0, call_id="call_1", name="get_weather", arguments="{}"))
    w.inbound(message({"type": "conversation.item.create", "item": {
        "type": "function_call_output", "call_id": "call_1", "output": "Sunny."}}))
    sent(queue)
    for _ in range(OUTPUT_WAIT_FRAMES - 1):
        w.audio(LOUD)
    assert sent(queue) == []
    w.audio(LOUD)
    assert types(sent(queue)) == [*OPENED, *["response.output_audio.delta"] * OUTPUT_WAIT_FRAMES]

    w = RealtimeWire(OutboundQueue(1000), "ga", "tiny", ["alice"], client_tool_deadline_s=2.0)
    w.event(READY)
    w.event(p.ToolCall(t=1.0, call_id="call_1", name="get_weather", arguments="{}"))
    queue = w.outbound
    sent(queue)
    for _ in range(round(2.0 / FRAME_S) - 1):
        w.audio(LOUD)
    assert sent(queue) == []
    w.audio(LOUD)
    assert types(sent(queue)) == [*OPENED, "response.output_audio.delta"]


def test_after_a_cancel_a_tool_call_is_a_response_of_its_own() -> None:
    w, queue = ready()
    w.inbound(message({"type": "response.cancel"}))
    sent(queue)
    w.event(p.ToolCall(t=1.0, call_id="call_1", name="get_weather", arguments="{}"))
    events = sent(queue)
    assert types(events) == ["response.created", "response.output_item.added", "conversation.item.added",
                             "response.function_call_arguments.delta", "response.function_call_arguments.done",
                             "response.output_item.done", "conversation.item.done", "response.done"]
    assert [item["type"] for item in events[-1]["response"]["output"]] == ["function_call"]


def test_user_transcripts_become_one_item_with_deltas_then_completed() -> None:
    w, queue = wire()
    w.event(p.UserTranscript(t=1.0, text="What is", final=False))
    w.event(p.UserTranscript(t=1.5, text="What is the time", final=False))
    w.event(p.UserTranscript(t=2.0, text="What is the time?", final=True, start=0.5, end=1.75))
    events = sent(queue)
    assert types(events) == ["conversation.item.added"] + ["conversation.item.input_audio_transcription.delta"] * 2 \
        + ["conversation.item.input_audio_transcription.completed"]
    assert [e.get("delta") for e in events[1:3]] == ["What is", " the time"]
    assert {e.get("item_id") for e in events[1:]} == {events[0]["item"]["id"]}
    assert events[-1]["usage"] == {"type": "duration", "seconds": 1.25}


def test_transcription_deltas_only_extend_and_completed_carries_the_final_text() -> None:
    w, queue = wire()
    for text in ("What is", "What's the", "What is the", "What is the time"):
        w.event(p.UserTranscript(t=1.0, text=text, final=False))
    w.event(p.UserTranscript(t=2.0, text="What's the time?", final=True, start=0.5, end=1.75))
    events = sent(queue)
    assert [e["delta"] for e in events if "delta" in e] == ["What is", " the", " time"]
    assert events[-1]["transcript"] == "What's the time?"


SPEECH_EVENTS = ["input_audio_buffer.speech_started", "conversation.item.added",
                 "conversation.item.input_audio_transcription.delta", "input_audio_buffer.speech_stopped",
                 "conversation.item.input_audio_transcription.completed"]


def utterance(w: RealtimeWire, text: str = "What time is it?", start: float = 1.2, end: float = 2.5) -> None:
    """The ASR hears one utterance: its start, a partial transcript, its end, then its final transcript."""
    w.event(p.UserSpeech(t=start + 0.4, state="started", at=start))
    w.event(p.UserTranscript(t=start + 1.0, text=text[:4], final=False))
    w.event(p.UserSpeech(t=end, state="stopped", at=end))
    w.event(p.UserTranscript(t=end + 0.3, text=text, final=True, start=start, end=end))


@pytest.mark.parametrize("dialect", ["ga", "beta"])
def test_speech_started_names_the_user_item_before_its_transcription_and_speech_stopped_comes_before_completed(
        dialect: rt.Dialect) -> None:
    w, queue = wire(dialect)
    utterance(w)
    events = sent(queue)
    added = "conversation.item.added" if dialect == "ga" else "conversation.item.created"
    assert types(events) == [added if name == "conversation.item.added" else name for name in SPEECH_EVENTS]
    started, item, _, stopped, completed = events
    assert {started["item_id"], stopped["item_id"], completed["item_id"]} == {item["item"]["id"]}
    assert (started["audio_start_ms"], stopped["audio_end_ms"]) == (1200, 2500)
    for event in events:
        as_sdk_event(event, dialect)


def test_each_utterance_is_a_new_user_item_even_after_one_whose_transcript_was_empty() -> None:
    w, queue = wire()
    w.event(p.UserSpeech(t=0.5, state="started", at=0.2))
    w.event(p.UserSpeech(t=1.5, state="stopped", at=1.5))  # a cough: Whisper heard no words, no transcript comes
    utterance(w, start=2.0, end=3.0)
    first, _, stopped, second, *rest = sent(queue)
    assert first["item_id"] == stopped["item_id"] != second["item_id"]
    assert {e.get("item_id", e.get("item", {}).get("id")) for e in rest} == {second["item_id"]}


def test_a_commit_during_speech_ends_the_utterance_and_is_answered_with_its_user_item() -> None:
    w, queue = wire()
    w.event(p.UserSpeech(t=0.5, state="started", at=0.2))
    assert w.inbound(message({"type": "input_audio_buffer.commit"})) == [CommitInput()]
    started, _, committed = sent(queue)
    assert committed["type"] == "input_audio_buffer.committed" and committed["item_id"] == started["item_id"]


def every_event_the_wire_sends(dialect: rt.Dialect) -> list[dict[str, Any]]:
    """The wire driven through every path that sends something: a session, its updates, turns, the input buffer,
    items, a tool call, an utterance (its speech and transcripts), a cancel, an error, a span event."""
    w, queue = wire(dialect)
    w.event(READY)
    w.inbound(message({"type": "session.update", "session": {"instructions": "Be brief.", "tools": [
        {"type": "function", "name": "get_weather"}]}}))
    w.event(p.SessionUpdated(t=0.0, prefix_frames=3, prefill_ms=2.0))
    turn(w)
    w.audio(LOUD)
    for event in ({"type": "input_audio_buffer.commit"}, {"type": "input_audio_buffer.clear"},
                  {"type": "conversation.item.create", "item": {"id": "item_booked", "type": "message",
                                                                "role": "user", "content": [
                      {"type": "input_text", "text": "Booked."}]}},
                  {"type": "conversation.item.create", "item": {"type": "function_call_output", "call_id": "c",
                                                                "output": "Sunny."}},
                  {"type": "conversation.item.truncate", "item_id": "item_1", "audio_end_ms": 80},
                  {"type": "conversation.item.delete", "item_id": "item_1"}):
        for item in w.inbound(message(event)):
            w.accepted(item)
    w.event(p.ToolCall(t=1.0, call_id="c", name="get_weather", arguments="{}"))
    w.inbound(message({"type": "response.create"}))  # the client's turn ends
    w.audio(LOUD)
    utterance(w, "What now?")
    w.event(p.ErrorEvent(t=1.6, code="asr_failed", message="RuntimeError: whisper died"))
    w.inbound(message({"type": "conversation.item.retrieve", "item_id": "item_booked"}))
    w.inbound(message({"type": "response.cancel"}))
    w.event(p.ErrorEvent(t=2.0, code="invalid_json", message="a client event must be a JSON object"))
    w.event(p.Retrieval(t=2.0, frame=25))
    return sent(queue)


def names_in(dialect: rt.Dialect) -> set[str]:
    """What every server event model of ours is called in the dialect (beta: some renamed, GA-only ones absent)."""
    if dialect == "ga":
        return set(server_event_models())
    return {rt.BETA_NAMES.get(name, name) for name in set(server_event_models()) - rt.GA_ONLY}


@pytest.mark.parametrize("dialect", ["ga", "beta"])
def test_every_event_the_wire_sends_is_one_of_the_openai_sdks_own_server_events(dialect: rt.Dialect) -> None:
    events = [e for e in every_event_the_wire_sends(dialect) if not e["type"].startswith(rt.EXTENSION_PREFIX)]
    for event in events:
        as_sdk_event(event, dialect)
    assert set(types(events)) == names_in(dialect)
