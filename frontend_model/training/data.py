"""Synthetic spoken conversations, laid out by the sequence convention (`frontend_model.span.convention`, the one
the engine is tested against) into the columns the temporal transformer reads when it serves: the persona prefix
from the serving code's `build_prefix`, span blocks built from text as the server builds them, the MOVE rule.

In a turn the user asks a question (espeak-ng speech encoded by the tiny Mimi), the agent's text row carries `<ret>`
one of `RET_OFFSETS` frames after the question's speech ends, a span arrives 1..`max_gap` frames later, and the
agent's text row then says the answer's tokens one a frame, from the column right after the block, while the user is
quiet. Spans are written by the model's span contract, as the server writes them: a tool's answer behind the tool prefix
(the agent says the answer, not the prefix), sometimes the abstain span (the agent says `ABSTAIN_REPLY`); in other
turns an app pushes a span with no question and no `<ret>` (`span.inject`: its text as pushed, said as it is). The
persona prefix is mostly the contract's default persona with the checkpoint's voice, what a session that names
neither gets. Chatter (statements) and long silences ask nothing. Prefix and span columns carry no loss; `<ret>` is
weighted up and padding down, as the reference's fine-tuning weights them.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

import numpy as np
import sentencepiece
import torch
from moshi.models.compression import MimiModel

from frontend_model.frame import FRAME_SAMPLES
from frontend_model.loading.loader import LoadedModel
from frontend_model.span.block import Prefix
from frontend_model.span.build import build_prefix
from frontend_model.span.config import SpanConfig
from frontend_model.span.contract import SpanContract
from frontend_model.span.convention import Assembled, Conversation, LossWeights, SpanAt, assemble
from frontend_model.span.text_ids import non_text_ids
from frontend_model.span.voice_prompt import VoicePrompt
from frontend_model.training.recipes import (
    Split,
    app_text,
    draw_chatter,
    draw_exchange,
    draw_voice,
    tool_answer,
)
from frontend_model.training.speech import Voice, speak

# Frames between the end of a question's speech and `<ret>` on the agent's text row. Not one fixed frame: a model that
# let that frame pass had never seen a question go on unanswered and asked seconds later, or never.
RET_OFFSETS = range(1, 5)
RET_WEIGHT = 5.0  # the reference's `w_ret`
PAD_WEIGHT = 0.5  # the reference's `pad_w`
MAX_SPAN_FRAMES = 48
LEAD_FRAMES = 3  # silence before speech when encoding, so the codec's causal state has settled
TAIL_FRAMES = 6  # silence after speech kept with the utterance: the codec's decay into steady silence
SILENCE_FRAMES = 200  # a quiet microphone's codes, from a session's start, are the same after these
PERSONAS = ("", "You are a helpful assistant.", "You are a friendly voice assistant. Answer briefly.",
            "You answer questions about time, dates and numbers.")
ABSTAIN_REPLY = "Sorry, I could not find that."
ABSTAIN_SHARE = 0.1  # question turns whose span is the abstain span
QUIET_SHARE = 0.15  # turns that ask nothing: a long stretch of silence
APP_SHARE = 0.3  # turns where an app pushes a span (no question, no `<ret>`), unless the caller says otherwise
ALL_APPS = 1 - QUIET_SHARE  # an app share where every turn that is not a long silence is an app's span
CHATTER_SHARE = 0.3  # turns that start with a statement


def reply_to(span_text: str, contract: SpanContract) -> str:
    """What the agent is trained to say after a span whose (normalised) text is `span_text`."""
    if contract.abstain_text and span_text == contract.abstain_text:
        return ABSTAIN_REPLY
    return span_text.removeprefix(contract.tool_prefix)


def ret_after(rng: random.Random, speech_end: int) -> int:
    """The frame of `<ret>` after a question whose speech ends at frame `speech_end`."""
    return speech_end + rng.choice(RET_OFFSETS)


@dataclass(frozen=True)
class Utterance:
    """A spoken sentence: user-side Mimi codes [user codebooks, frames], speech ending at `speech_frames`."""

    text: str
    voice: str
    codes: torch.Tensor
    speech_frames: int


@dataclass(frozen=True)
class Question:
    utterance: Utterance
    kind: str


@dataclass(frozen=True)
class Sequence:
    """Stream columns [rows, L] and the loss weight of each column's text token [L] (0: no loss): position p
    predicts the text of column p + 1. `ret_columns` and `answer_columns` locate `<ret>` and the answers' tokens."""

    columns: torch.Tensor
    weights: torch.Tensor
    ret_columns: tuple[int, ...]
    answer_columns: tuple[tuple[int, ...], ...]

    def last(self, columns: int) -> Sequence:
        """The last `columns` columns; `<ret>` and answers that fall before them are dropped."""
        cut = max(0, self.columns.shape[1] - columns)
        answers = tuple(tuple(c - cut for c in a) for a in self.answer_columns if a and a[0] - 1 >= cut)
        return Sequence(self.columns[:, cut:], self.weights[cut:], tuple(r - cut for r in self.ret_columns if r > cut),
                        answers)


@torch.no_grad()
def encode_speech(mimi: MimiModel, pcms: list[np.ndarray]) -> list[tuple[torch.Tensor, int]]:
    """PCM clips, encoded together -> per clip (codes [codebooks, frames] from the first speech frame to
    `TAIL_FRAMES` after it, speech frames). Each clip starts after `LEAD_FRAMES` of silence; shorter clips are
    padded with silence, which only follows their own frames (the codec is causal)."""
    speech = [math.ceil(len(pcm) / FRAME_SAMPLES) for pcm in pcms]
    total = (LEAD_FRAMES + max(speech) + TAIL_FRAMES) * FRAME_SAMPLES
    signal = torch.zeros(len(pcms), 1, total)
    for i, pcm in enumerate(pcms):
        start = LEAD_FRAMES * FRAME_SAMPLES
        signal[i, 0, start:start + len(pcm)] = torch.from_numpy(pcm.astype(np.float32))
    codes = mimi.encode(signal.to(next(mimi.parameters()).device)).cpu()
    return [(codes[i, :, LEAD_FRAMES:LEAD_FRAMES + frames + TAIL_FRAMES], frames) for i, frames in enumerate(speech)]


def served_silence(mimi: MimiModel, frames: int = SILENCE_FRAMES) -> torch.Tensor:
    """[codebooks, frames]: what a quiet microphone encodes to frame by frame from a session's start. Not one column:
    the codec's first frames differ, and after about two seconds its codes settle on others than in its first second
    (a model trained on one column heard a long silence as something new, and asked in it)."""
    with torch.no_grad():
        codes = mimi.encode(torch.zeros(1, 1, frames * FRAME_SAMPLES, device=next(mimi.parameters()).device))
    return codes[0].cpu()


def speak_and_encode(mimi: MimiModel, lines: list[tuple[str, Voice, float]], batch_size: int = 16) -> list[Utterance]:
    """(text, voice, gain) -> utterances, spoken by espeak-ng and encoded `batch_size` at a time."""
    out = []
    for lo in range(0, len(lines), batch_size):
        chunk = lines[lo:lo + batch_size]
        encoded = encode_speech(mimi, [speak(text, voice) * gain for text, voice, gain in chunk])
        out += [Utterance(text, voice.label(), codes, frames)
                for (text, voice, _), (codes, frames) in zip(chunk, encoded, strict=True)]
    return out


@dataclass(frozen=True)
class Corpus:
    """Every utterance a split speaks, encoded once."""

    split: Split
    questions: tuple[Question, ...]
    chatter: tuple[Utterance, ...]


def synthesise_corpus(mimi: MimiModel, split: Split, questions: int, chatter: int, seed: int) -> Corpus:
    rng = random.Random(f"{split}-{seed}")
    exchanges = [draw_exchange(rng, split) for _ in range(questions)]
    asked = speak_and_encode(mimi, [(e.question, draw_voice(rng, split), rng.uniform(0.3, 1.3)) for e in exchanges])
    said = speak_and_encode(mimi, [(draw_chatter(rng, split), draw_voice(rng, split), rng.uniform(0.3, 1.3))
                                   for _ in range(chatter)])
    return Corpus(split, tuple(Question(u, e.kind) for u, e in zip(asked, exchanges, strict=True)), tuple(said))


class Assembler:
    """Conversations drawn at random, laid out by the sequence convention (`frontend_model.span.convention`)."""

    def __init__(self, tokenizer: sentencepiece.SentencePieceProcessor, span: SpanConfig, delays: list[int],
                 initial: torch.Tensor, voice: VoicePrompt | None, user_silence: torch.Tensor) -> None:
        self.tokenizer = tokenizer
        self.user_silence = user_silence.to(torch.long)
        self.span = span
        self.delays = delays
        self.initial = initial.tolist()  # LMGen's initial token of each row
        self.voice = voice
        self.forbidden = non_text_ids(tokenizer, span)
        self.silence = torch.tensor(span.silence_codes, dtype=torch.long)

    def quiet(self, frames: int, at: int = 0) -> torch.Tensor:
        """Live frames `at`.. where nobody speaks: text pad, the silence codes on the agent rows and, on the user rows,
        what the codec makes of a quiet microphone that many frames into a session (`served_silence`: not the
        placeholder codes, which stand in for silence inside spans only; a model trained on those would hear
        something else while it answers)."""
        head = torch.cat([torch.tensor([self.span.text_pad_id]), self.silence])[:, None].repeat(1, frames)
        index = torch.arange(at, at + frames).clamp(max=self.user_silence.shape[1] - 1)
        return torch.cat([head, self.user_silence[:, index]])

    def speech(self, utterance: Utterance) -> torch.Tensor:
        frames = self.quiet(utterance.codes.shape[1])
        frames[1 + self.span.agent_codebooks:] = utterance.codes
        return frames

    def prefix(self, rng: random.Random) -> Prefix | None:
        """The contract's default persona and voice half the time (a session that names neither), else another."""
        contract = self.span.contract
        persona = contract.persona_text(None) if rng.random() < 0.5 else rng.choice(PERSONAS)
        voice = self.voice if rng.random() < 0.7 else None
        return build_prefix(persona, self.tokenizer, self.span, voice, self.delays, self.forbidden)

    def span_and_reply(self, rng: random.Random, frame: int, app: bool, split: Split) -> tuple[SpanAt, list[int]]:
        """A span as the server writes it before `frame`, and the text ids the agent says after it: an app's text
        as pushed, else a tool's answer behind the tool prefix or the abstain span. The answer is drawn afresh for
        every turn: the model must copy it, it cannot memorise it."""
        contract = self.span.contract
        if app:
            text = reply = app_text(rng, split)
        elif contract.abstain_text and rng.random() < ABSTAIN_SHARE:
            text, reply = contract.abstain_text, ABSTAIN_REPLY
        else:
            reply = tool_answer(rng)
            text = contract.span_text(reply, tool_result=True)
        block = SpanAt.from_text(frame, text, self.tokenizer, self.span, MAX_SPAN_FRAMES)
        said = SpanAt.from_text(frame, reply, self.tokenizer, self.span, MAX_SPAN_FRAMES)
        return block, list(said.text_ids[1:-1])

    @classmethod
    def for_model(cls, model: LoadedModel, voice: VoicePrompt | None) -> Assembler:
        """The assembler of `model`'s tokenizer, span ids, delays and codec, with `voice` in its persona prefixes."""
        lm = model.lm
        return cls(model.tokenizer, model.span, list(lm.delays), lm._get_initial_token()[0, :, 0].cpu(), voice,
                   served_silence(model.mimi))

    def conversation(self, rng: random.Random, corpus: Corpus, max_gap: int, turns: int,
                     window: int | None = None, app_share: float = APP_SHARE) -> Sequence:
        """One or more turns after an optional persona prefix: a question answered by a span, an app's span (in
        `app_share` of the turns: no question, no `<ret>`), or a long silence, any of them after a statement.
        `window` keeps the last columns only (training cost), as a long session's window reads them."""
        prefix = self.prefix(rng) if rng.random() < 0.7 else None
        parts: list[torch.Tensor] = []
        rets: list[int] = []
        spans: list[SpanAt] = []
        replies: list[int] = []
        at = 0

        def add(frames: torch.Tensor) -> None:
            nonlocal at
            parts.append(frames)
            at += frames.shape[1]

        for _ in range(turns):
            add(self.quiet(rng.randint(2, 12), at))
            if rng.random() < CHATTER_SHARE and corpus.chatter:
                add(self.speech(rng.choice(corpus.chatter)))
                add(self.quiet(rng.randint(3, 8), at))
            kind = rng.random()
            if kind < QUIET_SHARE:
                add(self.quiet(rng.randint(10, 60), at))
                continue
            app = kind < QUIET_SHARE + app_share
            if app:
                inject = at + rng.randint(1, 12)
            else:
                utterance = rng.choice(corpus.questions).utterance
                start = at
                add(self.speech(utterance))
                ret = ret_after(rng, start + utterance.speech_frames)
                inject = ret + rng.randint(1, max_gap)
                rets.append(ret)
            block, answer = self.span_and_reply(rng, inject, app, corpus.split)
            add(self.quiet(max(inject + len(answer) + rng.randint(2, 8) - at, 0), at))
            frames = torch.cat(parts, dim=1)
            frames[0, inject:inject + len(answer)] = torch.tensor(answer)
            parts = [frames]
            spans.append(block)
            replies.append(len(answer))
        frames = torch.cat(parts, dim=1)
        a = self.span.agent_codebooks
        conversation = Conversation(frames[0], frames[1:1 + a], frames[1 + a:], tuple(rets), tuple(spans), prefix)
        sequence = self.layout(assemble(conversation, self.span, LossWeights(ret=RET_WEIGHT, pad=PAD_WEIGHT)),
                               [(s.frame, n) for s, n in zip(spans, replies, strict=True)])
        return sequence if window is None else sequence.last(window)

    def layout(self, assembled: Assembled, answers: list[tuple[int, int]]) -> Sequence:
        """The convention's columns; weights aligned with them (column j + 1 holds the text of frame j)."""
        columns = assembled.columns(self.delays, self.initial)
        weights = torch.cat([torch.zeros(1), assembled.text_weight])
        live = assembled.live.tolist()
        position = {frame: i + 1 for i, frame in enumerate(live) if frame >= 0}
        rets = tuple(i + 1 for i, token in enumerate(assembled.frames[0].tolist())
                     if token == self.span.ret_id and live[i] >= 0)
        said = tuple(tuple(position[f] for f in range(frame, frame + n)) for frame, n in answers)
        return Sequence(columns, weights, rets, said)


def batch(sequences: list[Sequence], pad_column: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[B, rows, L] columns padded with a quiet column (no loss) and [B, L] weights."""
    length = max(s.columns.shape[1] for s in sequences)
    columns = pad_column[None, :, None].repeat(len(sequences), 1, length)
    weights = torch.zeros(len(sequences), length)
    for i, s in enumerate(sequences):
        columns[i, :, : s.columns.shape[1]] = s.columns
        weights[i, : s.weights.shape[0]] = s.weights
    return columns, weights
