"""The wire format as pure functions: kind-byte messages, client JSON, events, close reasons."""

from __future__ import annotations

import json

import numpy as np
import pytest

from frontend_model.moshi_internals.row_sampling import SamplingConfig
from server.session.session import SessionOptions, resolve_sampling
from server.wire import protocol as p
from server.wire.frame_clock import FrameAssembler
from server.wire.outbound import OutboundQueue, Outgoing


def test_wire_constants_match_the_model() -> None:
    from frontend_model.loading.loader import FRAME_SAMPLES, SAMPLE_RATE

    assert (SAMPLE_RATE, FRAME_SAMPLES) == (SAMPLE_RATE, FRAME_SAMPLES)


def test_binary_messages_round_trip() -> None:
    assert p.handshake() == b"\x00"
    assert p.decode_binary(p.audio_message(b"OggS...")) == (p.Kind.AUDIO, b"OggS...")
    assert p.decode_binary(p.text_message(" héllo")) == (p.Kind.TEXT, " héllo".encode())


@pytest.mark.parametrize(("message", "code"), [(b"", "empty_message"), (b"\x07abc", "unknown_kind")])
def test_bad_binary_messages(message: bytes, code: str) -> None:
    with pytest.raises(p.ProtocolError) as err:
        p.decode_binary(message)
    assert err.value.code == code


def test_session_update_parses() -> None:
    update = p.parse_client_text(json.dumps({
        "type": "session.update", "profile": {"name": "Ada", "location": "Paris", "timezone": "Europe/Paris"},
        "notes": "prefers metric units",
    }))
    assert update.profile is not None and update.profile.timezone == "Europe/Paris"
    assert update.notes == "prefers metric units"


@pytest.mark.parametrize(("text", "code"), [
    ("{not json", "invalid_json"),
    ("[1, 2]", "invalid_message"),
    ('{"type": "session.nuke"}', "unknown_type"),
    ('{"type": "session.update", "profile": {"age": 3}}', "invalid_message"),
    ('{"type": "session.update", "notes": 5}', "invalid_message"),
])
def test_bad_client_json(text: str, code: str) -> None:
    with pytest.raises(p.ProtocolError) as err:
        p.parse_client_text(text)
    assert err.value.code == code


def test_span_inject_parses() -> None:
    message = p.parse_client_text('{"type": "span.inject", "text": "Table booked for 8 pm.", "source": "bookings"}')
    assert isinstance(message, p.SpanInject)
    assert (message.text, message.source) == ("Table booked for 8 pm.", "bookings")
    assert p.parse_client_text('{"type": "span.inject", "text": "x"}').source is None  # type: ignore[union-attr]


@pytest.mark.parametrize(("message", "code"), [
    ({"type": "span.inject"}, "invalid_message"),
    ({"type": "span.inject", "text": ""}, "invalid_message"),
    ({"type": "span.inject", "text": 42}, "invalid_message"),
    ({"type": "span.inject", "text": "hi", "persona": "x"}, "invalid_message"),
    ({"type": "span.inject", "text": "hi", "source": "s" * 201}, "invalid_message"),
    ({"type": "span.inject", "text": "a" * (p.MAX_APP_SPAN_CHARS + 1)}, "span_too_long"),
    ({"type": "span.injected", "text": "hi"}, "unknown_type"),
])
def test_bad_span_inject(message: dict[str, object], code: str) -> None:
    with pytest.raises(p.ProtocolError) as err:
        p.parse_client_text(json.dumps(message))
    assert err.value.code == code
    assert "span.inject" in str(err.value) or code == "unknown_type"


def test_span_inject_at_the_limit_is_accepted() -> None:
    message = p.parse_client_text(json.dumps({"type": "span.inject", "text": "a" * p.MAX_APP_SPAN_CHARS}))
    assert isinstance(message, p.SpanInject)


def test_user_text_is_a_typed_user_turn_without_surrounding_whitespace() -> None:
    message = p.parse_client_text('{"type": "user.text", "text": " What is twelve times seven? "}')
    assert message == p.UserText(type="user.text", text="What is twelve times seven?")


@pytest.mark.parametrize("text", ["", "   ", "a" * (p.MAX_USER_TEXT_CHARS + 1)])
def test_empty_or_too_long_user_text_is_refused_clearly(text: str) -> None:
    with pytest.raises(p.ProtocolError) as err:
        p.parse_client_text(json.dumps({"type": "user.text", "text": text}))
    assert err.value.code == "invalid_text" and str(p.MAX_USER_TEXT_CHARS) in str(err.value)


def test_events_round_trip_and_omit_nulls() -> None:
    event = p.SpanInjected(t=1.28, text="Paris", source=None, frames=4, prefill_ms=3.1, latency_ms=40.0,
                           truncated=False, offset_before=10, offset_after=14)
    wire = p.encode_event(event)
    assert "source" not in json.loads(wire)
    assert p.decode_event(wire) == event
    stats = p.decode_event(p.encode_event(p.Stats(t=2.0, frames_in=12, frames_out=12, latency_ms=[9.5],
                                                  deadline_misses=0, audio_dropped=0, input_dropped=0,
                                                  send_queue=1)))
    assert stats.type == "stats"
    record = p.event_record(p.ErrorEvent(t=0.0, code="x", message="y"), wall_time=12.3456)
    assert record == {"wall": 12.346, "t": 0.0, "type": "error", "code": "x", "message": "y"}


def test_close_reason_fits_a_close_frame() -> None:
    reason = p.close_reason("at_capacity", "é" * 500)
    assert len(reason.encode()) <= 123
    assert json.loads(reason)["error"] == "at_capacity"


def test_query_options() -> None:
    opts = SessionOptions.from_query({"events": "1", "text_prompt": "You are kind.", "voice_prompt": "v1"}, "")
    assert (opts.events, opts.persona, opts.voice) == (True, "You are kind.", "v1")
    assert SessionOptions.from_query({}, "default persona").persona == "default persona"
    assert not SessionOptions.from_query({"events": "0"}, "").events


def test_frame_assembler_cuts_whole_frames() -> None:
    assembler = FrameAssembler()
    assert assembler.push(np.zeros(1000, np.float32)) == []
    frames = assembler.push(np.ones(3000, np.float32))
    assert [f.index for f in frames] == [0, 1]
    assert frames[0].pcm.shape == (1920,) and frames[0].pcm[999] == 0 and frames[0].pcm[1000] == 1
    assert assembler.stream_time == pytest.approx(0.16)


async def test_outbound_queue_drops_oldest_audio_only() -> None:
    queue = OutboundQueue(max_audio=3, max_other=2)
    queue.put(Outgoing("binary", b"\x01headers"))
    for i in range(5):
        queue.put(Outgoing("audio", bytes([1, i])))
    queue.put(Outgoing("text", "event"))
    assert queue.audio_dropped == 2 and len(queue) == 5
    drained = [await queue.get() for _ in range(5)]
    assert [m.data for m in drained] == [b"\x01headers", b"\x01\x02", b"\x01\x03", b"\x01\x04", "event"]
    for i in range(4):
        queue.put(Outgoing("text", str(i)))
    assert queue.other_dropped == 2 and [(await queue.get()).data for _ in range(2)] == ["2", "3"]


def test_kyutai_sampling_query_parameters_parse() -> None:
    query = {"text_temperature": "0.7", "text_topk": "25", "audio_temperature": "0", "audio_topk": "250",
             "text_seed": "0", "audio_seed": "4294967295", "pad_mult": "-1.5", "repetition_penalty": "1",
             "persona": "ignored here"}
    parsed = p.SamplingQuery.parse(query)
    assert (parsed.text_temperature, parsed.text_topk, parsed.audio_temperature, parsed.audio_seed) == (
        0.7, 25, 0.0, 4294967295)
    assert parsed.unsupported() == {"pad_mult": -1.5, "repetition_penalty": 1.0}
    assert p.SamplingQuery.parse({}).unsupported() == {}


@pytest.mark.parametrize(("name", "value"), [("text_temperature", "-0.1"), ("audio_temperature", "5.5"),
                                             ("text_temperature", "nan"), ("text_topk", "-1"),
                                             ("audio_topk", "2.5"), ("text_seed", "4294967296"),
                                             ("audio_seed", "-1"), ("pad_mult", "loud")])
def test_bad_sampling_query_parameters_name_the_parameter(name: str, value: str) -> None:
    with pytest.raises(ValueError, match=name):
        p.SamplingQuery.parse({name: value})


def test_the_query_overrides_the_checkpoint_defaults() -> None:
    chosen = resolve_sampling(SamplingConfig(), p.SamplingQuery.parse({"audio_topk": "1", "text_seed": "9"}))
    assert (chosen.text_temperature, chosen.text_topk, chosen.audio_temperature, chosen.audio_topk) == (
        0.7, 25, 0.8, 1)
    assert chosen.text_seed == 9 and 0 <= chosen.audio_seed < p.SEED_LIMIT
    greedy = resolve_sampling(SamplingConfig(use_sampling=False), p.SamplingQuery())
    assert (greedy.text_temperature, greedy.audio_temperature) == (0.0, 0.0)
