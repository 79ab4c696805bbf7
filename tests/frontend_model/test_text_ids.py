"""Which agent text ids are text: one answer per checkpoint, shared by the live and offline transcripts and the span
scrubber."""

from __future__ import annotations

import pytest
import torch

from frontend_model.loading.loader import LoadedModel, load_model
from frontend_model.span.build import build_span


@pytest.fixture(scope="module", params=["tiny", "tiny-contextspan"])
def model(request: pytest.FixtureRequest) -> LoadedModel:
    return load_model(request.param, device="cpu", dtype=torch.float32)


def test_padding_markers_and_byte_pieces_are_never_text(model: LoadedModel) -> None:
    tok, span, text = model.tokenizer, model.span, model.agent_text
    padding = {span.text_pad_id, model.lm.end_of_text_padding_id}
    assert {tok.unk_id(), tok.bos_id(), tok.eos_id(), *padding} <= text.non_text
    assert span.control_ids <= text.non_text
    for byte in range(256):
        assert text.piece(tok.piece_to_id(f"<0x{byte:02X}>")) is None


def test_a_word_piece_is_text_with_its_word_start_as_a_space(model: LoadedModel) -> None:
    ids = model.tokenizer.encode("the weather")
    assert "".join(model.agent_text.piece(i) or "" for i in ids) == " the weather"


def test_an_id_past_the_tokenizer_is_no_text_and_raises_nothing(model: LoadedModel) -> None:
    assert model.agent_text.piece(model.tokenizer.vocab_size()) is None
    assert model.agent_text.piece(-1) is None


def test_what_the_scrubber_lets_into_a_span_reads_back_as_text(model: LoadedModel) -> None:
    built = build_span("Hi\x00 <ret> there\x08 <0x09> friend", model.tokenizer, model.span, max_frames=64)
    assert built.token_ids and all(model.agent_text.piece(i) is not None for i in built.token_ids)
