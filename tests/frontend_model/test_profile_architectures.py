"""Every profile's architecture steps, prefills and injects spans: reduced width, real vocabulary and layout.

Width, depth and context are cut so that CPU runs it; the text vocabulary (32000 for the 7B shapes), the codebook
count, the depformer steps (8, or 16 limited to the 8 agent ones) and the delays are each profile's own.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch
from moshi.models import loaders

from frontend_model.engine.engine import GREEDY, Engine
from frontend_model.loading.loader import LoadedModel, load_model
from frontend_model.loading.profiles import MOSHI_DELAYS, PROFILE_LAYOUTS, PROFILES, TINY_LM_CONFIG, moshi_7b_lm_config
from frontend_model.moshi_internals.depformer import run_depformer_for_agent_only
from frontend_model.span.block import Block, Prefix
from frontend_model.span.build import placeholder_rows, silence_frames

REDUCED = {
    "dim": 64, "num_heads": 4, "num_layers": 1, "context": 16,
    "depformer_dim": 32, "depformer_dim_feedforward": 64, "depformer_num_heads": 2, "depformer_num_layers": 1,
}


def personaplex_family(profile: str) -> bool:
    return PROFILE_LAYOUTS.get(profile) in ("personaplex", "contextspan")


def architecture(profile: str) -> dict[str, Any]:
    """The tiny profiles keep their own (already small) shape and tokenizer; the others are the 7B shape, cut."""
    config = dict(TINY_LM_CONFIG, context=16) if profile.startswith("tiny") else dict(moshi_7b_lm_config(), **REDUCED)
    if personaplex_family(profile):
        config["dep_q"] = 16
    return config


@pytest.fixture(scope="module")
def tiny() -> LoadedModel:
    return load_model("tiny", device="cpu", dtype=torch.float32, context=16)


def reduced(profile: str, tiny: LoadedModel) -> LoadedModel:
    config = architecture(profile)
    config.setdefault("text_card", tiny.tokenizer.vocab_size())
    torch.manual_seed(0)
    lm = loaders.get_moshi_lm(None, lm_kwargs=config, device="cpu", dtype=torch.float32).eval()
    trained = run_depformer_for_agent_only(lm)
    span = dataclasses.replace(tiny.span, dep_q=trained, context=config["context"])
    return dataclasses.replace(tiny, profile=profile, lm=lm, span=span, suppressed_text_ids=frozenset())


def span_block(model: LoadedModel, frames: int) -> Block:
    text = torch.randint(5, model.lm.text_card, (frames,), generator=torch.Generator().manual_seed(frames))
    agent, user = placeholder_rows(model.span, frames)
    return Block(torch.cat([text[None], agent, user]))


@pytest.mark.parametrize("profile", PROFILES)
def test_each_profile_steps_prefills_and_injects(profile: str, tiny: LoadedModel) -> None:
    model = reduced(profile, tiny)
    lm = model.lm
    assert lm.delays == MOSHI_DELAYS and lm.n_q == 16 and lm.dep_q == 8
    assert model.span.dep_q == (16 if personaplex_family(profile) else 8)
    if not profile.startswith("tiny"):
        assert lm.text_card == 32000
    user = torch.randint(0, 2048, (40, 8), generator=torch.Generator().manual_seed(1))
    prefix = Prefix(Block(torch.cat([span_block(model, 5).tokens, silence_frames(model.span, 2).tokens], dim=1)))
    texts = []
    with Engine(model, GREEDY, max_span_frames=24) as engine:
        engine.prefill(prefix)
        for i in range(40):  # past context + max span: the KV ring wraps
            if i in (3, 30):
                engine.inject(span_block(model, 24 if i == 30 else 4))
            out = engine.step(user[i])
            assert out.agent_codes is not None and out.agent_codes.shape == (8,)
            assert all(0 <= c < lm.card for c in out.agent_codes.tolist())
            texts.append(out.text_token)
        assert engine.offset == prefix.frames + 40 + 4 + 24
    assert all(t is not None and 0 <= t < lm.text_card for t in texts)
