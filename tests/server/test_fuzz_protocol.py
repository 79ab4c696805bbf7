"""Property-based fuzzing of everything a client can send: kind-byte messages, client JSON, Ogg Opus audio.

A decoder fed hostile input must return a valid value or raise `ProtocolError` with a known code: any other
exception escapes the session's receive loop. Server events must survive encode_event -> decode_event.
Derandomized, without an example database, so that CI runs the same examples every time.
"""

from __future__ import annotations

import functools
import json
import types
import typing
from typing import Any, Literal, get_args, get_origin

import numpy as np
import pytest
from annotated_types import MaxLen
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ValidationError

from frontend_model.frame import FRAME_SAMPLES, SAMPLE_RATE
from server.wire import protocol as p
from server.wire.opus import OpusDecoder, OpusEncoder

pytestmark = pytest.mark.timeout(120)  # a hang fails the test instead of stalling CI

FUZZ = settings(max_examples=150, derandomize=True, database=None, deadline=None,
                suppress_health_check=[HealthCheck.too_slow])
# Known failures: report the first counterexample without spending time on shrinking it.
NO_SHRINK = settings(FUZZ, phases=[Phase.explicit, Phase.generate])

BINARY_ERRORS = {"empty_message", "unknown_kind"}
CLIENT_TEXT_ERRORS = {"invalid_json", "invalid_message", "unknown_type"}
AUDIO_ERRORS = {"bad_audio"}

# strategies ---------------------------------------------------------------------------------------------------

_JSON_SCALARS = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=30))
_JSON_VALUES = st.recursive(
    _JSON_SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12,
)
_FIELDS = ("type", "persona", "voice", "profile", "notes", "name", "location", "timezone")
_TYPES = st.sampled_from(["session.update", "session.updated", "SESSION.UPDATE", "", "error"]) | _JSON_VALUES
_PROFILES = st.dictionaries(st.sampled_from(_FIELDS) | st.text(max_size=8), _JSON_VALUES | st.text(), max_size=4)
_MESSAGE_OBJECTS = st.fixed_dictionaries(
    {"type": _TYPES},
    optional={
        "persona": _JSON_VALUES | st.text(max_size=9000),
        "voice": _JSON_VALUES | st.text(max_size=300),
        "profile": _PROFILES | _JSON_VALUES,
        "notes": _JSON_VALUES | st.text(),
        "extra": _JSON_VALUES,
    },
)
_JSON_TEXT = st.one_of(
    _JSON_VALUES.map(json.dumps),
    _MESSAGE_OBJECTS.map(json.dumps),
    _MESSAGE_OBJECTS.map(lambda obj: json.dumps(obj, ensure_ascii=False)),
    # a valid message with one slice cut out or duplicated: half-broken JSON
    st.tuples(_MESSAGE_OBJECTS.map(json.dumps), st.integers(0, 10_000), st.integers(0, 50), st.booleans()).map(
        lambda t: t[0][: t[1]] + t[0][t[1] + t[2] :] if t[3] else t[0][: t[1]] + t[0][t[1] - t[2] :]
    ),
)
# any str, surrogates included: a JSON escape such as "\ud800" produces one even from valid UTF-8 frames
_ANY_TEXT = st.text(st.characters(exclude_categories=()), max_size=200)


def _nested(depth: int, brackets: tuple[str, str], inside_update: bool) -> str:
    """`depth` levels of arrays or objects, alone or as the persona of a session.update."""
    value = brackets[0] * depth + "1" + brackets[1] * depth
    return '{"type": "session.update", "persona": ' + value + "}" if inside_update else value


def _huge_number(digits: int, sign: str, tail: str) -> str:
    return '{"type": "session.update", "notes": ' + sign + "9" * digits + tail + "}"


_DEEP_JSON = st.builds(
    _nested, st.integers(1, 200_000), st.sampled_from([("[", "]"), ('{"a":', "}"), ('{"type":', "}")]), st.booleans()
)
_HUGE_NUMBER_JSON = st.builds(
    _huge_number, st.integers(1, 100_000), st.sampled_from(["", "-"]), st.sampled_from(["", ".5", "e5", "e-99999"])
)


def _for_annotation(annotation: Any, max_size: int | None = None) -> st.SearchStrategy[Any]:
    """A strategy for every value of one pydantic field type; new field types fail loudly here."""
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is Literal:
        return st.sampled_from(args)
    if origin in (typing.Union, types.UnionType):
        return st.one_of(*(_for_annotation(arg, max_size) for arg in args))
    if origin is list:
        return st.lists(_for_annotation(args[0]), max_size=5)
    if origin is dict:
        return st.dictionaries(_for_annotation(args[0]), _for_annotation(args[1]), max_size=5)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return _for_model(annotation)
    simple: dict[Any, st.SearchStrategy[Any]] = {
        type(None): st.none(),
        bool: st.booleans(),
        int: st.integers(),
        float: st.floats(allow_nan=False, allow_infinity=False),  # NaN and inf encode as null: no round trip
        str: st.text(max_size=max_size if max_size is not None else 80),
    }
    if annotation not in simple:
        raise TypeError(f"no strategy for {annotation!r}: extend _for_annotation")
    return simple[annotation]


def _for_model(model: type[BaseModel]) -> st.SearchStrategy[BaseModel]:
    fields = {}
    for name, info in model.model_fields.items():
        max_size = next((m.max_length for m in info.metadata if isinstance(m, MaxLen)), None)
        fields[name] = _for_annotation(info.annotation, max_size)
    return st.fixed_dictionaries(fields).map(lambda values: model(**values))


_EVENT_MODELS: tuple[type[p.ServerEvent], ...] = get_args(get_args(p.Event)[0])
_EVENTS = st.one_of(*(_for_model(model) for model in _EVENT_MODELS))


def _assert_client_text_outcome(text: str) -> None:
    try:
        update = p.parse_client_text(text)
    except p.ProtocolError as exc:
        assert exc.code in CLIENT_TEXT_ERRORS, exc.code
        return
    assert isinstance(update, p.SessionUpdate)


# binary messages ----------------------------------------------------------------------------------------------


@FUZZ
@given(st.binary(max_size=64) | st.sampled_from([b"", b"\x00", b"\x01", b"\x02", b"\x03", b"\xff"]))
def test_decode_binary_returns_kind_and_payload_or_a_known_error(message: bytes) -> None:
    try:
        kind, payload = p.decode_binary(message)
    except p.ProtocolError as exc:
        assert exc.code in BINARY_ERRORS
        assert (exc.code == "empty_message") == (message == b"")
        return
    assert isinstance(kind, p.Kind) and kind == message[0]
    assert type(payload) is bytes and payload == message[1:]


@FUZZ
@given(st.binary(max_size=64), st.text(max_size=40))
def test_binary_builders_round_trip(ogg: bytes, piece: str) -> None:
    assert p.decode_binary(p.handshake()) == (p.Kind.HANDSHAKE, b"")
    assert p.decode_binary(p.audio_message(ogg)) == (p.Kind.AUDIO, ogg)
    assert p.decode_binary(p.text_message(piece)) == (p.Kind.TEXT, piece.encode("utf-8"))


# client JSON --------------------------------------------------------------------------------------------------


@FUZZ
@given(_ANY_TEXT | _JSON_TEXT)
@example('{"type": "session.update", "persona": "\\ud800"}')
@example('{"type": "session.update", "profile": {"name": "\\udfff\\ud800"}}')
@example('{"type": {"type": "session.update"}}')
@example('{"type": "session.update", "type": 1}')
@example("NaN")
@example('{"type": "session.update", "notes": Infinity}')
def test_parse_client_text_returns_an_update_or_a_known_error(text: str) -> None:
    _assert_client_text_outcome(text)


@NO_SHRINK
@given(_DEEP_JSON)
@example("[" * 100_000 + "]" * 100_000)
def test_deeply_nested_json_is_refused_cleanly(text: str) -> None:
    _assert_client_text_outcome(text)


@NO_SHRINK
@given(_HUGE_NUMBER_JSON)
@example('{"type": "session.update", "notes": ' + "9" * 5000 + "}")
def test_huge_numbers_are_refused_cleanly(text: str) -> None:
    _assert_client_text_outcome(text)


_UPDATES = st.builds(
    p.SessionUpdate,
    type=st.just("session.update"),
    persona=st.none() | st.text(max_size=300),
    voice=st.none() | st.text(max_size=200),
    profile=st.none() | st.builds(
        p.UserProfile,
        name=st.none() | st.text(max_size=200),
        location=st.none() | st.text(max_size=200),
        timezone=st.none() | st.text(max_size=64),
    ),
    notes=st.none() | st.text(max_size=300),
)


@FUZZ
@given(_UPDATES, st.sampled_from(["dumps", "ascii", "pydantic"]))
@example(p.SessionUpdate(type="session.update", persona="𝔘\u202e\u200b\x00\"\\<ret>", notes="\U0010ffff"), "ascii")
def test_session_update_with_any_unicode_round_trips(update: p.SessionUpdate, how: str) -> None:
    if how == "pydantic":
        text = update.model_dump_json(exclude_none=True)
    else:
        text = json.dumps(update.model_dump(exclude_none=True), ensure_ascii=how == "ascii")
    assert p.parse_client_text(text) == update


@FUZZ
@given(st.sampled_from(["persona", "voice", "notes", "name", "location", "timezone"]), st.integers(1, 50))
def test_over_long_fields_are_invalid_messages(field: str, extra: int) -> None:
    limits = {"persona": 8000, "voice": 200, "notes": 8000, "name": 200, "location": 200, "timezone": 64}
    value = "é" * (limits[field] + extra)
    body: dict[str, Any] = {"type": "session.update"}
    if field in ("name", "location", "timezone"):
        body["profile"] = {field: value}
    else:
        body[field] = value
    with pytest.raises(p.ProtocolError) as err:
        p.parse_client_text(json.dumps(body))
    assert err.value.code == "invalid_message"


# server events ------------------------------------------------------------------------------------------------


def test_every_event_model_is_fuzzed() -> None:
    assert set(_EVENT_MODELS) == _all_subclasses(p.ServerEvent)


def _all_subclasses(cls: type) -> set[type]:
    return {sub for direct in cls.__subclasses__() for sub in {direct, *_all_subclasses(direct)}}


@settings(FUZZ, max_examples=300)
@given(_EVENTS)
def test_every_server_event_round_trips(event: p.ServerEvent) -> None:
    text = p.encode_event(event)
    decoded = p.decode_event(text)
    assert type(decoded) is type(event)
    assert decoded == event
    assert p.encode_event(decoded) == text
    assert json.loads(text)["type"] == event.type  # type: ignore[attr-defined]


def _retyped(event: p.ServerEvent, event_type: str) -> str:
    """A real event's JSON under another event's `type`: valid JSON with the wrong fields."""
    return json.dumps({**json.loads(p.encode_event(event)), "type": event_type})


_EVENT_TYPES = [model.model_fields["type"].default for model in _EVENT_MODELS]


@FUZZ
@given(_ANY_TEXT | _JSON_TEXT | st.builds(_retyped, _EVENTS, st.sampled_from(_EVENT_TYPES)))
@example("[" * 100_000 + "]" * 100_000)
@example('{"type": "stats", "t": ' + "9" * 5000 + "}")
@example('{"type": "stats", "t": NaN}')
def test_decode_event_returns_an_event_or_a_validation_error(text: str) -> None:
    """Clients' side of the wire: any text is an event or a pydantic ValidationError, nothing else."""
    try:
        event = p.decode_event(text)
    except ValidationError:
        return
    assert type(event) in _EVENT_MODELS


# Ogg Opus input -----------------------------------------------------------------------------------------------


@functools.cache
def _valid_stream(seed: int, frames: int) -> tuple[bytes, ...]:
    """One client stream as the encoder's pages: headers with the first frame, then one chunk per frame."""
    rng = np.random.default_rng(seed)
    encoder = OpusEncoder()
    t = np.arange(FRAME_SAMPLES, dtype=np.float32) / SAMPLE_RATE
    chunks = []
    for i in range(frames):
        pcm = 0.3 * np.sin(2 * np.pi * (220 + 110 * seed) * (t + i * FRAME_SAMPLES / SAMPLE_RATE))
        pcm = (pcm + 0.05 * rng.standard_normal(FRAME_SAMPLES)).astype(np.float32)
        chunks.append(encoder.encode(pcm))
    return tuple(chunks)


_STREAMS = [_valid_stream(seed, 6) for seed in range(3)]


def _assert_audio_outcome(decoder: OpusDecoder, chunk: bytes) -> bool:
    """Decode one message; True when it raised the known error, else the result must be mono float32 PCM."""
    try:
        pcm = decoder.decode(chunk)
    except p.ProtocolError as exc:
        assert exc.code in AUDIO_ERRORS
        return True
    assert isinstance(pcm, np.ndarray) and pcm.dtype == np.float32 and pcm.ndim == 1
    assert np.isfinite(pcm).all()
    return False


# A page header with `nseg` segments of which the message holds `given` lacing values, all equal to `lace`.
_BOGUS_HEADERS = st.tuples(st.integers(1, 255), st.integers(0, 255), st.integers(0, 255)).map(
    lambda t: b"OggS\x00\x00" + bytes(20) + bytes([t[0]]) + bytes([t[1]]) * min(t[0], t[2])
)


def _page(header: bytes, packet: bytes) -> bytes:
    """One Ogg page holding `packet`, with the first 26 header bytes given (the CRC is not checked by sphn)."""
    lacing = [255] * (len(packet) // 255) + [len(packet) % 255]
    return header[:26].ljust(26, b"\x00") + bytes([len(lacing), *lacing]) + packet


@st.composite
def _corrupted_streams(draw: st.DrawFn) -> list[bytes]:
    """A valid stream with bytes flipped, pages cut, dropped, duplicated or inserted, sent as messages of whole
    pages (the usual framing, so that corrupt content reaches sphn) or cut anywhere."""
    pages = [bytearray(page) for page in draw(st.sampled_from(_STREAMS))]
    for _ in range(draw(st.integers(0, 4))):
        op = draw(st.sampled_from(["flip", "repacket", "repacket", "truncate", "drop", "duplicate", "insert"]))
        i = draw(st.integers(0, len(pages) - 1))
        page = pages[i]
        if op == "flip" and page:
            page[draw(st.integers(0, len(page) - 1))] ^= draw(st.integers(1, 255))
        elif op == "repacket":  # a whole page around an arbitrary Opus packet: it reaches the Opus decoder
            pages[i] = bytearray(_page(bytes(page[:26]), draw(st.binary(max_size=600))))
        elif op == "truncate":
            del page[draw(st.integers(0, len(page))) :]
        elif op == "drop" and len(pages) > 1:
            del pages[i]
        elif op == "duplicate":
            pages.insert(i, bytearray(page))
        else:  # junk, or a page header whose lengths run past the message
            pages.insert(i, bytearray(draw(st.binary(min_size=1, max_size=64) | _BOGUS_HEADERS)))
    if draw(st.booleans()):
        cuts = sorted(draw(st.lists(st.integers(1, len(pages) - 1), max_size=4))) if len(pages) > 1 else []
        return [b"".join(pages[a:b]) for a, b in zip([0, *cuts], [*cuts, len(pages)], strict=True)]
    data = b"".join(pages)
    cuts = sorted(draw(st.lists(st.integers(0, len(data)), max_size=5)))
    return [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]


@FUZZ
@given(st.lists(st.binary(max_size=300) | st.binary(max_size=200).map(lambda b: b"OggS" + b) | _BOGUS_HEADERS,
                min_size=1, max_size=4))
@example([b"OggS\x00\x02" + b"\x00" * 21])
@example([b"OggS" + b"\xff" * 40])
def test_opus_decoder_on_arbitrary_bytes(chunks: list[bytes]) -> None:
    decoder = OpusDecoder()
    for chunk in chunks:
        _assert_audio_outcome(decoder, chunk)


@FUZZ
@given(_corrupted_streams())
def test_opus_decoder_on_corrupted_and_truncated_streams(chunks: list[bytes]) -> None:
    decoder = OpusDecoder()
    for chunk in chunks:
        _assert_audio_outcome(decoder, chunk)


@FUZZ
@given(_corrupted_streams(), st.integers(0, 2))
@example([b"OggS\x00\x00" + bytes(20) + b"\xff" * 11], 0)  # declares 255 segments of 255 bytes: 65 KB to come
def test_opus_decoder_recovers_after_bad_input(garbage: list[bytes], seed: int) -> None:
    """After any input, a fresh stream plays: at most its first message fails, every later one yields PCM."""
    decoder = OpusDecoder()
    for chunk in garbage:
        _assert_audio_outcome(decoder, chunk)
    pages = _valid_stream(seed, 6)
    _assert_audio_outcome(decoder, pages[0])
    sizes = [decoder.decode(page).size for page in pages[1:]]
    assert all(sizes), f"later pages were swallowed: {sizes}"


def test_opus_decoder_accepts_a_valid_stream() -> None:
    decoder = OpusDecoder()
    total = sum(decoder.decode(page).size for page in _valid_stream(0, 6))
    assert total > 0
