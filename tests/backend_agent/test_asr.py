"""Streaming ASR on real espeak-ng speech with the bundled Whisper tiny.en model."""

from __future__ import annotations

import asyncio
import itertools
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from backend_agent.asr.streaming import SpeechEdge, StreamingASR, Transcript
from backend_agent.asr.transcriber import ASRLoadError, WhisperTranscriber
from frontend_model.frame import SAMPLE_RATE
from frontend_model.span.normaliser import normalise_text
from tests.support.speech import silence, speak

QUESTIONS = [
    "What time is it in Tokyo?",
    "How many kilometres are there in ten miles?",
    "What is the weather like in Paris today?",
    "When does the museum open on Sunday?",
    "What is twelve times seven?",
    "Who won the football match last night?",
]


def words(text: str) -> list[str]:
    text = normalise_text(text).lower().replace("-", " ")
    text = text.replace("kilometers", "kilometres")
    return re.findall(r"[a-z']+", text)


def word_errors(ref: list[str], hyp: list[str]) -> int:
    row = list(range(len(hyp) + 1))
    for i, r in enumerate(ref, 1):
        prev, row[0] = row[0], i
        for j, h in enumerate(hyp, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (r != h))
    return row[-1]


@pytest.fixture(scope="module")
def transcriber() -> WhisperTranscriber:
    return WhisperTranscriber()


def test_missing_model_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ASRLoadError, match="could not load Whisper model"):
        WhisperTranscriber(str(tmp_path / "nope"))


@pytest.mark.slow
def test_streaming_questions_have_low_word_error_rate(transcriber: WhisperTranscriber, tmp_path: Path) -> None:
    audio = [silence(0.5)]
    for i, q in enumerate(QUESTIONS):
        audio += [speak(q, tmp_path / f"q{i}.wav"), silence(1.2)]
    pcm = np.concatenate(audio)

    async def run() -> list[Transcript]:
        got: list[Transcript] = []
        with ThreadPoolExecutor(1) as pool:
            asr = StreamingASR(transcriber.transcribe, pool, got.append, queue_frames=len(pcm) // 1920 + 1)
            asr.start()
            for start in range(0, len(pcm) - 1919, 1920):
                asr.feed(pcm[start : start + 1920])
                await asyncio.sleep(0)
            await asr.drain()
            await asr.close()
        return got

    transcripts = asyncio.run(run())
    finals = [t for t in transcripts if t.final]
    assert len(finals) == len(QUESTIONS), [t.text for t in finals]
    errors = sum(word_errors(words(q), words(t.text)) for q, t in zip(QUESTIONS, finals, strict=True))
    total = sum(len(words(q)) for q in QUESTIONS)
    assert errors / total <= 0.15, [(q, t.text) for q, t in zip(QUESTIONS, finals, strict=True)]
    assert any(not t.final for t in transcripts), "a partial transcript is due about every second of speech"
    assert all(a.end_s <= b.start_s for a, b in itertools.pairwise(finals)), "utterances are in order"


def test_a_closed_stream_withdraws_its_calls_from_a_whisper_that_is_behind(tmp_path: Path) -> None:
    """Whisper slower than the sessions (a loaded host): the shared executor still holds this stream's calls when
    its session ends. `close` cancels them and drops the audio not yet segmented, so the stream (and the session
    its callbacks reach) is freed at once by reference counting, not when Whisper gets to it."""
    import gc
    import threading
    import weakref
    from concurrent.futures import Future

    pcm = np.concatenate([silence(0.3), speak("What is the weather like in Paris today?", tmp_path / "q.wav"),
                          silence(1.0), speak("And in Tokyo?", tmp_path / "t.wav"), silence(1.0)])
    stuck = threading.Event()
    submitted: list[Future[str]] = []

    class Behind(ThreadPoolExecutor):
        def submit(self, fn, /, *args, **kwargs):  # type: ignore[no-untyped-def]
            future = super().submit(fn, *args, **kwargs)
            submitted.append(future)
            return future

    async def run(pool: ThreadPoolExecutor) -> weakref.ref[StreamingASR]:
        pool.submit(stuck.wait)  # the one worker is busy with another session's call
        asr = StreamingASR(lambda audio: "late", pool, lambda t: None, queue_frames=len(pcm) // 1920 + 1)
        asr.start()
        for start in range(0, len(pcm) - 1919, 1920):
            asr.feed(pcm[start : start + 1920])
            await asyncio.sleep(0)
        await asyncio.sleep(0.2)  # the segmenter reached the first final: a call queued, the rest of the audio waits
        assert asr.awaiting_final and len(submitted) >= 2
        await asr.close()
        assert asr._queue.empty()
        return weakref.ref(asr)

    gc.disable()
    try:
        with Behind(1) as pool:
            try:
                ref = asyncio.run(run(pool))
                assert ref() is None, "the closed stream is still referenced: by the calls it left queued"
                assert all(f.cancelled() for f in submitted[1:]), "every call of the closed stream is withdrawn"
            finally:
                stuck.set()
    finally:
        gc.enable()


def test_speech_starts_then_a_commit_ends_it_at_once_and_its_final_transcript_follows(tmp_path: Path) -> None:
    """Push to talk: the client commits instead of sending the silence that would end the utterance."""
    pcm = np.concatenate([silence(0.5), speak("What time is it in Tokyo?", tmp_path / "q.wav")])
    heard: list[object] = []

    async def run() -> None:
        with ThreadPoolExecutor(1) as pool:
            asr = StreamingASR(lambda audio: f"{len(audio) / 16000:.2f} s", pool, heard.append,
                               queue_frames=len(pcm) // 1920 + 2, on_speech=heard.append)
            asr.start()
            for start in range(0, len(pcm) - 1919, 1920):
                asr.feed(pcm[start : start + 1920])
            await asr.drain()
            assert asr.awaiting_final and [type(h) for h in heard if not isinstance(h, Transcript)] == [SpeechEdge]
            asr.commit()
            await asr.drain()
            await asr.close()

    asyncio.run(run())
    edges = [h for h in heard if isinstance(h, SpeechEdge)]
    (final,) = [h for h in heard if isinstance(h, Transcript) and h.final]
    assert [e.started for e in edges] == [True, False]
    assert heard.index(edges[0]) == 0 and heard.index(edges[1]) < heard.index(final) == len(heard) - 1
    assert edges[0].at_s == final.start_s < 0.5 and edges[1].at_s == final.end_s <= len(pcm) / SAMPLE_RATE
    assert final.text == f"{final.end_s - final.start_s:.2f} s"  # all that was heard of it, transcribed
