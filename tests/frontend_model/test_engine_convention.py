"""A live session presents to the temporal transformer exactly the sequence the model was trained on.

The reference is the sequence convention (frontend_model/span/convention.py), not the engine: a session is stepped
live (greedy, float32) with a persona prefix and spans injected, after the KV ring has wrapped; the token ids every
input embedding of the transformer receives are recorded by forward pre-hooks, position by position; and the
conversation it had (the frames it emitted with the user frames it was fed, the spans where they went in) is
assembled by the convention. The two must be equal, column by column, prefix, blocks and the frame after each block
included. Then moshi's own training forward (`LMModel.forward`) on the assembled frames says which text token and
agent codes training supervises at each frame: greedy serving must have emitted exactly those, the frame after each
span included.
Both families (Moshi-shaped dep_q 8, PersonaPlex-shaped dep_q 16), the single engine one-pass and chunked, and one
slot of a batch whose other slots step and take spans of their own.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import pytest
import torch
from moshi.models.lm import LMModel

from frontend_model.engine.batch_engine import BatchEngine
from frontend_model.engine.chunked_prefill import SpanPrefill
from frontend_model.engine.engine import GREEDY, Engine, StepResult
from frontend_model.loading.loader import LoadedModel
from frontend_model.span.block import Block, Prefix
from frontend_model.span.build import build_prefix
from frontend_model.span.convention import Assembled, Conversation, Kind, SpanAt, assemble
from frontend_model.span.voice_prompt import VoicePrompt
from tests.support.engine import FAMILIES, span_like_block, tiny_model, user_frames

CONTEXT = 8
MAX_SPAN = 32
STEPS = CONTEXT + MAX_SPAN + 10  # the KV ring (capacity context + max span) has wrapped before the last span
SPANS = {3: 5, 14: 12, 42: 6}  # before step -> frames (open, tokens, close)
PERSONA = "Be Ada."
pytestmark = pytest.mark.slow  # each a live session of 50 steps with spans, seconds to minutes on a busy host


@pytest.fixture(scope="module", params=FAMILIES, ids=lambda q: f"dep_q{q}")
def model(request: pytest.FixtureRequest) -> LoadedModel:
    return tiny_model(request.param, context=CONTEXT)


class Recorder:
    """The ids each input embedding of the temporal transformer receives, for batch row `row` of each call."""

    def __init__(self, lm: LMModel) -> None:
        self.modules = [lm.text_emb, *lm.emb]
        self.seen: list[list[torch.Tensor]] = [[] for _ in self.modules]
        self.row = 0
        self.on = True

    def hook(self, index: int) -> Callable[[torch.nn.Module, tuple[torch.Tensor, ...]], None]:
        def record(module: torch.nn.Module, inputs: tuple[torch.Tensor, ...]) -> None:
            if self.on:
                self.seen[index].append(inputs[0][self.row].detach().cpu())
        return record

    @contextmanager
    def installed(self) -> Iterator[Recorder]:
        handles = [m.register_forward_pre_hook(self.hook(i)) for i, m in enumerate(self.modules)]
        try:
            yield self
        finally:
            for h in handles:
                h.remove()

    def columns(self) -> torch.Tensor:
        """[rows, positions]: row r of every position the transformer read."""
        return torch.stack([torch.cat(parts) for parts in self.seen])


@dataclass
class Live:
    """What a session did: frames out (text, agent codes), the user frame fed with each, the spans it took."""

    text: list[int] = field(default_factory=list)
    agent: list[torch.Tensor] = field(default_factory=list)
    user: list[torch.Tensor] = field(default_factory=list)
    spans: list[SpanAt] = field(default_factory=list)

    def took(self, block: Block) -> None:
        """A span goes in before the next frame out: the one the last step left pending."""
        self.spans.append(SpanAt(len(self.text), tuple(block.tokens[0].tolist())))

    def stepped(self, out: StepResult, user: torch.Tensor) -> None:
        """An output frame and the user frame of the same step are one frame of the conversation (the first step of
        a stream without a prefix outputs nothing and its user frame is never read, as in training)."""
        if out.text_token is None:
            return
        self.text.append(out.text_token)
        self.agent.append(out.agent_codes.cpu())
        self.user.append(user)

    def conversation(self, prefix: Prefix | None) -> Conversation:
        return Conversation(torch.tensor(self.text), torch.stack(self.agent, dim=1), torch.stack(self.user, dim=1),
                            spans=tuple(self.spans), prefix=prefix)


def voice(model: LoadedModel) -> VoicePrompt:
    codes = torch.randint(0, 2048, (model.span.agent_codebooks, 6), generator=torch.Generator().manual_seed(3))
    return VoicePrompt("codes", codes=codes)


def blocks(engine: Engine) -> dict[int, Block]:
    return {at: span_like_block(engine, frames, seed=at) for at, frames in SPANS.items()}


def single(model: LoadedModel, prefix: Prefix | None, prefill: SpanPrefill) -> tuple[Live, torch.Tensor]:
    user = user_frames(STEPS, seed=7)
    live = Live()
    with Engine(model, GREEDY, max_span_frames=MAX_SPAN, prefill=prefill) as engine, \
            Recorder(model.lm).installed() as recorder:
        if prefix is not None:
            engine.prefill(prefix)
        spans = blocks(engine)
        for step in range(STEPS):
            if step in spans:
                live.took(spans[step])
                engine.inject(spans[step])
            live.stepped(engine.step(user[step]), user[step])
    return live, recorder.columns()


def batched(model: LoadedModel, prefix: Prefix | None, slot: int = 1, slots: int = 3) -> tuple[Live, torch.Tensor]:
    """Slot `slot` of a batch in which every slot steps each tick and the others take spans at other ticks."""
    user = torch.stack([user_frames(STEPS, seed=7 + s) for s in range(slots)], dim=1)  # [steps, slots, 8]
    live = Live()
    with BatchEngine(model, slots, GREEDY, max_span_frames=MAX_SPAN) as engine, \
            Recorder(model.lm).installed() as recorder:
        recorder.on = False
        for s in range(slots):
            engine.reset_slot(s)
            if prefix is not None:
                recorder.on = s == slot
                engine.prefill_slot(s, prefix)
        spans = blocks(engine)
        others = {at + 2: span_like_block(engine, 7, seed=at + 2) for at in SPANS}
        active = torch.ones(slots, dtype=torch.bool)
        for step in range(STEPS):
            if step in spans:
                live.took(spans[step])
                recorder.on, recorder.row = True, 0
                engine.inject_slot(slot, spans[step])
            if step in others:
                recorder.on = False
                engine.inject_slot(0, others[step])
            recorder.on, recorder.row = True, slot
            out = engine.step_slots(user[step], active)[slot]
            assert isinstance(out, StepResult)
            live.stepped(out, user[step, slot])
    return live, recorder.columns()


def assembled_and_columns(model: LoadedModel, live: Live, prefix: Prefix | None) -> tuple[Assembled, torch.Tensor]:
    sequence = assemble(live.conversation(prefix), model.span)
    initial = model.lm._get_initial_token()[0, :, 0].tolist()
    return sequence, sequence.columns(model.lm.delays, initial)


def assert_reads_the_convention(model: LoadedModel, live: Live, read: torch.Tensor, prefix: Prefix | None) -> None:
    sequence, expected = assembled_and_columns(model, live, prefix)
    assert len(live.spans) == len(SPANS) and (sequence.kinds == Kind.SPAN).sum() == sum(SPANS.values())
    assert read.shape == expected.shape, (read.shape, expected.shape)
    differs = (read != expected).any(dim=0).nonzero().flatten().tolist()
    assert not differs, f"the transformer read other columns at positions {differs[:10]}"


def make_prefix(model: LoadedModel, which: str) -> Prefix | None:
    if which == "no prefix":
        return None
    return build_prefix(PERSONA, model.tokenizer, model.span, voice(model) if which == "voice and persona" else None)


def assert_emits_what_training_supervises(model: LoadedModel, live: Live, prefix: Prefix | None) -> None:
    """Greedy serving emits, at every live frame, the text token and agent codes that moshi's training forward
    predicts there from the assembled sequence: the frame after each span from the block's close position."""
    sequence = assemble(live.conversation(prefix), model.span)
    with torch.no_grad():
        out = model.lm(sequence.frames[None].to(model.device))
    text = greedy(out.text_logits[0, 0].float().cpu(), model.suppressed_text_ids)
    agent = greedy(out.logits[0, : model.span.agent_codebooks].float().cpu(), frozenset())
    live_frames = sequence.kinds == Kind.LIVE
    audio = sequence.audio_weight[0] > 0  # the frame before a block trains no audio: its acoustic codes moved
    after = [s.stop for s in sequence.span_slices]
    assert sequence.text_weight[after].gt(0).all() and audio[after].all(), "training supervises the frame after"
    assert torch.equal(text[live_frames], sequence.frames[0, live_frames])
    valid = out.mask[0, : model.span.agent_codebooks].cpu() & audio  # the last frame's acoustic codes: no logits
    assert valid.sum() > valid.shape[0] * (live_frames.sum() - 2 * len(after))
    assert torch.equal(agent[valid], sequence.frames[1 : 1 + model.span.agent_codebooks][valid])


@pytest.mark.parametrize("which", ["no prefix", "voice and persona"])
def test_a_live_session_with_spans_reads_the_training_sequence_and_emits_what_it_supervises(
    model: LoadedModel, which: str
) -> None:
    prefix = make_prefix(model, which)
    live, read = single(model, prefix, SpanPrefill.ONE_PASS)
    assert_reads_the_convention(model, live, read, prefix)
    assert_emits_what_training_supervises(model, live, prefix)


def test_a_chunked_span_prefill_reads_the_assembled_training_sequence(model: LoadedModel) -> None:
    prefix = make_prefix(model, "voice and persona")
    live, read = single(model, prefix, SpanPrefill.CHUNKED)
    assert_reads_the_convention(model, live, read, prefix)


def test_one_slot_of_a_batch_reads_the_assembled_training_sequence(model: LoadedModel) -> None:
    prefix = make_prefix(model, "voice and persona")
    live, read = batched(model, prefix)
    assert_reads_the_convention(model, live, read, prefix)


def greedy(logits: torch.Tensor, suppressed: frozenset[int]) -> torch.Tensor:
    logits = logits.clone()
    if suppressed:
        logits[..., sorted(suppressed)] = float("-inf")
    return logits.argmax(dim=-1)
