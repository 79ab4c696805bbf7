"""Every random profile loads a model whose parts fit together: `moshi-7b`'s 32000-entry text head gets a tokenizer
that decodes every id it can sample; the tiny PersonaPlex-family checkpoints step with 16 depformer heads."""

from __future__ import annotations

import pytest
import torch
from sentencepiece import SentencePieceProcessor

from frontend_model.engine.engine import Engine
from frontend_model.loading.loader import load_model
from frontend_model.loading.profiles import MOSHI_DELAYS
from frontend_model.loading.tiny_tokenizer import padded_tokenizer_path, tiny_tokenizer_path


def test_padded_tokenizer_keeps_the_id_layout_and_encoding() -> None:
    tiny = SentencePieceProcessor(model_file=str(tiny_tokenizer_path()))
    padded = SentencePieceProcessor(model_file=str(padded_tokenizer_path(32000)))
    assert padded.vocab_size() == 32000 > tiny.vocab_size()
    assert [padded.id_to_piece(i) for i in (0, 1, 2, 3, 4, 12, 13)] == [
        tiny.id_to_piece(i) for i in (0, 1, 2, 3, 4, 12, 13)]
    assert padded.id_to_piece(4) == "<0x00>" and padded.id_to_piece(13) == "<0x09>"
    text = "The current time in Tokyo is a quarter past nine <unused31999>."
    assert padded.encode(text) == tiny.encode(text)
    assert padded.decode([tiny.vocab_size(), 31999]) and not padded.is_byte(31999)


def test_moshi_7b_steps_with_its_real_vocabulary_at_reduced_width() -> None:
    model = load_model("moshi-7b", device="cpu", dtype=torch.float32, context=16, reduced=True)
    lm = model.lm
    assert (lm.text_card, lm.n_q, lm.dep_q, lm.delays) == (32000, 16, 8, MOSHI_DELAYS)
    assert model.tokenizer.vocab_size() == 32000 and lm.dim < 4096
    tiny_vocab = SentencePieceProcessor(model_file=str(tiny_tokenizer_path())).vocab_size()
    sampled = []
    generator = torch.Generator().manual_seed(0)
    with Engine(model) as engine:
        for _ in range(24):  # past the context of 16: the KV ring wraps
            result = engine.step(torch.randint(0, 2048, (8,), generator=generator))
            if result.text_token is not None:
                sampled.append(result.text_token)
                model.tokenizer.is_byte(result.text_token)  # raised for ids >= the tokenizer's size
                model.tokenizer.decode([result.text_token])
    assert any(token >= tiny_vocab for token in sampled)  # the ids that used to crash the session


@pytest.mark.parametrize("profile", ["tiny-personaplex", "tiny-contextspan"])
def test_tiny_personaplex_family_steps(profile: str) -> None:
    model = load_model(profile, device="cpu", dtype=torch.float32, context=16)
    assert model.span.dep_q == 16 and model.lm.dep_q == 8
    with Engine(model) as engine:
        outputs = [engine.step(torch.randint(0, 2048, (8,))) for _ in range(4)]
    assert all(o.agent_codes is not None and o.agent_codes.shape == (8,) for o in outputs[1:])
