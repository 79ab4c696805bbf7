"""A resumed slot's decoder is warmed with the agent audio its history holds.

The agent frames read back from a history are the codes the session's decoder decoded (a persona prefix and a span
in them; both families), and a slot resumed from it decodes the codes the uninterrupted session said next into its
PCM (float32, within TOLERANCE), where a cold decoder does not; the other slots' codec states stay bit for bit. The
same codes are given to both: after a resume the LM's own next codes differ, since the user's encoder starts cold
(docs/operations.md).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import pytest
import torch

from frontend_model.engine.batch_model import BatchedModel
from frontend_model.engine.codec import decoder_receptive_field
from frontend_model.engine.engine import GREEDY
from frontend_model.engine.history import SessionHistory, spoken_frames
from frontend_model.frame import FRAME_SAMPLES
from frontend_model.loading.loader import LoadedModel
from frontend_model.span.build import build_prefix
from tests.support.engine import FAMILIES, span_like_block, state_rows, tiny_model

MAX_SPAN = 64
AFTER = 6  # frames compared after the resume
TOLERANCE = 1e-5  # agent PCM in [-1, 1]; measured 1.2e-7 and 2.1e-7
COLD_GAP = 1e-2  # how far a cold decoder is at least; measured 0.19


@pytest.fixture(scope="module", params=FAMILIES, ids=lambda q: f"dep_q{q}")
def model(request: pytest.FixtureRequest) -> LoadedModel:
    return tiny_model(request.param)


@dataclass(frozen=True)
class Conversation:
    history: SessionHistory
    decoded: torch.Tensor  # [agent codebooks, frames] the decoder decoded before the history was taken
    said_next: list[tuple[torch.Tensor, np.ndarray]]  # the codes and the PCM of the AFTER frames after it


def speech(frames: int) -> np.ndarray:
    return (0.2 * np.random.default_rng(7).standard_normal((frames, FRAME_SAMPLES))).astype(np.float32)


@contextmanager
def batch(model: LoadedModel, slots: int) -> Iterator[BatchedModel]:
    batched = BatchedModel(model, slots, GREEDY, MAX_SPAN, record=True)
    batched.start()
    batched.warm_up()
    try:
        yield batched
    finally:
        batched.close()


def converse(model: LoadedModel, frames: int, span_at: int) -> Conversation:
    """A session with a persona prefix and a span before frame `span_at`, its history taken after `frames` frames."""
    pcm = speech(frames + AFTER)
    decoded: list[torch.Tensor] = []
    said_next: list[np.ndarray] = []
    with batch(model, 1) as batched:
        decode = batched.codec.decode

        def recording(codes: torch.Tensor, active: torch.Tensor) -> torch.Tensor:
            if active[0]:
                decoded.append(codes[0].cpu())
            return decode(codes, active)

        batched.codec.decode = recording  # type: ignore[method-assign]
        batched.open_slot(0, build_prefix("You are Ada.", model.tokenizer, model.span, None, model.lm.delays))
        for i in range(frames + AFTER):
            if i == frames:
                history = SessionHistory.from_bytes(batched.history(0).to_bytes())
                heard = len(decoded)
            if i == span_at:
                batched.inject(0, span_like_block(batched.engine, 12, seed=1))
            output = batched.tick({0: pcm[i]})[0]
            if i >= frames:
                said_next.append(output.agent_pcm)  # type: ignore[union-attr]
    said = list(zip(decoded[heard:], said_next, strict=True))
    return Conversation(history, torch.stack(decoded[:heard], dim=1), said)


def resume_and_decode(model: LoadedModel, conversation: Conversation, cold: bool) -> list[np.ndarray]:
    """The PCM slot 1's decoder makes of the codes said after the history, once `conversation` resumed there next to a
    session in slot 0 (whose codec state is asserted untouched); `cold` resets the codec after the replay (as before
    the warm-up)."""
    pcm = speech(3)
    with batch(model, 2) as batched:
        batched.open_slot(0, None)
        for frame in pcm:
            batched.tick({0: frame})
        neighbour = state_rows([model.mimi], 0)
        batched.resume_slot(1, conversation.history)
        assert all(torch.equal(a, b) for a, b in zip(neighbour, state_rows([model.mimi], 0), strict=True))
        if cold:
            batched.codec.reset_slot(1)
        slot = torch.tensor([False, True])
        return [batched.codec.decode(torch.stack([codes, codes]), slot)[1].cpu().numpy()
                for codes, _ in conversation.said_next]


def gap(got: list[np.ndarray], conversation: Conversation) -> float:
    return float(max(np.abs(x - y).max() for x, (_, y) in zip(got, conversation.said_next, strict=True)))


@pytest.fixture(scope="module", params=["shorter", "longer"])
def long_and_short(request: pytest.FixtureRequest, model: LoadedModel) -> tuple[Conversation, int]:
    """A conversation shorter than the decoder's receptive field, and one longer (its span inside the field)."""
    field = decoder_receptive_field(model.mimi)
    frames, span_at = (40, 20) if request.param == "shorter" else (field + 30, field)
    return converse(model, frames, span_at), frames


def test_the_frames_read_back_from_a_history_are_the_ones_the_decoder_decoded(
        model: LoadedModel, long_and_short: tuple[Conversation, int]) -> None:
    conversation, _ = long_and_short
    field = decoder_receptive_field(model.mimi)
    read_back = spoken_frames(conversation.history, model.span, model.lm, field)
    assert read_back.shape[1] == min(field, conversation.decoded.shape[1])
    assert torch.equal(read_back, conversation.decoded[:, -read_back.shape[1]:])


def test_a_resumed_slot_decodes_what_the_uninterrupted_session_said_and_a_cold_decoder_does_not(
        model: LoadedModel, long_and_short: tuple[Conversation, int]) -> None:
    conversation, _ = long_and_short
    assert gap(resume_and_decode(model, conversation, cold=False), conversation) <= TOLERANCE
    assert gap(resume_and_decode(model, conversation, cold=True), conversation) >= COLD_GAP


def test_the_decoder_s_receptive_field_is_read_from_its_config(model: LoadedModel) -> None:
    """The tiny Mimi: one decoder layer of context 250 at 25 Hz (124.5 frames) and a few convolutions."""
    assert 125 <= decoder_receptive_field(model.mimi) <= 135


def test_a_session_that_has_not_spoken_yet_resumes_with_a_fresh_decoder(model: LoadedModel) -> None:
    """Its one step emitted nothing (the delays fill): no frame to warm with."""
    with batch(model, 2) as batched:
        batched.open_slot(0, None)
        batched.tick({0: speech(1)[0]})
        history = batched.history(0)
        assert spoken_frames(history, model.span, model.lm, batched.decoder_frames).shape[1] == 0
        batched.codec.reset_slot(1)
        fresh = state_rows([model.mimi], 1)
        batched.resume_slot(1, history)
        assert all(torch.equal(a, b) for a, b in zip(fresh, state_rows([model.mimi], 1), strict=True))
