"""A dep_q-16 (PersonaPlex-shaped) model stepped by our engine equals a hand-written reference, frame for frame.

The reference runs the temporal transformer one column at a time and all 16 depformer steps, the 8 user rows
teacher-forced with the user's real codes in their delayed places, and keeps the agent rows (float32, greedy). The
engine runs moshi's LMGen with the depformer limited to the 8 agent steps.
"""

from __future__ import annotations

import pytest
import torch
from moshi.models.lm import LMGen, LMModel

from frontend_model.engine.engine import GREEDY, Engine
from frontend_model.loading.loader import LoadedModel
from tests.support.engine import tiny_model, unlimited, user_frames

FRAMES = 40


@pytest.fixture(scope="module")
def model() -> LoadedModel:
    return tiny_model(dep_q=16)


def column(lm: LMModel, c: int, generated: torch.Tensor, user: torch.Tensor) -> torch.Tensor:
    """Stream column c: text and agent rows as generated for it, user semantic of frame c, user acoustic of c-1."""
    agent = lm.n_q // 2
    col = generated.clone()
    col[1 + agent] = user[c, 0]
    col[2 + agent :] = user[c - 1, 1:] if c > 0 else 0
    initial = lm._get_initial_token()[0, :, 0]
    delays = torch.tensor(lm.delays)
    return torch.where(c <= delays, initial, col)


@torch.no_grad()
def reference(lm: LMModel, user: torch.Tensor, suppressed: list[int]) -> list[tuple[int, tuple[int, ...]]]:
    """Frames 1.. as (text, agent codes), aligned like LMGen's output (frame c: text/semantic of column c)."""
    agent = lm.n_q // 2
    generated = torch.zeros(lm.num_codebooks, dtype=torch.long)  # text and agent rows of the next column
    frames = []
    with lm.streaming(1):
        for c in range(user.shape[0]):
            out, text_logits = lm.forward_text(column(lm, c, generated, user)[None, :, None])
            text_logits[..., suppressed] = float("-inf")
            text = text_logits[0, 0, 0].argmax()
            rows = [text]
            with lm.depformer.streaming(1):
                previous = text
                for cb in range(lm.dep_q):
                    sampled = lm.forward_depformer(cb, previous.view(1, 1, 1), out)[0, 0, 0].argmax()
                    if cb < agent:
                        rows.append(sampled)
                        previous = sampled
                    else:  # teacher-forced: user row j of the column being predicted, c + 1 (delay 1 but row 0)
                        j = cb - agent
                        previous = user[min(c + 1, user.shape[0] - 1), 0] if j == 0 else user[c, j]
            if c > 0:  # frame c: text and semantic sampled at column c-1, acoustic codes just now
                frames.append((int(generated[0]), (int(generated[1]), *[int(r) for r in rows[2:]])))
            generated = torch.zeros_like(generated)
            generated[: 1 + agent] = torch.stack(rows)
    return frames


def test_dep_q16_engine_equals_the_all_16_steps_reference(model: LoadedModel) -> None:
    user = user_frames(FRAMES, seed=3)
    lm = unlimited(model)
    assert lm.dep_q == 16 and model.lm.dep_q == 8
    expected = reference(lm, user, sorted(model.suppressed_text_ids))
    with Engine(model, GREEDY) as engine:
        got = []
        for c in range(FRAMES):
            out = engine.step(user[c])
            if c > 0:
                got.append((out.text_token, tuple(out.agent_codes.tolist())))
    assert len(got) == FRAMES - 1
    assert got == expected
    assert len({text for text, _ in got}) > 3, "the comparison needs non-trivial text"
    assert len({codes for _, codes in got}) > FRAMES // 2


@torch.no_grad()
def test_moshi_lmgen_as_is_differs_from_the_reference(model: LoadedModel) -> None:
    """The comparison can fail: moshi's LMGen with dep_q left at 16 drops the user's input (the bug fixed)."""
    lm = unlimited(model)
    user = user_frames(FRAMES, seed=3)
    expected = reference(unlimited(model), user, [])
    gen = LMGen(lm, use_sampling=False)
    got = []
    with gen.streaming(1):
        for c in range(FRAMES):
            out = gen.step(user[c].view(1, -1, 1))  # LMGen keeps the first num_codebooks - dep_q - 1 = 0 rows
            if c > 0:
                got.append((int(out[0, 0, 0]), tuple(out[0, 1:9, 0].tolist())))
    assert got != expected


def test_an_unlimited_dep_q16_model_is_refused(model: LoadedModel) -> None:
    from dataclasses import replace

    with pytest.raises(ValueError, match="run_depformer_for_agent_only"):
        Engine(replace(model, lm=unlimited(model)), GREEDY)
