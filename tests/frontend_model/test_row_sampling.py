"""Per-session sampling in one batch: each row samples with its own settings, and a seed reproduces a session's
output whatever shares its ticks (float32, tiny profile)."""

from __future__ import annotations

import pytest
import torch

from frontend_model.engine.batch_engine import BatchEngine
from frontend_model.engine.engine import GREEDY, Engine
from frontend_model.loading.loader import LoadedModel, load_model
from frontend_model.moshi_internals.row_sampling import RowSampler, RowSampling, SamplingConfig, Stream
from frontend_model.span.build import build_prefix
from tests.support.engine import user_frames

CONTEXT = 8
TICKS = 24  # > CONTEXT: the rings wrap


@pytest.fixture(scope="module")
def model() -> LoadedModel:
    return load_model("tiny", device="cpu", dtype=torch.float32, context=CONTEXT)


def sampling(temperature: float, topk: int, seed: int) -> RowSampling:
    return RowSampling(temperature, topk, temperature, topk, seed, seed + 1)


GREEDY_ROW = sampling(0.0, 25, 0)
HOT = sampling(1.2, 0, 11)
WARM = sampling(0.7, 50, 42)


def run_pair(model: LoadedModel, rows: list[tuple[RowSampling, int]], compact: bool = True,
             personas: tuple[str, ...] = ()) -> list[list[tuple]]:
    """Slots stepped together for TICKS; each row is (sampling, user-audio seed), with a persona prefilled where
    `personas` has a non-empty one for its slot (its prefill samples the pending column); outputs per slot."""
    frames = [user_frames(TICKS, audio) for _, audio in rows]
    got: list[list[tuple]] = [[] for _ in rows]
    with BatchEngine(model, len(rows), SamplingConfig(), max_span_frames=48) as engine:
        engine.compact = compact
        for slot, (row, _) in enumerate(rows):
            engine.reset_slot(slot, row)
            persona = personas[slot] if slot < len(personas) else ""
            if persona:
                prefix = build_prefix(persona, model.tokenizer, model.span, None, model.lm.delays)
                assert prefix is not None
                engine.prefill_slot(slot, prefix)
        active = torch.ones(len(rows), dtype=torch.bool)
        for tick in range(TICKS):
            results = engine.step_slots(torch.stack([f[tick] for f in frames]), active)
            for slot, result in enumerate(results):
                assert result is not None
                codes = None if result.agent_codes is None else tuple(result.agent_codes.tolist())
                got[slot].append((result.text_token, codes))
    return got


def test_a_seeded_session_reproduces_next_to_any_neighbour(model: LoadedModel) -> None:
    first = run_pair(model, [(WARM, 1), (HOT, 2)])
    again = run_pair(model, [(sampling(0.3, 5, 7), 9), (WARM, 1)], compact=False)  # other neighbour, other slot
    assert again[1] == first[0]
    greedy_neighbour = run_pair(model, [(HOT, 2), (GREEDY_ROW, 3)])
    assert greedy_neighbour[0] == first[1]


def test_a_seeded_session_with_a_persona_reproduces_next_to_any_neighbour(model: LoadedModel) -> None:
    first = run_pair(model, [(HOT, 1), (WARM, 2)], personas=("You are kind.", "Be brief."))
    again = run_pair(model, [(HOT, 1), (sampling(0.9, 3, 5), 4)], personas=("You are kind.",))
    assert again[0] == first[0]


def test_the_seed_and_the_settings_decide_the_draws(model: LoadedModel) -> None:
    base = run_pair(model, [(WARM, 1), (GREEDY_ROW, 1)])
    reseeded = run_pair(model, [(RowSampling(0.7, 50, 0.7, 50, 43, 43), 1), (GREEDY_ROW, 1)])
    assert reseeded[0] != base[0]
    assert base[0] != base[1]  # sampled, not greedy: the same user audio gives another output


def test_a_greedy_session_next_to_a_sampled_one_is_the_greedy_session_alone(model: LoadedModel) -> None:
    frames = user_frames(TICKS, 5)
    with Engine(model, GREEDY, max_span_frames=16) as engine:
        alone = [engine.step(frames[tick]) for tick in range(TICKS)]
    expected = [(r.text_token, None if r.agent_codes is None else tuple(r.agent_codes.tolist())) for r in alone]
    for greedy in (GREEDY_ROW, RowSampling(0.9, 1, 0.9, 1, 3, 4)):  # temperature 0, or top-k 1
        together = run_pair(model, [(HOT, 6), (greedy, 5)])
        assert together[1] == expected


def test_rows_sample_with_their_own_settings() -> None:
    torch.manual_seed(0)
    logits = torch.randn(3, 1, 1, 100)
    sampler = RowSampler(3, GREEDY_ROW, torch.device("cpu"))
    sampler.set_row(1, sampling(1.0, 5, 1))
    sampler.set_row(2, sampling(5.0, 0, 2))
    top5 = set(logits[1, 0, 0].topk(5).indices.tolist())
    drawn: list[set[int]] = [set(), set(), set()]
    with sampler.installed(torch.ones(3, dtype=torch.bool)):
        for _ in range(200):
            tokens = sampler.sample(logits, Stream.TEXT)
            assert tokens.shape == (3, 1, 1)
            for row in range(3):
                drawn[row].add(int(tokens[row, 0, 0]))
    assert drawn[0] == {int(logits[0, 0, 0].argmax())}
    assert drawn[1] <= top5 and len(drawn[1]) > 1
    assert len(drawn[2]) > 30  # hot and unlimited: far more than any top-k above


def test_an_inactive_row_does_not_draw() -> None:
    logits = torch.randn(2, 1, 1, 50)
    sampler = RowSampler(2, sampling(1.0, 0, 9), torch.device("cpu"))
    with sampler.installed(torch.tensor([True, False])):
        sampler.sample(logits, Stream.AUDIO)
    assert sampler.draws.tolist() == [1, 0]


def test_new_settings_go_on_with_the_draws_and_new_seeds_restart_them() -> None:
    """A `session.update` mid-stream: without seeds the row keeps its place in its noise sequence; with the seeds
    it started from, the next draws repeat its first ones."""
    logits = torch.randn(1, 1, 1, 64)
    sampler = RowSampler(1, WARM, torch.device("cpu"))
    with sampler.installed(torch.ones(1, dtype=torch.bool)):
        first = [int(sampler.sample(logits, Stream.TEXT)) for _ in range(20)]
        sampler.set_row(0, sampling(0.9, 50, 42), restart=False)
        assert sampler.draws.tolist() == [20]
        assert float(sampler.temperature[Stream.TEXT][0]) == pytest.approx(0.9)
        sampler.set_row(0, WARM, restart=True)
        assert sampler.draws.tolist() == [0]
        assert [int(sampler.sample(logits, Stream.TEXT)) for _ in range(20)] == first
        assert len(set(first)) > 1  # sampled, so the repeat is the seed's doing


def test_moshi_sampling_outside_the_sampler_fails_loudly(model: LoadedModel) -> None:
    with Engine(model, max_span_frames=16) as engine, pytest.raises(TypeError):
        engine.lm_gen.step(user_frames(1, 0)[0].view(1, -1, 1))
