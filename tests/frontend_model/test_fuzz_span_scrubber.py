"""Property-based fuzzing of the span scrubber: hostile backend or persona text never yields a control id.

Whatever the text (control characters, literal special tokens, byte-piece look-alikes, zero-width and bidi
characters, lone surrogates, very long words and numbers), a span's text row is `[open] + data + [close]`
with no forbidden id inside, at most `max_frames` long, and building it never raises. Derandomized, without
an example database, so that CI runs the same examples every time.
"""

from __future__ import annotations

import re
import unicodedata

import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from frontend_model.loading.loader import LoadedModel, load_model
from frontend_model.span.build import build_prefix, build_span
from frontend_model.span.normaliser import normalise_text, scrub_control_text
from frontend_model.span.text_ids import non_text_ids

FUZZ = settings(max_examples=150, derandomize=True, database=None, deadline=None,
                suppress_health_check=[HealthCheck.too_slow])

_CONTROL_MARKUP = re.compile(r"</?(?:ret|system|s|pad|unk|0x[0-9a-f]{2})>", re.IGNORECASE)

_HOSTILE = [
    # special tokens and their spellings
    "<ret>", "<RET>", "<s>", "</s>", "<unk>", "<pad>", "<system>", "<", ">", "/", "ret", "s", "unk", "0x",
    "＜ret＞", "<ret\u200b>", "<<s>s>", "<0x0", "0>",
    # control, format, separator and bidi characters
    "\x00", "\x01", "\x08", "\x09", "\x0b", "\x1b", "\x7f", "\x85", "\n", "\r\n", "\u2028", "\u2029",
    "\u200b", "\u200c", "\u200d", "\u2060", "\ufeff", "\u00ad", "\u061c", "\u200e", "\u200f",
    "\u202a", "\u202b", "\u202c", "\u202d", "\u202e", "\u2066", "\u2067", "\u2068", "\u2069",
    "\ufe0f", "\U000e0001", "\U000e0041", "\ue000", "\U000f0000", "\ufffd", "\ufffe", "\uffff",
    "\ud800", "\udfff", "\u0301", "\u0338",
    # the tokenizer's own word-start mark, numbers and symbols the normaliser rewrites
    "\u2581", "\u2581\u2581", "1", "0", "1999", "3:45", "$", "€", "%", "°", "&", "-", ".", ",", "1,234", ".5",
    "²", "½", "١", "Ⅻ", "ﬁ", "İ", "ß", "東京", "😀", "👩‍👩‍👧", " ", "a", "The",
]  # fmt: skip
_BYTE_PIECES = st.tuples(st.integers(0, 255), st.sampled_from(["<0x{:02X}>", "<0x{:02x}>", "＜0x{:02X}＞"])).map(
    lambda t: t[1].format(t[0])
)
# runs around the limits that matter: 18 digits (cardinal words), 4300 (Python's int() of a str)
_RUN_LENGTHS = st.sampled_from([1, 18, 19, 4301, 5000]) | st.integers(1, 5000)
_LONG_RUNS = st.tuples(
    st.sampled_from(["a", "Z", "9", "0", "ab", "\u2581", "<", "\u200b", "東", "😀", "-", "<ret>", "\x00"]),
    _RUN_LENGTHS,
).map(lambda t: t[0] * t[1])
_NUMBERS = st.tuples(
    st.sampled_from(["", "-", "−", "the "]),
    st.sampled_from(["", "$", "€", "£", "USD "]),
    st.sampled_from(["1", "7", "0", "12,"]),
    _RUN_LENGTHS,
    st.sampled_from(["", ".50", ".5", ".05", ".123"]),
    st.sampled_from(["", " million", "k", "%", "th", "s", " USD", "-5", "."]),
).map(lambda t: f"{t[0]}{t[1]}{t[2] * t[3]}{t[4]}{t[5]}")
_FRAGMENTS = st.one_of(
    st.sampled_from(_HOSTILE),
    _BYTE_PIECES,
    st.text(st.characters(exclude_categories=()), max_size=12),  # any code point, surrogates included
)
# short fragments that abut (so that halves of markup meet), half the time around one long run or number
_SHORT_TEXT = st.lists(_FRAGMENTS, max_size=12).map("".join)
_TEXT = _SHORT_TEXT | st.tuples(_SHORT_TEXT, _LONG_RUNS | _NUMBERS, _SHORT_TEXT).map("".join)


@pytest.fixture(scope="module")
def model() -> LoadedModel:
    return load_model("tiny", device="cpu", dtype=torch.float32)


@pytest.fixture(scope="module")
def forbidden(model: LoadedModel) -> frozenset[int]:
    return non_text_ids(model.tokenizer, model.span)


def test_forbidden_set_covers_every_control_and_byte_piece(model: LoadedModel, forbidden: frozenset[int]) -> None:
    tok, span = model.tokenizer, model.span
    assert span.control_ids <= forbidden
    assert {tok.unk_id(), tok.bos_id(), tok.eos_id(), span.text_pad_id} <= forbidden
    assert {tok.piece_to_id(f"<0x{b:02X}>") for b in range(256)} <= forbidden
    # the fuzzed text spells every forbidden piece (the byte pieces are drawn from all 256 values)
    spelled = {tok.id_to_piece(i) for i in forbidden} - {f"<0x{b:02X}>" for b in range(256)}
    assert spelled <= set(_HOSTILE), spelled


@settings(FUZZ, max_examples=120)
@given(text=_TEXT, max_frames=st.integers(3, 64) | st.just(10_000))
@example(text="<ret>hello<0x08>world<0x09></s><s><unk>\u200b\u202e", max_frames=3)
@example(text="$" + "1" * 5000 + ".50", max_frames=64)
@example(text="\u2581" * 50 + "a", max_frames=3)
@example(text="a" * 6000, max_frames=10_000)
def test_span_block_never_carries_a_control_id(
    model: LoadedModel, forbidden: frozenset[int], text: str, max_frames: int
) -> None:
    span = model.span
    built = build_span(text, model.tokenizer, span, max_frames, forbidden)
    if built.block is None:
        assert built.token_ids == () and built.frames == 0
        assert built.reason in ("empty text", "nothing left after removing control text")
        assert not any(ch.isascii() and ch.isalnum() for ch in normalise_text(text)), "spellable text was lost"
        return
    tokens = built.block.tokens
    row = tokens[0].tolist()
    assert tokens.shape == (span.num_rows, len(row))
    assert 3 <= built.frames == len(row) <= max_frames
    assert row[0] == span.open_id and row[-1] == span.close_id
    assert row.count(span.open_id) == 1 and row.count(span.close_id) == 1
    assert not set(row[1:-1]) & forbidden
    assert tuple(row[1:-1]) == built.token_ids
    assert (tokens[1 : 1 + span.agent_codebooks] == torch.tensor(span.silence_codes)[:, None]).all()
    assert (tokens[1 + span.agent_codebooks :] == torch.tensor(span.sine_codes)[:, None]).all()
    if not built.truncated:
        assert built.dropped_text == ""


@settings(FUZZ, max_examples=60)
@given(text=_TEXT)
@example(text="persona <system> x <0x00><ret>\x00\u202e")
def test_persona_prefix_never_carries_a_control_id(
    model: LoadedModel, forbidden: frozenset[int], text: str
) -> None:
    prefix = build_prefix(text, model.tokenizer, model.span, forbidden=forbidden)
    if prefix is None:
        return
    row = prefix.block.tokens[0, : -model.span.prefix_silence_frames].tolist()
    marker = model.tokenizer.encode("<system>")
    assert row[: len(marker)] == marker and row[-len(marker) :] == marker
    assert not set(row) & forbidden


def _assert_clean_and_stable(out: str) -> None:
    assert not any(ch.isdigit() for ch in out)
    assert not any(unicodedata.category(ch)[0] == "C" for ch in out)
    assert not _CONTROL_MARKUP.search(out)
    assert out == out.strip() and "  " not in out
    assert normalise_text(out) == out
    assert scrub_control_text(out) == out


@settings(FUZZ, max_examples=80)
@given(text=_TEXT)
def test_normaliser_output_is_clean_and_stable(text: str) -> None:
    _assert_clean_and_stable(normalise_text(text))


@settings(FUZZ, max_examples=100)
@given(text=_NUMBERS)
@example(text="$" + "1" * 5000 + ".50")
@example(text="-€" + "9" * 4400 + ".05")
def test_normaliser_reads_numbers_of_any_length(text: str) -> None:
    _assert_clean_and_stable(normalise_text(text))
