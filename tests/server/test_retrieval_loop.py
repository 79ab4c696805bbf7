"""The `<ret>` -> answer loop with real speech, the real Whisper model and the built-in router."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from backend_agent.agent import Agent
from backend_agent.asr.streaming import StreamingASR
from backend_agent.asr.transcriber import WhisperTranscriber
from backend_agent.context_store import ContextStore
from backend_agent.tools import build_catalogue
from server.session.retrieval import Retrieval, RetrievalConfig, SpanAnswer, is_question
from server.wire import protocol as p
from tests.support.speech import silence, speak


def test_question_detection() -> None:
    assert is_question("What time is it in Tokyo?")
    assert is_question("how far is the moon")
    assert not is_question("I like trains.")


async def _run(pcm: np.ndarray, trigger_after_s: float, config: RetrievalConfig,
               transcriber: WhisperTranscriber) -> tuple[list[SpanAnswer], list[Any], ContextStore]:
    answers: list[SpanAnswer] = []
    events: list[Any] = []
    store = ContextStore(":memory:")
    with ThreadPoolExecutor(1) as pool:
        retrieval: Retrieval

        def on_transcript(t: Any) -> None:
            retrieval.on_transcript(t)

        asr = StreamingASR(transcriber.transcribe, pool, on_transcript, queue_frames=len(pcm) // 1920 + 1)
        retrieval = Retrieval("s1", "u1", Agent(build_catalogue()), store, asr, answers.append, events.append,
                              lambda: 0.0, config)
        asr.start()
        frames = [pcm[i : i + 1920] for i in range(0, len(pcm) - 1919, 1920)]
        for i, frame in enumerate(frames):
            retrieval.feed(frame)
            if i == int(trigger_after_s / 0.08) and config.trigger == "ret":
                await asr.drain()
                assert retrieval.trigger()
                assert not retrieval.trigger(), "one retrieval in flight per session"
            await asyncio.sleep(0.01)
        await asr.drain()
        for _ in range(300):
            if answers or any(isinstance(e, p.SpanDropped) and e.reason != "a retrieval is already in flight"
                              for e in events):
                break
            await asyncio.sleep(0.01)
        await retrieval.close()
    return answers, events, store


@pytest.fixture(scope="module")
def transcriber() -> WhisperTranscriber:
    return WhisperTranscriber()


@pytest.mark.slow
def test_ret_after_a_spoken_question_yields_the_answer(transcriber: WhisperTranscriber, tmp_path: Path) -> None:
    pcm = np.concatenate([silence(0.3), speak("What is twelve times seven?", tmp_path / "q.wav"), silence(1.0)])
    answers, events, store = asyncio.run(_run(pcm, len(pcm) / 24000 - 0.1, RetrievalConfig(), transcriber))
    assert len(answers) == 1, events
    assert "84" in answers[0].text and answers[0].tool == "arithmetic"
    assert "twelve times seven" in answers[0].question.lower() or "12" in answers[0].question
    assert {type(e).__name__ for e in events} >= {"UserTranscript", "Question", "SpanDropped"}
    assert [t.role for t in store.turns("s1")] == ["user", "tool"]


@pytest.mark.slow
def test_asr_trigger_mode_starts_retrieval_on_a_question(transcriber: WhisperTranscriber, tmp_path: Path) -> None:
    pcm = np.concatenate([silence(0.3), speak("How many kilometres are in ten miles?", tmp_path / "q.wav"),
                          silence(1.0)])
    answers, _, _ = asyncio.run(_run(pcm, 0, RetrievalConfig(trigger="asr"), transcriber))
    assert len(answers) == 1 and answers[0].tool == "unit_conversion" and "16" in answers[0].text


@pytest.mark.slow
def test_no_speech_gives_a_dropped_span(transcriber: WhisperTranscriber) -> None:
    answers, events, _ = asyncio.run(_run(silence(2.0), 1.0, RetrievalConfig(), transcriber))
    assert answers == []
    dropped = [e for e in events if isinstance(e, p.SpanDropped) and "in flight" not in e.reason]
    assert dropped and dropped[0].reason in ("no question heard", "no built-in tool answers this (no LLM configured)")


def test_agent_pieces_become_one_turn_before_the_users_next_utterance() -> None:
    from backend_agent.asr.streaming import Transcript

    store = ContextStore(":memory:")
    retrieval = Retrieval("s1", "u1", Agent(build_catalogue()), store, None, lambda a: None, lambda e: None,
                          lambda: 0.0)
    for piece in [" It", " is", " nine", "."]:
        retrieval.on_agent_text(piece)
    retrieval.on_transcript(Transcript("Thanks!", True, 0.0, 1.0, 0.0))
    retrieval.on_agent_text(" Bye")
    asyncio.run(retrieval.close())
    assert [(t.role, t.text) for t in store.turns("s1")] == [("agent", "It is nine."), ("user", "Thanks!"),
                                                             ("agent", "Bye")]


@pytest.mark.parametrize(("trigger", "utterance", "starts"), [
    ("asr", "Hello there, what time is it in Tokyo right now? Thank you.", True),
    ("asr", "Okay, thanks! That's all, goodbye.", False),
    ("asr", "I like trains.", False),
    ("ret", "What time is it in Tokyo?", False),  # only the model's <ret> starts one
])
def test_asr_trigger_starts_on_a_question_inside_the_utterance(trigger: str, utterance: str, starts: bool) -> None:
    from backend_agent.asr.streaming import Transcript

    async def run() -> bool:
        retrieval = Retrieval("s1", "u1", Agent(build_catalogue()), ContextStore(":memory:"), None, lambda a: None,
                              lambda e: None, lambda: 0.0, RetrievalConfig(trigger=trigger))  # type: ignore[arg-type]
        retrieval.on_transcript(Transcript(utterance, True, 0.0, 2.0, 0.0))
        started = retrieval.in_flight
        await retrieval.close()
        return started

    assert asyncio.run(run()) is starts


class SlowTranscriber:
    """Whisper on a starved machine: every transcription takes longer than the span deadline."""

    def transcribe(self, audio: np.ndarray) -> str:
        import time

        time.sleep(1.5)
        return "what is two plus two"


def test_a_slow_asr_drops_the_span_at_the_deadline_not_later(tmp_path: Path) -> None:
    async def run() -> tuple[list[SpanAnswer], list[Any], float]:
        answers: list[SpanAnswer] = []
        events: list[Any] = []
        with ThreadPoolExecutor(1) as pool:
            asr = StreamingASR(SlowTranscriber().transcribe, pool, lambda t: None)
            retrieval = Retrieval("s1", "u1", Agent(build_catalogue()), ContextStore(":memory:"), asr,
                                  answers.append, events.append, lambda: 0.0, RetrievalConfig(deadline_s=0.5))
            asr._segmenter.recent_audio = lambda seconds: np.ones(16000, np.float32)  # type: ignore[method-assign]
            started = asyncio.get_running_loop().time()
            assert retrieval.trigger()
            while not events:
                await asyncio.sleep(0.01)
            elapsed = asyncio.get_running_loop().time() - started
            await retrieval.close()
        return answers, events, elapsed

    answers, events, elapsed = asyncio.run(run())
    assert not answers
    assert len(events) == 1 and isinstance(events[0], p.SpanDropped) and events[0].reason.startswith("late"), events
    assert 0.5 <= elapsed < 1.0, elapsed


def test_ret_while_the_final_is_still_being_transcribed_waits_for_it(tmp_path: Path) -> None:
    """A slow host: the utterance has ended but its final transcript is still being computed when `<ret>` comes.
    The question is that final, not a second transcription of the last seconds heard."""
    calls: list[int] = []

    def transcribe(audio: np.ndarray) -> str:
        import time

        calls.append(len(audio))
        time.sleep(0.4)
        return "What is two plus two?"

    pcm = np.concatenate([silence(0.3), speak("What is two plus two?", tmp_path / "q.wav"), silence(1.0)])

    async def run() -> tuple[list[SpanAnswer], list[Any]]:
        answers: list[SpanAnswer] = []
        events: list[Any] = []
        with ThreadPoolExecutor(1) as pool:
            retrieval: Retrieval
            asr = StreamingASR(transcribe, pool, lambda t: retrieval.on_transcript(t),
                               queue_frames=len(pcm) // 1920 + 1)
            retrieval = Retrieval("s1", "u1", Agent(build_catalogue()), ContextStore(":memory:"), asr,
                                  answers.append, events.append, lambda: 0.0, RetrievalConfig(question_wait_s=2.0))
            asr.start()
            for i in range(0, len(pcm) - 1919, 1920):
                retrieval.feed(pcm[i : i + 1920])
            while not asr._final_running:
                await asyncio.sleep(0.005)
            assert not asr._segmenter.in_speech and asr.awaiting_final
            assert retrieval.trigger()
            while not answers and not any(isinstance(e, p.SpanDropped) for e in events):
                await asyncio.sleep(0.01)
            await retrieval.close()
        return answers, events

    answers, events = asyncio.run(run())
    assert len(answers) == 1, events
    assert answers[0].question == "What is two plus two?" and answers[0].text == "2 plus 2 is 4."
    assert "asr_ms" not in answers[0].timings_ms, "the last seconds were transcribed again instead of waiting"


def test_a_typed_question_is_the_users_turn_answered_through_the_agent_one_retrieval_at_a_time() -> None:
    answers: list[SpanAnswer] = []
    events: list[Any] = []
    store = ContextStore(":memory:")

    async def run() -> None:
        retrieval = Retrieval("s1", "u1", Agent(build_catalogue()), store, None, answers.append, events.append,
                              lambda: 0.0)
        retrieval.on_agent_text(" Hello.")
        assert retrieval.ask("What is twelve times seven?")
        assert not retrieval.ask("And eight times nine?")  # stored, but one retrieval is in flight
        while retrieval.in_flight:
            await asyncio.sleep(0.01)
        await retrieval.close()

    asyncio.run(run())
    (answer,) = answers
    assert answer.question == "What is twelve times seven?" and answer.tool == "arithmetic" and "84" in answer.text
    assert [(t.role, t.text) for t in store.turns("s1")][:3] == [
        ("agent", "Hello."), ("user", "What is twelve times seven?"), ("user", "And eight times nine?")]
    assert [e.text for e in events if isinstance(e, p.Question)] == ["What is twelve times seven?"]
    assert [e.reason for e in events if isinstance(e, p.SpanDropped)] == ["a retrieval is already in flight"]


def test_ret_while_the_user_still_asks_waits_for_that_question_and_its_deadline_starts_when_they_stop(
    tmp_path: Path,
) -> None:
    """The model asks before the question ends (it anticipates): an older utterance, still fresh, is not the
    question, and the span deadline, shorter here than the rest of the question, counts from the user's stop."""
    before = speak("I like trains.", tmp_path / "a.wav")
    question = speak("Tell me, what is two plus two?", tmp_path / "q.wav")
    pcm = np.concatenate([silence(0.3), before, silence(1.5), question, silence(1.2)])
    ret_at = 0.3 + (len(before) + len(question)) / 24000 + 1.5 - 1.0  # a second before the question ends

    def transcribe(audio: np.ndarray) -> str:  # 16 kHz, the same pre-roll and end each: the question is longer
        return "What is two plus two?" if len(audio) > len(question) * 2 / 3 else "I like trains."

    async def run() -> tuple[list[SpanAnswer], list[Any], float, float]:
        answers: list[SpanAnswer] = []
        events: list[Any] = []
        with ThreadPoolExecutor(1) as pool:
            retrieval: Retrieval
            asr = StreamingASR(transcribe, pool, lambda t: retrieval.on_transcript(t),
                               queue_frames=len(pcm) // 1920 + 1, on_speech=lambda e: retrieval.on_speech(e))
            retrieval = Retrieval("s1", "u1", Agent(build_catalogue()), ContextStore(":memory:"), asr,
                                  answers.append, events.append, lambda: 0.0, RetrievalConfig(deadline_s=0.6))
            asr.start()
            triggered = 0.0
            for i in range(0, len(pcm) - 1919, 1920):
                retrieval.feed(pcm[i : i + 1920])
                if i == int(ret_at * 24000) // 1920 * 1920:
                    await asr.drain()
                    assert asr.latest_final is not None and asr.latest_final.text == "I like trains."
                    assert asr.in_speech
                    assert retrieval.trigger()
                    triggered = asyncio.get_running_loop().time()
                if triggered:
                    await asyncio.sleep(0.08)  # the rest of the question comes in real time
            while not answers and not any(isinstance(e, p.SpanDropped) for e in events):
                await asyncio.sleep(0.01)
            await retrieval.close()
        return answers, events, triggered, asyncio.get_running_loop().time()

    answers, events, _, _ = asyncio.run(run())
    assert len(answers) == 1, events
    answer = answers[0]
    assert answer.question == "What is two plus two?" and answer.text == "2 plus 2 is 4."
    assert answer.deadline_from - answer.triggered >= 0.6, "the deadline counts from the question's end"


class TalkingOn:
    """The ASR of a user who goes on speaking right after the question whose final started the retrieval."""

    awaiting_final = True
    in_speech = True
    latest_final = None

    async def next_final(self) -> None:
        await asyncio.sleep(60)

    async def close(self) -> None:
        """Nothing runs."""


def test_in_asr_mode_the_question_is_the_final_that_started_the_retrieval_whatever_follows() -> None:
    from backend_agent.asr.streaming import Transcript

    async def run() -> tuple[list[SpanAnswer], float]:
        answers: list[SpanAnswer] = []
        retrieval = Retrieval("s1", "u1", Agent(build_catalogue()), ContextStore(":memory:"), TalkingOn(),  # type: ignore[arg-type]
                              answers.append, lambda e: None, lambda: 0.0, RetrievalConfig(trigger="asr"))
        started = asyncio.get_running_loop().time()
        retrieval.on_transcript(Transcript("What is two plus two?", True, 0.0, 2.0, 0.0))
        while retrieval.in_flight:
            await asyncio.sleep(0.01)
        elapsed = asyncio.get_running_loop().time() - started
        await retrieval.close()
        return answers, elapsed

    answers, elapsed = asyncio.run(run())
    assert [a.question for a in answers] == ["What is two plus two?"]
    assert elapsed < 1.0, "it did not wait for the user's next utterance"
