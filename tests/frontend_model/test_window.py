"""A rolled window reads as [prefix + the recent frames] (frontend_model/engine/window.py), float32 on CPU.

The reference is a fresh engine prefilled with the same prefix, then fed the very inputs (summed embeddings, as
recorded from the long run's transformer) of the frames the window keeps, its token ring and LMGen offset those of
the rolled engine: teacher-forced, so the next steps read the same columns. Both families (the tiny Moshi-shaped
model, dep_q 8, and a PersonaPlex-shaped one, dep_q 16), a persona prefix with a voice prompt (codes, or replayed
embeddings), a span injected before the roll. With one transformer layer a roll is exact; deeper layers keep the keys
and values the recent frames got from the history the window drops, which the last test measures.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import pytest
import torch

from frontend_model.engine.batch_engine import BatchEngine
from frontend_model.engine.columns import forward_last
from frontend_model.engine.engine import GREEDY, Engine, StepResult
from frontend_model.engine.history import SessionHistory, replay, start_recording
from frontend_model.engine.window import WindowAhead, refill_window, roll_window, rotate_keys
from frontend_model.loading.loader import LoadedModel
from frontend_model.moshi_internals.kv_ring import attention_layers
from frontend_model.span.block import Prefix
from frontend_model.span.build import build_prefix
from tests.frontend_model.test_engine_equivalence import PERSONA, as_embeddings, voice_codes
from tests.support.engine import FAMILIES, span_like_block, tiny_model, user_frames

CONTEXT = 96
MAX_SPAN = 64  # the ring's capacity is CONTEXT + MAX_SPAN: the roll comes before it wraps over the prefix
PAST = CONTEXT + 8  # the offset at the roll: past the context, the prefix out of a sliding ring's reach
KEEP = 20
AFTER = 6  # steps compared after the roll
ATOL = 1e-4  # as test_engine_equivalence.py's one pass against column by column


@pytest.fixture(scope="module", params=FAMILIES, ids=lambda q: f"dep_q{q}")
def one_layer(request: pytest.FixtureRequest) -> LoadedModel:
    return tiny_model(request.param, context=CONTEXT, num_layers=1)


@pytest.fixture(scope="module", params=FAMILIES, ids=lambda q: f"dep_q{q}")
def two_layers(request: pytest.FixtureRequest) -> LoadedModel:
    return tiny_model(request.param, context=CONTEXT)


def persona_prefix(model: LoadedModel, voice: str) -> Prefix:
    prompt = voice_codes(model, 7)
    if voice == "embeddings":
        prompt = as_embeddings(model, prompt)
    prefix = build_prefix(PERSONA, model.tokenizer, model.span, prompt, model.lm.delays)
    assert prefix is not None and prefix.frames + KEEP < CONTEXT < PAST
    return prefix


@contextmanager
def recorded_inputs(model: LoadedModel) -> Iterator[tuple[list[torch.Tensor], list[list[torch.Tensor]]]]:
    """Every input the temporal transformer reads ([1, T, dim] a call, in order: one position each), and the token
    columns embedded for it (one list a row of the stream: [1, T] a call; a replayed voice prompt's have none)."""
    inputs: list[torch.Tensor] = []
    tokens: list[list[torch.Tensor]] = [[] for _ in range(model.span.num_rows)]
    lm = model.lm
    embeddings = [(0, lm.text_emb), *((cb + lm.audio_offset, emb) for cb, emb in enumerate(lm.emb))]
    handles = [lm.transformer.register_forward_pre_hook(lambda _, args: inputs.append(args[0].clone()))]
    for r, module in embeddings:
        handles.append(module.register_forward_pre_hook(lambda _, args, r=r: tokens[r].append(args[0].clone())))
    try:
        yield inputs, tokens
    finally:
        for handle in handles:
            handle.remove()


@dataclass
class Run:
    kept: torch.Tensor  # [1, KEEP, dim]: the inputs of the frames the window keeps
    columns: torch.Tensor  # [rows, KEEP]: their token columns
    ring: torch.Tensor  # LMGen's token ring as the steps after start from it
    before: list[torch.Tensor]  # each attention layer's K/V ring before the roll
    after: list[torch.Tensor]  # and after it, as the next step starts
    positions: list[tuple[int, int, int]]  # per layer: its offset, its ring's end offset, LMGen's offset
    user: torch.Tensor  # the user frames of the steps after
    logits: list[torch.Tensor]  # their text logits


def rings(engine: Engine) -> list[torch.Tensor]:
    return [attn._streaming_state.kv_cache.cache.clone() for attn in attention_layers(engine.model.lm.transformer)]


def positions(engine: Engine) -> list[tuple[int, int, int]]:
    offset = engine.offset
    return [(int(attn._streaming_state.offset[0]), int(attn._streaming_state.kv_cache.end_offset[0]), offset)
            for attn in attention_layers(engine.model.lm.transformer)]


def steps(engine: Engine, user: torch.Tensor) -> list[torch.Tensor]:
    logits = []
    for frame in user:
        engine.step(frame)
        assert engine.last_text_logits is not None
        logits.append(engine.last_text_logits.clone())
    return logits


def long_run(model: LoadedModel, prefix: Prefix, span_at: int | None = None, window: str = "roll") -> Run:
    """Prefix, steps (a span injected after `span_at` of them) up to PAST, the window rolled, refilled or left to
    slide, then AFTER steps."""
    user = user_frames(PAST + AFTER, seed=3)
    with Engine(model, GREEDY, max_span_frames=MAX_SPAN) as engine, recorded_inputs(model) as (inputs, tokens):
        engine.prefill(prefix)
        i = 0
        while engine.offset < PAST:
            engine.step(user[i])
            i += 1
            if i == span_at:
                engine.inject(span_like_block(engine, 9, seed=4))
        assert engine.offset == PAST
        kept = torch.cat(inputs, dim=1)[:, PAST - KEEP :]
        columns = torch.stack([torch.cat(row, dim=1)[0, -KEEP:] for row in tokens])
        before = rings(engine)
        if window == "roll":
            roll_window(engine, 0, prefix.frames, KEEP)
        elif window == "refill":
            refill_window(engine, 0, prefix.frames, columns)
        ring = engine.lm_gen._streaming_state.cache.clone()
        after = rings(engine)
        return Run(kept, columns, ring, before, after, positions(engine), user[i : i + AFTER],
                   steps(engine, user[i : i + AFTER]))


def fresh_run(model: LoadedModel, prefix: Prefix, rolled: Run) -> Run:
    """The prefix, then the kept frames' inputs right after it and the rolled engine's token ring: the same steps."""
    with Engine(model, GREEDY, max_span_frames=MAX_SPAN) as engine:
        engine.prefill(prefix)
        before = rings(engine)
        forward_last(model.lm, rolled.kept)
        state = engine.lm_gen._streaming_state
        state.offsets += KEEP
        state.cache.copy_(rolled.ring)
        return Run(rolled.kept, rolled.columns, rolled.ring, before, rings(engine), positions(engine), rolled.user,
                   steps(engine, rolled.user))


def gap(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    return max((x - y).abs().max().item() for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("span_at", [None, 30], ids=["no_span", "span"])
@pytest.mark.parametrize("voice", ["codes", "embeddings"])
def test_a_rolled_window_is_a_fresh_prefill_of_the_prefix_and_the_recent_frames(
        one_layer: LoadedModel, voice: str, span_at: int | None) -> None:
    prefix = persona_prefix(one_layer, voice)
    rolled = long_run(one_layer, prefix, span_at)
    fresh = fresh_run(one_layer, prefix, rolled)
    assert rolled.positions == fresh.positions == [(prefix.frames + KEEP,) * 3]
    assert gap(rolled.logits, fresh.logits) <= ATOL
    # Without the roll the ring slides: the prefix is out of reach, and the model reads another sequence.
    sliding = long_run(one_layer, prefix, span_at, window="slide")
    assert gap(sliding.logits, fresh.logits) > 1e-2


@pytest.mark.parametrize("span_at", [None, 30], ids=["no_span", "span"])
def test_a_refilled_window_is_a_fresh_prefill_at_every_depth(two_layers: LoadedModel, span_at: int | None) -> None:
    prefix = persona_prefix(two_layers, "embeddings")
    refilled = long_run(two_layers, prefix, span_at, window="refill")
    fresh = fresh_run(two_layers, prefix, refilled)
    window = prefix.frames + KEEP
    assert refilled.positions == fresh.positions == [(window,) * 3] * 2
    for before, after in zip(refilled.before, refilled.after, strict=True):
        assert torch.equal(before[:, :, :, : prefix.frames], after[:, :, :, : prefix.frames])
    assert gap([r[..., :window, :] for r in refilled.after], [r[..., :window, :] for r in fresh.after]) <= 1e-5
    assert gap(refilled.logits, fresh.logits) <= ATOL
    assert gap(long_run(two_layers, prefix, span_at, window="slide").logits, fresh.logits) > 1e-2


def test_deeper_layers_keep_what_the_recent_frames_saw(two_layers: LoadedModel) -> None:
    """Exact where a rotation can be: the prefix as prefilled in every layer, the first layer's keys and values of
    the kept frames those of a fresh prefill, every position counter; the second layer's keys and values of the kept
    frames were computed against the dropped history, and the next steps read them."""
    prefix = persona_prefix(two_layers, "codes")
    rolled = long_run(two_layers, prefix)
    fresh = fresh_run(two_layers, prefix, rolled)
    P, window = prefix.frames, prefix.frames + KEEP
    assert rolled.positions == fresh.positions == [(window,) * 3] * 2
    for before, after in zip(rolled.before, rolled.after, strict=True):
        assert torch.equal(before[:, :, :, :P], after[:, :, :, :P])
    assert (rolled.after[0][..., :window, :] - fresh.after[0][..., :window, :]).abs().max().item() <= 1e-5
    assert (rolled.after[1][..., P:window, :] - fresh.after[1][..., P:window, :]).abs().max().item() > 1e-3
    assert gap(rolled.logits, fresh.logits) > ATOL


def test_a_rotation_moves_a_key_to_its_new_position(two_layers: LoadedModel) -> None:
    """Thousands of positions (a 7B context is 3000 frames) in float32: the rotated key is the one RoPE computes at
    the new position, to the rounding RoPE itself makes there."""
    attn = attention_layers(two_layers.lm.transformer)[0]
    assert attn.rope is not None
    raw = torch.randn(1, 4, 5, 32, generator=torch.Generator().manual_seed(1))
    old, new = torch.tensor([2990]), torch.tensor([40])
    _, at_old = attn.rope(raw, raw, old)
    _, at_new = attn.rope(raw, raw, new)
    assert (rotate_keys(at_old, int(new - old), attn) - at_new).abs().max().item() <= 1e-3


TICKS = 70
ROLL_TICKS = (44, 50)  # each slot's: a batch's rows roll at their own ticks


def window_at(engine: Engine, row: int, prefix: Prefix, window: str, columns: torch.Tensor) -> None:
    if window == "roll":
        roll_window(engine, row, prefix.frames, KEEP)
    else:
        refill_window(engine, row, prefix.frames, columns)


def alone(model: LoadedModel, prefix: Prefix, seed: int, roll_tick: int, window: str
          ) -> tuple[list[int | None], torch.Tensor]:
    """One session alone, its window moved before `roll_tick`: (its text tokens, the columns it kept)."""
    user = user_frames(TICKS, seed)
    texts = []
    with Engine(model, GREEDY, max_span_frames=MAX_SPAN) as engine, recorded_inputs(model) as (_, tokens):
        engine.prefill(prefix)
        for tick in range(TICKS):
            if tick == roll_tick:
                columns = torch.stack([torch.cat(row, dim=1)[0, -KEEP:] for row in tokens])
                window_at(engine, 0, prefix, window, columns)
            texts.append(engine.step(user[tick]).text_token)
    return texts, columns


@pytest.fixture(scope="module")
def personaplex() -> LoadedModel:
    return tiny_model(16, context=CONTEXT)


@pytest.mark.parametrize("window", ["roll", "refill"])
def test_each_row_of_a_batch_moves_its_window_alone(personaplex: LoadedModel, window: str) -> None:
    """One family only: what a row of a batch is does not depend on it, and a batch on CPU is slow."""
    prefix = persona_prefix(personaplex, "codes")
    seeds = (5, 6)
    runs = [alone(personaplex, prefix, seed, at, window) for seed, at in zip(seeds, ROLL_TICKS, strict=True)]
    users = [user_frames(TICKS, seed) for seed in seeds]
    texts: list[list[int | None]] = [[], []]
    with BatchEngine(personaplex, 2, GREEDY, max_span_frames=MAX_SPAN) as engine:
        for slot in range(2):
            engine.prefill_slot(slot, prefix)
        for tick in range(TICKS):
            for slot, at in enumerate(ROLL_TICKS):
                if tick == at:
                    window_at(engine, slot, prefix, window, runs[slot][1])
            results = engine.step_slots(torch.stack([u[tick] for u in users]), torch.ones(2, dtype=torch.bool))
            for slot, result in enumerate(results):
                assert isinstance(result, StepResult)
                texts[slot].append(result.text_token)
    assert texts == [run[0] for run in runs]


def test_a_window_needs_the_frames_it_keeps(two_layers: LoadedModel) -> None:
    prefix = persona_prefix(two_layers, "codes")
    with Engine(two_layers, GREEDY, max_span_frames=MAX_SPAN) as engine:
        engine.prefill(prefix)
        with pytest.raises(ValueError, match="needs an offset of at least"):
            roll_window(engine, 0, prefix.frames, 1)


def test_the_session_history_follows_a_refilled_window(two_layers: LoadedModel) -> None:
    """The recorded columns move with the window, so a session resumed from its history after a roll (issue 36) reads
    [prefix + kept frames] and steps as the rolled one does."""
    prefix = persona_prefix(two_layers, "codes")
    user = user_frames(PAST + AFTER, seed=3)
    stepped = PAST - prefix.frames
    with Engine(two_layers, GREEDY, max_span_frames=MAX_SPAN) as engine:
        log = start_recording(engine)
        engine.prefill(prefix)
        for frame in user[:stepped]:
            engine.step(frame)
        refill_window(engine, 0, prefix.frames, log.recent(0, engine.offset, KEEP).long())
        history = SessionHistory.of(engine)
        rolled = steps(engine, user[stepped : stepped + AFTER])
    assert (history.start, history.offset) == (0, prefix.frames + KEEP)
    with Engine(two_layers, GREEDY, max_span_frames=MAX_SPAN) as resumed:
        replay(resumed, history)
        assert gap(steps(resumed, user[stepped : stepped + AFTER]), rolled) <= ATOL


def kv(model: LoadedModel, frames: int) -> list[torch.Tensor]:
    return [attn._streaming_state.kv_cache.cache[:, 0, :, :frames].clone()
            for attn in attention_layers(model.lm.transformer)]


def test_a_window_built_ahead_while_the_session_steps_is_the_refilled_window(two_layers: LoadedModel) -> None:
    """Begun three frames before the roll and fed a chunk between steps, the window swapped in holds the keys and
    values, and gives the next logits, of `refill_window` of the same frames at the same point."""
    prefix = persona_prefix(two_layers, "codes")
    user = user_frames(PAST + AFTER, seed=5)
    begun = PAST - prefix.frames - 3  # frames stepped when the build begins; three more step during it
    results = []
    for how in ("refill", "ahead"):
        with Engine(two_layers, GREEDY, max_span_frames=MAX_SPAN) as engine:
            log = start_recording(engine)
            engine.prefill(prefix)
            steps(engine, user[:begun])
            if how == "ahead":
                ahead = WindowAhead(engine, 4)
                ahead.begin(0, prefix.frames, PAST - KEEP)
                for frame in user[begun : begun + 3]:
                    assert ahead.feed(4) > 0  # not caught up: the session steps on
                    engine.step(frame)
                assert ahead.feed(KEEP) == 0  # the rest at once, as when the roll is due
                assert ahead.swap() == KEEP
                ahead.close()
            else:
                steps(engine, user[begun : begun + 3])
                refill_window(engine, 0, prefix.frames, log.recent(0, engine.offset, KEEP).long())
            window = kv(two_layers, prefix.frames + KEEP)
            results.append((window, steps(engine, user[PAST - prefix.frames : PAST - prefix.frames + AFTER])))
    (refilled, after_refill), (built, after_build) = results
    assert max((a - b).abs().max().item() for a, b in zip(refilled, built, strict=True)) <= 1e-5
    assert gap(after_refill, after_build) <= ATOL


def test_a_window_built_ahead_starts_after_the_prefix_and_goes_in_only_caught_up(two_layers: LoadedModel) -> None:
    prefix = persona_prefix(two_layers, "codes")
    with Engine(two_layers, GREEDY, max_span_frames=MAX_SPAN) as engine:
        with pytest.raises(ValueError, match="start the engine recording"):
            WindowAhead(engine, 8)
        start_recording(engine)
        with pytest.raises(ValueError, match="power of two"):
            WindowAhead(engine, 12)
        engine.prefill(prefix)
        steps(engine, user_frames(KEEP, seed=2))
        ahead = WindowAhead(engine, 8)
        with pytest.raises(ValueError, match="starts between it and the offset"):
            ahead.begin(0, prefix.frames, prefix.frames - 1)
        ahead.begin(0, prefix.frames, prefix.frames + 2)
        ahead.feed(8)
        with pytest.raises(ValueError, match="fed up to"):
            ahead.swap()
        ahead.close()


@pytest.mark.parametrize("window", ["roll", "refill", "ahead"])
def test_a_window_moved_as_served_keeps_no_autograd_graph(two_layers: LoadedModel, window: str) -> None:
    """Served weights require grad (moshi's modules as loaded): a refill outside `no_grad` chained every roll's
    activations to the cache, and a long call's memory grew about 1.3 MB a second on the tiny model."""
    prefix = persona_prefix(two_layers, "codes")
    with Engine(two_layers, GREEDY, max_span_frames=MAX_SPAN) as engine:
        log = start_recording(engine)
        engine.prefill(prefix)
        for frame in user_frames(PAST - prefix.frames, seed=3):
            engine.step(frame)
        if window == "roll":
            roll_window(engine, 0, prefix.frames, KEEP)
        elif window == "refill":
            refill_window(engine, 0, prefix.frames, log.recent(0, engine.offset, KEEP).long())
        else:
            ahead = WindowAhead(engine, 8)
            ahead.begin(0, prefix.frames, engine.offset - KEEP)
            ahead.feed(KEEP)
            ahead.swap()
            ahead.close()
        assert any(p.requires_grad for p in two_layers.lm.parameters())
        for attn in attention_layers(two_layers.lm.transformer):
            cache = attn._streaming_state.kv_cache.cache
            assert cache.grad_fn is None and not cache.requires_grad
