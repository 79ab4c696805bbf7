"""The frozen test set of `bench behaviour` (issue 35) is the committed file, far from every training phrasing,
spoken in voices training never heard, answered by the built-in router as written (follow-ups from the history), and
its scoring counts an answer as said only with its numbers right."""

from __future__ import annotations

import hashlib
import re
import shutil
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from backend_agent.asr.transcriber import WhisperTranscriber
from backend_agent.request import Answered
from backend_agent.router import Router
from backend_agent.tools import build_catalogue
from benchmarks.behaviour_scoring import Turn, numbers_right, score
from benchmarks.behaviour_testset import SetTurn, heard_as_written, misheard, routed, wer
from benchmarks.harness import StreamResult
from benchmarks.harness.testset import (
    MIN_EDITS,
    TESTSET_PATH,
    TESTSET_SHA256,
    Conversation,
    SetQuestion,
    SetVoice,
    load_testset,
    nearest_edits,
    phrasing_words,
    room_noise,
    say,
    sentences,
    word_edits,
)
from frontend_model.span.contract import CONTRACTS
from frontend_model.training.recipes import _CHATTER, _TEMPLATES, HELD_OUT_VOICES, TRAIN_VOICES
from frontend_model.training.statements import _SLOTS
from frontend_model.training.statements import _TEMPLATES as _STATEMENTS

TRAIN_PHRASINGS = [p for phrasings in _TEMPLATES["train"].values() for p in phrasings]
TRAIN_RATES = range(135, 186)  # recipes.draw_voice's words a minute


def test_the_committed_test_set_has_the_pinned_sha256() -> None:
    assert hashlib.sha256(TESTSET_PATH.read_bytes()).hexdigest() == TESTSET_SHA256


def test_an_edited_test_set_is_refused(tmp_path: Path) -> None:
    edited = tmp_path / "v1.json"
    edited.write_bytes(TESTSET_PATH.read_bytes().replace(b"Warsaw", b"Paris"))
    with pytest.raises(ValueError, match="not the frozen test set"):
        load_testset(edited)


def test_word_edits_count_whole_words() -> None:
    assert word_edits(phrasing_words("what time is it"), phrasing_words("what time is it")) == 0
    assert word_edits(phrasing_words("what time is it"), phrasing_words("what is the time")) == 3
    assert word_edits(phrasing_words("what time is it now"), phrasing_words("what time is it")) == 1
    assert word_edits([], ["a", "b"]) == 2
    assert phrasing_words("What's {a} {op} {b}, please?") == ["what's", "{number}", "{op}", "{number}", "please"]


def test_every_sentence_of_every_question_is_three_word_edits_from_every_training_phrasing() -> None:
    near = {q.text: nearest_edits(q.phrasing, TRAIN_PHRASINGS)
            for c in load_testset().conversations for q in c.questions}
    assert min(near.values()) >= MIN_EDITS, {q: n for q, n in near.items() if n < MIN_EDITS}


def test_the_chatter_is_three_word_edits_from_every_training_statement() -> None:
    assert all(nearest_edits(line, _CHATTER["train"]) >= MIN_EDITS for line in load_testset().chatter)
    near = {s: min(edits_to_a_fill(plain_words(s), plain_words(t)) for t in _STATEMENTS["train"])
            for line in load_testset().chatter for s in sentences(line)}
    assert min(near.values()) >= MIN_EDITS, {s: n for s, n in near.items() if n < MIN_EDITS}


def plain_words(text: str) -> list[str]:
    return re.findall(r"\{\w+\}|[a-z0-9']+", text.lower())


def slot_fills(slot: str) -> list[list[str]]:
    """Every fill of a training statement's slot, as words (a fill's own slots filled in turn)."""
    fills: list[list[str]] = []
    for value in _SLOTS["train"][slot]:
        words = plain_words(value)
        inner = next((i for i, w in enumerate(words) if w.startswith("{")), None)
        fills += [words] if inner is None else [words[:inner] + f + words[inner + 1:]
                                                for f in slot_fills(words[inner][1:-1])]
    return fills


def edits_to_a_fill(words: list[str], template: list[str]) -> int:
    """The fewest word edits from `words` to any fill of `template` (slots filled independently)."""
    def take(row: list[int], word: str) -> list[int]:
        out = [row[0] + 1]
        for j, w in enumerate(words, start=1):
            out.append(min(row[j] + 1, out[j - 1] + 1, row[j - 1] + (w != word)))
        return out

    row = list(range(len(words) + 1))
    for token in template:
        if not token.startswith("{"):
            row = take(row, token)
            continue
        filled = []
        for fill in slot_fills(token[1:-1].lower()):
            through = row
            for word in fill:
                through = take(through, word)
            filled.append(through)
        row = [min(column) for column in zip(*filled, strict=True)]
    return row[-1]


def test_edits_to_a_fill_finds_the_nearest_fill() -> None:
    template = plain_words("{Person} lives in {city}.")
    assert edits_to_a_fill(plain_words("My sister lives in Paris."), template) == 0
    assert edits_to_a_fill(plain_words("My sister lives in Prague."), template) == 1
    assert edits_to_a_fill(plain_words("A colleague of mine lives near Paris."), template) == 1


def test_the_voices_are_flite_or_espeak_ng_voices_and_rates_training_never_used() -> None:
    voices = load_testset().voices
    assert {v.engine for v in voices} == {"flite", "espeak-ng"}
    for voice in voices:
        if voice.engine == "espeak-ng":
            assert voice.name not in (*TRAIN_VOICES, *HELD_OUT_VOICES), voice
            assert voice.words_per_minute is not None and voice.words_per_minute not in TRAIN_RATES, voice


def test_the_router_answers_every_question_as_written_in_its_intent_follow_ups_from_the_history() -> None:
    router = Router(build_catalogue())
    tools = {"time": "time_in_place", "date": "date", "math": "arithmetic", "units": "unit_conversion"}
    testset = load_testset()
    assert {q.intent for c in testset.conversations for q in c.questions} == set(tools)
    for conversation in testset.conversations:
        history: tuple[Answered, ...] = ()
        for question in conversation.questions:
            answer = routed(router, question.text, history)
            assert answer is not None and answer.tool == tools[question.intent], question
            if question.follow_up:
                assert routed(router, question.text, ()) is None, f"{question.text!r} needs no history"
            history += (answer,)


def test_each_conversation_asks_a_follow_up_and_a_second_question() -> None:
    for conversation in load_testset().conversations:
        assert len(conversation.questions) >= 3
        assert sum(q.follow_up for q in conversation.questions) >= 1


@pytest.mark.skipif(shutil.which("flite") is None, reason="flite is not installed (apt-get install flite)")
def test_flite_speaks_a_question_at_the_models_rate() -> None:
    voice = next(v for v in load_testset().voices if v.engine == "flite")
    pcm = say("Which date was it yesterday?", voice)
    assert pcm.dtype == np.float32 and 1.0 < len(pcm) / 24_000 < 4.0 and 0.05 < np.abs(pcm).max() <= 1.0


def test_the_room_noise_is_a_quiet_seeded_minute() -> None:
    noise = load_testset().noise
    pcm = room_noise(noise)
    assert len(pcm) == 60 * 24_000 and np.array_equal(pcm, room_noise(noise))
    assert 0.005 < float(np.sqrt(np.mean(pcm**2))) < 0.02


def turn(span: str, said: str, recall: float) -> Turn:
    return Turn("q", True, "q", span, said, recall, 100.0, 500.0, 0.0)


def test_an_answer_is_said_exactly_only_with_its_numbers_right() -> None:
    span = "(tool result) Twenty-four times six is one hundred forty-four."
    assert numbers_right("twenty-four times six is one hundred forty-four", "twenty four times six is 144 ok")
    assert not numbers_right("twenty-four times six is one hundred forty-four", "twenty four times six is 145")
    assert turn(span, "Twenty-four times six is one hundred forty-four.", 1.0).said_exactly
    assert not turn(span, "Twenty-four times six is one hundred forty-five.", 0.9).said_exactly
    assert not turn(span, "Twenty-four times six is one hundred forty-four.", 0.7).said_exactly


def test_abstain_turns_are_apart_from_tool_answers_and_misheard_is_a_miss_of_its_own() -> None:
    abstain = turn(CONTRACTS["contextspan"].abstain_text, "Sorry, I could not find that.", 1.0)
    assert abstain.abstained and abstain.said_exactly
    assert SetTurn("c1", "flite:slt", "time", False, abstain, misheard=True).outcome == "misheard"
    tool = turn("(tool result) Nine plus ten is nineteen.", "Nine plus ten is nineteen.", 1.0)
    assert not tool.abstained
    assert SetTurn("c1", "flite:slt", "math", True, tool, misheard=False).outcome == "answered"
    silent = Turn("q", False, None, None, "", 0.0, None, None, None)
    assert SetTurn("c1", "flite:slt", "math", True, silent, misheard=True).outcome == "no <ret>"


def test_a_question_heard_in_other_spelling_is_not_misheard_when_the_tool_answers_it_alike() -> None:
    router = Router(build_catalogue(clock=lambda: datetime(2026, 12, 6, 9, 30, tzinfo=UTC)))
    written = routed(router, "how many gallons are there in 13 litres?", ())
    assert not misheard(written, routed(router, "How many gallons are there in 13 liters?", ()))
    assert misheard(written, routed(router, "How many gallons are there in 30 liters?", ()))
    assert misheard(written, routed(router, "How many gallants are there in tin liters?", ()))


def test_a_conversation_is_heard_as_written_only_if_whisper_hears_every_question_as_the_router_answers_it() -> None:
    transcriber = WhisperTranscriber()
    slt = SetVoice("flite", "slt")
    first = SetQuestion("math", "what is twelve plus thirty?", {}, follow_up=False)
    follow_up = SetQuestion("math", "so what is that minus two?", {}, follow_up=True)
    nonsense = SetQuestion("units", "how many glorbs are in a flimflam?", {}, follow_up=False)
    assert heard_as_written(Conversation("c", slt, (first, follow_up)), transcriber)
    assert not heard_as_written(Conversation("c", slt, (follow_up,)), transcriber)  # nothing for it to follow
    assert not heard_as_written(Conversation("c", slt, (first, nonsense)), transcriber)


def test_word_error_counts_numbers_as_digits_on_both_sides() -> None:
    assert wer(["What does twenty-four times six equal?"], ["What does 24 times 6 equal"]) == 0.0
    assert wer(["which date was it yesterday"], ["which day was it yesterday"]) == 0.2


def test_a_late_span_is_scored_with_the_ret_it_answers_not_the_question_it_lands_in() -> None:
    def event(kind: str, t: float, **fields: object) -> SimpleNamespace:
        return SimpleNamespace(type=kind, t=t, **fields)

    result = StreamResult(events=[
        event("retrieval", 3.0), event("retrieval", 13.0),  # one `<ret>` after each question (at 0 s and at 10 s)
        event("question", 11.0, text="what is nine plus ten"),
        event("span.injected", 11.0, text="(tool result) Nine plus ten is nineteen.", step=140),
        event("agent.text", 11.1, frame=140, text=" Nine plus ten is nineteen."),
        event("span.dropped", 16.0, reason="late: no answer within 2.5 s of the request", text=""),
    ])
    first, second = score("q1", 2.5, result, 0.0, 10.0), score("q2", 12.0, result, 10.0)
    assert first.span and first.recall == 1.0 and first.heard == "what is nine plus ten"
    assert second.asked and second.span is None and second.dropped and second.dropped.startswith("late")
