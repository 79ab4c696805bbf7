"""Synthetic spoken conversations, laid out by the sequence convention (`frontend_model.span.convention`, the one
the engine is tested against) into the columns the temporal transformer reads when it serves: the persona prefix
from the serving code's `build_prefix`, span blocks built from text as the server builds them, the MOVE rule.

The user's audio is what serving feeds the model (`served`): each conversation has one noise profile (digital
silence or a room's noise floor), its quiet stretches are that profile's session track (Opus round trip, the
server's leveller, the tiny Mimi, frame by frame from the session's start) and its utterances were said over that
room, after a lead-in long enough for the leveller to settle, with the room after them as the leveller recovers.

A conversation has up to `max_turns` turns. In a turn the user asks a question (espeak-ng speech encoded by the tiny
Mimi) or a follow-up of the question answered before it ("what about in Paris?"), sometimes while the agent still
says its last answer; the agent's text row carries `<ret>` one of `RET_OFFSETS` frames after the question's speech
ends (after the agent's answer, when the question began during it), a span arrives 1..`max_gap` frames later, and
the agent's text row then says the answer's tokens one a frame, from the column right after the block. Spans are
written by the model's span contract, as the server writes them: a tool's answer behind the tool prefix (the agent
says the answer, not the prefix), sometimes the abstain span (the agent says `ABSTAIN_REPLY`); in other turns an app
pushes a span with no question and no `<ret>` (`span.inject`: its text as pushed, said as it is). The persona prefix
is mostly the trained checkpoint's own short default persona (`TRAINED_PERSONA`, written to its `contextspan.json`)
with its voice, what a session that names neither gets: short enough that the prefix stays in the attention context.
Chatter (statements and small talk drawn by `statements`, between turns or alone) and long quiet stretches ask
nothing. Prefix and span columns carry no loss; `<ret>` is weighted up and padding down, as the reference's
fine-tuning weights them.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from functools import cached_property

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
    draw_exchange,
    draw_follow_up,
    draw_voice,
    follow_up_kinds,
    tool_answer,
)
from frontend_model.training.served import PROFILES, NoiseProfile, session
from frontend_model.training.speech import Voice, speak
from frontend_model.training.statements import draw_statement

# Frames between the end of a question's speech and `<ret>` on the agent's text row. Not one fixed frame: a model that
# let that frame pass had never seen a question go on unanswered and asked seconds later, or never.
RET_OFFSETS = range(1, 5)
RET_WEIGHT = 5.0  # the reference's `w_ret`
PAD_WEIGHT = 0.5  # the reference's `pad_w`
MAX_SPAN_FRAMES = 64  # a tool's longest answers ("... in the United Arab Emirates.") take 54 frames with the prefix
LEAD_FRAMES = 10  # the room before speech, from a session's start: the leveller has settled on it
TAIL_FRAMES = 6  # the room after speech kept with the utterance: the codec's decay into steady silence
AFTER_FRAMES = 24  # the room after that, as the leveller holds the speech's gain then returns to the room's
SILENCE_FRAMES = 240  # a profile's session track: a quiet microphone's codes from a session's start
# Most utterances are said later in a session, as every question after a session's first is: the codec's codes of the
# same words then differ (its transformer reads 20 s back; a question 4-24 s into a session kept 59-73 % of its first
# codebook's codes said 0.8 s in), and a model trained on words said 0.8 s into a session asked after a session's
# first question but missed later ones (benchmarks/README.md). Some are said after other words.
LATER_SHARE = 0.7
LATER_LEAD = (30, 150)  # frames of the session before a later utterance's words
EARLIER_WORDS = 0.5  # later utterances with other words said before them in the session
# Session tracks of each room: with one, the model learnt that room's noise by heart and asked in the same room drawn
# with another seed (20-40 `<ret>` a minute in a development probe; none in digital silence or the faint hiss).
ROOM_TAKES = 8
# The trained checkpoint's default persona: with the voice prompt (8 frames), the two silences and the `<system>`
# markers (8 tokens each), its prefix is 38 frames, well inside the 96-frame attention context (tested; the
# reference's persona took 294).
TRAINED_PERSONA = "You answer questions."
DEFAULT_PERSONA_SHARE = 0.6  # prefixes with the default persona (a session that names none)
PERSONAS = ("", "You are a helpful assistant.", "You are a friendly voice assistant. Answer briefly.",
            "You answer questions about time, dates and numbers.")
ABSTAIN_REPLY = "Sorry, I could not find that."
ABSTAIN_SHARE = 0.1  # question turns whose span is the abstain span
QUIET_SHARE = 0.15  # turns that ask nothing: a long stretch of silence
APP_SHARE = 0.3  # turns where an app pushes a span (no question, no `<ret>`), unless the caller says otherwise
ALL_APPS = 1 - QUIET_SHARE  # an app share where every turn that is not a long silence is an app's span
CHATTER_SHARE = 0.4  # turns that start with a statement (or two)
FOLLOW_UP_SHARE = 0.35  # questions after an answered question of a kind that has follow-ups: a follow-up
BARGE_IN_SHARE = 0.2  # questions after a span that start while the agent still says its answer
NOISE_ONLY_SHARE = 0.08  # conversations that are the room and chatter only: nothing asked for a long while
DIGITAL_SHARE = 0.25  # conversations in digital silence; the others in one of the rooms


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
    """A spoken sentence in a profile's room: user-side Mimi codes [user codebooks, frames], speech ending at
    `speech_frames`, and `after` [user codebooks, frames]: the room's codes that follow them."""

    text: str
    voice: str
    codes: torch.Tensor
    speech_frames: int
    profile: int = 0
    after: torch.Tensor | None = None


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
def encode_speech(mimi: MimiModel, pcms: list[np.ndarray], profiles: list[int] | None = None,
                  seeds: list[int] | None = None,
                  leads: list[int] | None = None) -> list[tuple[torch.Tensor, int, torch.Tensor]]:
    """PCM clips, encoded together -> per clip (codes [codebooks, frames] from its words' first frame to
    `TAIL_FRAMES` after them, their speech frames, the `AFTER_FRAMES` codes after those). A clip with a profile (index
    into `served.PROFILES`) is a session in that room as served, its PCM said from `LEAD_FRAMES` on and its words from
    `leads[i]` (default `LEAD_FRAMES`: what comes before them is words said earlier in the session, and the room);
    without, raw PCM after silence (the agent's voice prompt). Shorter clips are padded, which only follows their own
    frames (the codec is causal)."""
    leads = leads or [LEAD_FRAMES] * len(pcms)
    speech = [math.ceil((len(pcm) - (lead - LEAD_FRAMES) * FRAME_SAMPLES) / FRAME_SAMPLES)
              for pcm, lead in zip(pcms, leads, strict=True)]
    total = max(lead + frames for lead, frames in zip(leads, speech, strict=True)) + TAIL_FRAMES + AFTER_FRAMES
    signal = torch.zeros(len(pcms), 1, total * FRAME_SAMPLES)
    for i, pcm in enumerate(pcms):
        if profiles is None:
            start = LEAD_FRAMES * FRAME_SAMPLES
            signal[i, 0, start:start + len(pcm)] = torch.from_numpy(pcm.astype(np.float32))
        else:
            rng = np.random.default_rng(seeds[i] if seeds is not None else i)
            served = session(PROFILES[profiles[i]], pcm, LEAD_FRAMES, total, rng)
            signal[i, 0] = torch.from_numpy(served)
    codes = mimi.encode(signal.to(next(mimi.parameters()).device)).cpu()
    out = []
    for i, (lead, frames) in enumerate(zip(leads, speech, strict=True)):
        end = lead + frames + TAIL_FRAMES
        out.append((codes[i, :, lead:end], frames, codes[i, :, end:end + AFTER_FRAMES]))
    return out


def later_in_session(rng: random.Random, own: np.ndarray, earlier: np.ndarray | None) -> tuple[np.ndarray, int]:
    """`own` said `LATER_LEAD` frames into a session, after `earlier` words (if any) and the room: (the session's
    speech from `LEAD_FRAMES` on, the frame `own` starts at)."""
    before = rng.randint(*LATER_LEAD) - LEAD_FRAMES
    if earlier is not None:
        before = max(before, math.ceil(len(earlier) / FRAME_SAMPLES) + 4)
    return session_words(own, before * FRAME_SAMPLES, earlier), LEAD_FRAMES + before


def served_silence(mimi: MimiModel, frames: int = SILENCE_FRAMES, profile: NoiseProfile = PROFILES[0],
                   seed: int = 0) -> torch.Tensor:
    """[codebooks, frames]: what a microphone in `profile`'s room encodes to frame by frame from a session's start,
    as served. Not one column: the codec's first frames differ, and after about two seconds its codes settle on
    others than in its first second (a model trained on one column heard a long silence as something new, and asked
    in it); a room's codes never settle."""
    pcm = session(profile, None, 0, frames, np.random.default_rng(seed))
    with torch.no_grad():
        codes = mimi.encode(torch.from_numpy(pcm)[None, None].to(next(mimi.parameters()).device))
    return codes[0].cpu()


def speak_and_encode(mimi: MimiModel, lines: list[tuple[str, Voice, float]], batch_size: int = 16,
                     profiles: list[int] | None = None, seed: int = 0, later: float = 0.0) -> list[Utterance]:
    """(text, voice, gain) -> utterances, spoken by espeak-ng and encoded `batch_size` at a time: in the rooms of
    `profiles` (one per line, as served; a share `later` of them said later in the session, `later_in_session`), or
    (None) as raw PCM after digital silence. Encoded in order of length, so that a batch pads its clips little (a
    clip said 24 s into a session beside 2 s ones tripled the cost); each clip's frames are its own (the codec is
    causal)."""
    rng = random.Random(seed)
    words = [speak(text, voice) * gain for text, voice, gain in lines]
    placed: list[tuple[int, int | None, int]] = []  # per line: (frames before its words, earlier words', lead)
    for i, own in enumerate(words):
        if profiles is not None and rng.random() < later:
            others = [j for j in range(max(0, i - batch_size), min(len(words), i + batch_size)) if j != i]
            earlier = rng.choice(others) if others and rng.random() < EARLIER_WORDS else None
            pcm, lead = later_in_session(rng, own, None if earlier is None else words[earlier])
            placed.append((len(pcm) - len(own), earlier, lead))
        else:
            placed.append((0, None, LEAD_FRAMES))
    order = sorted(range(len(lines)), key=lambda i: placed[i][0] + len(words[i]))
    encoded: dict[int, tuple[torch.Tensor, int, torch.Tensor]] = {}
    for lo in range(0, len(order), batch_size):
        chunk = order[lo:lo + batch_size]
        pcms = [session_words(words[i], placed[i][0], None if placed[i][1] is None else words[placed[i][1]])
                for i in chunk]
        rooms = None if profiles is None else [profiles[i] for i in chunk]
        seeds = [seed * 1_000_003 + i for i in chunk]
        encoded.update(zip(chunk, encode_speech(mimi, pcms, rooms, seeds, [placed[i][2] for i in chunk]),
                           strict=True))
    return [Utterance(text, voice.label(), *encoded[i][:2], 0 if profiles is None else profiles[i], encoded[i][2])
            for i, (text, voice, _) in enumerate(lines)]


def session_words(own: np.ndarray, before: int, earlier: np.ndarray | None) -> np.ndarray:
    """`own` after `before` samples of a session, which start with `earlier` words (if any)."""
    if before == 0:
        return own
    pcm = np.zeros(before + len(own), np.float32)
    if earlier is not None:
        pcm[:len(earlier)] = earlier
    pcm[before:] = own
    return pcm


@dataclass(frozen=True)
class Corpus:
    """Every utterance a split speaks, encoded once, each in one profile's room."""

    split: Split
    questions: tuple[Question, ...]
    chatter: tuple[Utterance, ...]
    follow_ups: tuple[Question, ...] = ()

    @cached_property
    def by_profile(self) -> dict[int, tuple[tuple[Question, ...], tuple[Utterance, ...], tuple[Question, ...]]]:
        """Per profile: its questions, chatter and follow-ups (all of them where a profile has none of a kind)."""
        def of(items: tuple, profile: int, utterance: object) -> tuple:
            own = tuple(item for item in items if utterance(item).profile == profile)
            return own or items

        return {p: (of(self.questions, p, lambda q: q.utterance), of(self.chatter, p, lambda u: u),
                    of(self.follow_ups, p, lambda q: q.utterance)) for p in range(len(PROFILES))}


def draw_profile(rng: random.Random) -> int:
    """A conversation's (or an utterance's) noise profile: digital silence in `DIGITAL_SHARE`, else a room."""
    return 0 if rng.random() < DIGITAL_SHARE else rng.randrange(1, len(PROFILES))


def synthesise_corpus(mimi: MimiModel, split: Split, questions: int, chatter: int, seed: int,
                      follow_ups: int | None = None) -> Corpus:
    """`questions` questions, `chatter` statements and `follow_ups` follow-ups (default: a fifth of the questions),
    each in a room drawn for it."""
    rng = random.Random(f"{split}-{seed}")
    exchanges = [draw_exchange(rng, split) for _ in range(questions)]
    lines = [(e.question, draw_voice(rng, split), rng.uniform(0.3, 1.3)) for e in exchanges]
    rooms = [draw_profile(rng) for _ in lines]
    asked = speak_and_encode(mimi, lines, profiles=rooms, seed=rng.randrange(1 << 30), later=LATER_SHARE)
    lines = [(draw_statement(rng, split), draw_voice(rng, split), rng.uniform(0.3, 1.3)) for _ in range(chatter)]
    rooms = [draw_profile(rng) for _ in lines]
    said = speak_and_encode(mimi, lines, profiles=rooms, seed=rng.randrange(1 << 30), later=LATER_SHARE)
    kinds = follow_up_kinds(split)
    count = questions // 5 if follow_ups is None else follow_ups
    followed = [rng.choice(kinds) for _ in range(count)]
    lines = [(draw_follow_up(rng, split, kind), draw_voice(rng, split), rng.uniform(0.3, 1.3)) for kind in followed]
    rooms = [draw_profile(rng) for _ in lines]
    again = speak_and_encode(mimi, lines, profiles=rooms, seed=rng.randrange(1 << 30), later=LATER_SHARE)
    return Corpus(split, tuple(Question(u, e.kind) for u, e in zip(asked, exchanges, strict=True)), tuple(said),
                  tuple(Question(u, kind) for u, kind in zip(again, followed, strict=True)))


class Assembler:
    """Conversations drawn at random, laid out by the sequence convention (`frontend_model.span.convention`)."""

    def __init__(self, tokenizer: sentencepiece.SentencePieceProcessor, span: SpanConfig, delays: list[int],
                 initial: torch.Tensor, voice: VoicePrompt | None,
                 user_silence: torch.Tensor | tuple[torch.Tensor | tuple[torch.Tensor, ...], ...],
                 default_persona: str = TRAINED_PERSONA, places: tuple[str, ...] | None = None) -> None:
        self.tokenizer = tokenizer
        profiles = (user_silence,) if isinstance(user_silence, torch.Tensor) else tuple(user_silence)
        # Per noise profile (`served.PROFILES`), one or more session tracks: a room's noise drawn afresh each time.
        self.tracks = tuple(tuple(t.to(torch.long) for t in ((track,) if isinstance(track, torch.Tensor) else track))
                            for track in profiles)
        self.user_silence = self.tracks[0][0]
        self.span = span
        self.delays = delays
        self.initial = initial.tolist()  # LMGen's initial token of each row
        self.voice = voice
        self.default_persona = default_persona
        self.places = places  # the places tools' answers name (None: every place they know)
        self.forbidden = non_text_ids(tokenizer, span)
        self.silence = torch.tensor(span.silence_codes, dtype=torch.long)

    def quiet(self, frames: int, at: int = 0, profile: int = 0, take: int = 0) -> torch.Tensor:
        """Live frames `at`.. where nobody speaks: text pad, the silence codes on the agent rows and, on the user rows,
        what the codec makes of a quiet microphone in the profile's room that many frames into a session, as served
        (`served_silence`: not the placeholder codes, which stand in for silence inside spans only; a model trained
        on those would hear something else while it answers). Past its track, the second half of it again. `take`
        picks one of the profile's tracks (a room's noise is never the same twice)."""
        takes = self.tracks[profile if profile < len(self.tracks) else 0]
        track = takes[take % len(takes)]
        length = track.shape[1]
        settled = length // 2
        index = torch.arange(at, at + frames)
        index = torch.where(index < length, index, settled + (index - settled) % (length - settled))
        head = torch.cat([torch.tensor([self.span.text_pad_id]), self.silence])[:, None].repeat(1, frames)
        return torch.cat([head, track[:, index]])

    def speech(self, utterance: Utterance) -> torch.Tensor:
        frames = self.quiet(utterance.codes.shape[1])
        frames[1 + self.span.agent_codebooks:] = utterance.codes
        return frames

    def prefix(self, rng: random.Random) -> Prefix | None:
        """The trained default persona and voice mostly (a session that names neither), else another."""
        persona = self.default_persona if rng.random() < DEFAULT_PERSONA_SHARE else rng.choice(PERSONAS)
        voice = self.voice if rng.random() < 0.7 else None
        return build_prefix(persona, self.tokenizer, self.span, voice, self.delays, self.forbidden)

    def span_and_reply(self, rng: random.Random, frame: int, app: bool, split: Split) -> tuple[SpanAt, list[int], bool]:
        """A span as the server writes it before `frame`, the text ids the agent says after it (an app's text as
        pushed, else a tool's answer behind the tool prefix or the abstain span), and whether a tool answered. The
        answer is drawn afresh for every turn: the model must copy it, it cannot memorise it."""
        contract = self.span.contract
        tool = False
        if app:
            text = reply = app_text(rng, split)
        elif contract.abstain_text and rng.random() < ABSTAIN_SHARE:
            text, reply = contract.abstain_text, ABSTAIN_REPLY
        else:
            reply = tool_answer(rng, self.places)
            text = contract.span_text(reply, tool_result=True)
            tool = True
        block = SpanAt.from_text(frame, text, self.tokenizer, self.span, MAX_SPAN_FRAMES)
        said = SpanAt.from_text(frame, reply, self.tokenizer, self.span, MAX_SPAN_FRAMES)
        return block, list(said.text_ids[1:-1]), tool

    @classmethod
    def for_model(cls, model: LoadedModel, voice: VoicePrompt | None,
                  default_persona: str = TRAINED_PERSONA) -> Assembler:
        """The assembler of `model`'s tokenizer, span ids, delays and codec, with `voice` in its persona prefixes and
        session tracks of every noise profile: `ROOM_TAKES` of each room (digital silence has one)."""
        lm = model.lm
        tracks = tuple(tuple(served_silence(model.mimi, profile=profile, seed=i + len(PROFILES) * take)
                             for take in range(1 if profile.rms <= 0 else ROOM_TAKES))
                       for i, profile in enumerate(PROFILES))
        return cls(model.tokenizer, model.span, list(lm.delays), lm._get_initial_token()[0, :, 0].cpu(), voice,
                   tracks, default_persona)

    @staticmethod
    def question(rng: random.Random, questions: tuple[Question, ...], follow_ups: tuple[Question, ...],
                 answered: str | None) -> Question:
        """A question, or after a tool answered one of kind `answered`, sometimes a follow-up of that kind."""
        if answered is not None and rng.random() < FOLLOW_UP_SHARE:
            own = [q for q in follow_ups if q.kind == answered]
            if own:
                return rng.choice(own)
        return rng.choice(questions)

    def conversation(self, rng: random.Random, corpus: Corpus, max_gap: int, turns: int,
                     window: int | None = None, app_share: float = APP_SHARE) -> Sequence:
        """One or more turns after an optional persona prefix, in one noise profile's room: a question answered by a
        span (a follow-up after an answered question, sometimes said while the agent still answers), an app's span
        (in `app_share` of the turns: no question, no `<ret>`), or a long quiet stretch, any of them after chatter;
        or (`NOISE_ONLY_SHARE`) the room and chatter only. `window` keeps the last columns only (training cost), as a
        long session's window reads them."""
        profile = draw_profile(rng)
        take = rng.randrange(len(self.tracks[profile])) if profile < len(self.tracks) else 0
        questions, chatter, follow_ups = corpus.by_profile[profile]
        prefix = self.prefix(rng) if rng.random() < 0.7 else None
        a = self.span.agent_codebooks
        parts: list[torch.Tensor] = []
        rets: list[int] = []
        spans: list[SpanAt] = []
        answers: list[tuple[int, list[int]]] = []
        at = 0
        after: torch.Tensor | None = None  # the room's codes after the last utterance, not yet laid

        def add(frames: torch.Tensor) -> None:
            nonlocal at
            parts.append(frames)
            at += frames.shape[1]

        def room(frames: int) -> None:
            nonlocal after
            quiet = self.quiet(max(frames, 0), at, profile, take)
            if after is not None:
                laid = min(quiet.shape[1], after.shape[1])
                quiet[1 + a:, :laid] = after[:, :laid]
                after = after[:, laid:]
            add(quiet)

        def say(utterance: Utterance) -> None:
            nonlocal after
            add(self.speech(utterance))
            after = utterance.after

        if rng.random() < NOISE_ONLY_SHARE:
            length = rng.randint(60, (window or 192) + 40)
            while at < length:
                room(rng.randint(10, 60))
                if chatter and rng.random() < 0.5:
                    say(rng.choice(chatter))
            turns = 0
        answered: str | None = None  # the kind of the last question a tool answered
        barging: Question | None = None  # the next question, begun while the agent still answers
        for turn in range(turns):
            if barging is None:
                room(rng.randint(2, 12))
                if rng.random() < CHATTER_SHARE and chatter:
                    for _ in range(rng.choice((1, 1, 2))):
                        say(rng.choice(chatter))
                        room(rng.randint(3, 8))
            kind = rng.random()
            if barging is None and kind < QUIET_SHARE:
                room(rng.randint(10, 90))
                answered = None
                continue
            app = barging is None and kind < QUIET_SHARE + app_share
            if app:
                inject = at + rng.randint(1, 12)
                asked = None
            else:
                asked = barging or self.question(rng, questions, follow_ups, answered)
                start = at
                say(asked.utterance)
                ret = ret_after(rng, start + asked.utterance.speech_frames)
                inject = ret + rng.randint(1, max_gap)
                rets.append(ret)
            block, answer, tool = self.span_and_reply(rng, inject, app, corpus.split)
            answered = asked.kind if asked is not None and tool else None
            spans.append(block)
            answers.append((inject, answer))
            end = inject + len(answer)
            room(inject + 1 - at)
            barging = None
            if not app and turn < turns - 1 and rng.random() < BARGE_IN_SHARE:
                # The next question starts while the agent still answers and ends after it: `<ret>` follows both.
                following = self.question(rng, questions, follow_ups, answered)
                earliest = max(at, end - following.utterance.speech_frames + 2)
                if earliest < end:
                    room(rng.randint(earliest, end - 1) - at)
                    barging = following
            if barging is None:
                room(end + rng.randint(2, 8) - at)
        frames = torch.cat(parts, dim=1)
        for inject, answer in answers:
            frames[0, inject:inject + len(answer)] = torch.tensor(answer, dtype=frames.dtype)
        sequence = self.laid(frames, rets, spans, answers, prefix)
        if window is None or sequence.columns.shape[1] <= window:
            return sequence
        if prefix is None:
            return sequence.last(window)
        # As a rolled window reads a long session: the prefix, then the most recent frames (a serving window keeps the
        # prefix; a window cut from the front lost it, and the model never saw a prefix followed by the middle of a
        # conversation: 4 frames of a settled room after it, it asked). The frames kept are the most recent that fit
        # with their spans.
        excess, cut = sequence.columns.shape[1] - window, 0
        while excess > 0:
            excess -= 1 + sum(len(block.text_ids) for block in spans if block.frame == cut)
            cut += 1
        return self.laid(frames[:, cut:], [r - cut for r in rets if r >= cut],
                         [SpanAt(block.frame - cut, block.text_ids) for block in spans if block.frame >= cut],
                         [(at_ - cut, answer) for at_, answer in answers if at_ >= cut], prefix)

    def laid(self, frames: torch.Tensor, rets: list[int], spans: list[SpanAt], answers: list[tuple[int, list[int]]],
             prefix: Prefix | None) -> Sequence:
        a = self.span.agent_codebooks
        conversation = Conversation(frames[0], frames[1:1 + a], frames[1 + a:], tuple(rets), tuple(spans), prefix)
        return self.layout(assemble(conversation, self.span, LossWeights(ret=RET_WEIGHT, pad=PAD_WEIGHT)),
                           [(at_, len(answer)) for at_, answer in answers])

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
