"""The sequence convention lays a conversation out as the Context Spanning model was trained on it.

Facts from the paper and the reference's training code: prefix first, no loss on prefix and span frames, `<ret>`
up-weighted, a block of constant placeholder frames, and the MOVE rule (the acoustic codes of the frame before a
block go to the block's last frame) so that the transformer reads real audio exactly once around the block.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from moshi.models.lm import _delay_sequence

from frontend_model.loading.loader import LoadedModel, load_model
from frontend_model.span.block import Block, Prefix
from frontend_model.span.build import build_prefix, build_span
from frontend_model.span.config import SpanConfig
from frontend_model.span.convention import Conversation, Kind, LossWeights, SpanAt, assemble
from frontend_model.span.voice_prompt import VoicePrompt

DELAYS = [0, 0, 1, 1, 1, 1, 1, 1, 1, 0, 1, 1, 1, 1, 1, 1, 1]
INITIAL = [32000] + [2048] * 16
T = 8


@pytest.fixture(scope="module")
def model() -> LoadedModel:
    return load_model("tiny", device="cpu", dtype=torch.float32)


@pytest.fixture(scope="module")
def span(model: LoadedModel) -> SpanConfig:
    return model.span


def dialogue(span: SpanConfig, **kwargs: object) -> Conversation:
    """Live frames whose every code is distinct and outside the placeholder codes."""
    g = torch.Generator().manual_seed(0)
    text = torch.randint(20, 60, (T,), generator=g)
    text[2] = span.text_pad_id
    agent = 1000 + torch.arange(span.agent_codebooks * T).reshape(span.agent_codebooks, T) % 900
    user = 100 + torch.arange(span.user_codebooks * T).reshape(span.user_codebooks, T) % 800
    return Conversation(text, agent, user, **kwargs)  # type: ignore[arg-type]


def block_ids(span: SpanConfig, inner: int) -> tuple[int, ...]:
    return (span.open_id, *range(30, 30 + inner), span.close_id)


def test_a_span_block_is_read_as_constant_columns_with_the_frame_befores_acoustic_codes_after_it(
    span: SpanConfig,
) -> None:
    talk = dialogue(span, spans=(SpanAt(4, block_ids(span, 3)),))
    out = assemble(talk, span)
    cols = out.columns(DELAYS, INITIAL)
    n = 5
    assert out.frames.shape == (span.num_rows, T + n)
    # Positions 1..4 read live frames 0..3, 5..9 the block, 10 live frame 4.
    block = cols[:, 5 : 5 + n]
    assert block[0].tolist() == list(block_ids(span, 3))
    assert (block[1 : 1 + span.agent_codebooks] == torch.tensor(span.silence_codes)[:, None]).all()
    assert (block[1 + span.agent_codebooks :] == torch.tensor(span.sine_codes)[:, None]).all()
    after = cols[:, 5 + n]
    delayed = torch.tensor(DELAYS) > 0
    assert torch.equal(after[~delayed], torch.cat([talk.text[4:5], talk.agent[:1, 4], talk.user[:1, 4]]))
    frame3 = torch.cat([talk.text[3:4], talk.agent[:, 3], talk.user[:, 3]])
    assert torch.equal(after[delayed], frame3[delayed]), "frame 3's acoustic codes are read after the block"
    # Real audio exactly once: every acoustic code of frame 3 appears once among the columns read.
    for r in delayed.nonzero().flatten().tolist():
        assert (cols[r] == frame3[r]).sum() == 1


def test_the_move_rule_leaves_placeholders_on_the_frame_before_and_moves_its_codes_to_the_close_frame(
    span: SpanConfig,
) -> None:
    talk = dialogue(span, spans=(SpanAt(4, block_ids(span, 2)),))
    out = assemble(talk, span)
    a = span.agent_codebooks
    before, close = out.frames[:, 3], out.frames[:, 3 + 4]
    assert before[2 : 1 + a].tolist() == list(span.silence_codes[1:])
    assert before[2 + a :].tolist() == list(span.sine_codes[1:])
    assert before[:2].tolist() == [int(talk.text[3]), int(talk.agent[0, 3])] and before[1 + a] == talk.user[0, 3]
    assert close[0] == span.close_id and close[1] == span.silence_codes[0] and close[1 + a] == span.sine_codes[0]
    assert torch.equal(close[2 : 1 + a], talk.agent[1:, 3]) and torch.equal(close[2 + a :], talk.user[1:, 3])


def test_the_columns_are_what_moshis_training_forward_feeds_the_transformer(span: SpanConfig) -> None:
    out = assemble(dialogue(span, spans=(SpanAt(2, block_ids(span, 1)), SpanAt(6, block_ids(span, 4)))), span)
    initial = torch.tensor(INITIAL)[None, :, None]
    moshi = torch.cat([initial, _delay_sequence(DELAYS, out.frames[None], initial)], dim=2)[0, :, :-1]
    assert torch.equal(out.columns(DELAYS, INITIAL)[:, :-1], moshi)


def test_loss_weights_skip_prefix_and_spans_and_weigh_ret_pad_and_codebooks(
    model: LoadedModel, span: SpanConfig
) -> None:
    prefix = build_prefix("Be kind.", model.tokenizer, span)
    talk = dialogue(span, ret_frames=(1,), spans=(SpanAt(3, block_ids(span, 2)),), prefix=prefix)
    weights = LossWeights(ret=5.0, pad=0.5, semantic=1.0, acoustic=0.02)
    out = assemble(talk, span, weights)
    p = prefix.block.frames
    assert torch.equal(out.frames[:, :p], prefix.block.tokens)
    assert out.kinds.tolist() == [Kind.PREFIX] * p + [Kind.LIVE] * 3 + [Kind.SPAN] * 4 + [Kind.LIVE] * (T - 3)
    assert out.live.tolist() == [-1] * p + [0, 1, 2] + [-1] * 4 + list(range(3, T))
    assert out.span_slices == (slice(p + 3, p + 7),)
    assert out.frames[0, p + 1] == span.ret_id
    expected_text = [0.0] * p + [1.0, 5.0, 0.5] + [0.0] * 4 + [1.0] * (T - 3)
    assert out.text_weight.tolist() == pytest.approx(expected_text)
    audio = [0.0] * p + [1.0, 1.0, 0.0] + [0.0] * 4 + [1.0] * (T - 3)  # frame 2 lost its acoustic codes
    assert out.audio_weight[0].tolist() == audio
    assert torch.allclose(out.audio_weight[1:], 0.02 * torch.tensor(audio).expand(out.audio_weight.shape[0] - 1, -1))


def test_spans_are_placed_by_live_frame_whatever_their_order(span: SpanConfig) -> None:
    first, second = SpanAt(2, block_ids(span, 1)), SpanAt(5, block_ids(span, 2))
    a = assemble(dialogue(span, spans=(first, second)), span)
    b = assemble(dialogue(span, spans=(second, first)), span)
    assert torch.equal(a.frames, b.frames)
    assert a.span_slices == (slice(2, 5), slice(8, 12))
    assert a.live[5].item() == 2 and a.live[12].item() == 5


def test_a_span_from_text_has_the_servers_ids(model: LoadedModel, span: SpanConfig) -> None:
    text = "It opens at 7:30 am, 3 blocks away."
    built = build_span(text, model.tokenizer, span, max_frames=200)
    assert SpanAt.from_text(4, text, model.tokenizer, span).text_ids == tuple(built.block.tokens[0].tolist())
    with pytest.raises(ValueError, match="no tokens"):
        SpanAt.from_text(4, "<ret>", model.tokenizer, span)


def test_a_codes_voice_prefix_is_assembled_and_an_embeddings_one_is_refused(
    model: LoadedModel, span: SpanConfig
) -> None:
    codes = torch.randint(0, 2048, (span.agent_codebooks, 4), generator=torch.Generator().manual_seed(1))
    prefix = build_prefix("Hi.", model.tokenizer, span, VoicePrompt("v", codes=codes))
    out = assemble(dialogue(span, prefix=prefix), span)
    assert torch.equal(out.frames[1 : 1 + span.agent_codebooks, :4], codes)
    replayed = dataclasses.replace(prefix, embeddings=torch.zeros(3, 16))
    with pytest.raises(ValueError, match="embeddings"):
        assemble(dialogue(span, prefix=replayed), span)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"spans": "twice"}, "two spans"),
        ({"spans": "at start"}, "frame before"),
        ({"spans": "past end"}, "live frames"),
        ({"spans": "no close"}, "open, token"),
        ({"ret_frames": (T,)}, "<ret> frame"),
        ({"agent": "short"}, "agent must be"),
    ],
)
def test_a_malformed_conversation_is_refused_with_a_clear_error(
    span: SpanConfig, change: dict[str, object], message: str
) -> None:
    ids = block_ids(span, 1)
    spans = {"twice": (SpanAt(3, ids), SpanAt(3, ids)), "at start": (SpanAt(0, ids),),
             "past end": (SpanAt(T, ids),), "no close": (SpanAt(3, ids[:-1]),)}
    talk = dialogue(span)
    if "spans" in change:
        talk = dataclasses.replace(talk, spans=spans[change["spans"]])
    elif "agent" in change:
        talk = dataclasses.replace(talk, agent=talk.agent[:, :-1])
    else:
        talk = dataclasses.replace(talk, **change)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=message):
        assemble(talk, span)


def test_a_span_before_the_first_live_frame_moves_the_prefixs_last_frame(span: SpanConfig) -> None:
    agent, user = torch.full((span.agent_codebooks, 2), 7), torch.full((span.user_codebooks, 2), 9)
    prefix = Prefix(Block(torch.cat([torch.full((1, 2), span.text_pad_id), agent, user])))
    out = assemble(dialogue(span, spans=(SpanAt(0, block_ids(span, 1)),), prefix=prefix), span)
    assert out.kinds[:5].tolist() == [Kind.PREFIX] * 2 + [Kind.SPAN] * 3
    assert (out.frames[2 : 1 + span.agent_codebooks, 4] == 7).all()
