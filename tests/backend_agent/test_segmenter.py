"""The VAD segmenter on real espeak-ng speech: an utterance's start cue, and an utterance ended before its silence."""

from __future__ import annotations

import numpy as np
import pytest

from backend_agent.asr.segmenter import RATE, VAD_FRAME, Cue, SegmenterConfig, UtteranceSegmenter
from tests.support.speech import silence, speak

LEAD_S = 1.0


@pytest.fixture(scope="module")
def speech(tmp_path_factory: pytest.TempPathFactory) -> np.ndarray:
    """A second of silence, then a question, with no silence after it."""
    said = speak("What is the weather like in Paris today?", tmp_path_factory.mktemp("speech") / "q.wav", rate=RATE)
    return np.concatenate([silence(LEAD_S, RATE), said])


def test_an_utterance_opens_with_a_start_cue_whose_start_includes_the_pre_roll(speech: np.ndarray) -> None:
    segmenter = UtteranceSegmenter()
    events = segmenter.feed(np.concatenate([speech, silence(1.0, RATE)]))
    cues = [e.cue for e in events]
    assert cues[0] is Cue.START and cues[-1] is Cue.FINAL and cues.count(Cue.START) == 1
    assert set(cues[1:-1]) == {Cue.PARTIAL}
    start, final = events[0], events[-1]
    assert start.start_s == final.start_s
    config = SegmenterConfig()
    pre_roll_s = (config.start_frames + config.pre_roll_frames) * VAD_FRAME / RATE
    assert LEAD_S - pre_roll_s <= start.start_s < LEAD_S  # the speech's first phonemes are in, and a little silence


def test_finish_ends_the_utterance_going_on_as_silence_would(speech: np.ndarray) -> None:
    segmenter = UtteranceSegmenter()
    segmenter.feed(speech)
    assert segmenter.in_speech  # no silence came: the utterance is still open
    (final,) = segmenter.finish()
    assert final.cue is Cue.FINAL and not segmenter.in_speech
    assert final.end_s == pytest.approx(len(speech) / RATE, abs=VAD_FRAME / RATE)
    assert len(final.audio) == round((final.end_s - final.start_s) * RATE)


def test_finish_with_no_utterance_going_on_ends_nothing() -> None:
    segmenter = UtteranceSegmenter()
    segmenter.feed(silence(1.0, RATE))
    assert segmenter.finish() == []


def test_speech_after_a_finish_opens_the_next_utterance(speech: np.ndarray) -> None:
    segmenter = UtteranceSegmenter()
    segmenter.feed(speech)
    segmenter.finish()
    assert [e.cue for e in segmenter.feed(speech)][:1] == [Cue.START]
