"""The wire is the clock: every 1920 samples (80 ms) of received user audio make one frame to step."""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from frontend_model.loading import FRAME_SAMPLES, SAMPLE_RATE


@dataclass(frozen=True)
class InputFrame:
    index: int
    pcm: np.ndarray  # [FRAME_SAMPLES] float32
    arrived: float  # time.perf_counter() when its last sample arrived: the frame's deadline starts here


class FrameAssembler:
    """Cuts decoded PCM of any chunk size into whole frames, numbered from 0."""

    def __init__(self) -> None:
        self._pending = np.zeros(0, dtype=np.float32)
        self.frames = 0

    def push(self, pcm: np.ndarray) -> list[InputFrame]:
        if pcm.size == 0:
            return []
        buffer = np.concatenate([self._pending, pcm.astype(np.float32, copy=False)])
        whole = buffer.size // FRAME_SAMPLES
        now = time.perf_counter()
        frames = []
        for k in range(whole):
            chunk = np.clip(buffer[k * FRAME_SAMPLES : (k + 1) * FRAME_SAMPLES], -1.0, 1.0)
            frames.append(InputFrame(self.frames, chunk, now))
            self.frames += 1
        self._pending = buffer[whole * FRAME_SAMPLES :].copy()
        return frames

    @property
    def stream_time(self) -> float:
        """Seconds of user audio received so far in whole frames."""
        return self.frames * FRAME_SAMPLES / SAMPLE_RATE
