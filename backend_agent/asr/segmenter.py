"""Voice-activity segmentation of a 16 kHz stream into utterances, with partial-transcript cues.

Pure logic over webrtcvad decisions: it says when an utterance starts, when a partial transcript is due and
when the utterance has ended (by silence, or when the client says the user is done), and holds the audio; the
transcriber does the rest.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

import numpy as np
import webrtcvad

from backend_agent.asr.resample import to_int16_bytes

RATE = 16000
VAD_FRAME = 480  # 30 ms


class Cue(Enum):
    START = "start"  # the user started speaking: clients hear of it before any transcript
    PARTIAL = "partial"
    FINAL = "final"


@dataclass(frozen=True)
class SegmentEvent:
    cue: Cue
    audio: np.ndarray  # 16 kHz float32, the utterance so far
    start_s: float
    end_s: float


@dataclass
class SegmenterConfig:
    aggressiveness: int = 2
    start_frames: int = 3  # 90 ms of speech opens an utterance
    end_silence_s: float = 0.6
    partial_every_s: float = 1.0
    max_utterance_s: float = 15.0
    pre_roll_frames: int = 10  # 300 ms kept from before the start, so first phonemes are not cut


@dataclass
class UtteranceSegmenter:
    config: SegmenterConfig = field(default_factory=SegmenterConfig)

    def __post_init__(self) -> None:
        self._vad = webrtcvad.Vad(self.config.aggressiveness)
        self._pending = np.zeros(0, dtype=np.float32)
        self._frames_seen = 0
        self._history: list[np.ndarray] = []
        self._voiced_run = 0
        self._speech: list[np.ndarray] | None = None
        self._start_frame = 0
        self._silence_frames = 0
        self._last_partial_frame = 0

    @property
    def in_speech(self) -> bool:
        return self._speech is not None

    def recent_audio(self, seconds: float) -> np.ndarray:
        """The last `seconds` of audio heard, speech or not (for a question asked without a clear end)."""
        frames = int(seconds * RATE / VAD_FRAME)
        parts = self._history[-frames:] + ([self._pending] if len(self._pending) else [])
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.float32)

    def feed(self, pcm16k: np.ndarray) -> list[SegmentEvent]:
        self._pending = np.concatenate([self._pending, pcm16k.astype(np.float32)])
        events: list[SegmentEvent] = []
        while len(self._pending) >= VAD_FRAME:
            frame, self._pending = self._pending[:VAD_FRAME], self._pending[VAD_FRAME:]
            event = self._frame(frame)
            if event is not None:
                events.append(event)
        return events

    def _frame(self, frame: np.ndarray) -> SegmentEvent | None:
        cfg = self.config
        voiced = self._vad.is_speech(to_int16_bytes(frame), RATE)
        self._frames_seen += 1
        self._history.append(frame)
        keep = int(max(cfg.max_utterance_s, 10.0) * RATE / VAD_FRAME)
        if len(self._history) > keep:
            del self._history[: len(self._history) - keep]
        if self._speech is None:
            self._voiced_run = self._voiced_run + 1 if voiced else 0
            if self._voiced_run >= cfg.start_frames:
                lead = cfg.start_frames + cfg.pre_roll_frames
                self._speech = list(self._history[-lead:])
                self._start_frame = self._frames_seen - len(self._speech)
                self._silence_frames = 0
                self._last_partial_frame = self._frames_seen
                return self._event(Cue.START)
            return None
        self._speech.append(frame)
        self._silence_frames = 0 if voiced else self._silence_frames + 1
        frame_s = VAD_FRAME / RATE
        length_s = len(self._speech) * frame_s
        if self._silence_frames * frame_s >= cfg.end_silence_s or length_s >= cfg.max_utterance_s:
            return self._finish()
        if (self._frames_seen - self._last_partial_frame) * frame_s >= cfg.partial_every_s:
            self._last_partial_frame = self._frames_seen
            return self._event(Cue.PARTIAL)
        return None

    def finish(self) -> list[SegmentEvent]:
        """The utterance going on ends now, as silence would have ended it: a push-to-talk client said the user is
        done and sends no silence. Nothing when no utterance is going on."""
        return [self._finish()] if self._speech is not None else []

    def _event(self, cue: Cue) -> SegmentEvent:
        assert self._speech is not None
        frame_s = VAD_FRAME / RATE
        start = self._start_frame * frame_s
        return SegmentEvent(cue, np.concatenate(self._speech), start, start + len(self._speech) * frame_s)

    def _finish(self) -> SegmentEvent:
        event = self._event(Cue.FINAL)
        self._speech = None
        self._voiced_run = 0
        return event
