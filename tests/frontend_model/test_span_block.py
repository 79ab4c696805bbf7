from __future__ import annotations

import pytest
import torch

from frontend_model.loading.loader import LoadedModel, load_model
from frontend_model.span.build import build_span
from frontend_model.span.placeholders import compute_placeholder_codes
from frontend_model.span.text_ids import non_text_ids


@pytest.fixture(scope="module")
def model() -> LoadedModel:
    return load_model("tiny", device="cpu", dtype=torch.float32)


def test_block_layout(model: LoadedModel) -> None:
    span = model.span
    built = build_span("The 1999 budget was $4.5 million, 12% more than in 1998, at 3:45 pm.", model.tokenizer,
                       span, max_frames=200)
    assert built.block is not None and not built.truncated
    tokens = built.block.tokens
    assert tokens.shape == (span.num_rows, len(built.token_ids) + 2)
    assert tokens[0, 0] == span.open_id and tokens[0, -1] == span.close_id
    assert tokens[0, 1:-1].tolist() == list(built.token_ids)
    agents = tokens[1 : 1 + span.agent_codebooks]
    users = tokens[1 + span.agent_codebooks :]
    assert (agents == torch.tensor(span.silence_codes)[:, None]).all()
    assert (users == torch.tensor(span.sine_codes)[:, None]).all()
    assert built.text == ("The nineteen ninety-nine budget was four point five million dollars, twelve percent more "
                          "than in nineteen ninety-eight, at three forty-five p m.")


def test_every_control_id_is_scrubbed(model: LoadedModel) -> None:
    forbidden = non_text_ids(model.tokenizer, model.span)
    assert {model.span.ret_id, model.span.open_id, model.span.close_id, 0, 1, 2, 3} <= forbidden
    hostile = "Hi\x00 <ret> there\x08\tyou <0x09> ☃ 東京 </s><s><pad>\u200b friend <system>"
    built = build_span(hostile, model.tokenizer, model.span, max_frames=200)
    assert built.block is not None
    inner = built.block.tokens[0, 1:-1].tolist()
    assert not set(inner) & forbidden
    for byte_piece in range(256):
        piece_id = model.tokenizer.piece_to_id(f"<0x{byte_piece:02X}>")
        assert piece_id not in inner


@pytest.mark.parametrize("text", ["", "   ", "<ret><ret>", "\x00\x08\t", "☃☃", "<0x08><0x09>"])
def test_empty_or_all_control_text_yields_no_block(model: LoadedModel, text: str) -> None:
    built = build_span(text, model.tokenizer, model.span, max_frames=200)
    assert built.block is None and built.frames == 0
    assert built.reason in ("empty text", "nothing left after removing control text")


def test_over_long_span_is_cut_at_a_word_boundary(model: LoadedModel) -> None:
    text = "The train from London to Edinburgh takes about four and a half hours every day of the week."
    full = build_span(text, model.tokenizer, model.span, max_frames=1000)
    cut = build_span(text, model.tokenizer, model.span, max_frames=14)
    assert cut.truncated and cut.block is not None and cut.frames <= 14
    assert full.text.startswith(cut.text) and cut.dropped_text
    next_piece = model.tokenizer.id_to_piece(full.token_ids[len(cut.token_ids)])
    assert next_piece.startswith("\u2581"), "the cut must fall before the start of a word"
    assert f"{cut.text} {cut.dropped_text}".split() == full.text.split()


def test_tiny_placeholders_come_from_the_loaded_codec(model: LoadedModel) -> None:
    silence, sine = compute_placeholder_codes(model.mimi)
    assert model.span.silence_codes == silence and model.span.sine_codes == sine
    assert silence != sine
    assert all(0 <= c < 2048 for c in silence + sine)
