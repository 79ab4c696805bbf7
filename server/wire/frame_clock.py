"""The wire is the clock: every 1920 samples (80 ms) of received user audio make one frame to step."""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from frontend_model.frame import FRAME_S, FRAME_SAMPLES, SAMPLE_RATE


@dataclass(frozen=True)
class InputFrame:
    index: int
    pcm: np.ndarray  # [FRAME_SAMPLES] float32
    arrived: float  # time.perf_counter() when its last sample arrived: the frame's deadline starts here


def phase_pad(chunk: int, until_grid_s: float) -> int:
    """Samples of silence to put ahead of a stream's first chunk so that its frames end with the others'.

    Sessions share a tick only when their frames end close together; a client's frames end where its 80 ms of audio
    happen to end, anywhere in the frame. A client that sends `chunk`-sample pages, shorter than a frame, can have
    its frame ends moved in steps of a page by silence at the start: this picks the silence that makes its first
    frame (and so every later one) end at most one page before the grid instant `until_grid_s` from now, the
    moment the other sessions' frames end. Pages of a whole frame, or of sizes that do not divide it, get none.
    """
    if chunk <= 0 or chunk >= FRAME_SAMPLES or FRAME_SAMPLES % chunk:
        return 0
    until = until_grid_s % FRAME_S
    # The first frame needs FRAME_SAMPLES - chunk - pad more samples, which arrive at the real-time rate.
    still_needed = min(int(until * SAMPLE_RATE) // chunk * chunk, FRAME_SAMPLES - chunk)
    return FRAME_SAMPLES - chunk - still_needed


class FrameAssembler:
    """Cuts decoded PCM of any chunk size into whole frames, numbered from `first` (0, or where a resumed session's
    stream was)."""

    def __init__(self, first: int = 0) -> None:
        self._pending = np.zeros(0, dtype=np.float32)
        self.first = first
        self.frames = first
        self.padded = 0

    def pad(self, samples: int) -> None:
        """Silence ahead of the stream (see `phase_pad`); only before the first frame, whose deadline it moves."""
        if self.frames > self.first or self.padded:
            raise RuntimeError("a stream can only be padded before its first frame")
        self._pending = np.concatenate([np.zeros(samples, np.float32), self._pending])
        self.padded = samples

    def clear(self) -> None:
        """Drops the samples not yet cut into a frame (a Realtime `input_audio_buffer.clear`)."""
        self._pending = np.zeros(0, dtype=np.float32)

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
