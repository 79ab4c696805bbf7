"""One-pass injection and prefill leave exactly the state of the same columns fed one by one (float32, greedy).

Both families: the tiny Moshi-shaped model (dep_q 8) and a PersonaPlex-shaped one (dep_q 16, stepped on its agent
rows). The references here are written against moshi itself, not against the engine's code: a span is its columns
through `forward_text` one at a time (T=1), then the pending column's text and agent semantic sampled from the last
of them and the column moved on; a prefix is its columns one at a time and then one ordinary LMGen step on the last,
with the last frame's agent acoustic codes kept. (That the layouts are the trained ones is
tests/frontend_model/test_engine_convention.py's subject.)
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import pytest
import torch

from frontend_model.engine import engine as engine_module
from frontend_model.engine.columns import embed_columns, forward_last
from frontend_model.engine.engine import GREEDY, Engine
from frontend_model.loading.loader import LoadedModel
from frontend_model.span.block import Block, Prefix
from frontend_model.span.build import build_prefix, silence_frames
from frontend_model.span.convention import Conversation, assemble
from frontend_model.span.voice_prompt import VoicePrompt
from tests.support.engine import FAMILIES, assert_same_state, snapshot, span_like_block, tiny_model, user_frames

CONTEXT = 8
MAX_SPAN = 64
WRAPPED = CONTEXT + MAX_SPAN + 9  # steps before injection: the KV ring (capacity context + max span) has wrapped
PERSONAPLEX_RING = 4  # columns in PersonaPlex's token ring: the shape of a voice prompt's `cache`


@pytest.fixture(scope="module", params=FAMILIES, ids=lambda q: f"dep_q{q}")
def model(request: pytest.FixtureRequest) -> LoadedModel:
    return tiny_model(request.param, context=CONTEXT)


Force = Callable[[Engine, object], None]


def run(model: LoadedModel, warm: int, forced: object, force: Force, user: torch.Tensor, after: int = 20
        ) -> tuple[object, torch.Tensor, list[tuple]]:
    """Warm steps, the forced span or prefix, then `after` steps: (state, next-step logits, outputs after)."""
    with Engine(model, GREEDY, max_span_frames=MAX_SPAN) as engine:
        for i in range(warm):
            engine.step(user[i])
        force(engine, forced)
        state = snapshot(engine)
        continuation = []
        logits = None
        for i in range(after):
            out = engine.step(user[warm + i])
            if logits is None:
                logits = engine.last_text_logits.clone()
            codes = None if out.agent_codes is None else tuple(out.agent_codes.tolist())
            continuation.append((out.text_token, codes))
        return state, logits, continuation


def assert_same_run(a: tuple, b: tuple) -> None:
    assert_same_state(a[0], b[0])
    assert (a[1] - b[1]).abs().max().item() <= 1e-4
    assert a[2] == b[2]


# spans ------------------------------------------------------------------------------------------------------------
def greedy_text(engine: Engine, logits: torch.Tensor) -> torch.Tensor:
    logits = logits.clone()
    logits[..., sorted(engine.model.suppressed_text_ids)] = float("-inf")
    return logits.argmax(dim=-1).reshape(-1)


def read_pending_later(engine: Engine, frames: int, out: torch.Tensor, logits: torch.Tensor) -> None:
    """The pending column, its text and agent semantic sampled (greedy) from the last forced position, is read
    `frames` positions later."""
    state = engine.lm_gen._streaming_state
    at = int(state.offsets[0]) % state.cache.shape[2]
    delays = torch.tensor(engine.model.lm.delays, device=engine.model.device)
    text = greedy_text(engine, logits)
    assert engine.sampler is not None
    with engine.sampler.installed(state.exec_mask):
        semantic = engine.lm_gen.depformer_step(text, out)[:, 0]
    pending = state.cache[0, :, at].clone()
    pending[0], pending[1] = text[0], semantic[0]
    state.cache[0, :, at] = torch.where(state.offsets[0] <= delays, state.initial[0, :, 0], pending)
    for _ in range(frames):
        state.cache.copy_(torch.roll(state.cache, 1, dims=2))
        state.offsets += 1
        state.offset_cpu += 1


def columns_one_by_one(engine: Engine, block: Block) -> None:
    """The trained layout, column by column: each block column verbatim (T=1), the pending column read after."""
    for i in range(block.frames):
        out, logits = engine.model.lm.forward_text(block.tokens[None, :, i : i + 1].to(engine.model.device))
    read_pending_later(engine, block.frames, out, logits)


def one_pass(engine: Engine, block: object) -> None:
    engine.inject(block)  # type: ignore[arg-type]


@pytest.mark.parametrize("frames", [1, 16, 64])
@pytest.mark.parametrize("warm", [1, 12, WRAPPED], ids=["offset1", "offset12", "wrapped"])
def test_inject_equals_the_columns_one_by_one(model: LoadedModel, frames: int, warm: int) -> None:
    user = user_frames(warm + 20, seed=warm)
    block = span_like_block(Engine(model, GREEDY, max_span_frames=MAX_SPAN), frames, seed=frames)
    fast = run(model, warm, block, one_pass, user)
    slow = run(model, warm, block, columns_one_by_one, user)
    assert_same_run(fast, slow)
    assert fast[0].offsets.item() == warm + frames
    if frames == 16:  # the engine's own column-by-column path, which benchmarks time
        assert_same_run(fast, run(model, warm, block, lambda e, b: e.inject_stepwise(b), user))


def test_ring_of_exactly_context_breaks_after_wrap(model: LoadedModel, monkeypatch: pytest.MonkeyPatch) -> None:
    """The reason for the widened ring: without it, one-pass injection after a wrap is not exact."""
    monkeypatch.setattr(engine_module, "wide_rings", lambda transformer, extra: contextlib.nullcontext(CONTEXT))
    warm = 3 * CONTEXT
    user = user_frames(warm + 20, seed=5)
    block = span_like_block(Engine(model, GREEDY), 16, seed=3)
    fast = run(model, warm, block, one_pass, user)
    slow = run(model, warm, block, columns_one_by_one, user)
    assert (fast[1] - slow[1]).abs().max().item() > 1e-3


def test_the_first_frame_after_a_span_is_sampled_from_the_close_position(model: LoadedModel) -> None:
    """The frame pending when the span came is read after the block, its text token now the one the close position
    predicts (through moshi's `forward_text`, one column at a time), not the one sampled before the block. (Before
    issue 21 it kept the text and agent semantic sampled before the span.)"""
    user = user_frames(30, seed=11)
    block = span_like_block(Engine(model, GREEDY), 16, seed=2)
    texts = []
    with Engine(model, GREEDY, max_span_frames=MAX_SPAN) as engine:
        for i in range(12):
            engine.step(user[i])
        state = engine.lm_gen._streaming_state
        before = state.cache[0, 0, int(state.offsets[0]) % state.cache.shape[2]].item()
        for i in range(block.frames):
            _, logits = model.lm.forward_text(block.tokens[None, :, i : i + 1].to(model.device))
        texts.append(int(greedy_text(engine, logits)[0]))
    with Engine(model, GREEDY, max_span_frames=MAX_SPAN) as engine:
        for i in range(12):
            engine.step(user[i])
        engine.inject(block)
        out = engine.step(user[12])
    assert out.text_token == texts[0] != model.span.close_id
    assert before != texts[0], "this seed's close position predicts another token than the step before the span"


# prefixes ---------------------------------------------------------------------------------------------------------
def stream_columns(frames: torch.Tensor, delays: list[int]) -> torch.Tensor:
    """Frames [rows, m] through the delays from the start of the stream, as PersonaPlex's runtime lays them."""
    columns = frames.clone()
    for r, d in enumerate(delays):
        columns[r, d:] = frames[r, : frames.shape[1] - d]
    return columns


def prefill_by_steps(engine: Engine, prefix: object) -> None:
    """All columns but the last one by one, then an ordinary LMGen step on the last (its user rows as the step's
    input) that samples the next column's text and semantic; that column keeps the last frame's acoustic codes."""
    assert isinstance(prefix, Prefix)
    lm = engine.model.lm
    state = engine.lm_gen._streaming_state
    agent = engine.span.agent_codebooks
    device = lm.device
    frames = prefix.block.tokens.to(device)
    if prefix.embeddings is not None:
        for embedding in prefix.embeddings:
            forward_last(lm, embedding.view(1, 1, -1).to(device, lm.dtype))
        columns = stream_columns(torch.cat([prefix.carry.to(device)[:, None], frames], dim=1), lm.delays)[:, 1:]
    else:  # as trained: the stream's initial column first
        columns = stream_columns(torch.cat([state.initial[0], frames], dim=1), lm.delays)
    positions = prefix.replayed + torch.arange(columns.shape[1], device=device)
    columns = torch.where(positions[None] <= torch.tensor(lm.delays, device=device)[:, None], state.initial[0], columns)
    for j in range(columns.shape[1] - 1):
        lm.forward_text(columns[None, :, j : j + 1])
    last, ring_len = prefix.frames - 1, state.cache.shape[2]
    state.offsets += last
    state.offset_cpu += last
    state.cache[0, :, last % ring_len] = columns[:, -1]
    assert engine.sampler is not None
    with engine.sampler.installed(state.exec_mask):
        engine.lm_gen.step(frames[None, 1 + agent :, -1:])
    state.cache[0, 2 : 1 + agent, prefix.frames % ring_len] = frames[2 : 1 + agent, -1]


def prefill(engine: Engine, prefix: object) -> None:
    engine.prefill(prefix)  # type: ignore[arg-type]


def voice_codes(model: LoadedModel, frames: int) -> VoicePrompt:
    codes = torch.randint(0, 2048, (model.span.agent_codebooks, frames), generator=torch.Generator().manual_seed(9))
    return VoicePrompt("codes", codes=codes)


def as_embeddings(model: LoadedModel, voice: VoicePrompt) -> VoicePrompt:
    """A voice in PersonaPlex's format, recorded from its frames laid out as trained (the sequence convention): the
    summed embeddings of the stream's first N columns (the initial one, then frames 0..N-2), and a ring of 4
    columns after them (column N whole, the delayed rows of column N + 1), other slots stale."""
    frames = build_prefix("", model.tokenizer, model.span, voice).block.tokens[:, : voice.frames]
    empty = torch.zeros(0, dtype=torch.long)
    voice_only = Conversation(empty, empty.reshape(model.span.agent_codebooks, 0),
                              empty.reshape(model.span.user_codebooks, 0), prefix=Prefix(Block(frames)))
    initial = model.lm._get_initial_token()[0, :, 0].tolist()
    columns = assemble(voice_only, model.span).columns(model.lm.delays, initial)
    count = voice.frames
    embeddings = embed_columns(model.lm, columns[None, :, :count].to(model.device))[0].reshape(count, 1, 1, -1).cpu()
    ring = torch.full((1, model.span.num_rows, PERSONAPLEX_RING), -2, dtype=torch.long)
    ring[0, :, count % PERSONAPLEX_RING] = columns[:, count]
    delayed = torch.tensor(model.lm.delays) > 0
    ring[0, delayed, (count + 1) % PERSONAPLEX_RING] = frames[delayed, -1]
    return VoicePrompt("embeddings", embeddings=embeddings, cache=ring)


PERSONA = "You are a helpful travel assistant called Ada."


def test_replayed_embeddings_are_what_forward_text_feeds(model: LoadedModel) -> None:
    columns = torch.randint(0, 500, (1, model.span.num_rows, 5), generator=torch.Generator().manual_seed(4))
    columns = columns.to(model.device)
    with model.lm.streaming(1):
        out, logits = model.lm.forward_text(columns)
    with model.lm.streaming(1):
        out2, logits2 = forward_last(model.lm, embed_columns(model.lm, columns))
    assert torch.equal(out[:, -1:], out2)
    # The text head on one position instead of five: the same sums, possibly blocked differently.
    assert (logits[:, :, -1:] - logits2).abs().max().item() <= 1e-5


@pytest.mark.parametrize("voice", ["none", "codes", "embeddings"])
def test_prefill_equals_the_columns_one_by_one(model: LoadedModel, voice: str) -> None:
    prompt = None if voice == "none" else voice_codes(model, 7)
    if voice == "embeddings":
        prompt = as_embeddings(model, prompt)
    prefix = build_prefix(PERSONA, model.tokenizer, model.span, prompt, model.lm.delays)
    assert prefix is not None and prefix.frames > 10
    user = user_frames(20, seed=1)
    fast = run(model, 0, prefix, prefill, user)
    assert fast[0].offsets.item() == prefix.frames
    assert_same_run(fast, run(model, 0, prefix, prefill_by_steps, user))
    assert_same_run(fast, run(model, 0, prefix, lambda e, p: e.prefill_stepwise(p), user))


def test_an_embeddings_voice_replays_what_its_codes_would_feed(model: LoadedModel) -> None:
    codes = voice_codes(model, 7)
    user = user_frames(20, seed=2)
    runs = [run(model, 0, build_prefix(PERSONA, model.tokenizer, model.span, v, model.lm.delays), prefill, user)
            for v in (codes, as_embeddings(model, codes))]
    assert_same_run(*runs)


def test_the_prefix_is_laid_out_in_the_family_order(model: LoadedModel) -> None:
    span = model.span
    voice = voice_codes(model, 5)
    prefix = build_prefix("Be kind.", model.tokenizer, span, voice, model.lm.delays)
    tokens = prefix.block.tokens
    marker = model.tokenizer.encode("<system>")
    persona = model.tokenizer.encode("Be kind.")
    silence = silence_frames(span, span.prefix_silence_frames).tokens
    expected_text = [span.text_pad_id] * 5 + [span.text_pad_id] * span.prefix_silence_frames + marker + persona + \
        marker + [span.text_pad_id] * span.prefix_silence_frames
    assert tokens[0].tolist() == expected_text
    assert marker + persona + marker == model.tokenizer.encode("<system> Be kind. <system>")
    assert torch.equal(tokens[1 : 1 + span.agent_codebooks, :5], voice.codes)
    assert torch.equal(tokens[1:, 5 : 5 + span.prefix_silence_frames], silence[1:])
    assert (tokens[1 + span.agent_codebooks :] == torch.tensor(span.sine_codes)[:, None]).all()
    assert prefix.embeddings is None and prefix.frames == 1 + tokens.shape[1]  # the stream's initial column first
