"""A session's history, replayed into a fresh engine or slot, resumes it exactly (float32, sampled, fixed seeds).

The original session is a persona prefix, steps, a span and more steps; its history goes through bytes and is
replayed elsewhere, and the next steps' text logits and sampled tokens are compared with the session's own. Both
families (the tiny Moshi-shaped model, dep_q 8, and a PersonaPlex-shaped one, dep_q 16), with a context of 3000
(the history holds everything) and of 8 (it holds only the receptive field, 2 layers x 7 columns).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import torch

from frontend_model.engine.batch_engine import BatchEngine
from frontend_model.engine.engine import SAMPLED, Engine, EngineStateError
from frontend_model.engine.history import (
    EMBEDDED,
    MAGIC,
    HistoryFormatError,
    SessionHistory,
    receptive_field,
    replay,
    start_recording,
)
from frontend_model.loading.loader import LoadedModel
from frontend_model.moshi_internals.row_sampling import RowSampling
from frontend_model.span.block import Prefix
from frontend_model.span.build import build_prefix
from tests.support.engine import FAMILIES, snapshot, span_like_block, tiny_model, user_frames

MAX_SPAN = 64
SEEDS = RowSampling.from_config(SAMPLED, text_seed=7, audio_seed=11)
PERSONA = "You are a helpful travel assistant called Ada."
AFTER = 12  # steps compared after the resume
TOLERANCE = 1e-4  # text logits, as tests/frontend_model/test_engine_equivalence.py


@pytest.fixture(scope="module", params=[(q, c) for q in FAMILIES for c in (3000, 8)],
                ids=lambda p: f"dep_q{p[0]}-context{p[1]}")
def model(request: pytest.FixtureRequest) -> LoadedModel:
    return tiny_model(request.param[0], context=request.param[1])


@contextmanager
def recording(model: LoadedModel, keep: int | None = None) -> Iterator[Engine]:
    with Engine(model, SAMPLED, max_span_frames=MAX_SPAN) as engine:
        assert engine.sampler is not None
        engine.sampler.set_row(0, SEEDS)
        start_recording(engine, keep)
        yield engine


def persona(model: LoadedModel) -> Prefix:
    prefix = build_prefix(PERSONA, model.tokenizer, model.span, None, model.lm.delays)
    assert prefix is not None
    return prefix


def converse(engine: Engine, user: torch.Tensor, warm: int) -> None:
    """Prefix, `warm` steps, a 16-frame span, 3 steps."""
    engine.prefill(persona(engine.model))
    for i in range(warm):
        engine.step(user[i])
    engine.inject(span_like_block(engine, 16, seed=warm))
    for i in range(warm, warm + 3):
        engine.step(user[i])


def go_on(engine: Engine, user: torch.Tensor) -> tuple[torch.Tensor, list[tuple]]:
    """The next steps: the first one's text logits, and every step's sampled text token and agent codes."""
    outputs, logits = [], None
    for frame in user:
        out = engine.step(frame)
        if logits is None:
            assert engine.last_text_logits is not None
            logits = engine.last_text_logits.clone()
        outputs.append((out.text_token, None if out.agent_codes is None else out.agent_codes.tolist()))
    assert logits is not None
    return logits, outputs


def through_bytes(history: SessionHistory) -> SessionHistory:
    blob = history.to_bytes()
    back = SessionHistory.from_bytes(blob)
    assert torch.equal(back.columns, history.columns) and torch.equal(back.pending, history.pending)
    assert (back.start, back.sampling, back.draws) == (history.start, history.sampling, history.draws)
    return back


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a - b).abs().max().item()


@pytest.mark.parametrize("warm", [5, 40])
def test_a_replayed_history_resumes_the_session(model: LoadedModel, warm: int) -> None:
    user = user_frames(warm + 3 + AFTER, seed=warm)
    with recording(model) as original:
        converse(original, user, warm)
        history = through_bytes(SessionHistory.of(original))
        assert history.offset == original.offset
        positions = snapshot(original)
        expected = go_on(original, user[warm + 3 :])
    field = receptive_field(original)
    if history.offset <= field:
        assert history.start == 0, "the whole session, prefix first"
    else:
        assert history.columns.shape[1] == field, "past the receptive field only that much is kept"
    with recording(model) as resumed:
        replay(resumed, history)
        resumed_positions = snapshot(resumed)
        logits, outputs = go_on(resumed, user[warm + 3 :])
    assert torch.equal(resumed_positions.offsets, positions.offsets)
    assert resumed_positions.offset_cpu == positions.offset_cpu
    for name in ("kv_end", "attn_offsets"):  # the keys sit at the positions they had, RoPE rotations included
        assert all(torch.equal(a, b) for a, b in zip(getattr(resumed_positions, name), getattr(positions, name),
                                                     strict=True)), name
    assert max_diff(logits, expected[0]) <= TOLERANCE
    assert outputs == expected[1]
    assert any(text is not None for text, _ in outputs)


def test_only_the_attention_window_is_not_enough(model: LoadedModel) -> None:
    """Why the receptive field is kept: with the last `context` columns only, the upper layers' oldest keys are
    computed from columns that are no longer there."""
    if model.lm.transformer.layers[0].self_attn.context != 8:
        pytest.skip("the short-context model only")
    user = user_frames(40 + 3 + AFTER, seed=3)
    with recording(model, keep=8) as original:
        converse(original, user, 40)
        history = SessionHistory.of(original)
        expected = go_on(original, user[43:])
    with recording(model) as resumed:
        replay(resumed, history)
        logits, _ = go_on(resumed, user[43:])
    assert max_diff(logits, expected[0]) > 1e-3


def test_a_batch_slot_resumes_in_another_batch_among_other_sessions(model: LoadedModel) -> None:
    """Recorded in slot 1 of a batch whose other slots step too, resumed in slot 2 of another batch while slot 0
    there runs its own session, which the replay leaves as it was."""
    user = user_frames(60, seed=8)
    others = user_frames(60, seed=9)
    active = torch.ones(3, dtype=torch.bool)
    with BatchEngine(model, 3, SAMPLED, max_span_frames=MAX_SPAN) as batch:
        start_recording(batch)
        batch.reset_slot(1, SEEDS)
        batch.prefill_slot(1, persona(model))
        for i in range(20):
            batch.step_slots(torch.stack([others[i], user[i], others[i + 1]]), active)
        batch.inject_slot(1, span_like_block(batch, 16, seed=1))
        for i in range(20, 25):
            batch.step_slots(torch.stack([others[i], user[i], others[i + 1]]), active)
        history = through_bytes(SessionHistory.of(batch, 1))
        expected = [batch.step_slots(torch.stack([others[i], user[i], others[i]]), active)[1] for i in range(25, 35)]

    def neighbour_and_resumed(resume: bool) -> tuple[list, list]:
        with BatchEngine(model, 3, SAMPLED, max_span_frames=MAX_SPAN) as other:
            start_recording(other)
            other.reset_slot(0, SEEDS)
            for i in range(5):
                other.step_slots(torch.stack([others[i], others[i], others[i]]), torch.tensor([True, False, False]))
            if resume:
                replay(other, history, slot=2)
            mask = torch.tensor([True, False, resume])
            steps = [other.step_slots(torch.stack([others[i], others[i], user[i]]), mask) for i in range(25, 35)]
        return [s[0] for s in steps], [s[2] for s in steps]

    neighbour, resumed = neighbour_and_resumed(resume=True)
    alone, _ = neighbour_and_resumed(resume=False)
    assert [(r.text_token, r.agent_codes.tolist()) for r in resumed] == \
        [(e.text_token, e.agent_codes.tolist()) for e in expected]
    assert [(r.text_token, r.agent_codes.tolist()) for r in neighbour] == \
        [(a.text_token, a.agent_codes.tolist()) for a in alone]


def test_a_history_is_small() -> None:
    """About 425 bytes a second: 17 rows of int16 a frame at 12.5 frames a second, and a small header."""
    columns = torch.randint(0, 2048, (17, 125))
    columns[0] = torch.randint(0, 32000, (125,))
    history = SessionHistory(0, columns, columns[:, -1].clone(), SEEDS, 3)
    blob = history.to_bytes()
    assert len(blob) < 1000 + 17 * 2 * 125
    assert SessionHistory.from_bytes(blob).columns.tolist() == columns.tolist()


@pytest.mark.parametrize(("damage", "message"), [
    (lambda b: b"XXXX" + b[4:], "not a session history"),
    (lambda b: b[:4] + bytes([2]) + b[5:], "version 2"),
    (lambda b: b[:-3], "does not hold"),
    (lambda b: b[:9] + b"{" * 10 + b[19:], "corrupt session history header"),
    (lambda b: b[:3], "at least"),
])
def test_a_corrupt_or_unknown_blob_is_refused(damage, message: str) -> None:
    blob = SessionHistory(4, torch.zeros(17, 5, dtype=torch.long), torch.zeros(17, dtype=torch.long), SEEDS, 0)
    good = blob.to_bytes()
    assert good[:4] == MAGIC
    with pytest.raises(HistoryFormatError, match=message):
        SessionHistory.from_bytes(damage(good))


def test_replay_needs_a_fresh_slot_and_a_recording_engine() -> None:
    model = tiny_model(8, context=8)
    with Engine(model, SAMPLED, max_span_frames=MAX_SPAN) as engine:
        with pytest.raises(EngineStateError, match="start_recording"):
            SessionHistory.of(engine)
        start_recording(engine)
        engine.step(user_frames(1, seed=0)[0])
        history = SessionHistory.of(engine)
        with pytest.raises(EngineStateError, match="reset it first"):
            replay(engine, history)


def test_a_voice_prompt_s_embeddings_are_passed_back_to_the_replay(model: LoadedModel) -> None:
    """A PersonaPlex voice prompt fills the stream's first positions with embeddings, not columns: the history marks
    them, and the replay takes them from the voice while the history still reaches them."""
    if model.lm.transformer.layers[0].self_attn.context == 8:
        pytest.skip("the long-context model only: its history reaches the voice prompt")
    generator = torch.Generator().manual_seed(5)
    block = persona(model).block
    voice = Prefix(block, torch.randn(6, model.lm.dim, generator=generator).to(model.device), block.tokens[:, 0])
    user = user_frames(8 + AFTER, seed=6)
    with recording(model) as original:
        original.prefill(voice)
        for i in range(8):
            original.step(user[i])
        history = through_bytes(SessionHistory.of(original))
        expected = go_on(original, user[8:])
    assert history.start == 0 and (history.columns[:, :6] == EMBEDDED).all()
    with recording(model) as resumed, pytest.raises(ValueError, match="replayed embeddings"):
        replay(resumed, history)
    with recording(model) as resumed:
        replay(resumed, history, embeddings=voice.embeddings)
        logits, outputs = go_on(resumed, user[8:])
    assert max_diff(logits, expected[0]) <= TOLERANCE
    assert outputs == expected[1]


def test_a_session_that_never_stepped_resumes(model: LoadedModel) -> None:
    """No prefix and no step yet (a client that connected and left): an empty history replays to a fresh slot that
    steps as the original would."""
    user = user_frames(AFTER, seed=5)
    with recording(model) as original:
        history = through_bytes(SessionHistory.of(original))
        expected = go_on(original, user)
    assert history.columns.shape[1] == 0
    with recording(model) as resumed:
        replay(resumed, history)
        logits, outputs = go_on(resumed, user)
    assert max_diff(logits, expected[0]) <= TOLERANCE
    assert outputs == expected[1]
