"""A model that really uses spans, on a real server: the tiny Context Spanning model trained by `contextspan train`
(cached per machine), served as any checkpoint (`--profile contextspan --checkpoint DIR`, trigger `auto` -> `ret`),
no forcing hook, the real Whisper and the built-in router. Questions and voice are held out from training.

The model must emit `<ret>` itself after a spoken question, the question is transcribed, the router answers, the span
goes in, and the agent's text after it carries the span's words in order; and it must not ask in silence. The same
holds as row 2 of a batch next to a busy session, with the chunked prefill, for a span an app pushes, late in a
two-minute call (fifteen windows of the model's context, the KV ring wrapped three times over) as early in it, and for
a later question of a conversation in a synthesizer training never heard (flite).
"""

from __future__ import annotations

import asyncio
import itertools
import random
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from backend_agent.asr.transcriber import WhisperTranscriber
from benchmarks.behaviour import ask, audible_questions, held_out_voice
from benchmarks.behaviour_long import EDGE_S, TAIL_S, call_audio, long_call, rolls, said_the_answer
from benchmarks.behaviour_scoring import (
    SAID_RECALL,
    Turn,
    in_order_recall,
    stream_time,
    stream_when_free,
    words,
)
from benchmarks.behaviour_testset import converse, heard_as_written
from benchmarks.harness import StreamResult
from benchmarks.harness.testset import Conversation, SetQuestion, SetVoice
from contextspan_client import chat_url
from frontend_model.frame import SAMPLE_RATE
from frontend_model.training.recipes import draw_exchange, draw_follow_up, follow_up_kinds
from frontend_model.training.released import tiny_contextspan_checkpoint
from frontend_model.training.speech import speak
from frontend_model.training.trainer import TrainConfig
from server.wire.protocol import SpanInject

from .servers import RunningServer, start_server, stop_server

# The first test of a machine trains the model in its fixture (about 15 minutes on 2 cores, longer with one kept busy),
# inside its timeout.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400)]

# Spans are timed, not cut: a loaded host's Whisper must not decide an outcome (the bench reports the times; with a
# core taken, a slow host's final transcripts came 20-24 s after a question: the deadline is about twice). Blocks
# up to 320 frames: the reference persona and voice prefix takes about 294 (the trained default persona's, 39). The
# KV ring is the context (96 frames) plus those 320: it wraps after 33.3 s.
FLAGS = ("--span-deadline-s", "45", "--question-wait-s", "3", "--max-span-frames", "320")
# The model is sampled, and it is tiny: it does not ask after every question (the bench measures how often, README).
# Each behaviour below gets its own six held-out questions, ones Whisper hears right (`audible_questions`: the test is
# the speech model's, not the ASR's), and must show itself on one of them: `<ret>` from the model within 2 s of the
# question's end, the question transcribed and answered by the router, the span injected, and at least `SAID_RECALL`
# of the answer's words said in order.
PER_TEST = 6
# Notifications of shapes training never used (recipes' held-out app templates); like a question, the behaviour must
# show itself on one of them (sampled).
APP_TEXTS = ("Your train to the airport leaves at nine thirty from gate four.",
             "The museum opens tomorrow morning at ten and closes at six.",
             "Your parcel was delayed and arrives on Friday afternoon.")


@pytest.fixture(scope="session")
def trained() -> Path:
    """The committed release of the default recipe (or, for a recipe changed since, trained once per machine)."""
    return tiny_contextspan_checkpoint(TrainConfig(), progress=False)


def serve(tmp: Path, checkpoint: Path, *flags: str) -> RunningServer:
    return start_server(tmp, "--profile", "contextspan", "--checkpoint", str(checkpoint), *FLAGS, *flags)


@pytest.fixture(scope="session")
def questions() -> list[str]:
    return audible_questions(3 * PER_TEST, held_out_voice())


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, trained: Path) -> Iterator[RunningServer]:
    running = serve(tmp_path_factory.mktemp("behaviour"), trained, "--max-sessions", "2", "--app-spans", "on")
    yield running
    stop_server(running)


def used_the_span(turn: Turn) -> bool:
    return said_the_answer(turn) and turn.ret_ms is not None and turn.ret_ms < 2000 and bool(turn.heard)


def first_answered(questions: list[str], ask_one: Callable[[str], Turn]) -> Turn:
    """Asks until a question is answered with its span's words; fails with every turn if none is."""
    turns = []
    for question in questions:
        turns.append(ask_one(question))
        if used_the_span(turns[-1]):
            return turns[-1]
    pytest.fail("no question was asked for and answered:\n" + "\n".join(map(str, turns)))


def alone(ws: str) -> Callable[[str], Turn]:
    return lambda question: asyncio.run(ask(ws, [question], held_out_voice()))[0]


def test_the_model_asks_after_held_out_questions_and_says_the_routers_answers(server: RunningServer,
                                                                             questions: list[str]) -> None:
    """Asks until two questions were asked for and one of them answered with its span's words."""
    turns: list[Turn] = []
    for question in questions_for(questions, 0):
        turns.append(alone(server.ws)(question))
        if sum(t.asked for t in turns) >= 2 and any(used_the_span(t) for t in turns):
            return
    pytest.fail("fewer than two questions asked for, or none answered:\n" + "\n".join(map(str, turns)))


def questions_for(questions: list[str], test: int) -> list[str]:
    """Each test's own questions, interleaved over the held-out order."""
    return questions[test::3]


def test_no_ret_in_a_minute_of_silence(server: RunningServer) -> None:
    result = asyncio.run(stream_when_free(chat_url(server.ws, events=True), np.zeros(60 * SAMPLE_RATE, np.float32)))
    assert result.frames_sent >= 740
    assert not result.of_type("retrieval")


def test_row_two_of_a_batch_next_to_a_busy_session_asks_and_answers(server: RunningServer,
                                                                   questions: list[str]) -> None:
    chatter = speak("We watched a movie last night and then we talked about it for a long time.", held_out_voice())
    busy_pcm = np.concatenate([chatter] * 4)

    def beside_a_busy_session(question: str) -> Turn:
        async def both() -> Turn:
            busy = asyncio.create_task(stream_when_free(chat_url(server.ws, events=True), busy_pcm))
            await asyncio.sleep(1.0)  # the busy session holds row 1
            turn = (await ask(server.ws, [question], held_out_voice()))[0]
            await busy
            return turn

        return asyncio.run(both())

    first_answered(questions_for(questions, 1), beside_a_busy_session)


def test_a_span_an_app_pushes_is_said_too(server: RunningServer) -> None:
    pcm = np.zeros(2 * SAMPLE_RATE, np.float32)

    def push(text: str) -> tuple[float, str]:
        message = SpanInject(type="span.inject", text=text, source="app").model_dump_json()

        def done(result: StreamResult) -> bool:
            spans = result.of_type("span.injected")
            return bool(spans) and stream_time(result) >= spans[0].t + 4.0

        result = asyncio.run(stream_when_free(chat_url(server.ws, events=True), pcm, texts=[(1.0, message)],
                                              until=done, until_timeout_s=20.0))
        spans = result.of_type("span.injected")
        assert len(spans) == 1 and spans[0].source == "app"
        said = "".join(e.text for e in result.of_type("agent.text") if e.frame >= spans[0].step)
        return in_order_recall(words(spans[0].text), words(said)), said

    tries = []
    for text in APP_TEXTS:
        tries.append(push(text))
        if tries[-1][0] >= SAID_RECALL:
            return
    pytest.fail(f"no app's span was said: {tries}")


def test_with_the_chunked_prefill_the_model_asks_and_answers(tmp_path: Path, trained: Path,
                                                             questions: list[str]) -> None:
    running = serve(tmp_path, trained, "--max-sessions", "1", "--span-prefill", "chunked")
    try:
        first_answered(questions_for(questions, 2), alone(running.ws))
    finally:
        stop_server(running)


CALL_S = 120.0
MAX_RSS_GROWTH = 20 * 2**20


def test_in_a_two_minute_call_questions_in_its_last_windows_are_answered_as_in_its_first(
        server: RunningServer, questions: list[str]) -> None:
    """Fifteen windows of the 96-frame context, a question every 7 s: the window keeps the 38-frame persona prefix
    (`--window auto` -> keep-prefix), so the model late in the call reads what it read at its start (issue 37)."""
    pcm, placed = call_audio(questions, held_out_voice(), CALL_S, every_s=7.0)
    rolled = rolls(server.http)
    call = asyncio.run(long_call(server.ws, pcm, placed, server.rss_bytes))
    assert rolls(server.http) - rolled >= 14
    first, last = call.answered_between(0.0, EDGE_S), call.answered_between(CALL_S - TAIL_S - EDGE_S, CALL_S)
    assert first[0] >= 1 and last[0] >= 1, (first, last, call.turns)
    assert call.rss_growth(EDGE_S) <= MAX_RSS_GROWTH, call.rss


# A synthesizer family training never heard (the frozen test set's; these conversations are drawn here, not its own).
FLITE = SetVoice("flite", "slt")


def flite_conversation(seed: int) -> Conversation:
    """A held-out question the router has follow-ups for, a held-out follow-up of it, another held-out question."""
    rng = random.Random(seed)
    first = draw_exchange(rng, "held_out")
    while first.kind not in follow_up_kinds("held_out"):
        first = draw_exchange(rng, "held_out")
    last = draw_exchange(rng, "held_out")
    return Conversation(f"e2e-{seed}", FLITE, (
        SetQuestion(first.kind, first.question, {}, follow_up=False),
        SetQuestion(first.kind, draw_follow_up(rng, "held_out", first.kind), {}, follow_up=True),
        SetQuestion(last.kind, last.question, {}, follow_up=False)))


def audible_flite_conversations(count: int) -> list[Conversation]:
    """The first `count` conversations (by seed) whose every question Whisper hears as written in flite's voice: the
    test is the speech model's, not the ASR's."""
    transcriber = WhisperTranscriber()
    drawn = (flite_conversation(seed) for seed in itertools.count())
    return list(itertools.islice((c for c in drawn if heard_as_written(c, transcriber)), count))


def test_in_a_conversation_of_several_turns_in_an_unheard_synthesizer_a_later_question_is_answered(
        server: RunningServer) -> None:
    """Issue 35: one session, three questions 7 s apart in flite's voice (training heard espeak-ng only), a follow-up
    the router resolves from the answered history among them; a question after the first is asked for, heard as
    written and its answer said, in one of six conversations (the model is sampled)."""
    tried = []
    for conversation in audible_flite_conversations(PER_TEST):
        turns = asyncio.run(converse(server.ws, conversation))
        tried.append(turns)
        if any(used_the_span(t.turn) and not t.misheard for t in turns[1:]):
            return
    pytest.fail("no question after a conversation's first was answered:\n" + "\n".join(map(str, tried)))
